"""Interrupted pretrain and finetune runs, every fault from outside (tests/helpers/faults.py): a user's
file in the output folder survives, the newest intact checkpoint loads, and `--resume_from_checkpoint
latest` ends with exactly the weights of the run never interrupted (the reference, trained once per
command). A stop signal during the final push, to a main process whose workers tokenize, or while it
exits, ends the run with 128 + the signal."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.helpers.faults import KILL_MARK, KILLED, run_signalled, silent_server
from tests.helpers.processes import alive, descendants
from tests.helpers.reference import Command, describe, error_line, succeeded
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, assert_same_weights, pretrain_env
from tests.training.sft.test_finetune import prompt_records, write_jsonl


deep = pytest.mark.deep
NOTES = "My own notes, kept in the output folder: no training run may touch them.\n"
STAGING = ".tinytx-staging"  # the export's hidden folder inside the output folder
MOVES = ("os.replace", "os.rename")  # either may move a staged file into place; they share one call count
# called once a step by both scripts: a signal after call N lands in step N
STEP = "accelerate.Accelerator.backward"


def with_notes(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "my_notes.txt").write_text(NOTES)
    return path


def assert_notes_kept(output_dir: Path):
    assert (output_dir / "my_notes.txt").read_text() == NOTES, os.listdir(output_dir)


def flip_last_bytes(path: Path):
    data = bytearray(path.read_bytes())
    data[-8:-4] = bytes(255 - b for b in data[-8:-4])
    path.write_bytes(bytes(data))


def tmpfs_bytes(folder: Path) -> int:
    """What the files under `folder` take on a tmpfs: whole 4 KiB pages each."""
    return sum(-(-path.stat().st_size // 4096) * 4096 for path in folder.rglob("*") if path.is_file())


def silent_hub_env(server, tmp_path) -> dict:
    env = {
        k: v for k, v in pretrain_env(tmp_path).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))
    }
    env.update(HF_ENDPOINT=server.url, HF_TOKEN="hf_silent" + os.urandom(16).hex(), HF_HUB_OFFLINE="0",
               TRANSFORMERS_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    return env


@pytest.fixture
def pretrain(reference_pretrain) -> Command:
    return reference_pretrain


@pytest.fixture
def finetune(reference_finetune) -> Command:
    return reference_finetune


@pytest.fixture(params=["pretrain", pytest.param("finetune", marks=deep)])
def command(request) -> Command:
    return request.getfixturevalue(f"reference_{request.param}")


# ---------------------------------------------------------------- stop signals


@deep
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_mid_run_saves_a_checkpoint_and_the_resume_ends_bit_for_bit(command, tmp_path, signum):
    """A scheduler's SIGTERM or a user's Ctrl-C: a checkpoint, no export, exit 128
    + signal, a line on resuming."""
    out = tmp_path / "run"
    flags = ["--enable_jit_checkpoint"] if command.name == "finetune" and signum == signal.SIGINT else []
    stopped = command.at_call(out, *flags, function=STEP, nth=3, signum=signum)
    assert stopped.returncode == 128 + signum, describe(stopped)
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr, describe(stopped)
    step, name, checkpoint = command.stop_line(stopped.stdout + stopped.stderr)
    assert (step, name) == (3, signal.Signals(signum).name)
    assert checkpoint in (f"step_{step}", str(command.checkpoint(out, step)))
    assert (command.checkpoint(out, step) / "checksums.json").is_file()
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()

    resume = [
        "--resume_from_checkpoint", "latest" if signum == signal.SIGTERM else command.checkpoint(out, step),
    ]
    if signum == signal.SIGTERM:  # the checkpoint's optimizer state would undo a changed rate: refused
        refused = command.run(out, *flags, *resume, "--learning_rate", "1e-3")
        line = error_line(
            refused, command.name, "resume with --learning_rate", "but this run has --learning_rate"
        )
        assert refused.returncode == 2 and re.search(
            r"was trained with --learning_rate 0\.00[35],", line
        ), line
        assert not (out / "model.safetensors").exists()
    if command.name == "pretrain":
        assert command.steps_logged(out, final=False) == list(range(1, step + 1))
        # a full disk mid-append tears the last line: the resume drops it and says so
        if signum == signal.SIGTERM:
            with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write('{"step": %d, "loss": 4.1' % (step + 1))
    resumed = command.run(out, *flags, *resume)
    succeeded(resumed)
    assert f"{command.resumed} {command.checkpoint(out, step)} at step {step}" in resumed.stdout, describe(
        resumed
    )
    assert_same_weights(command.reference, out)
    if command.name == "pretrain":
        torn = [line for line in resumed.stdout.splitlines() if "torn last line" in line]
        assert len(torn) == (signum == signal.SIGTERM), resumed.stdout[-3000:]
        assert not torn or f"line {step + 1} of {out / 'metrics.jsonl'}" in torn[0]
        assert command.steps_logged(out) == list(range(1, command.steps + 1))
        # The log and the card count both launches' time: the log's seconds go on from the stopped launch's.
        seconds = [
            json.loads(line)["elapsed_seconds"]
            for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line
        ]
        assert seconds == sorted(seconds) and seconds[step] > seconds[step - 1] > 0, seconds
        assert (
            "in 2 launches (the run was resumed 1 time; the last launch trained"
            in (out / "README.md").read_text()
        )


@deep
def test_ctrl_c_that_also_ends_the_reader_of_the_output_still_stops_with_a_checkpoint(finetune, tmp_path):
    """`finetune.py ... | tee log` and Ctrl-C, which ends tee too: once a
    BrokenPipeError mid-step and no checkpoint."""
    out = tmp_path / "run"
    process = subprocess.Popen(
        finetune.command(out, *finetune.every()), cwd=finetune.cwd,
        env={**pretrain_env(finetune.cwd), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    for line in process.stdout:
        if "'loss'" in line:
            break
    process.stdout.close()
    process.stdout = None
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    result = subprocess.CompletedProcess(process.args, process.returncode, "", err)
    assert process.returncode == 130, describe(result)
    step, name, checkpoint = finetune.stop_line(err)
    assert name == "SIGINT" and finetune.checkpoint(out, step).is_dir(), describe(result)
    assert "Traceback" not in err and not (out / "checkpoints" / ".tmp_checkpoint").exists(), describe(result)


@deep
def test_a_stop_signal_in_the_last_step_stops_with_its_checkpoint_and_the_resume_only_saves(
    command, tmp_path
):
    """A preempted job spends no seconds on evaluating and saving: the resume trains
    no step, evaluates and saves."""
    out, flags = tmp_path / "run", []
    if command.name == "finetune":
        flags = [
            "--validation_file", write_jsonl(tmp_path / "validation.jsonl", prompt_records(64, offset=100)),
        ]
    stopped = command.at_call(out, *flags, function=STEP, nth=command.steps, signum=signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, describe(stopped)
    assert command.stop_line(stopped.stdout + stopped.stderr)[0] == command.steps
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()

    resumed = command.run(out, *flags, "--resume_from_checkpoint", "latest")
    succeeded(resumed)
    assert (
        f"{command.resumed} {command.checkpoint(out, command.steps)} at step {command.steps}"
        in resumed.stdout
    )
    # the evaluation the signal cut
    assert "eval_loss" in resumed.stdout or "validation: loss" in resumed.stdout
    assert_same_weights(command.reference, out)
    if command.name == "pretrain":
        assert command.steps_logged(out) == list(range(1, command.steps + 1))


@deep
def test_a_stop_signal_while_the_run_starts_ends_it_at_once_with_a_line(command, tmp_path):
    """The handler comes before the heavy imports: the stop line, not a bare -15."""
    args = command.command(tmp_path / "out")[1:]
    when = r"import time:.*\| +transformers\."
    if command.name == "pretrain":
        when = r"^Training a byte-level BPE tokenizer"
    stopped = run_signalled([sys.executable, "-X", "importtime", *args], signal.SIGTERM, when,
                            pretrain_env(command.cwd), command.cwd)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout
    assert (
        f"{command.name}.py: stopped by SIGTERM before training started; resume with the same command and "
        "--resume_from_checkpoint latest."
    ) in stopped.stdout.splitlines(), stopped.stdout[-3000:]
    assert not (tmp_path / "out" / "config.json").exists()


# ---------------------------------------------------------------- SIGKILL and damage


def test_a_kill_mid_checkpoint_and_damage_fall_back_to_the_newest_intact_checkpoint(command, tmp_path):
    """Killed in the fifth checkpoint; then `latest` sets aside a damaged one and
    one without optimizer state."""
    out = tmp_path / "run"
    killed = command.at_call(out, *command.every(), function="safetensors.torch.save_file",
                             match=f"checkpoints{os.sep}.tmp", nth=5)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    intact = [command.interval * n for n in (1, 2, 3, 4)]
    checkpoints = out / "checkpoints"
    assert sorted(
        name for name in os.listdir(checkpoints) if not name.startswith((".", "tokenizer"))
    ) == sorted(command.checkpoint(out, step).name for step in intact)
    assert not (out / "model.safetensors").exists()  # no final export from a killed run
    newest = command.checkpoint(out, intact[-1])
    weights = load_file(newest / "model.safetensors")
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    state = json.loads((newest / "trainer_state.json").read_text())
    assert state.get("step", state.get("global_step")) == intact[-1]

    flip_last_bytes(newest / "model.safetensors")
    (command.checkpoint(out, intact[-2]) / command.optimizer_file).unlink()
    resumed = command.run(out, *command.every(limit=2), "--resume_from_checkpoint", "latest")
    succeeded(resumed)
    assert re.search(rf"{newest.name}\b.*model\.safetensors does not match its checksum", resumed.stdout)
    assert re.search(rf"{intact[-2]}\b.*{command.optimizer_file} is missing", resumed.stdout), describe(
        resumed
    )
    assert f"{command.resumed} {command.checkpoint(out, intact[-3])} at step {intact[-3]}" in resumed.stdout
    assert_same_weights(command.reference, out)
    names = set(os.listdir(checkpoints))
    assert {f"abandoned_{command.checkpoint(out, step).name}" for step in intact[-2:]} <= names
    assert sorted(name for name in names if name.startswith(("step_", "checkpoint-"))) == sorted(
        command.checkpoint(out, step).name for step in (command.steps - command.interval, command.steps))
    assert not [name for name in names if name.startswith(".tmp")], names
    if command.name == "pretrain":
        assert command.steps_logged(out) == list(range(1, command.steps + 1))


@deep
@pytest.mark.parametrize(
    "function, nth", [("os.mkdir", 1), (MOVES, 2)], ids=["staging-created", "second-file-moved"]
)
def test_a_kill_during_the_export_keeps_user_files_and_the_resume_ends_bit_for_bit(
    command, tmp_path, function, nth
):
    """Killed once the staging folder exists, or after two files moved in: the resume finishes the export."""
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
                processes.append(
                    subprocess.Popen(command.command(out), env=env, cwd=command.cwd, stdout=f, stderr=f)
                )
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


# ---------------------------------------------------------------- what only one of the two commands has


@deep
def test_pretrain_resume_rules_on_a_finished_run(pretrain, tmp_path):
    """On a copy of the finished reference (checkpoints 2, 4 and 6)."""
    out = tmp_path / "run"
    shutil.copytree(pretrain.reference, out)
    checkpoints = out / "checkpoints"
    resume = ["--resume_from_checkpoint", "latest"]
    refused = pretrain.run(out, *resume, "--per_device_train_batch_size", 4)
    assert (
        "resume with the same --seed, --block_size and --total_batch_size (on any process count)"
        in error_line(refused, "pretrain")
    )
    for flag, value, was in (("--learning_rate", "1e-3", "0.005"), ("--weight_decay", "0.0", "0.1"),
                             ("--adam_beta2", "0.99", "0.95")):
        refused = pretrain.run(out, *resume, flag, value)
        line = error_line(
            refused, "pretrain", f"was trained with {flag} {was}, but this run has {flag} {float(value)}",
            f"resume with {flag} {was}, or start a new run", "--init_from",
        )
        assert refused.returncode == 2, line
    assert sorted(os.listdir(checkpoints)) == ["step_2", "step_4", "step_6", "tokenizer"]

    again = pretrain.run(out, *resume)
    assert "at step 6" in again.stdout
    assert_same_weights(pretrain.reference, out)
    assert pretrain.steps_logged(out) == list(range(1, 7))

    (checkpoints / "abandoned_step_4").mkdir()  # set aside by an earlier resume: the new one is numbered
    older = pretrain.run(out, *pretrain.every(limit=10), "--resume_from_checkpoint", checkpoints / "step_2")
    succeeded(older)
    assert "at step 2" in older.stdout
    assert "Set aside abandoned_step_4.1: this run continues from step 2." in older.stdout
    assert "Set aside abandoned_step_6: this run continues from step 2." in older.stdout
    assert_same_weights(pretrain.reference, out)

    longer = pretrain.run(
        out, *resume, "--max_train_steps", 10, "--lr_scheduler_type", "constant_with_warmup",
        "--overwrite_output_dir",
    )
    assert "at step 6" in longer.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "loss" in row]
    assert [row["step"] for row in rows] == list(range(1, 11))
    assert [row["lr"] for row in rows[6:]] == [pytest.approx(5e-3)] * 4, rows[6:]

    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"
    (out / "metrics.jsonl").write_text("".join(lines))
    exported = (out / "model.safetensors").read_bytes()
    damaged = pretrain.run(out, *resume, "--max_train_steps", 10)
    assert damaged.returncode == 1
    error_line(damaged, "pretrain", f"{out / 'metrics.jsonl'} line 3 is not a metrics row")
    assert (out / "model.safetensors").read_bytes() == exported


@deep
def test_pretrain_seeds_decide_the_run(pretrain, tmp_path):
    """Resumes agree with the reference because they are seeded alike: another
    --seed gives another first loss."""
    def first_loss(folder):
        return next(json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()
                    if '"loss"' in line)

    succeeded(pretrain.run(tmp_path / "same", "--max_train_steps", 1))
    succeeded(pretrain.run(tmp_path / "other", "--max_train_steps", 1, "--seed", 7))
    losses = [first_loss(folder) for folder in (pretrain.reference, tmp_path / "same", tmp_path / "other")]
    assert losses[0] == losses[1] != losses[2], losses


@deep
def test_pretrain_into_a_mount_point(pretrain, tmp_path, mounted):
    with mounted(tmp_path / "mnt", "64m") as out:
        with_notes(out)
        succeeded(pretrain.run(out))
        assert os.path.ismount(out) and (out / "config.json").is_file()
        assert_same_weights(pretrain.reference, out)
        assert_notes_kept(out)


# 80 documents make 144-191 blocks of 64 tokens: three batches of 48 an epoch, so the 6 steps run two epochs.
EPOCHS_OF_THREE = ["--num_train_documents", 80, "--per_device_train_batch_size", 48]


@deep
def test_pretrain_killed_with_attention_dropout_resumes_bit_for_bit_in_a_later_epoch(pretrain, tmp_path):
    """Dropout's random numbers, and the second epoch's order of blocks
    (resumes once read epoch 0's again)."""
    values = json.loads((REPO_ROOT / "training" / "configs" / "model-tiny.json").read_text())
    (tmp_path / "dropout.json").write_text(json.dumps({**values, "attention_dropout": 0.1}))
    flags = ["--model_config", tmp_path / "dropout.json", *EPOCHS_OF_THREE, *pretrain.every()]
    ran = pretrain.run(tmp_path / "straight", *flags)
    succeeded(ran)
    blocks = int(re.search(r"([\d,]+) training and", ran.stdout).group(1).replace(",", ""))
    assert blocks // 48 == 3, f"{blocks} blocks: not three batches an epoch any more; change EPOCHS_OF_THREE"
    # Killed right after step 5's checkpoint weights were written: the run resumes
    # from step 4, in the second epoch.
    out = tmp_path / "run"
    killed = pretrain.at_call(out, *flags, function="safetensors.torch.save_file", match="checkpoints", nth=5)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    assert "step_4" in os.listdir(out / "checkpoints") and "step_5" not in os.listdir(out / "checkpoints")
    resumed = pretrain.run(out, *flags, "--resume_from_checkpoint", "latest")
    succeeded(resumed)
    assert re.search(r"Resumed from \S*step_4\b", resumed.stdout), describe(resumed)
    assert_same_weights(tmp_path / "straight", out)


@deep
def test_a_resume_that_changes_what_decides_the_model_is_refused_in_one_line(pretrain, finetune, tmp_path):
    """Once ignored (or a traceback mid-load), now refused before anything is written; moved data resumes."""
    from tests.helpers.tiny import build_byte_bpe_tokenizer, run_side_by_side, write_text

    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "other-tokenizer")
    lora, on_file, sft = tmp_path / "lora", tmp_path / "on-file", tmp_path / "sft"
    text, other_text, records = tmp_path / "data.txt", tmp_path / "other.txt", tmp_path / "sft.jsonl"
    write_text(text, 0.05), write_text(other_text, 0.05, seed=1), write_jsonl(records, prompt_records(16))
    other_records = write_jsonl(tmp_path / "other.jsonl", prompt_records(16, offset=16))
    short = {"pretrain": ["--max_train_steps", 2, "--checkpointing_steps", 2], "finetune": ["--max_steps", 2,
                                                                                           "--save_steps", 2]}
    started = {"lora": (finetune, lora, [*short["finetune"], "--use_peft"]),
               "on-file": (pretrain, on_file, [*short["pretrain"], "--train_file", text]),
               "sft": (finetune, sft, [*short["finetune"], "--train_file", records])}
    trained = run_side_by_side({name: (command.command(out, *flags), command.cwd, pretrain_env(command.cwd))
                                for name, (command, out, flags) in started.items()})
    for result in trained.values():
        succeeded(result)
    (tmp_path / "moved").mkdir()
    moved = Path(shutil.copy2(text, tmp_path / "moved" / "data.txt"))  # its name and times kept
    with text.open("a") as f:  # the same files, written again
        f.write("A paragraph added after the run.\n")
    write_jsonl(records, prompt_records(17))
    resume = ["--resume_from_checkpoint", "latest"]
    cases = {  # name: (command, its finished run, flags, words of the one line)
        "hidden_size": (
            pretrain,
            pretrain.reference,
            ["--hidden_size", 32],
            [
                "holds a model with hidden_size 64, head_dim 16, but this run builds one with hidden_size "
                "32, head_dim 8",
                "resume with the sizes it was started with",
            ],
        ),
        "vocab_size": (
            pretrain,
            pretrain.reference,
            ["--vocab_size", 400],
            [
                "was trained with --vocab_size 320, but this run has --vocab_size 400",
                "keeps the tokenizer it saved",
            ],
        ),
        "tokenizer_name": (
            pretrain, pretrain.reference, ["--tokenizer_name", tmp_path / "other-tokenizer"],
            ["was trained with --tokenizer_name None, but this run has --tokenizer_name"],
        ),
        "lora_r": (
            finetune, lora, ["--use_peft", "--lora_r", 4],
            ["holds a LoRA adapter trained with --lora_r 8, but this run has --lora_r 4"],
        ),
        "lora_trainable_tokens": (
            finetune, lora, ["--use_peft", "--lora_trainable_tokens", "0123"],
            ["holds a LoRA adapter trained with the token ids of --lora_trainable_tokens None, but this run "
             "has the token ids of --lora_trainable_tokens "],
        ),
        "lora_without_peft": (
            finetune, lora, [], ["holds a LoRA adapter, but this run fine-tunes every weight"],
        ),
        "full_with_peft": (
            finetune, finetune.reference, ["--use_peft"],
            ["holds a full fine-tune's weights, but this run trains a LoRA adapter"],
        ),
        "pretrain_file_rewritten": (
            pretrain,
            on_file,
            ["--train_file", text],
            [
                "step_2 was trained on other data: --train_file data.txt changed since",
                "resume with the same data flags and unchanged files, or start a new run on this data from "
                "its weights (--init_from ",
            ],
        ),
        "pretrain_another_file": (
            pretrain, on_file, ["--train_file", other_text],
            ["--train_file was data.txt, this run has other.txt"],
        ),
        "pretrain_corpus_size": (
            pretrain, pretrain.reference, ["--num_train_documents", 200],
            ["--num_train_documents was 300, this run has 200"],
        ),
        "finetune_file_rewritten": (
            finetune,
            sft,
            ["--train_file", records],
            [
                "checkpoint-2 was trained on other data: --train_file sft.jsonl changed since",
                "or fine-tune anew (another --output_dir, or --overwrite_output_dir)",
            ],
        ),
        "finetune_another_file": (
            finetune, finetune.reference, ["--train_file", other_records],
            ["--train_file was train.jsonl, this run has other.jsonl"],
        ),
    }
    resumed = {"moved_data": (pretrain, on_file, ["--train_file", moved, "--max_train_steps", 4])}
    runs = {}
    for name, (command, finished, flags, *_) in {**cases, **resumed}.items():
        shutil.copytree(finished, tmp_path / name)
        runs[name] = (
            command.command(tmp_path / name, *resume, *flags), command.cwd, pretrain_env(command.cwd),
        )
    # The data is compared before anything is tokenized or moved: the token store and the checkpoints stay.
    before = {name: folder_state(tmp_path / name) for name in cases}
    results = run_side_by_side(runs, timeout=600)
    for name, (command, finished, _, words) in cases.items():
        line = error_line(results[name], command.name, *words)
        assert results[name].returncode == 2, line
        weights = "adapter_model.safetensors" if finished == lora else "model.safetensors"
        assert (tmp_path / name / weights).read_bytes() == (finished / weights).read_bytes()
        after = folder_state(tmp_path / name)
        assert after == before[name], (
            name,
            sorted(k for k in after.keys() | before[name].keys() if after.get(k) != before[name].get(k)),
        )
    succeeded(results["moved_data"])
    assert re.search(r"Resumed from \S*step_2\b", results["moved_data"].stdout), describe(
        results["moved_data"]
    )


def folder_state(folder: Path) -> dict:
    """Every file's size and modification time."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*") if path.is_file()}


class Planted:
    """What an attacker puts in a checkpoint's state file: unpickling it would run a command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@deep
def test_a_planted_pickle_in_any_state_file_is_refused_in_one_line(pretrain, finetune, tmp_path):
    """Checksum recomputed: once torch's traceback advising weights_only=False."""
    import pickle

    from hf_tinytx_training import checkpoints
    from tests.helpers.tiny import run_side_by_side

    cases = {"pretrain": (pretrain, ["optimizer.bin", "scheduler.bin"]),
             "finetune": (finetune, ["optimizer.pt", "scheduler.pt", "rng_state.pth"])}
    runs, expected = {}, {}
    for command, names in cases.values():
        for name in names:
            out = tmp_path / f"{command.name}-{name}"
            shutil.copytree(command.reference, out)
            checkpoint = command.checkpoint(out, command.steps)
            (checkpoint / name).write_bytes(pickle.dumps(Planted(tmp_path / f"ran-{name}"), protocol=2))
            (checkpoint / checkpoints.CHECKSUM_FILE).unlink()
            checkpoints.write_json(checkpoint / checkpoints.CHECKSUM_FILE, checkpoints.checksums(checkpoint))
            runs[name] = (command.command(out, "--resume_from_checkpoint", "latest"), command.cwd,
                          pretrain_env(command.cwd))
            expected[name] = (command.name, checkpoint / name)
    results = run_side_by_side(runs, timeout=600)
    for name, (program, path) in expected.items():
        line = error_line(results[name], program, f"Refused to load {path}: it holds posix.system",
                          "unpickling it could run code")
        assert results[name].returncode == 1, line
        assert not (tmp_path / f"ran-{name}").exists(), "the planted pickle ran"


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


@deep
def test_kill_campaign_quick(tmp_path):
    """tests/kill_campaign --quick: two trials per command, and convert's publish
    over another shape and links; the token store's build faulted (a worker killed, SIGTERM), and refused
    over a user's file."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.kill_campaign", "--quick", "--out", str(tmp_path / "results")],
        cwd=REPO_ROOT, env=pretrain_env(tmp_path), capture_output=True, text=True, timeout=900,
    )
    succeeded(result)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "kill_campaign" and summary["mode"] == "quick"
    assert summary["commands"] == ["pretrain", "finetune", "convert", "store"], summary["commands"]
    for name, counts in summary["per_command"].items():
        tried = 4 if name == "convert" else 2  # convert: also a publish of another shape, and planted links
        assert counts["tried"] == tried and counts["lost"] == 0 and counts["bit_for_bit"] == tried, (
            name, counts,
        )
        assert f"{name}: {tried} tried, {tried} resumed bit for bit, 0 lost" in result.stdout
    convert = summary["per_command"]["convert"]
    assert (
        convert["shape_trials"] == 1 and convert["link_trials"] == 1 and convert["written_through_links"] == 0
    )
    assert "planted links: 1 trials, 0 written through" in result.stdout
    store = summary["per_command"]["store"]
    assert store["foreign_refused"] == store["foreign_trials"] == 1 and store["left_running"] == 0, store
    assert "a user's file in the store's folder: 1 trials, 1 refused in one line with nothing written" in \
        result.stdout
    assert "0 hung; 0 left a process running; endings: 1 one line, 1 stopped" in result.stdout
    assert (
        "overall: 10 tried, 10 resumed bit for bit, 0 lost; 0 written through a planted link" in result.stdout
    )
    failed = [trial for trial in summary["trials"] if not trial["equal"] or trial["lost"] or trial["error"]]
    assert not failed, json.dumps(failed, indent=1)
    assert all(trial["killed"] for trial in summary["trials"] if trial["stop"] is None), summary["trials"]
    assert summary["signal_trials"] == 3 and summary["stop_promises_kept"] == 3, summary["stops"]
    assert not (tmp_path / "results").exists()  # --quick writes no results


@deep
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_the_resume_ends_bit_for_bit(pretrain, tmp_path):
    """The ranks may get torchrun's SIGTERM a step apart: they agree on one step and save one checkpoint."""
    env = pretrain_env(tmp_path, OMP_NUM_THREADS="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [*torchrun, *pretrain.command(tmp_path / "straight")[1:], "--per_device_train_batch_size", 4,
               "--max_train_steps", 60]
    straight = subprocess.run(list(map(str, command)), env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
    succeeded(straight)
    out = tmp_path / "run"
    command = [str(out) if part == str(tmp_path / "straight") else str(part) for part in command]
    stopped = run_signalled(command, signal.SIGTERM, r"^train:.*\| *[1-9]\d*/", env, tmp_path)
    assert stopped.returncode == 1, stopped.stdout[-4000:]  # torchrun's status after a signal
    found = re.findall(r"^pretrain\.py: stopped at step (\d+) of 60 by SIGTERM; checkpoint step_\1 is saved",
                       stopped.stdout, re.MULTILINE)
    assert len(found) == 1, stopped.stdout[-4000:]
    assert (out / "checkpoints" / f"step_{found[0]}" / "checksums.json").is_file()
    assert not (out / "model.safetensors").exists()

    succeeded(subprocess.run([*command, "--resume_from_checkpoint", "latest"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300))
    assert_same_weights(tmp_path / "straight", out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == list(range(1, 61))


def test_the_checkpoint_state_reads_back_and_one_without_a_field_is_refused_in_one_line(tmp_path):
    """A trainer_state.json that lacks a field a resume needs is one line naming it, not a KeyError."""
    from hf_tinytx_training import checkpoints
    from hf_tinytx_training.errors import UserInputError

    signature = {
        "seed": 42, "block_size": 64, "global_batch": 8, "gradient_accumulation_steps": 1, "num_processes": 1,
    }
    written = {"step": 6, "epoch": 1, "batch_in_epoch": 3, "run_signature": signature, "planned_steps": 8,
               "train_seconds": 2.5, "trained_seconds": 4.0, "launches": 2, "torch_threads": 2,
               "plan": {"size": "micro"}}
    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps(written))
    state = checkpoints.read_training_state(str(tmp_path))
    assert dataclasses.asdict(state) == written

    # a checkpoint of before they were recorded: one launch
    del written["trained_seconds"], written["launches"], written["torch_threads"], written["plan"]
    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps(written))
    assert (checkpoints.read_training_state(str(tmp_path)).launches, state.launches) == (1, 2)

    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps({"step": 6, "run_signature": signature}))
    with pytest.raises(
        UserInputError, match=r"has no epoch, batch_in_epoch: it is not a checkpoint of pretrain\.py"
    ):
        checkpoints.read_training_state(str(tmp_path))


def test_the_data_fingerprint_names_each_change_and_data_of_the_same_bytes_is_the_same(tmp_path):
    """checkpoints.refuse_data_change without a run; a checkpoint from before the
    fingerprint has nothing to compare."""
    from types import SimpleNamespace

    from hf_tinytx_training import checkpoints
    from hf_tinytx_training.data.fingerprint import finetune_data
    from hf_tinytx_training.errors import UserInputError

    data, other = write_jsonl(tmp_path / "a.jsonl", prompt_records(4)), write_jsonl(tmp_path / "b.jsonl", [])
    flags = {"train_file": str(data), "validation_file": None, "max_seq_length": None, "packing": False}
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    how = "or fine-tune anew"
    # none recorded
    checkpoints.refuse_data_change(str(checkpoint), finetune_data(SimpleNamespace(**flags)), how)
    checkpoints.write_json(checkpoint / checkpoints.DATA_FILE, finetune_data(SimpleNamespace(**flags)))

    (tmp_path / "moved").mkdir()
    moved = shutil.copy2(data, tmp_path / "moved" / "a.jsonl")
    # Before (issue 69): a touch, or a copy without -p, was refused though no byte changed.
    (tmp_path / "copied").mkdir()
    copied = shutil.copy(data, tmp_path / "copied" / "a.jsonl")
    os.utime(copied, ns=(time.time_ns(), time.time_ns() + 5 * 10**9))
    for same in ({}, {"train_file": moved}, {"train_file": copied}):
        checkpoints.refuse_data_change(
            str(checkpoint), finetune_data(SimpleNamespace(**{**flags, **same})), how
        )
    write_jsonl(data, prompt_records(4, offset=1))  # the same size, other text
    os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))
    for changed, words in [
        ({}, "--train_file a.jsonl changed since (other bytes)"),
        ({"train_file": str(other)}, "--train_file was a.jsonl, this run has b.jsonl"),
        ({"train_file": moved, "packing": True}, "--packing was False, this run has True"),
    ]:
        with pytest.raises(UserInputError) as refused:
            checkpoints.refuse_data_change(
                str(checkpoint), finetune_data(SimpleNamespace(**{**flags, **changed})), how
            )
        assert str(refused.value).startswith(
            f"{checkpoint} was trained on other data: {words}"
        ), refused.value
        assert str(refused.value).endswith(
            "resume with the same data flags and unchanged files, or fine-tune anew."
        )


# ---------------------------------------------------------------- stops during
# the push, the workers, the exit

PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
FINETUNE = str(REPO_ROOT / "training" / "finetune.py")
FAST = [*TINY_PRETRAIN_ARGS, "--max_train_steps", "4", "--eval_steps", "100", "--num_probes_per_kind", "0",
        "--num_samples", "0"]
LONG_WAIT = "300"  # a --hub_timeout no test may sit out: a stop must end the wait long before
# seconds a stop may take to end the process; generous, so that a loaded machine does not fail the test
PROMPT = 60


class Running:
    """A command started in the background; its stdout and stderr (together)
    read line by line as they come."""

    def __init__(self, command, env, cwd):
        self.process = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        pending = b""
        for chunk in iter(lambda: self.process.stdout.read1(65536), b""):
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)
            self.lines += [line.decode(errors="replace") for line in lines]
        self.lines.append(pending.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 240) -> None:
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        while not any(regex.search(line) for line in list(self.lines)):
            assert self.process.poll() is None, f"ended before {pattern!r}:\n{self.output[-4000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n{self.output[-4000:]}"
            time.sleep(0.05)

    def finish(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"still running {timeout} s after the signal:\n{self.output[-4000:]}")
        finally:
            self._reader.join(timeout=10)


def assert_stopped_during_push(run: Running, code: int, signum: int, program: str, folder) -> None:
    output = run.output
    assert code == 128 + signum, f"returncode {code}\n{output[-4000:]}"
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-4000:]
    lines = [
        line for line in run.lines if line.startswith(f"{program}: stopped by {signal.Signals(signum).name}")
    ]
    assert len(lines) == 1, output[-4000:]
    assert f"the local folder {folder} is complete: push it with `hf upload " in lines[0], lines[0]
    from transformers import AutoModelForCausalLM

    import hf_tinytx  # noqa: F401

    assert AutoModelForCausalLM.from_pretrained(folder).config.model_type == "tinytx"


@deep
def test_sigterm_during_a_pretrain_push_that_never_finishes_ends_it_at_once(tmp_path):
    out = tmp_path / "out"
    with silent_server() as server:
        run = Running(
            [
                sys.executable, PRETRAIN, *FAST, "--output_dir", str(out), "--push_to_hub",
                "--hub_model_id", "me/tiny", "--hub_timeout", LONG_WAIT,
            ],
            silent_hub_env(server, tmp_path),
            tmp_path,
        )
        run.wait_for(r"^Model folder: ")
        time.sleep(1)  # inside the wait for the upload
        run.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = run.finish(timeout=PROMPT)
    assert time.monotonic() - started < PROMPT
    assert_stopped_during_push(run, code, signal.SIGTERM, "pretrain.py", out)
    assert not (out / ".lock").exists()


@deep
def test_ctrl_c_three_times_during_a_finetune_push_that_never_finishes_ends_it_at_once(tmp_path):
    from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
    from tests.training.sft.test_finetune import QUICK

    build_tiny_model(vocab_size=320).save_pretrained(tmp_path / "base")
    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", prompt_records(16))
    with silent_server() as server:
        run = Running(
            [
                sys.executable, FINETUNE, "--model_name_or_path", "base", "--train_file", "train.jsonl",
                "--output_dir", "tuned", "--push_to_hub", "--hub_model_id", "me/tuned",
                "--hub_timeout", LONG_WAIT, *QUICK,
            ],
            silent_hub_env(server, tmp_path),
            tmp_path,
        )
        run.wait_for(r"^Model saved to ")
        time.sleep(1)
        for _ in range(3):
            run.process.send_signal(signal.SIGINT)
            time.sleep(0.1)
        code = run.finish(timeout=PROMPT)
    assert_stopped_during_push(run, code, signal.SIGINT, "finetune.py", tmp_path / "tuned")


@deep
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc; the workers' death is Linux's prctl"
)
def test_sigterm_to_the_main_process_alone_takes_its_tokenization_workers_along(tmp_path):
    # Enough text that tokenizing it with 2 workers takes a while: the signal lands while they work.
    words = "the miller kept his grain in the old mill by the river and sold bread".split()
    with open(tmp_path / "big.txt", "w", encoding="utf-8") as f:
        for i in range(200_000):  # 20 MB
            f.write(" ".join(words[(i + j) % len(words)] for j in range(18)) + ".\n\n")
    command = [sys.executable, PRETRAIN, *FAST, "--train_file", str(tmp_path / "big.txt"),
               "--preprocessing_num_workers", "2", "--output_dir", str(tmp_path / "out")]
    run = Running(command, pretrain_env(tmp_path), tmp_path)
    deadline, workers = time.monotonic() + 240, set()
    while len(workers) < 2:  # what torchrun does to a rank: SIGTERM to that process, not its group
        assert run.process.poll() is None and time.monotonic() < deadline, run.output[-4000:]
        workers = set(descendants(run.process.pid))
        time.sleep(0.05)
    run.process.send_signal(signal.SIGTERM)
    code = run.finish(timeout=PROMPT)
    assert code == 128 + signal.SIGTERM, f"returncode {code}\n{run.output[-4000:]}"
    deadline = time.monotonic() + 10
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, workers)), f"workers {sorted(filter(alive, workers))} outlived their parent"


@deep
def test_a_second_sigterm_while_a_stopped_run_exits_keeps_its_status(tmp_path):
    # Started as `tinytx pretrain` (its module form), so its lines name it so, not "pretrain.py".
    command = [
        sys.executable, "-m", "hf_tinytx_training", "pretrain", *TINY_PRETRAIN_ARGS,
        "--max_train_steps", "60", "--num_probes_per_kind", "0", "--num_samples", "0",
        "--output_dir", str(tmp_path / "out"),
    ]
    run = Running(command, pretrain_env(tmp_path), tmp_path)
    run.wait_for(r"^train:.*\| *[1-9]\d*/")
    run.process.send_signal(signal.SIGTERM)
    run.wait_for(r"^tinytx pretrain: stopped at step \d+ of 60 by SIGTERM")
    while run.process.poll() is None:  # again and again while it exits, up to its very last moments
        run.process.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    code = run.finish(timeout=PROMPT)
    assert code == 128 + signal.SIGTERM, f"returncode {code}\n{run.output[-4000:]}"
