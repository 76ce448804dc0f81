"""Issue 40's unclear failures on a full disk, reproduced from outside with a small tmpfs: now one line
naming the file, the problem and the fix, no traceback, and no debris that blocks the corrected rerun. (Its
damaged files are cases of finetune's table of bad input, sft/test_finetune_args.py.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tinytx.convert.__main__ import main as convert_main
from hf_tinytx.folders.safe import mib
from tests.helpers.reference import error_line
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env, save_tiny_model_folder


pytestmark = pytest.mark.deep

FINETUNE = REPO_ROOT / "training" / "finetune.py"
PRETRAIN = REPO_ROOT / "training" / "pretrain.py"
QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--save_strategy", "no", "--use_cpu",
         "--disable_tqdm", "true"]
PROMPTS = [{"prompt": f"Q: add {i} and {i + 1}\nA:", "response": f" {2 * i + 1}"} for i in range(8)]


def write_jsonl(path: Path, lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clear_messages")
    save_tiny_model_folder(root / "base")
    write_jsonl(root / "train.jsonl", PROMPTS)
    return root


def run(command, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=tmp_path, env=pretrain_env(tmp_path), capture_output=True, text=True,
                          timeout=300)


def test_a_full_token_store_names_the_store_and_the_rerun_elsewhere_trains(root, tmp_path, mounted):
    """Before (issue 40): "No space left on the device while writing the output
    folder", a folder never made."""
    write_jsonl(
        tmp_path / "big.jsonl",
        [
            {
                "text": f"document {i} is about the quick brown fox and the lazy dog, "
                # 1.5 MB of tokens
                f"number {i * 7}"
            }
            for i in range(30_000)
        ],
    )
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
        # the partial shard
        assert not [path for path in store.iterdir() if path.name.startswith(".tmp-")], line
    assert not (tmp_path / "out").exists()
    rerun = run([*command, "--token_store", str(tmp_path / "roomy")], tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]


def test_a_full_disk_in_the_merged_save_names_the_merged_folder_and_removes_it(root, tmp_path, mounted):
    """Before: the line named OUT/.tinytx-staging, said "about 0.0 MiB needed", and
    left an empty merged/ behind."""
    command = [
        sys.executable, str(FINETUNE), "--model_name_or_path", str(root / "base"),
        "--train_file", str(root / "train.jsonl"), *QUICK, "--use_peft", "--merge",
        "--output_dir", str(tmp_path / "out"),
    ]
    with mounted(tmp_path / "disk", "100k") as disk:
        merged = disk / "a" / "merged"
        full = run([*command, "--merged_output_dir", str(merged)], tmp_path)
        line = error_line(full, "finetune")
        assert full.returncode == 1
        assert f"while saving {merged} (about " in line and ".tinytx-staging" not in line, line
        assert " 0.0 MiB" not in line and "--overwrite_output_dir" in line, line
        assert list(disk.iterdir()) == [], "the folders the failed save created were left behind"
    assert (tmp_path / "out" / "adapter_config.json").is_file()  # the adapter, saved before the merge, stays
    rerun = run(
        [*command, "--merged_output_dir", str(tmp_path / "merged"), "--overwrite_output_dir"], tmp_path
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (tmp_path / "merged" / "config.json").is_file()


@pytest.mark.parametrize("to, name", [("llama", "model"), ("gguf", "model.gguf")])
def test_convert_and_gguf_on_a_full_disk_remove_the_folders_they_created(
    root, tmp_path, mounted, capsys, to, name
):
    with mounted(tmp_path / "disk", "64k") as disk:
        assert convert_main(["--to", to, str(root / "base"), str(disk / "x" / "y" / name)]) == 1
        err = capsys.readouterr().err
        message = err.strip().splitlines()[-1]  # above it, only the progress bar of loading the weights
        assert "Traceback" not in err and message.startswith(
            f"python -m hf_tinytx.convert: error: {'gguf' if to == 'gguf' else 'convert'}: "
        )
        assert "the disk is full while writing" in message, message
        assert list(disk.iterdir()) == [], "the parent folders the command created were left behind"
        assert " 0.0 MiB" not in message, message


def test_sizes_below_a_tenth_of_a_mib_are_never_zero():
    assert mib(0) == mib(40_000) == "less than 0.1 MiB"
    assert mib(3 * 2**20) == "3.0 MiB"
