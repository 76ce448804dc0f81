"""`python -m hf_tinytx.serve` (transformers' `transformers serve`) on a TinyTx folder or Hub id, in a
subprocess on a loopback port, through the `openai` client: completions and chats, streamed or not,
answer greedy `generate`'s text; a folder without a chat template gets a 400 naming the fix; plain
`transformers serve` still stops at start-up."""

import functools
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
import torch
from huggingface_hub import HfApi
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.cluster_runs import free_port
from tests.helpers.hub_server import LocalHub
from tests.helpers.tiny import TINY_SENTENCES, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env


MAX_TOKENS = 24  # pinned, for the server and for `generate`; the replies below end with EOS before that
COMPLETION_PROMPT = "The quick brown fox"
CHAT_MESSAGES = [{"role": "user", "content": "Attention lets every position"}]
# A minimal ChatML-like template: role markers as plain text, EOS closes each turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
READY_TIMEOUT_S = 90  # start-up is imports plus a tiny model; a loaded 2-core machine needs ~15 s
HUB_REPO = "tester/tinytx-serve"


# ---- a trained-ish model, saved with and without a chat template ----


def as_chat(sentence: str) -> list[dict]:
    """A sentence split into a user turn (its first four words) and the assistant's reply (the rest)."""
    words = sentence.split()
    return [
        {"role": "user", "content": " ".join(words[:4])},
        {"role": "assistant", "content": " ".join(words[4:])},
    ]


def train_tiny_chat_model(
    min_steps: int = 60, max_steps: int = 400, stopping=("completion", "chat"), **model_fields
):
    """A tiny TinyTx (width 64 unless `model_fields` say otherwise) and byte-level BPE that learned three of
    TINY_SENTENCES as text and as chats, trained until the greedy replies named in `stopping` end with EOS
    within MAX_TOKENS (a fixed step count made the tests depend on the rounding of every kernel)."""
    tokenizer = build_byte_bpe_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    sentences = TINY_SENTENCES[:3]  # the prompts below start the first and the third
    texts = [tokenizer.bos_token + s + tokenizer.eos_token for s in sentences]
    texts += [tokenizer.apply_chat_template(as_chat(s), tokenize=False) for s in sentences]
    batch = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model = build_tiny_model(
        vocab_size=len(tokenizer), **{"hidden_size": 64, "intermediate_size": 128, **model_fields}
    )
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains faster on one thread than on two busy ones
    try:
        for step in range(1, max_steps + 1):
            model.train()
            model(**batch, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if (
                step >= min_steps
                and step % 20 == 0
                and replies_end_with_eos(model.eval(), tokenizer, stopping)
            ):
                return model, tokenizer
    finally:
        torch.set_num_threads(threads)
    raise AssertionError(
        f"the tiny chat model did not learn to end its replies with EOS in {max_steps} steps"
    )


def replies_end_with_eos(model, tokenizer, which) -> bool:
    with torch.no_grad():
        last = [model.generate(**prompt_inputs(tokenizer, name == "chat"), max_new_tokens=MAX_TOKENS,
                               do_sample=False)[0, -1] for name in which]
    return all(token == tokenizer.eos_token_id for token in last)


def prompt_inputs(tokenizer, chat: bool) -> dict:
    """The tokenized CHAT_MESSAGES or COMPLETION_PROMPT."""
    if chat:
        return tokenizer.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, return_dict=True,
                                             return_tensors="pt")
    return tokenizer(COMPLETION_PROMPT, return_tensors="pt")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """{"chat": a folder whose tokenizer has the chat template, "plain": the same model without one}."""
    model, tokenizer = train_tiny_chat_model()
    root = tmp_path_factory.mktemp("serve_models")
    folders = {"chat": root / "tinytx-chat", "plain": root / "tinytx-plain"}
    model.save_pretrained(folders["chat"])
    tokenizer.save_pretrained(folders["chat"])
    tokenizer.chat_template = None
    model.save_pretrained(folders["plain"])
    tokenizer.save_pretrained(folders["plain"])
    assert not any(p.name.startswith("chat_template") for p in folders["plain"].iterdir())
    return folders


@functools.cache
def greedy_text(folder: Path, chat: bool) -> str:
    """What greedy `generate` writes for the test's prompt, decoded as the server decodes it."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    inputs = prompt_inputs(tokenizer, chat)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    assert new_tokens[-1] == tokenizer.eos_token_id, "the reply must end with EOS before the token limit"
    text = tokenizer.decode(new_tokens, skip_special_tokens=True)
    assert len(set(text)) > 5, f"degenerate test: the model wrote {text!r}"
    return text


# ---- servers in subprocesses ----


class Server:
    """A server command in a subprocess on a free loopback port, its output in a log file."""

    ready_path = "/health"  # transformers serve's (a model named on the command line is loaded by then)

    def __init__(self, command: list[str], log: Path, env: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [*command, "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, deadline: float) -> str:
        """"ready" once `ready_path` answers 200, or "exited"."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return "exited"
            try:
                with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=2) as response:
                    if response.status == 200:
                        return "ready"
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not answer {self.ready_path} in time:\n{self.output()[-5000:]}")

    def wait_ready(self, deadline: float) -> None:
        if self.wait(deadline) == "exited":
            raise AssertionError(f"the server exited ({self.process.returncode}):\n{self.output()[-5000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self) -> "openai.OpenAI":
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)


LAUNCHER = [sys.executable, "-m", "hf_tinytx.serve"]
TRANSFORMERS_CLI = str(Path(sys.executable).with_name("transformers"))


@pytest.fixture(scope="module")
def servers(folders, tmp_path_factory):
    """"folder": the documented command on the chat folder; "any": no model, each request names
    its own (a folder or a Hub id from a local Hub); "plain": `transformers serve
    --trust-remote-code`, started once the others are ready."""
    root = tmp_path_factory.mktemp("serve_run")
    env = pretrain_env(root, OMP_NUM_THREADS="1")  # offline, private caches; the servers share two cores
    with LocalHub() as hub:
        hub_env = {**env, **hub.client_env(root / "hf_home_hub")}
        started = {}
        try:
            started["folder"] = Server([*LAUNCHER, str(folders["chat"])], root / "folder.log", env)
            started["any"] = Server(LAUNCHER, root / "any.log", hub_env)
            api = HfApi(endpoint=hub.url, token=hub.token)
            api.create_repo(HUB_REPO)
            api.upload_folder(repo_id=HUB_REPO, folder_path=str(folders["chat"]))
            deadline = time.monotonic() + READY_TIMEOUT_S
            started["folder"].wait_ready(deadline)
            started["any"].wait_ready(deadline)
            started["plain"] = Server(
                [TRANSFORMERS_CLI, "serve", str(folders["chat"]), "--trust-remote-code"], root / "plain.log",
                env,
            )
            yield started
        finally:
            for server in started.values():
                server.stop()


# ---- the tests ----


def ask(client, model: str, chat: bool, stream: bool, **extra) -> str:
    """The greedy reply's text to CHAT_MESSAGES (`chat`) or to COMPLETION_PROMPT."""
    create = client.chat.completions.create if chat else client.completions.create
    prompt = {"messages": CHAT_MESSAGES} if chat else {"prompt": COMPLETION_PROMPT}
    answer = create(model=model, **prompt, max_tokens=MAX_TOKENS, temperature=0, stream=stream, **extra)
    choices = [chunk.choices[0] for chunk in answer if chunk.choices] if stream else answer.choices
    if chat:
        return "".join((choice.delta if stream else choice.message).content or "" for choice in choices)
    return "".join(choice.text for choice in choices)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_completions_and_chat_match_generate(servers, folders, stream):
    client, model = servers["folder"].client(), str(folders["chat"])
    assert ask(client, model, chat=False, stream=stream) == greedy_text(folders["chat"], chat=False)
    assert ask(client, model, chat=True, stream=stream) == greedy_text(folders["chat"], chat=True)


def test_a_hub_id(servers, folders):
    client = servers["any"].client()
    assert ask(client, HUB_REPO, chat=False, stream=False) == greedy_text(folders["chat"], chat=False)
    assert ask(client, HUB_REPO, chat=True, stream=True) == greedy_text(folders["chat"], chat=True)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_chat_without_a_template_is_a_400_that_names_the_fix(servers, folders, stream):
    client, model = servers["any"].client(), str(folders["plain"])
    with pytest.raises(openai.BadRequestError) as raised:
        ask(client, model, chat=True, stream=stream)
    assert raised.value.status_code == 400
    message = str(raised.value)
    assert (
        f"{model} has no chat template" in message
        and "/v1/completions" in message
        and "chat_template" in message
    )
    assert "Traceback" not in servers["any"].output()
    # the same folder still completes text
    assert ask(client, model, chat=False, stream=stream) == greedy_text(folders["plain"], chat=False)


def test_transformers_chat_talks_to_the_server(servers, folders, tmp_path):
    """`transformers chat MODEL URL` (the interactive client shipped with transformers), fed from stdin."""
    model, server = str(folders["chat"]), servers["folder"]
    flags = [f"max_new_tokens={MAX_TOKENS}", "do_sample=False", "eos_token_id=2", "pad_token_id=0"]
    env = pretrain_env(tmp_path, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_UPDATE_CHECK="1", NO_PROXY="127.0.0.1")
    result = subprocess.run(
        [TRANSFORMERS_CLI, "chat", model, server.url, *flags],
        input=CHAT_MESSAGES[0]["content"] + "\n!exit\n", env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reply = " ".join(greedy_text(folders["chat"], chat=True).split())
    assert reply in " ".join(result.stdout.split()), result.stdout[-3000:]


def test_plain_transformers_serve_still_stops_at_start_up(servers, folders, tmp_path):
    """The negative control. If this fails because it now starts, transformers serves
    remote-code models: update the README."""
    server = servers["plain"]
    assert (
        server.wait(time.monotonic() + READY_TIMEOUT_S) == "exited"
    ), "plain `transformers serve` serves TinyTx now"
    assert server.process.returncode != 0
    assert "has no attribute TinyTxForCausalLM" in server.output(), server.output()[-3000:]
    # Without the flag it stops earlier, at transformers' own remote-code check
    # (no stdin: the prompt reads EOF).
    without_flag = subprocess.run(
        [TRANSFORMERS_CLI, "serve", str(folders["chat"])], env=pretrain_env(tmp_path),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=READY_TIMEOUT_S,
    )
    assert without_flag.returncode != 0
    assert "contains custom code which must be executed" in without_flag.stderr, without_flag.stderr[-3000:]


def test_the_launcher_imports_no_private_module_of_transformers_serve():
    """Issue 66: `transformers.cli.serving.*` changes with every release; the launcher runs `Serve` (what the
    `transformers serve` command runs) and speaks HTTP to it, nothing more."""
    import ast

    import hf_tinytx.serve

    imported = set()
    for path in Path(hf_tinytx.serve.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
    transformers_names = {name for name in imported if name.startswith("transformers.")}
    assert "transformers.cli.serve.Serve" in transformers_names, sorted(transformers_names)
    assert not [
        name for name in transformers_names if name.startswith("transformers.cli.serving")
    ], transformers_names
