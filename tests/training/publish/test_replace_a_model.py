"""A model of 2 layers published over one of 3 (issue 40: convert --overwrite, pretrain and
finetune --overwrite_output_dir, GGUF), SIGKILLed from outside before and after each move out of
the staging folder: the folder loads as the old model or the new one, or refuses in one line, never
a mix; the command run again completes."""

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_tinytx.convert.__main__ import main as convert_main
from tests.helpers.faults import KILL_MARK, KILLED, run_killed_at
from tests.helpers.tiny import (
    REPO_ROOT,
    TINY_PRETRAIN_ARGS,
    build_tiny_model,
    pretrain_env,
    save_tiny_model_folder,
)


pytestmark = pytest.mark.deep


STAGING = ".tinytx-staging"
MOVES = ("os.replace", "os.rename")  # either may move a staged file into place; they share one call count
CONVERT_SCRIPT = "import sys\nfrom hf_tinytx.convert.__main__ import main\nsys.exit(main())\n"
NOTES = "my own notes\n"


def weights_of(folder: Path) -> dict | str:
    """The loaded model's state dict, or the one-line refusal `from_pretrained` gave."""
    try:
        model = AutoModelForCausalLM.from_pretrained(folder)
    except (OSError, ValueError) as error:
        assert "\n" not in str(error).strip(), f"a refusal of more than one line: {error}"
        return str(error)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def same(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def assert_old_new_or_refused(folder: Path, old: dict, new: dict, where: str) -> bool:
    """True when the folder refused to load; fails when it loads as anything but `old` or `new`."""
    loaded = weights_of(folder)
    if isinstance(loaded, str):
        return True
    assert same(loaded, old) or same(loaded, new), f"{where}: the folder loads as a mix of the two models"
    return False


def kill_copies(original: Path, tmp_path: Path, points, args, **how) -> list:
    """[(point, copy, run)]: `args` (DEST: the copy) on a copy of `original` for
    each kill point, two at a time."""
    def one(point):
        copy = tmp_path / f"kill-{point[0]}-{point[1]}"
        shutil.copytree(original, copy, symlinks=True)
        command = [str(copy) if arg == "DEST" else str(arg) for arg in args]
        return point, copy, run_killed_at(command, function=MOVES, match=STAGING, nth=point[1], when=point[0],
                                          timeout=300, **how)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, points))


def walk_kills(original: Path, tmp_path: Path, args, script) -> dict:
    """{kill point: (copy, run)}: killed before the first move and after each one, up to the first run that
    completes (the last entry)."""
    points = [("before", 1)] + [("after", nth) for nth in range(1, 100)]
    runs = {}
    for start in range(0, len(points), 2):
        for point, copy, result in kill_copies(
            original, tmp_path, points[start : start + 2], args, script=script, cwd=REPO_ROOT
        ):
            runs[point] = (copy, result)
        if any(result.returncode != KILLED for _, result in runs.values()):
            break
    finished = [point for point, (_, result) in runs.items() if result.returncode != KILLED]
    assert finished, "no run completed"
    first_unkilled = finished[0]
    copy, result = runs[first_unkilled]
    assert result.returncode == 0, result.stderr[-3000:]
    for point, (_, result) in runs.items():
        if point != first_unkilled and point[1] < first_unkilled[1]:
            assert (
                result.returncode == KILLED and KILL_MARK in result.stderr
            ), f"{point}: {result.stderr[-2000:]}"
    return {point: runs[point] for point in runs if point == first_unkilled or point[1] < first_unkilled[1]}


def assert_every_kill_point(runs: dict, old: dict, new: dict, notes: str | None = NOTES) -> list[Path]:
    """The killed copies, each the old or the new model or refused; at least one
    refused (its config taken out)."""
    killed, refused = [], 0
    for point, (copy, result) in runs.items():
        if result.returncode != KILLED:
            continue
        killed.append(copy)
        refused += assert_old_new_or_refused(copy, old, new, f"killed {point[0]} move {point[1]}")
        if notes is not None:
            assert (copy / "notes.txt").read_text() == notes, f"{point}: the user's file changed"
    assert len(killed) >= 3 and refused >= 1, f"{len(killed)} kills, {refused} refusals"
    return killed


def assert_complete(folder: Path, new: dict) -> None:
    loaded = weights_of(folder)
    assert isinstance(loaded, dict) and same(loaded, new), f"{folder} does not load as the new model"
    assert not (folder / STAGING).exists(), f"{folder}: staging folder left behind"


# ---------------------------------------------------------------- convert


def tiny_source(folder: Path, to: str, layers: int, seed: int) -> Path:
    """A TinyTx model to convert --to llama, a Llama one else."""
    model = build_tiny_model(seed=seed, num_hidden_layers=layers, vocab_size=320)
    if to == "tinytx":
        from hf_tinytx.convert import tinytx_to_llama

        model = tinytx_to_llama(model)
    return save_tiny_model_folder(folder, model)


def test_convert_overwrite_with_fewer_layers_killed_at_every_move(tmp_path):
    """--to tinytx only: both directions publish through one function, and a TinyTx folder, with its code
    files, has the more moves to be killed at."""
    to = "tinytx"
    old_source, new_source = tiny_source(tmp_path / "a", to, 3, 0), tiny_source(tmp_path / "b", to, 2, 1)
    original = tmp_path / "original"
    assert convert_main(["--to", to, str(old_source), str(original)]) == 0
    (original / "notes.txt").write_text(NOTES)
    assert convert_main(["--to", to, str(new_source), str(tmp_path / "reference")]) == 0
    old, new = weights_of(original), weights_of(tmp_path / "reference")
    script = tmp_path / "convert_cli.py"
    script.write_text(CONVERT_SCRIPT)

    args = ["--to", to, "--overwrite", str(new_source), "DEST"]
    runs = walk_kills(original, tmp_path, args, script)
    for copy in assert_every_kill_point(runs, old, new):
        assert convert_main([str(arg) if arg != "DEST" else str(copy) for arg in args]) == 0
        assert_complete(copy, new)
        assert (copy / "notes.txt").read_text() == NOTES
    final = next(copy for copy, result in runs.values() if result.returncode == 0)
    assert_complete(final, new)
    assert sorted(path.name for path in final.iterdir()) == sorted(
        [*(path.name for path in (tmp_path / "reference").iterdir()), "notes.txt"]
    )


def test_convert_names_an_interrupted_save_in_one_line(tmp_path, capsys):
    source = tiny_source(tmp_path / "a", "llama", 2, 0)
    assert convert_main(["--to", "llama", str(source), str(tmp_path / "out")]) == 0
    (tmp_path / "out" / STAGING / ".replaced").mkdir(parents=True)  # what a kill after the config left leaves
    (tmp_path / "out" / "config.json").rename(tmp_path / "out" / STAGING / ".replaced" / "config.json")
    capsys.readouterr()
    assert convert_main(["--to", "tinytx", str(tmp_path / "out"), str(tmp_path / "again")]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "killed before it finished" in error and "run the command" in error, error


# ---------------------------------------------------------------- GGUF: one file, one rename


def test_gguf_overwrite_with_fewer_layers_is_one_rename(tmp_path):
    pytest.importorskip("gguf")
    tiny_source(tmp_path / "a", "llama", 3, 0)
    tiny_source(tmp_path / "b", "llama", 2, 1)
    assert convert_main(["--to", "gguf", str(tmp_path / "a"), str(tmp_path / "old.gguf")]) == 0
    assert convert_main(["--to", "gguf", str(tmp_path / "b"), str(tmp_path / "new.gguf")]) == 0
    old, new = (tmp_path / "old.gguf").read_bytes(), (tmp_path / "new.gguf").read_bytes()
    assert old != new
    script = tmp_path / "convert_cli.py"
    script.write_text(CONVERT_SCRIPT)

    for when, expected in (("before", old), ("after", new)):
        folder = tmp_path / when
        folder.mkdir()
        (folder / "model.gguf").write_bytes(old)
        args = ["--to", "gguf", "--overwrite", str(tmp_path / "b"), str(folder / "model.gguf")]
        killed = run_killed_at(args, cwd=REPO_ROOT, script=script, function=MOVES, match=STAGING, when=when)
        assert killed.returncode == KILLED and KILL_MARK in killed.stderr, killed.stderr[-2000:]
        assert (folder / "model.gguf").read_bytes() == expected
    # No second rename of a staged file exists: a kill before it never comes, the run completes.
    args = ["--to", "gguf", "--overwrite", str(tmp_path / "b"), str(tmp_path / "before" / "model.gguf")]
    rerun = run_killed_at(args, cwd=REPO_ROOT, script=script, function=MOVES, match=STAGING, nth=2)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert (tmp_path / "before" / "model.gguf").read_bytes() == new
    assert sorted(path.name for path in (tmp_path / "before").iterdir()) == ["model.gguf"]


# ---------------------------------------------------------------- pretrain and
# finetune --overwrite_output_dir

PRETRAIN = REPO_ROOT / "training" / "pretrain.py"
FINETUNE = REPO_ROOT / "training" / "finetune.py"
SHORT_PRETRAIN = [
    *TINY_PRETRAIN_ARGS, "--num_train_documents", "100", "--block_size", "32", "--max_train_steps", "1",
    "--eval_steps", "100", "--max_eval_batches", "1", "--num_probes_per_kind", "0", "--num_samples", "0",
]


def run(script: Path, args, tmp_path: Path, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, str(script), *map(str, args)], cwd=cwd, env=pretrain_env(tmp_path),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def check_training_walk(tmp_path, script, first_args, again_args, cwd) -> None:
    """`again_args` over `first_args`' folder, killed before the first move and after the first two (convert
    walks every move; a training run a kill point costs ~12 s); the copy left with no config is run again."""
    original = tmp_path / "original"
    run(script, [*first_args, "--output_dir", original], tmp_path, cwd)
    (original / "notes.txt").write_text(NOTES)
    old = weights_of(original)

    kills = kill_copies(
        original, tmp_path, [("before", 1), ("after", 1), ("after", 2)],
        [*again_args, "--output_dir", "DEST"], env=pretrain_env(tmp_path), cwd=cwd, script=script,
    )
    refused = 0
    for point, copy, result in kills:
        assert result.returncode == KILLED and KILL_MARK in result.stderr, f"{point}: {result.stderr[-2000:]}"
        refused += assert_old_new_or_refused(copy, old, old, f"killed {point[0]} move {point[1]}")
        assert (copy / "notes.txt").read_text() == NOTES, f"{point}: the user's file changed"
    assert refused >= 1
    unconfigured = next(copy for _, copy, _ in kills if not (copy / "config.json").exists())
    run(script, [*again_args, "--output_dir", unconfigured], tmp_path, cwd)
    new = weights_of(unconfigured)
    assert isinstance(new, dict) and not same(new, old)
    assert_complete(unconfigured, new)
    assert (unconfigured / "notes.txt").read_text() == NOTES


def test_pretrain_overwrite_with_fewer_layers_killed_in_its_publish(tmp_path):
    first = [*SHORT_PRETRAIN, "--num_hidden_layers", "3"]
    again = [*SHORT_PRETRAIN, "--num_hidden_layers", "2", "--overwrite_output_dir"]
    check_training_walk(tmp_path, PRETRAIN, first, again, tmp_path)


def test_finetune_overwrite_with_fewer_layers_killed_in_its_publish(tmp_path):
    from tests.training.sft.test_finetune import QUICK, prompt_records, write_jsonl

    for name, layers in (("base3", 3), ("base2", 2)):
        tiny_source(tmp_path / name, "llama", layers, 0)
    write_jsonl(tmp_path / "train.jsonl", prompt_records(8))
    common = ["--train_file", "train.jsonl", *QUICK, "--max_steps", "2"]
    first = ["--model_name_or_path", "base3", *common]
    again = ["--model_name_or_path", "base2", *common, "--overwrite_output_dir"]
    check_training_walk(tmp_path, FINETUNE, first, again, tmp_path)
