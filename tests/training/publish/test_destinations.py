"""Every path a command writes is a destination, checked as --output_dir is, and no write follows a link: each
refused case runs the real script and finds one line, exit status 2, and every file it named (or a link led
to) unchanged. The --merged_output_dir refusals, decided before torch loads, are in finetune's table
(sft/test_finetune_args.py), interpret's --out in its own (tests/hf_tinytx/interpret/test_interpret.py)."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.refusals import snapshot
from tests.helpers.tiny import REPO_ROOT, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env
from tests.training.sft.test_finetune import (
    prompt_records,
    save_base,
    save_folders_beside_the_runs,
    write_jsonl,
)


pytestmark = pytest.mark.deep


FINETUNE = REPO_ROOT / "training" / "finetune.py"
QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--use_cpu", "--disable_tqdm", "true",
         "--save_strategy", "no", "--report_to", "none"]
LORA = ["--model_name_or_path", "base", "--train_file", "train.jsonl", "--use_peft", "--merge", *QUICK]


def run(root: Path, *argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, argv)], cwd=root, env=env or pretrain_env(root),
                          capture_output=True, text=True, timeout=300)


def one_line(result, prefix: str) -> str:
    describe = (
        f"returncode {result.returncode}\nSTDOUT:\n{result.stdout[-2000:]}\nSTDERR:\n{result.stderr[-3000:]}"
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, describe
    lines = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, describe
    return lines[0]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A base model, another user's model, another run's folder, the data, and a
    user's folder with a config.json."""
    root = tmp_path_factory.mktemp("destinations")
    save_base(root / "base")
    save_folders_beside_the_runs(root)
    write_jsonl(root / "train.jsonl", prompt_records(16))
    return root


def test_a_merged_output_dir_apart_from_the_output_folder_is_written_and_replaced_by_the_next_run(
    root, tmp_path
):
    """The rules refuse only what would lose files."""
    output_dir, merged = tmp_path / "run", tmp_path / "merged"
    for again in ([], ["--overwrite_output_dir"]):
        result = run(root, FINETUNE, *LORA, "--output_dir", output_dir, "--merged_output_dir", merged, *again)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (output_dir / "adapter_config.json").is_file() and (merged / "model.safetensors").is_file()
        assert not (output_dir / "merged").exists()


# ---- no write follows a link: a link planted at each name a command writes, the victim unchanged ----

VICTIM = "a user's file: no command may write it\n"


def plant(folder: Path, names, target: Path) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(target, target_is_directory=target.is_dir())


def victims(folder: Path) -> tuple[Path, Path]:
    """A user's file and folder inside `folder` (links to them pass the links-out
    check, so the writes meet them)."""
    (folder / "mine").mkdir(parents=True)
    (folder / "mine" / "kept.txt").write_text(VICTIM)
    (folder / "notes.txt").write_text(VICTIM)
    return folder / "notes.txt", folder / "mine"


def assert_untouched(notes: Path, mine: Path, names, folder: Path) -> None:
    assert notes.read_text() == VICTIM and snapshot(mine) == {
        "kept.txt": hashlib.sha256(VICTIM.encode()).hexdigest()
    }
    assert not [name for name in names if (folder / name).is_symlink()], "a planted link is still there"


PRETRAIN = REPO_ROOT / "training" / "pretrain.py"
TINY = [
    "--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "1",
    "--num_attention_heads", "2", "--num_train_documents", "60", "--vocab_size", "300", "--block_size", "32",
    "--per_device_train_batch_size", "4", "--max_train_steps", "2", "--max_eval_batches", "1",
    "--num_probes_per_kind", "1", "--num_samples", "0", "--max_train_seconds", "0", "--report_to", "none",
]


def test_pretrain_replaces_links_at_its_lock_log_and_staging_names_and_refuses_one_out_of_the_folder(
    root, tmp_path
):
    """Before: the PID went into the file `.lock` led to; new checkpoints into
    the folder `checkpoints` led to."""
    out = tmp_path / "out"
    notes, mine = victims(out)
    files, folders = [".lock", "metrics.jsonl", "metrics.jsonl.tmp"], [".tinytx-staging", "checkpoints"]
    plant(out, files, notes)
    plant(out, folders, mine)
    result = run(root, PRETRAIN, *TINY, "--output_dir", out, "--overwrite_output_dir")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_untouched(notes, mine, files + folders, out)
    assert (out / "model.safetensors").is_file() and (out / "checkpoints" / "step_2").is_dir()

    (tmp_path / "victim.txt").write_text(VICTIM)
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / ".lock").symlink_to(tmp_path / "victim.txt")
    line = one_line(run(root, PRETRAIN, *TINY, "--output_dir", tmp_path / "fresh"), "pretrain.py: error: ")
    assert "fresh/.lock is a link to" in line and "outside" in line, line
    assert (tmp_path / "victim.txt").read_text() == VICTIM


def test_finetune_replaces_links_at_every_name_it_writes(root, tmp_path):
    """Each name a link to a user's file or folder inside the destination, in the merged folder too."""
    out = tmp_path / "out"
    notes, mine = victims(out)
    merged_notes, merged_mine = victims(out / "merged")
    files = [".lock", ".tinytx-written.json.new"]
    folders = [".tinytx-staging", "checkpoints/.tmp_checkpoint"]
    plant(out, files, notes)
    plant(out, folders, mine)
    plant(out / "merged", files[1:], merged_notes)
    plant(out / "merged", folders[:1], merged_mine)
    flags = [arg for arg in LORA if arg not in ("--save_strategy", "no")]
    result = run(
        root, FINETUNE, *flags, "--output_dir", out, "--save_steps", 1, "--resume_from_checkpoint", "latest"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_untouched(notes, mine, files + folders, out)
    assert_untouched(merged_notes, merged_mine, files[1:] + folders[:1], out / "merged")
    assert (out / "checkpoints" / "checkpoint-2").is_dir() and (
        out / "merged" / "model.safetensors"
    ).is_file()


def test_convert_gguf_and_interpret_replace_links_at_their_staging_record_and_output_names(root, tmp_path):
    """Before: convert and GGUF wrote through links at their record and staging
    names. The victims lie outside."""
    victim, victim_dir = tmp_path / "victim.txt", tmp_path / "victim_dir"
    victim.write_text(VICTIM)
    victim_dir.mkdir()
    (victim_dir / "kept.txt").write_text(VICTIM)
    plant(tmp_path / "llama", [".tinytx-written.json.new"], victim)
    plant(tmp_path / "llama", [".tinytx-staging"], victim_dir)
    plant(tmp_path, [".m.gguf.tinytx-staging"], victim)
    plant(tmp_path / "maps", ["layer0_head0.png", "heads.json"], victim)
    commands = {
        "convert": ["-m", "hf_tinytx.convert", "--to", "llama", "base", tmp_path / "llama", "--overwrite"],
        "gguf": ["-m", "hf_tinytx.convert", "--to", "gguf", "base", tmp_path / "m.gguf"],
        "interpret": ["-m", "hf_tinytx.interpret", "base", "the cat sat", "--out", tmp_path / "maps"],
    }
    for name, argv in commands.items():
        result = run(root, *argv)
        assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
    assert victim.read_text() == VICTIM and (victim_dir / "kept.txt").read_text() == VICTIM
    assert not (tmp_path / "m.gguf").is_symlink() and (tmp_path / "m.gguf").read_bytes()[:4] == b"GGUF"
    assert (tmp_path / "llama" / "config.json").is_file() and (
        tmp_path / "maps" / "layer0_head0.png"
    ).is_file()
    for path in [tmp_path / "llama" / ".tinytx-written.json.new", tmp_path / "maps" / "heads.json"]:
        assert not path.is_symlink()


def test_a_tokenizer_larger_than_the_model_is_one_line_and_leaves_no_debris(root, tmp_path):
    """Before: a traceback mid-training, and a .tmp_checkpoint that made the rerun
    "already holds an earlier run"."""
    small = tmp_path / "small"
    build_tiny_model(seed=0, vocab_size=200).save_pretrained(small)
    build_byte_bpe_tokenizer(vocab_size=320).save_pretrained(small)
    line = one_line(
        run(root, FINETUNE, *LORA[2:], "--model_name_or_path", small, "--output_dir", tmp_path / "out"),
        "finetune.py: error: ",
    )
    assert "tokens but the model's embedding only 200 rows" in line, line
    assert not (tmp_path / "out").exists()
