"""finetune's bad input, one table (training/sft/finetune_args.py: `preflight`, run before torch loads): each
case one line on stderr, exit status 2, nothing written, the Hub never asked. The table runs in process; one
case also runs the real script, which must print the same line, write nothing and never import torch. The
refusals found once torch has loaded (a mistyped flag, which may be one of Trainer's; a chat template that
fails) run the script in test_finetune.py's runs, with two of these cases, which prove the script never asks
the (local) Hub."""

import gzip
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tinytx_training.sft.finetune_args import preflight
from tests.helpers.faults import relabel_dtype
from tests.helpers.refusals import refused_in_process, snapshot
from tests.helpers.tiny import REPO_ROOT, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env
from tests.training.sft.test_finetune import (
    QUICK,
    chat_records,
    prompt_records,
    save_base,
    save_folders_beside_the_runs,
    write_jsonl,
)


GOOD = ["--model_name_or_path", "bases/gated", "--train_file", "train.jsonl", *QUICK]  # a case's flags follow
PUSH = ["--push_to_hub", "--hub_model_id"]
MERGE = ["--use_peft", "--merge", "--output_dir", "mine/run", "--merged_output_dir"]
# the header's dtype for F32 data: same size, half the size
RELABELED = {"i32-header": "I32", "f16-header": "F16"}
DAMAGED = [("truncated", "file not fully covered"), ("header-garbage", "invalid UTF-8 in header"),
           ("header-length", "header too large"), ("flipped-json", "missing field `dtype`"),
           ("f16-header", "invalid shape, data type, or offset")]
# --merged_output_dir VALUE (with --output_dir mine/run), words of the one line
MERGED_INTO = {
    "the base model": ("bases/gated", "is the same folder as --model_name_or_path"),
    "the output folder": ("mine/run", "is the same folder as --output_dir"),
    "above the output folder": ("mine", "holds --output_dir"),
    "inside the output folder": ("mine/run/sub", "is inside --output_dir"),
    "another model's folder": ("other", "holds a model that tinytx finetune did not write (config.json"),
    "another run's folder": ("pretrained", "holds a training run (checkpoints, metrics.jsonl)"),
    "a file": ("a_file", "is a file"),
}
# name -> (flags after GOOD's, words of the one line); the output folder is never-NAME unless the flags say
CASES = {
    "malformed": (["--train_file", "malformed.jsonl"], ["malformed.jsonl, line 3", "not valid JSON"]),
    "second line": (["--train_file", "second.jsonl"], ["second.jsonl, line 2: not valid JSON"]),
    "missing": (["--train_file", "missing.jsonl"], ["missing.jsonl, line 2", "needs either"]),
    "latin1_txt": (
        ["--train_file", "latin1.txt"], ["latin1.txt, line 2", "not UTF-8", "save the file as UTF-8"],
    ),
    "latin1_jsonl": (["--train_file", "latin1.jsonl"], ["latin1.jsonl, line 2", "not UTF-8", "as UTF-8"]),
    "binary": (["--train_file", "packed.jsonl"], ["packed.jsonl, line 1", "binary file"]),
    "no_tokenizer": (
        ["--model_name_or_path", "bases/no-tokenizer"], ["'bases/no-tokenizer' has no tokenizer"],
    ),
    "no_config": (["--model_name_or_path", "bases/no-config"], ["'bases/no-config' has no config.json"]),
    "typo_path": (
        ["--model_name_or_path", "bases/gatedd"],  # at once, not after a Hub lookup
        ["'bases/gatedd': no such folder (did you mean 'bases/gated'?)"],
    ),
    "bad_hub_id": ([*PUSH, "tester/not a name"], ["'tester/not a name' is not a valid Hub repo id"]),
    "hub_timeout": (
        [*PUSH, "tester/never", "--hub_timeout", "0"], ["--hub_timeout must be a positive number"],
    ),
    "hub_stop_timeout": (
        ["--hub_stop_timeout", "-1"], ["--hub_stop_timeout must be a number of seconds >= 0 such as 20"],
    ),
    "link_out": (
        [*PUSH, "tester/linked", "--output_dir", "linked"],
        ["linked/notes.txt is a link to", "secret.txt, outside", "never read or uploaded"],
    ),
    # The base model is read, never written: an output folder inside it (or it, or above it) is refused.
    "output_in_base": (
        ["--output_dir", "bases/gated/sft"],
        ["--output_dir", "is inside --model_name_or_path", "never writes where it reads"],
    ),
    "fsdp_launch": (
        [], ["saves the weights one process holds", "FSDP and DeepSpeed split up", "drop --fsdp"],
    ),
    "deepspeed_launch": ([], ["saves the weights one process holds", "drop --fsdp/--deepspeed"]),
    # A lone surrogate: data the tokenizer cannot take.
    "surrogate": (
        ["--train_file", "surrogate.jsonl"],
        [
            'surrogate.jsonl, line 3: "prompt" holds a lone surrogate \\ud800 at character 1',
            "both halves of its pair",
        ],
    ),
    # Damaged files (issue 40).
    **{
        f"safetensors-{kind}": (
            ["--model_name_or_path", f"base-{kind}"],
            [f"base-{kind}/model.safetensors is damaged or truncated", why, "copy or save it again"],
        )
        for kind, why in DAMAGED
    },
    # Before: accepted, exit 0, a model trained from weights ~1e9 where they were 0.1 (issue 57).
    "safetensors-i32-header": (
        ["--model_name_or_path", "base-i32-header"],
        ["base-i32-header/model.safetensors stores", "(I32)", "as an integer type", "copy or save it again"],
    ),
    "deep-jsonl": (
        ["--train_file", "deep.jsonl"], ["deep.jsonl, line 9: JSON nested too deeply", "one JSON object"],
    ),
    "both-formats": (
        ["--train_file", "both.jsonl"],
        [
            'both.jsonl, line 2: the record has both "messages" and "prompt"/"response"',
            "keep one of the two formats",
        ],
    ),
    "empty-reply": (
        ["--train_file", "empty_reply.jsonl"],
        ['empty_reply.jsonl, line 1: message 1 (assistant) has an empty "content"', "write the reply"],
    ),
    "bad-utf8-past-64-kib": (
        ["--train_file", "late.txt"], ["late.txt, line 2001", "is not UTF-8", "save the file"],
    ),
    # Before: taken for a Hub id, four tracebacks from the lookup (issue 57).
    "link-loop": (["--model_name_or_path", "loop"], ["--model_name_or_path 'loop' is a loop of links"]),
    # Before: "unexpected ... report it" once torch had loaded, with .lock and checkpoints/ left (issue 69).
    "negative-learning-rate": (
        ["--learning_rate", "-1"], ["--learning_rate must be a small positive number such as 1e-4, got -1.0"],
    ),
    "no-batch": (
        ["--per_device_train_batch_size", "0"], ["--per_device_train_batch_size must be at least 1"],
    ),
    # Embedding rows trained beside an adapter: without --use_peft every weight trains anyway.
    "trainable-tokens-without-peft": (
        ["--lora_trainable_tokens", "0123456789"], ["--lora_trainable_tokens", "add --use_peft"],
    ),
    "empty-trainable-tokens": (
        ["--use_peft", "--lora_trainable_tokens", ""], ["--lora_trainable_tokens is empty"],
    ),
    # Before: an empty --train_file (an unset shell variable) was taken as no flag at all (issue 69).
    "empty-train-file": (["--train_file", ""], ["--train_file is empty", "leave the flag out"]),
    # Before: the merge replaced another model, the adapter beside it, or the user's config.json above it.
    # Refused even with --overwrite_output_dir, which replaces only a fine-tune's own files.
    **{
        f"merged into {name}{again}": ([*MERGE, merged, *flags], ["--merged_output_dir", words])
        for name, (merged, words) in MERGED_INTO.items()
        for again, flags in (("", []), (", overwrite", ["--overwrite_output_dir"]))
    },
}
# What `accelerate launch` with an FSDP or DeepSpeed config sets for the script (and Trainer) to read.
LAUNCHED_WITH = {"fsdp_launch": "ACCELERATE_USE_FSDP", "deepspeed_launch": "ACCELERATE_USE_DEEPSPEED"}


def damaged_base(root: Path, kind: str) -> Path:
    """A copy of bases/gated whose model.safetensors is damaged one way."""
    folder = root / f"base-{kind}"
    folder.mkdir()
    for path in (root / "bases" / "gated").iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if kind == "truncated":
        data = data[: len(data) // 2]
    elif kind == "header-garbage":
        data[8:40] = b"\x00\xff" * 16
    elif kind == "header-length":
        data[:8] = struct.pack("<Q", 1 << 40)
    elif kind == "flipped-json":
        at = data.index(b'"dtype"', 8)
        data[at + 1] ^= 0x01  # "dtype" -> "etype": valid JSON, no dtype
    weights.write_bytes(bytes(data))
    if kind in RELABELED:
        relabel_dtype(weights, "F32", RELABELED[kind])
    return folder


def write_data(root: Path) -> None:
    """The data files behind CASES."""
    record = '{"prompt": "Q:", "response": " A"}\n'
    write_jsonl(root / "train.jsonl", prompt_records(24))
    (root / "malformed.jsonl").write_text(record + "\n" + '{"prompt": "Q:", "response": "A"\n')
    (root / "second.jsonl").write_text(record + '{"prompt": "Q:"\n')
    write_jsonl(root / "missing.jsonl", [*prompt_records(1), {"question": "Q?", "answer": "A"}])
    (root / "latin1.txt").write_bytes("first document\ncaf\xe9 au lait\n".encode("latin-1"))
    (root / "latin1.jsonl").write_bytes(
        b'{"prompt": "Q:", "response": "A"}\n{"prompt": "caf\xe9", "response": "A"}\n'
    )
    (root / "packed.jsonl").write_bytes(gzip.compress(record.encode() * 8))  # gzip, misnamed
    write_jsonl(root / "surrogate.jsonl", [*prompt_records(2), {"prompt": "\ud800", "response": "A"}])
    write_jsonl(root / "deep.jsonl", prompt_records(8))
    with open(root / "deep.jsonl", "a") as f:
        f.write("[" * 100_000 + "\n")  # line 9
    write_jsonl(root / "both.jsonl", [prompt_records(1)[0], {**prompt_records(2)[1], **chat_records(1)[0]}])
    write_jsonl(root / "empty_reply.jsonl",
                [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]}])
    lines = "".join(f"document {i} is about the quick brown fox, café\n" for i in range(2000)).encode()
    assert len(lines) > 1 << 16
    (root / "late.txt").write_bytes(lines + "the end of café\n".encode("latin-1"))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The data, the base model and damaged copies, and the folders a destination must not be."""
    root = tmp_path_factory.mktemp("finetune_inputs")
    write_data(root)
    save_base(root / "bases" / "gated")
    build_tiny_model(seed=0).save_pretrained(root / "bases" / "no-tokenizer")
    build_byte_bpe_tokenizer().save_pretrained(root / "bases" / "no-config")
    for kind in {*dict(DAMAGED), *RELABELED}:
        damaged_base(root, kind)
    (root / "loop").symlink_to(root / "loop")
    (root / "linked").mkdir()
    (root / "secret.txt").write_text("not for the Hub")
    (root / "linked" / "notes.txt").symlink_to(root / "secret.txt")  # a link out of the output folder
    save_folders_beside_the_runs(root)
    return root


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_before_anything_is_written_or_uploaded(root, monkeypatch, capsys, case):
    flags, words = CASES[case]
    asked = []

    def connect(sock, address):  # no Hub request, nor any other
        asked.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.chdir(root)
    if case in LAUNCHED_WITH:
        monkeypatch.setenv(LAUNCHED_WITH[case], "true")
    before = snapshot(root)
    line = refused_in_process(capsys, monkeypatch, "finetune.py", preflight,
                              [*GOOD, "--output_dir", f"never-{case}", *flags])
    assert all(word in line for word in words), line
    assert snapshot(root) == before and not asked


def test_the_script_prints_the_line_before_torch_loads_and_writes_nothing(root, tmp_path):
    """Refused in about a second, not after ~8 s of imports: Python's import log
    (-X importtime) names no torch."""
    before = snapshot(root)
    command = [sys.executable, "-X", "importtime", str(REPO_ROOT / "training" / "finetune.py"), *GOOD,
               "--output_dir", "never", *CASES["second line"][0]]
    result = subprocess.run(command, cwd=root, env=pretrain_env(tmp_path), capture_output=True, text=True,
                            timeout=120)
    *imports, error = result.stderr.strip().splitlines()
    assert result.returncode == 2 and error.startswith("finetune.py: error: "), result.stderr[-3000:]
    assert all(word in error for word in CASES["second line"][1]), error
    imported = {line.split("|")[-1].strip() for line in imports}
    assert "json" in imported, "the import log was read"
    assert "torch" not in imported and "transformers.training_args" not in imported
    assert snapshot(root) == before
