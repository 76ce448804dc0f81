"""Every path a command writes is a destination, checked as --output_dir is, and no write follows a link.

From outside, as a user would: each refused case runs the real script in a subprocess and finds one line, an exit
status of 2, and every file of the folders it named (and of a victim a link points at) unchanged."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tiny import REPO_ROOT, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env
from tests.test_finetune import prompt_records, write_jsonl


FINETUNE = REPO_ROOT / "training" / "finetune.py"
QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--use_cpu", "--disable_tqdm", "true",
         "--save_strategy", "no", "--report_to", "none"]
LORA = ["--model_name_or_path", "base", "--train_file", "train.jsonl", "--use_peft", "--merge", *QUICK]


def snapshot(folder: Path) -> dict:
    """Every file under `folder` (links as links): name -> hash of its bytes, or the link's target."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(folder))] = f"-> {path.readlink()}"
        elif path.is_file():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def run(root: Path, *argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, argv)], cwd=root, env=env or pretrain_env(root),
                          capture_output=True, text=True, timeout=300)


def one_line(result, prefix: str) -> str:
    describe = f"returncode {result.returncode}\nSTDOUT:\n{result.stdout[-2000:]}\nSTDERR:\n{result.stderr[-3000:]}"
    assert result.returncode == 2 and "Traceback" not in result.stderr, describe
    lines = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, describe
    return lines[0]


def save_model(folder: Path) -> Path:
    tokenizer = build_byte_bpe_tokenizer()
    build_tiny_model(seed=0, vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A base model, another user's model, another run's folder, the data, and a user's folder with a config.json."""
    root = tmp_path_factory.mktemp("destinations")
    save_model(root / "base")
    save_model(root / "other")
    save_model(root / "pretrained")
    (root / "pretrained" / "checkpoints" / "step_2").mkdir(parents=True)
    (root / "pretrained" / "metrics.jsonl").write_text('{"step": 2}\n')
    (root / "mine").mkdir()
    (root / "mine" / "config.json").write_text('{"my": "settings"}\n')  # the user's, beside the runs' folders
    (root / "a_file").write_text("not a folder\n")
    write_jsonl(root / "train.jsonl", prompt_records(16))
    return root


# --merged_output_dir VALUE (with --output_dir mine/run) -> words of the one-line refusal
MERGED_REFUSALS = {
    "the base model": ("base", "is the same folder as --model_name_or_path"),
    "the output folder": ("mine/run", "is the same folder as --output_dir"),
    "above the output folder": ("mine", "holds --output_dir"),
    "inside the output folder": ("mine/run/sub", "is inside --output_dir"),
    "another model's folder": ("other", "holds a model that tinytx finetune did not write (config.json"),
    "another run's folder": ("pretrained", "holds a training run (checkpoints, metrics.jsonl)"),
    "a file": ("a_file", "is a file"),
}


@pytest.mark.parametrize("overwrite", [[], ["--overwrite_output_dir"]], ids=["", "overwrite"])
@pytest.mark.parametrize("case", list(MERGED_REFUSALS))
def test_a_merged_output_dir_that_would_lose_files_is_refused_before_anything_is_written(root, case, overwrite):
    """Before: the merge replaced another model (exit 0), deleted the adapter saved into the same folder a moment
    earlier, or overwrote the user's config.json above the output folder."""
    merged, words = MERGED_REFUSALS[case]
    before = snapshot(root)
    line = one_line(run(root, FINETUNE, *LORA, "--output_dir", "mine/run", "--merged_output_dir", merged, *overwrite),
                    "finetune.py: error: ")
    assert "--merged_output_dir" in line and words in line, line
    assert snapshot(root) == before and not (root / "mine" / "run").exists()


def test_a_merged_output_dir_apart_from_the_output_folder_is_written_and_replaced_by_the_next_run(root, tmp_path):
    """The rules refuse only what would lose files: a folder of its own is written, and a later run with
    --overwrite_output_dir replaces the merge it recorded there."""
    output_dir, merged = tmp_path / "run", tmp_path / "merged"
    for again in ([], ["--overwrite_output_dir"]):
        result = run(root, FINETUNE, *LORA, "--output_dir", output_dir, "--merged_output_dir", merged, *again)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (output_dir / "adapter_config.json").is_file() and (merged / "model.safetensors").is_file()
        assert not (output_dir / "merged").exists()


def test_interpret_never_writes_its_maps_into_the_model_folder(root):
    before = snapshot(root / "base")
    result = run(root, "-m", "hf_tinytx.interpret", "base", "the cat sat", "--out", "base/maps")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "error: interpret: --out 'base/maps' is inside MODEL 'base'" in result.stderr
    assert snapshot(root / "base") == before
