"""The llama.cpp recipes of docs/serving.md as a user runs them, read from the page:
`llama_cpp.Llama` from Python, the no-repack setting for q8_0 files, and llama-cpp-python's
OpenAI-compatible server with `repeat_penalty` 1.0, on test_serve.py's tiny chat model exported to
f32 and q8_0. llama.cpp runs in .venv-llamacpp (marked `engine`).
"""

import shlex
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_tinytx.convert.__main__ import main as convert_main
from tests.helpers.engines import LLAMA_CPP_PYTHON, require_llama_cpp
from tests.helpers.tiny import pretrain_env
from tests.hf_tinytx.serve.test_serve import MAX_TOKENS, Server, ask, prompt_inputs, train_tiny_chat_model
from tests.test_readme import section_block


pytestmark = pytest.mark.engine

README_PAGE = "docs/serving.md"  # the page of the recipes, and their section:
README_SECTION = "llama.cpp's Python API and its OpenAI-compatible server"
README_PROMPT, README_MAX_TOKENS = "The animal didn't cross the street because", 32  # what its snippets ask
SERVE_COMMAND = "python -m llama_cpp.server"
SERVED_MODEL = "out/tinytx.gguf"
READY_TIMEOUT_S = 120
MODEL = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32,
}


def readme_block(language: str, containing: str) -> str:
    return section_block(README_PAGE, README_SECTION, language, containing)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's folder: out/tinytx (a tiny model that learnt to end its replies),
    its f32 and q8_0 GGUF exports."""
    require_llama_cpp("llama.cpp is needed to check its recipes")
    root = tmp_path_factory.mktemp("llama_cpp_user")
    # vLLM's test's model (serve/test_vllm.py): its reply to the README's prompt is more than a full stop.
    model, tokenizer = train_tiny_chat_model(min_steps=100, stopping=["chat"], **MODEL)
    model.save_pretrained(root / "out" / "tinytx")
    tokenizer.save_pretrained(root / "out" / "tinytx")
    for name, outtype in (("tinytx.gguf", "f32"), ("tinytx-q8_0.gguf", "q8_0")):
        assert convert_main(["--to", "gguf", str(root / "out" / "tinytx"), str(root / "out" / name),
                             "--outtype", outtype]) == 0
    return root


def greedy_text(workdir, inputs: dict, max_new_tokens: int) -> str:
    """What greedy `generate` writes, decoded as llama.cpp decodes it."""
    folder = workdir / "out" / "tinytx"
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert len(set(text)) > 5, f"degenerate test: the model wrote {text!r}"
    return text


def prompt_text(workdir, prompt: str, max_new_tokens: int) -> str:
    tokenizer = AutoTokenizer.from_pretrained(workdir / "out" / "tinytx")
    return greedy_text(workdir, tokenizer(prompt, return_tensors="pt"), max_new_tokens)


def run_in_llama_cpp(workdir, name: str, code: str) -> subprocess.CompletedProcess:
    path = workdir / f"{name}.py"
    path.write_text(code)
    return subprocess.run([str(LLAMA_CPP_PYTHON), str(path)], cwd=workdir, env=pretrain_env(workdir),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def test_python_snippet_prints_generates_text(workdir):
    snippet = readme_block("python", 'Llama("out/tinytx.gguf"')
    assert README_PROMPT in snippet and f"max_tokens={README_MAX_TOKENS}" in snippet, snippet
    result = run_in_llama_cpp(workdir, "readme_llama_cpp", snippet)
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.stdout == prompt_text(workdir, README_PROMPT, README_MAX_TOKENS) + "\n"


def test_no_repack_snippet_turns_llama_cpps_extra_buffers_off_and_q8_0_runs(workdir):
    """On Intel AMX CPUs llama.cpp 0.3.36 segfaults in its q8_0 repacking without it; checked: the snippet
    sets what Llama() reads, and q8_0 runs."""
    snippet = readme_block("python", "use_extra_bufts")
    check = (
        "\nfrom llama_cpp import Llama\n"
        "assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is False\n"
        "llm = Llama('out/tinytx-q8_0.gguf', verbose=False)\n"
        f"print(llm({README_PROMPT!r}, max_tokens=8, temperature=0)['choices'][0]['text'])\n"
    )
    result = run_in_llama_cpp(workdir, "readme_no_repack", snippet + check)
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.stdout.strip(), "q8_0 wrote nothing"


class LlamaCppServer(Server):
    ready_path = "/v1/models"  # llama_cpp.server has no /health; the model is loaded once this answers


@pytest.fixture(scope="module")
def server(workdir):
    """The README's server command, run in the user's folder with .venv-llamacpp's python, on a free port."""
    line = next(
        line for line in readme_block("bash", SERVE_COMMAND).splitlines() if line.startswith(SERVE_COMMAND)
    )
    # `env -C`: relative paths are the user's folder's; the server's argparse keeps
    # Server's --host/--port (the last).
    command = ["env", "-C", str(workdir), str(LLAMA_CPP_PYTHON), *shlex.split(line)[1:]]
    started = LlamaCppServer(command, workdir / "server.log", pretrain_env(workdir))
    try:
        started.wait_ready(time.monotonic() + READY_TIMEOUT_S)
        yield started
    finally:
        started.stop()


def test_readme_client_snippet_prints_generates_text(server, workdir):
    snippet = readme_block("python", "OpenAI(")
    assert "http://localhost:8001/v1" in snippet and f'model="{SERVED_MODEL}"' in snippet, snippet
    assert '"repeat_penalty": 1.0' in snippet, snippet
    path = workdir / "readme_llama_cpp_client.py"
    path.write_text(snippet.replace("localhost:8001", f"127.0.0.1:{server.port}"))
    result = subprocess.run(
        [sys.executable, str(path)], cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.stdout == prompt_text(workdir, README_PROMPT, README_MAX_TOKENS) + "\n"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_server_replies_with_generates_text(server, workdir, chat, stream):
    inputs = prompt_inputs(AutoTokenizer.from_pretrained(workdir / "out" / "tinytx"), chat)
    reply = ask(server.client(), SERVED_MODEL, chat, stream, extra_body={"repeat_penalty": 1.0})
    assert reply == greedy_text(workdir, inputs, MAX_TOKENS)


def test_the_servers_default_repeat_penalty_is_what_parts_it_from_generate(server, workdir):
    """Why the README asks for repeat_penalty 1.0: the server's default (1.1) changes the greedy text here."""
    client = server.client()
    default = (
        client.completions.create(
            model=SERVED_MODEL, prompt=README_PROMPT, max_tokens=README_MAX_TOKENS, temperature=0
        )
        .choices[0]
        .text
    )
    assert default != prompt_text(workdir, README_PROMPT, README_MAX_TOKENS)
