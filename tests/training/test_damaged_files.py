"""Issue 40's unclear failures, reproduced from outside (a damaged file, a small tmpfs): now one line naming the file,
the problem and the fix, no traceback, and no debris that blocks the corrected rerun. The refusals run side by side."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tinytx.convert.__main__ import main as convert_main
from hf_tinytx.folders.safe import mib
from tests.helpers.faults import relabel_dtype
from tests.helpers.reference import error_line
from tests.helpers.tiny import (
    REPO_ROOT,
    TINY_PRETRAIN_ARGS,
    build_byte_bpe_tokenizer,
    build_tiny_model,
    pretrain_env,
    run_side_by_side,
)


pytestmark = pytest.mark.deep

FINETUNE = REPO_ROOT / "training" / "finetune.py"
PRETRAIN = REPO_ROOT / "training" / "pretrain.py"
QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--save_strategy", "no", "--use_cpu",
         "--disable_tqdm", "true"]
PROMPTS = [{"prompt": f"Q: add {i} and {i + 1}\nA:", "response": f" {2 * i + 1}"} for i in range(8)]


def write_jsonl(path: Path, lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def damaged_base(root: Path, kind: str) -> Path:
    """A copy of the base model folder whose model.safetensors is damaged one way."""
    folder = root / f"base-{kind}"
    folder.mkdir()
    for path in (root / "base").iterdir():
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


RELABELED = {"i32-header": "I32", "f16-header": "F16"}  # the header's dtype for F32 data: same size, half the size


# finetune refusals: name -> (flags besides the good ones, words the line must hold).
FINETUNE_CASES = {
    **{
        f"safetensors-{kind}": ([], [f"base-{kind}/model.safetensors is damaged or truncated", why,
                                     "copy or save it again"])
        for kind, why in [("truncated", "file not fully covered"), ("header-garbage", "invalid UTF-8 in header"),
                          ("header-length", "header too large"), ("flipped-json", "missing field `dtype`"),
                          ("f16-header", "invalid shape, data type, or offset")]
    },
    # Before: accepted, exit 0, a model trained from weights ~1e9 where they were 0.1 (issue 57).
    "safetensors-i32-header": ([], ["base-i32-header/model.safetensors stores", "(I32)", "as an integer type",
                                    "copy or save it again"]),
    "deep-jsonl": (["--train_file", "deep.jsonl"], ["deep.jsonl, line 9: JSON nested too deeply", "one JSON object"]),
    "both-formats": (["--train_file", "both.jsonl"], ['both.jsonl, line 2: the record has both "messages" and '
                                                      '"prompt"/"response"', "keep one of the two formats"]),
    "empty-reply": (["--train_file", "empty_reply.jsonl"],
                    ['empty_reply.jsonl, line 1: message 1 (assistant) has an empty "content"', "write the reply"]),
    "bad-utf8-past-64-kib": (["--train_file", "late.txt"], ["late.txt, line 2001", "is not UTF-8", "save the file"]),
    # Before: taken for a Hub id, four tracebacks from the lookup (issue 57).
    "link-loop": (["--model_name_or_path", "loop"], ["--model_name_or_path 'loop' is a loop of links"]),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clear_messages")
    build_tiny_model(vocab_size=320).save_pretrained(root / "base")
    build_byte_bpe_tokenizer().save_pretrained(root / "base")
    write_jsonl(root / "train.jsonl", PROMPTS)
    write_jsonl(root / "deep.jsonl", [*PROMPTS, "[" * 100_000])
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    write_jsonl(root / "both.jsonl", [PROMPTS[0], {**PROMPTS[1], **chat}])
    write_jsonl(root / "empty_reply.jsonl",
                [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]}])
    lines = "".join(f"document {i} is about the quick brown fox, café\n" for i in range(2000)).encode()
    assert len(lines) > 1 << 16
    (root / "late.txt").write_bytes(lines + "the end of café\n".encode("latin-1"))
    (root / "loop").symlink_to(root / "loop")
    for kind in ("truncated", "header-garbage", "header-length", "flipped-json", *RELABELED):
        damaged_base(root, kind)
    return root


@pytest.fixture(scope="module")
def refusals(root) -> dict:
    runs = {}
    for name, (flags, _) in FINETUNE_CASES.items():
        base = f"base-{name.removeprefix('safetensors-')}" if name.startswith("safetensors-") else "base"
        command = [sys.executable, str(FINETUNE), "--model_name_or_path", base, "--train_file", "train.jsonl", *QUICK,
                   "--output_dir", f"out-{name}", *flags]
        runs[name] = command, root, pretrain_env(root)
    return run_side_by_side(runs)


def run(command, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=tmp_path, env=pretrain_env(tmp_path), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("name", FINETUNE_CASES)
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(root, refusals, name):
    error_line(refusals[name], "finetune", *FINETUNE_CASES[name][1])
    assert refusals[name].returncode == 2
    assert not (root / f"out-{name}").exists()


def test_a_full_token_store_names_the_store_and_the_rerun_elsewhere_trains(root, tmp_path, mounted):
    """Before (issue 40): "No space left on the device while writing the output folder", a folder never made."""
    write_jsonl(tmp_path / "big.jsonl", [{"text": f"document {i} is about the quick brown fox and the lazy dog, "
                                                  f"number {i * 7}"} for i in range(30_000)])  # 1.5 MB of tokens
    flags = TINY_PRETRAIN_ARGS[:]  # every document of the file
    at = flags.index("--num_train_documents")
    del flags[at : at + 2]
    command = [sys.executable, str(PRETRAIN), *flags, "--max_train_steps", "2", "--train_file", "big.jsonl",
               "--output_dir", "out"]
    with mounted(tmp_path / "store", "256k") as store:
        full = run([*command, "--token_store", str(store)], tmp_path)
        line = error_line(full, "pretrain")
        assert full.returncode == 1
        assert f"while writing the token store {store} (" in line and "--token_store" in line, line
        assert not [path for path in store.iterdir() if path.name.startswith(".tmp-")], line  # the partial shard
    assert not (tmp_path / "out").exists()
    rerun = run([*command, "--token_store", str(tmp_path / "roomy")], tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]


def test_a_full_disk_in_the_merged_save_names_the_merged_folder_and_removes_it(root, tmp_path, mounted):
    """Before: the line named OUT/.tinytx-staging, said "about 0.0 MiB needed", and left an empty merged/ behind."""
    command = [sys.executable, str(FINETUNE), "--model_name_or_path", str(root / "base"), "--train_file",
               str(root / "train.jsonl"), *QUICK, "--use_peft", "--merge", "--output_dir", str(tmp_path / "out")]
    with mounted(tmp_path / "disk", "100k") as disk:
        merged = disk / "a" / "merged"
        full = run([*command, "--merged_output_dir", str(merged)], tmp_path)
        line = error_line(full, "finetune")
        assert full.returncode == 1
        assert f"while saving {merged} (about " in line and ".tinytx-staging" not in line, line
        assert " 0.0 MiB" not in line and "--overwrite_output_dir" in line, line
        assert list(disk.iterdir()) == [], "the folders the failed save created were left behind"
    assert (tmp_path / "out" / "adapter_config.json").is_file()  # the adapter, saved before the merge, stays
    rerun = run([*command, "--merged_output_dir", str(tmp_path / "merged"), "--overwrite_output_dir"], tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (tmp_path / "merged" / "config.json").is_file()


@pytest.mark.parametrize("to, name", [("llama", "model"), ("gguf", "model.gguf")])
def test_convert_and_gguf_on_a_full_disk_remove_the_folders_they_created(root, tmp_path, mounted, capsys, to, name):
    with mounted(tmp_path / "disk", "64k") as disk:
        assert convert_main(["--to", to, str(root / "base"), str(disk / "x" / "y" / name)]) == 1
        err = capsys.readouterr().err
        message = err.strip().splitlines()[-1]  # above it, only the progress bar of loading the weights
        assert "Traceback" not in err and message.startswith(f"error: {'gguf' if to == 'gguf' else 'convert'}: ")
        assert "the disk is full while writing" in message, message
        assert list(disk.iterdir()) == [], "the parent folders the command created were left behind"
        assert " 0.0 MiB" not in message, message


def test_sizes_below_a_tenth_of_a_mib_are_never_zero():
    assert mib(0) == mib(40_000) == "less than 0.1 MiB"
    assert mib(3 * 2**20) == "3.0 MiB"
