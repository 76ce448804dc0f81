"""Interrupted pretrain and finetune runs, every fault from outside (tests/helpers/faults.py): a kill during
the export or the first step, a full disk, a second run on one folder, a silent Hub, a mount point, a
finetune killed while it replaces or publishes a model. A user's file in the output folder survives, and
`--resume_from_checkpoint latest` ends with exactly the weights of the run never interrupted (the
reference, trained once per command)."""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.helpers.faults import KILL_MARK, KILLED, silent_hub_env, silent_server
from tests.helpers.reference import STEP, describe, error_line, succeeded
from tests.helpers.tiny import assert_same_weights, pretrain_env


deep = pytest.mark.deep
deep = pytest.mark.deep
NOTES = "My own notes, kept in the output folder: no training run may touch them.\n"
STAGING = ".tinytx-staging"  # the export's hidden folder inside the output folder
MOVES = ("os.replace", "os.rename")  # either may move a staged file into place; they share one call count


def with_notes(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "my_notes.txt").write_text(NOTES)
    return path


def assert_notes_kept(output_dir: Path):
    assert (output_dir / "my_notes.txt").read_text() == NOTES, os.listdir(output_dir)



def tmpfs_bytes(folder: Path) -> int:
    """What the files under `folder` take on a tmpfs: whole 4 KiB pages each."""
    return sum(-(-path.stat().st_size // 4096) * 4096 for path in folder.rglob("*") if path.is_file())




@deep
@pytest.mark.parametrize(
    "name, function, nth", [("pretrain", "os.mkdir", 1), ("finetune", MOVES, 2)],
    ids=["pretrain-staging-created", "finetune-second-file-moved"],
)
def test_a_kill_during_the_export_keeps_user_files_and_the_resume_ends_bit_for_bit(
    request, tmp_path, name, function, nth
):
    """Killed once the staging folder exists, or after two files moved in: the resume finishes the export.
    One moment per command: both publish through hf_tinytx/folders/safe.py's `publish`."""
    command = request.getfixturevalue(f"reference_{name}")
    out = with_notes(tmp_path / "run")
    killed = command.at_call(out, *command.every(), function=function, match=STAGING, nth=nth)
    assert (
        killed.returncode == KILLED and KILL_MARK in killed.stderr
    ), f"not killed in the export (no call of {function} with {STAGING} in its arguments)\n" + describe(
        killed
    )
    assert_notes_kept(out)
    assert command.checkpoint(out, command.steps).is_dir(), sorted(os.listdir(out / "checkpoints"))

    succeeded(command.run(out, *command.every(), "--resume_from_checkpoint", "latest"))
    assert_same_weights(command.reference, out)
    assert_notes_kept(out)
    assert not [name for name in os.listdir(out) if name.startswith(STAGING)], "staging folder left behind"


@deep
def test_a_run_killed_in_its_first_step_leaves_no_stuck_lock(command, tmp_path):
    out = with_notes(tmp_path / "run")
    killed = command.at_call(out, function=STEP, nth=1, when="before")
    assert killed.returncode == KILLED, describe(killed)
    succeeded(command.run(out, "--resume_from_checkpoint", "latest"))
    assert_same_weights(command.reference, out)
    assert_notes_kept(out)


# ---------------------------------------------------------------- disk, folder, Hub


@deep
def test_a_full_disk_is_one_line_naming_the_intact_checkpoint_and_the_resume_ends_bit_for_bit(
    command, tmp_path, mounted
):
    """A tmpfs with room for two and a half checkpoints (and the rest of the run): the third cannot fit."""
    reference_checkpoint = command.checkpoint(command.reference, command.steps)
    room = tmpfs_bytes(reference_checkpoint) * 5 // 2 + 16 * 4096
    if command.name == "pretrain":
        room += tmpfs_bytes(command.reference / "checkpoints" / "tokenizer")
    with mounted(tmp_path / "small", f"{room // 1024}k") as out:
        with_notes(out)
        result = command.run(out, *command.every())
        assert result.returncode not in (
            0, KILLED,
        ), f"the run did not fail on a full disk\n{describe(result)}"
        line = error_line(result, command.name, "No space left on the device while writing", str(out))
        saved = sorted(int(m[1]) for m in map(re.compile(r"(?:step_|checkpoint-)(\d+)$").match,
                                               os.listdir(out / "checkpoints")) if m)
        assert saved and saved[-1] < command.steps, os.listdir(out / "checkpoints")
        assert f"checkpoint {command.checkpoint(out, saved[-1]).name} is intact" in line.replace(
            str(out / "checkpoints") + os.sep, ""), line
        weights = load_file(command.checkpoint(out, saved[-1]) / "model.safetensors")
        assert weights and all(torch.isfinite(tensor).all() for tensor in weights.values())
        assert not [
            name for name in os.listdir(out / "checkpoints") if name.startswith(".tmp")
        ], "partial left"
        assert_notes_kept(out)
        shutil.copytree(out, tmp_path / "moved", symlinks=True)
    succeeded(command.run(tmp_path / "moved", *command.every(), "--resume_from_checkpoint", "latest"))
    assert_same_weights(command.reference, tmp_path / "moved")
    assert_notes_kept(tmp_path / "moved")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "moved").config.model_type == "tinytx"


def wait_for_line(logs: list[Path], processes, pattern: str, timeout: float = 120) -> int:
    """The index of the first process whose log shows `pattern`; fails if none does
    before all exit or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for index, log in enumerate(logs):
            if re.search(pattern, log.read_text(errors="replace"), re.MULTILINE):
                return index
        if all(process.poll() is not None for process in processes):
            break
        time.sleep(0.05)
    pytest.fail(f"no run printed {pattern!r}:\n" + "\n".join(log.read_text()[-2000:] for log in logs))


@deep
def test_a_second_run_on_one_folder_is_refused_while_the_first_trains_and_after_it_finished(
    command, tmp_path
):
    """The run holding the lock (held still) trains, the other is refused; an
    overwrite keeps the user's files."""
    out = with_notes(tmp_path / "run")
    logs, processes = [tmp_path / "a.log", tmp_path / "b.log"], []
    env = {**pretrain_env(command.cwd), "PYTHONUNBUFFERED": "1"}
    try:
        for log in logs:
            with open(log, "w") as f:
                # Each in its own session: a stopped process in an orphaned process group (pytest started
                # in the background) is sent SIGHUP by the kernel when another member of the group exits.
                processes.append(subprocess.Popen(command.command(out), env=env, cwd=command.cwd, stdout=f,
                                                  stderr=f, start_new_session=True))
        winner = wait_for_line(logs, processes, r"^Training for|'loss'")
        processes[winner].send_signal(signal.SIGSTOP)
        loser = processes[1 - winner]
        try:
            loser.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the second run waited for the first one instead of being refused")
        processes[winner].send_signal(signal.SIGCONT)
        processes[winner].wait(timeout=180)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
    refused = logs[1 - winner].read_text()
    assert loser.returncode == 2 and "Traceback" not in refused, refused[-3000:]
    assert f"is in use by another training run (process {processes[winner].pid})" in refused, refused[-3000:]
    assert processes[winner].returncode == 0, logs[winner].read_text()[-5000:]
    assert_same_weights(command.reference, out)

    saved = (out / "model.safetensors").read_bytes()
    again = command.run(out)
    error_line(again, command.name, "already holds an earlier run", "--resume_from_checkpoint latest",
               "--overwrite_output_dir")
    assert again.returncode == 2 and (out / "model.safetensors").read_bytes() == saved

    stale = command.checkpoint(out, command.steps) / "stale.txt"
    stale.write_text("the earlier run's")
    succeeded(command.run(out, "--overwrite_output_dir", "--learning_rate", "1e-3"))
    assert (out / "model.safetensors").read_bytes() != saved and not stale.exists()
    assert_notes_kept(out)


@deep
def test_a_silent_hub_ends_the_push_in_bounded_time_with_the_model_kept_locally(command, tmp_path):
    from tests.training.publish.test_hub import assert_token_nowhere

    out = with_notes(tmp_path / "run")
    with silent_server() as server:
        env = silent_hub_env(server, command.cwd)
        token = env["HF_TOKEN"]
        start = time.monotonic()
        try:
            result = command.run(out, *command.every(), "--push_to_hub", "--hub_model_id", "me/tiny",
                                 "--hub_timeout", 5, env=env, timeout=150)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command.name}.py still waited on a silent Hub after 150 s")
        elapsed, connections = time.monotonic() - start, server.connections

    # asked, not done: no success
    assert result.returncode == 1 and "Traceback" not in result.stderr, describe(result)
    assert connections >= 1, "the run never reached the (silent) Hub: HF_ENDPOINT was not used"
    assert elapsed < 120, f"{elapsed:.0f} s on a Hub that never answers"
    assert "did not finish within 5 s" in result.stdout + result.stderr, describe(result)
    assert "was NOT pushed" in result.stderr, describe(result)
    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "tinytx"  # complete on disk
    assert_notes_kept(out)
    assert_token_nowhere(token, [tmp_path], [result.stdout, result.stderr])



@deep
def test_pretrain_into_a_mount_point(pretrain, tmp_path, mounted):
    with mounted(tmp_path / "mnt", "64m") as out:
        with_notes(out)
        succeeded(pretrain.run(out))
        assert os.path.ismount(out) and (out / "config.json").is_file()
        assert_same_weights(pretrain.reference, out)
        assert_notes_kept(out)


# 80 documents make 144-191 blocks of 64 tokens: three batches of 48 an epoch, so the 6 steps run two epochs.


@deep
def test_finetune_rerun_plainly_after_a_kill_before_its_first_checkpoint_starts_afresh(finetune, tmp_path):
    """Only the start's empty .tmp_checkpoint: the same command is a new run, not
    "already holds an earlier run"."""
    out = with_notes(tmp_path / "run")
    killed = finetune.at_call(out, function=STEP, nth=1, when="before")
    assert killed.returncode == KILLED, describe(killed)
    assert (out / "checkpoints" / ".tmp_checkpoint").is_dir()
    succeeded(finetune.run(out))
    assert_same_weights(finetune.reference, out)
    assert_notes_kept(out)


@deep
def test_finetune_killed_while_replacing_a_model_leaves_one_that_loads(finetune, tmp_path):
    """A second fine-tune (--overwrite_output_dir) killed as it writes its weights, then after two moves."""
    out = tmp_path / "run"
    shutil.copytree(finetune.reference, out)
    again = ["--learning_rate", "1e-3", "--overwrite_output_dir"]  # weights that differ from the first's

    def files():
        return {
            path.name: path.read_bytes() for path in out.iterdir() if path.is_file() and path.name != ".lock"
        }

    saved = files()
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(saved)
    killed = finetune.at_call(out, *again, function="safetensors.torch.save_file", match=STAGING, nth=1)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    assert files() == saved, "the killed save changed the folder's model"

    killed = finetune.at_call(out, *again, function=MOVES, match=STAGING, nth=2)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    assert files()["config.json"] == saved["config.json"], "the config is moved in last"
    assert files()["model.safetensors"] != saved["model.safetensors"], "the weights are moved in first"
    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "tinytx"

    succeeded(finetune.run(out, *again))
    assert files()["model.safetensors"] != saved["model.safetensors"]
    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "tinytx"
    assert not (out / STAGING).exists(), "staging folder left behind"


@deep
def test_finetune_overwrite_removes_what_the_earlier_run_wrote_and_this_one_does_not(finetune, tmp_path):
    """LoRA with --merge, then a full fine-tune over it: PEFT would load the old
    adapter beside the new model."""
    out = with_notes(tmp_path / "run")
    succeeded(finetune.run(out, "--max_steps", 2, "--use_peft", "--merge"))
    assert (out / "adapter_config.json").is_file() and (out / "merged" / "model.safetensors").is_file()

    succeeded(finetune.run(out, "--max_steps", 2, "--overwrite_output_dir"))
    assert not list(out.glob("adapter_*")) and not (out / "merged").exists()
    assert_notes_kept(out)
    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "TinyTxForCausalLM"

    succeeded(finetune.run(out, "--max_steps", 2, "--use_peft", "--overwrite_output_dir"))
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()


@deep
@pytest.mark.parametrize(
    "merged, rerun", [("default", "--resume_from_checkpoint"), ("own", "--overwrite_output_dir")],
    ids=["merged-resumed", "merged_output_dir-overwritten"],
)
def test_finetune_killed_while_publishing_the_merged_model_is_never_stuck(finetune, tmp_path, merged, rerun):
    """Once every rerun was refused ("holds a model that tinytx finetune did not write")."""
    out = with_notes(tmp_path / "run")
    merged_dir = out / "merged" if merged == "default" else tmp_path / "elsewhere"
    flags = ["--max_steps", 2, "--save_steps", 2, "--use_peft", "--merge"]
    if merged == "own":
        flags += ["--merged_output_dir", merged_dir]
    killed = finetune.at_call(out, *flags, function=MOVES, match=f"{merged_dir.name}/{STAGING}", nth=1)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    assert (merged_dir / "model.safetensors").is_file() and not (merged_dir / "config.json").exists()

    again = finetune.run(
        out, *flags, *([rerun, "latest"] if rerun == "--resume_from_checkpoint" else [rerun])
    )
    succeeded(again)
    assert type(AutoModelForCausalLM.from_pretrained(merged_dir)).__name__ == "TinyTxForCausalLM"
    assert not (merged_dir / STAGING).exists(), "staging folder left behind"
    assert_notes_kept(out)
