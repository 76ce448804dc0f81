"""`python -m hf_tinytx.serve`'s bad command line, one table (issue 66): a flag or the model argument, each
refused by the launcher (hf_tinytx/serve/__main__.py) before anything starts, in one line on stderr that names
the problem and the fix, exit status 2, nothing written, no server started and no connection made. The table
runs in process; one case also runs the real command, which must print the same line and never import torch.
A model that passes these checks and still does not load is refused only once transformers' server has tried;
the HTTP 400s of bad requests are in test_serve_limits.py."""

import json
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import transformers.cli.serve  # noqa: F401  (loaded with torch allowed; a check blocks it)
from safetensors.numpy import save_file

from hf_tinytx.commands.signals import STOP_SIGNALS, restore
from hf_tinytx.serve import __main__ as serve
from tests.helpers.faults import relabel_dtype
from tests.helpers.refusals import refused_in_process, snapshot
from tests.helpers.tiny import pretrain_env


PROG = "python -m hf_tinytx.serve"
HELP = f"{PROG} --help lists the options"  # how each of the parser's own errors ends
CONFIG = {"model_type": "tinytx", "vocab_size": 4}
# case: (the command line, words of the one line); {root}: the folders the cases name (the fixture `root`),
# the working folder too.
REFUSED = {
    # the parser's errors (typer's): before, a box of 4 to 5 lines
    "an unknown flag": (["--foo"], ["No such option: --foo", HELP]),
    "a flag's typo": (["--max-tokens-cp", "3"], ["No such option: --max-tokens-cp", "--max-tokens-cap"]),
    "a flag without its value": (["--port"], ["Option '--port' requires an argument", HELP]),
    "a second model": (["org/name", "extra"], ["unexpected extra argument(s) (extra)", HELP]),
    "--max_tokens_cap 0": (
        ["--max_tokens_cap", "0"], ["'--max_tokens_cap'", "greater than or equal to 1", HELP],
    ),
    "--max_tokens_cap -5": (["--max_tokens_cap", "-5"], ["'--max_tokens_cap'", "greater than or equal to 1"]),
    "--max_tokens_cap many": (["--max_tokens_cap", "many"], ["'--max_tokens_cap'", "a valid integer"]),
    "--max_request_seconds 0": (
        ["--max_request_seconds", "0"], ["'--max_request_seconds'", "greater than or equal to 0.001"],
    ),
    "--port http": (["--port", "http"], ["'--port'", "a valid integer"]),
    "--reasoning maybe": (["--reasoning", "maybe"], ["'--reasoning'", "'maybe' is not one of 'on', 'off'"]),
    # Before: "Uvicorn running on http://localhost:99999", while it listened on another port.
    "--port 99999": (["--port", "99999"], [
        f"{PROG}: error: --port 99999 is not a port: give one from 1 to 65535, e.g. --port 8000",
    ]),
    # uvicorn's "any free port", which the launcher never offered (no doc, no test)
    "--port 0": (["--port", "0"], ["--port 0 is not a port: give one from 1 to 65535"]),
    "--port -1": (["--port", "-1"], ["--port -1 is not a port: give one from 1 to 65535"]),
    "--chat-template-kwargs not JSON": (
        ["--chat-template-kwargs", "{"], ["--chat-template-kwargs must be a JSON object", "enable_thinking"],
    ),
    "--chat-template-kwargs a list": (
        ["--chat-template-kwargs", "[1]"], ["--chat-template-kwargs must be a JSON object"],
    ),
    # the model argument
    "a URL": (["https://huggingface.co/org/model"], [
        "https://huggingface.co/org/model is a URL: pass a local model folder or a Hub id (org/name)",
    ]),
    "a missing folder": (
        ["{root}/absent"], ["no such folder: {root}/absent (check the path; a Hub id looks like owner/name)"],
    ),
    # Before: started, then "cannot load model 'models/typo': We couldn't connect to 'https://huggingface.co'"
    # (the rule of every command, hf_tinytx/folders/location.py: its folder exists, so it is a path).
    "a missing folder in one that exists": (
        ["models/typo"], [f"{PROG}: error: no such folder: models/typo (check the path; a Hub id looks like"],
    ),
    "a missing ./folder": (["./typo"], ["no such folder: ./typo"]),
    "a link to nowhere": (["dangling"], ["dangling is a link to", "which does not exist", "point the link"]),
    "a file": (["a_file"], ["a_file is a file, not a model folder: pass the folder that holds config.json"]),
    "a folder without config.json": (
        ["empty"], ["empty is not a model folder (no config.json in it)", "e.g. out/tinytx"],
    ),
    # what generate and convert refuse in a folder (hf_tinytx/folders/), read without torch
    "config.json not JSON": (["broken-config"], ["broken-config/config.json is not valid JSON", "line 1"]),
    "config.json a list": (["config-list"], ["config-list/config.json holds a JSON list, not an object"]),
    "a tokenizer larger than the embedding": (
        ["big-tokenizer"], ["big-tokenizer's tokenizer has 10 tokens but the model's embedding only 4 rows"],
    ),
    "damaged weights": (["damaged"], ["damaged/model.safetensors is damaged or truncated", "save it again"]),
    "integer weights": (
        ["{root}/i32"], ["{root}/i32", "as an integer type, but the weights of a model that is not"],
    ),
    # Before: served, the pickle loaded by transformers (issue 69); and no weights: a backend traceback.
    "pickled weights only": (["pickled"], ["pickled holds its weights only as a pickle (pytorch_model.bin)"]),
    "no weights": (["no-weights"], ["no-weights has a config but no weights (no model.safetensors)"]),
}
IN_A_PROCESS = "a missing folder in one that exists"  # the real command: the same line, no torch imported


def model_folder(folder, config=CONFIG, tokens: int = 4) -> None:
    """A model folder the checks read: config.json, a tokenizer.json of `tokens` ids, one tensor's weights."""
    folder.mkdir()
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    vocab = {chr(ord("a") + i): i for i in range(tokens)}
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
    weights = {"lm_head.weight": np.zeros((CONFIG["vocab_size"], 2), np.float32)}
    save_file(weights, folder / "model.safetensors")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The folders the cases name, made once (no torch: the weights are written with numpy)."""
    root = tmp_path_factory.mktemp("serve_args")
    model_folder(root / "good")
    (root / "models").mkdir()
    (root / "empty").mkdir()
    (root / "a_file").write_text("not a folder")
    (root / "dangling").symlink_to(root / "nowhere")
    model_folder(root / "broken-config", config='{"vocab_size": 4,')
    model_folder(root / "config-list", config=[CONFIG])
    model_folder(root / "big-tokenizer", tokens=10)
    model_folder(root / "damaged")
    (root / "damaged" / "model.safetensors").write_bytes(b"\x40" + bytes(7) + b"{not a header")
    model_folder(root / "i32")
    relabel_dtype(root / "i32" / "model.safetensors", "F32", "I32")
    model_folder(root / "pickled")
    (root / "pickled" / "model.safetensors").rename(root / "pickled" / "pytorch_model.bin")
    model_folder(root / "no-weights")
    (root / "no-weights" / "model.safetensors").unlink()
    return root


@pytest.fixture
def nothing_starts(monkeypatch):
    """No server started, no connection made (the Hub above all); the test process's own stop-signal
    handlers back afterwards (the launcher records the signals before it parses)."""
    asked, earlier = [], {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def connect(sock, address):
        asked.append(address)
        raise OSError("no network in this test")

    def started(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(serve, "serve_until_stopped", started)
    yield asked
    restore(earlier)


def refused(root, monkeypatch, capsys, case: str) -> str:
    """The case's one line, run in process in `root` (status 2, nothing on stdout, torch not imported)."""
    monkeypatch.chdir(root)
    argv = [arg.replace("{root}", str(root)) for arg in REFUSED[case][0]]
    return refused_in_process(capsys, monkeypatch, PROG, serve.main, argv)


@pytest.mark.parametrize("case", REFUSED)
def test_bad_command_line_is_one_line_before_anything_starts(root, monkeypatch, capsys, nothing_starts, case):
    before = snapshot(root)
    line = refused(root, monkeypatch, capsys, case)
    assert all(word.replace("{root}", str(root)) in line for word in REFUSED[case][1]), line
    assert snapshot(root) == before and not nothing_starts


def test_the_command_prints_the_same_line_before_torch_loads(root, monkeypatch, capsys, nothing_starts):
    """The real command: the same line and status, in about a second (Python's import log names no torch)."""
    line = refused(root, monkeypatch, capsys, IN_A_PROCESS)
    before = snapshot(root)
    command = [sys.executable, "-X", "importtime", "-m", "hf_tinytx.serve", *REFUSED[IN_A_PROCESS][0]]
    result = subprocess.run(command, cwd=root, env=pretrain_env(root.parent), capture_output=True, text=True,
                            timeout=120)
    said = [entry for entry in result.stderr.splitlines() if not entry.startswith("import time:")]
    assert result.returncode == 2 and said == [line] and result.stdout == "", result.stderr[-3000:]
    imported = {entry.split("|")[-1].strip() for entry in result.stderr.splitlines() if "|" in entry}
    assert "transformers.cli.serve" in imported, "the import log was read"
    assert "torch" not in imported
    assert snapshot(root) == before


@pytest.mark.parametrize("model", ["org/name", "gpt2", "org/name@main", "org/name:model.Q8_0.gguf",
                                   "out/tinytx", "good", "good@main"])
def test_hub_ids_and_model_folders_pass(root, monkeypatch, model):
    """A Hub id stays one (out/tinytx too, where no out folder is), beside the folder cases above."""
    monkeypatch.chdir(root)
    assert serve.model_argument_error(model) is None
