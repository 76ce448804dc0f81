"""training/pretrain.py under faults injected from outside (tests/helpers/faults.py): SIGKILL during the export, an
output folder that is a mount point, two runs on one folder, a full disk, a Hub that never answers, and a campaign of
random kills (python -m tests.kill_campaign --quick).

What must hold whatever happens: a file of the user's in --output_dir survives untouched, the newest complete
checkpoint stays loadable, `--resume_from_checkpoint latest` finishes the run with exactly the weights of a run that
was never interrupted, and every error is one line that says what happened (no traceback).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.helpers.faults import (
    KILL_MARK,
    KILLED,
    PRETRAIN,
    run_killed_after_line,
    run_killed_at,
    silent_server,
)
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, assert_same_weights, pretrain_env


pytestmark = pytest.mark.deep

STEPS = 6
# A checkpoint every step and none pruned: every kill finds the previous step saved, and a full disk comes soon.
FLAGS = [*TINY_PRETRAIN_ARGS, "--max_train_steps", STEPS, "--checkpointing_steps", 1, "--checkpoints_total_limit", 100,
         "--eval_steps", 100, "--num_probes_per_kind", 0, "--num_samples", 0]
RESUME = ["--resume_from_checkpoint", "latest"]
NOTES = "My own notes, kept in the output folder: no training run may touch them.\n"
STAGING = ".tinytx-staging"  # the export's hidden folder inside --output_dir
MOVES = ("os.replace", "os.rename")  # either may move a staged file into place; they share one call count


def pretrain(output_dir, *flags, tmp_path, env=None, timeout=300) -> subprocess.CompletedProcess:
    command = [sys.executable, str(PRETRAIN), *map(str, FLAGS), "--output_dir", str(output_dir), *map(str, flags)]
    return subprocess.run(command, env=env or pretrain_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


def output_with_notes(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "my_notes.txt").write_text(NOTES)
    return path


def describe(result) -> str:
    stderr = "\n".join(line for line in result.stderr.splitlines() if "%|" not in line)  # without progress bars
    return f"returncode {result.returncode}\nSTDOUT:\n{result.stdout[-3000:]}\nSTDERR:\n{stderr[-5000:]}"


def assert_completed(result):
    assert result.returncode == 0, describe(result)
    assert "Traceback" not in result.stderr, describe(result)


def assert_notes_kept(output_dir: Path):
    assert (output_dir / "my_notes.txt").is_file(), f"my_notes.txt is gone from {output_dir}: {os.listdir(output_dir)}"
    assert (output_dir / "my_notes.txt").read_text() == NOTES


def error_lines(stderr: str, needle: str) -> list[str]:
    return [line for line in stderr.splitlines() if needle.lower() in line.lower()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The output folder of the same command, never interrupted."""
    tmp_path = tmp_path_factory.mktemp("reference")
    result = pretrain(tmp_path / "model", tmp_path=tmp_path)
    assert_completed(result)
    return tmp_path / "model"


# ---------------------------------------------------------------- SIGKILL during the final export


@pytest.mark.parametrize(
    "function, nth, when",
    [
        ("os.mkdir", 1, "after"),  # the staging folder exists, nothing is in place yet
        (MOVES, 2, "after"),  # two staged files moved into the output folder, the others not
    ],
    ids=["staging-created", "second-file-moved"],
)
def test_killed_during_export_keeps_user_files_and_resumes_bit_for_bit(reference, tmp_path, function, nth, when):
    output_dir = output_with_notes(tmp_path / "model")
    killed = run_killed_at([*FLAGS, "--output_dir", output_dir], env=pretrain_env(tmp_path), cwd=tmp_path,
                           function=function, match=STAGING, nth=nth, when=when)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, (
        f"the run was not killed in the export (no call of {function} with {STAGING} in its arguments)\n"
        + describe(killed))

    assert_notes_kept(output_dir)
    assert (output_dir / "checkpoints" / f"step_{STEPS}").is_dir(), (
        f"no checkpoint of the final step before the export: {sorted(os.listdir(output_dir))}")

    resumed = pretrain(output_dir, *RESUME, tmp_path=tmp_path)
    assert_completed(resumed)
    assert_same_weights(reference, output_dir)
    assert_notes_kept(output_dir)
    assert (output_dir / "checkpoints" / f"step_{STEPS}").is_dir()
    assert not [name for name in os.listdir(output_dir) if name.startswith(STAGING)], "staging folder left behind"


# ---------------------------------------------------------------- SIGKILL mid-run, with dropout, in a later epoch

# 40 documents make 144-191 blocks of 64 tokens: three batches of 48 an epoch, so the 6 steps run two epochs.
EPOCHS_OF_THREE = ["--num_train_documents", 40, "--per_device_train_batch_size", 48]


@pytest.fixture(scope="module")
def dropout_flags(tmp_path_factory) -> list:
    """FLAGS with training/configs/model-tiny.json's attention_dropout set to 0.1 (FLAGS still set the sizes)."""
    values = json.loads((REPO_ROOT / "training" / "configs" / "model-tiny.json").read_text())
    values["attention_dropout"] = 0.1
    path = tmp_path_factory.mktemp("dropout_config") / "model-tiny-dropout.json"
    path.write_text(json.dumps(values))
    return ["--model_config", path, *EPOCHS_OF_THREE]


def test_killed_mid_run_with_attention_dropout_resumes_bit_for_bit_in_a_later_epoch(dropout_flags, tmp_path):
    """Dropout draws random numbers every step: a resumed run must draw exactly those the straight run drew. And the
    resume lands inside the second epoch: it must read that epoch's blocks as the straight run did (not epoch 0's
    order again, as resumed runs once did) and skip the batch it had trained on."""
    straight = tmp_path / "straight"
    ran = pretrain(straight, *dropout_flags, tmp_path=tmp_path)
    assert_completed(ran)
    blocks = int(re.search(r"([\d,]+) training and", ran.stdout).group(1).replace(",", ""))
    assert blocks // 48 == 3, f"{blocks} blocks: not three batches an epoch any more; change EPOCHS_OF_THREE"
    output_dir = output_with_notes(tmp_path / "model")
    # Killed right after step 5's checkpoint weights were written (before that checkpoint is complete): the run
    # resumes from step 4, one batch into the second epoch, and trains steps 5 and 6 again, with dropout.
    killed = run_killed_at([*FLAGS, *dropout_flags, "--output_dir", output_dir], env=pretrain_env(tmp_path),
                           cwd=tmp_path, function="safetensors.torch.save_file", match="checkpoints", nth=5,
                           when="after")
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    saved_steps = os.listdir(output_dir / "checkpoints")
    assert "step_4" in saved_steps and "step_5" not in saved_steps

    resumed = pretrain(output_dir, *dropout_flags, *RESUME, tmp_path=tmp_path)
    assert_completed(resumed)
    assert re.search(r"Resumed from \S*step_4\b", resumed.stdout), describe(resumed)
    assert_same_weights(straight, output_dir)
    assert_notes_kept(output_dir)


# ---------------------------------------------------------------- the output folder is a mount point


def test_output_dir_that_is_a_mount_point(reference, tmp_path, mounted):
    with mounted(tmp_path / "mnt", "64m") as output_dir:
        output_with_notes(output_dir)
        result = pretrain(output_dir, tmp_path=tmp_path)
        assert_completed(result)
        assert os.path.ismount(output_dir)
        assert (output_dir / "config.json").is_file()
        assert_same_weights(reference, output_dir)
        assert_notes_kept(output_dir)


# ---------------------------------------------------------------- two runs on one output folder


def _wait_for_line(logs: list[Path], processes, pattern: str, timeout: float) -> int:
    """The index of the first process whose log shows `pattern`; fails if none does before all exit or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for index, log in enumerate(logs):
            if re.search(pattern, log.read_text(errors="replace"), re.MULTILINE):
                return index
        if all(process.poll() is not None for process in processes):
            break
        time.sleep(0.05)
    pytest.fail(f"no run printed {pattern!r}:\n" + "\n".join(log.read_text()[-2000:] for log in logs))


def test_second_run_on_the_same_output_dir_is_refused_while_the_first_finishes(reference, tmp_path):
    output_dir = output_with_notes(tmp_path / "model")
    command = [sys.executable, str(PRETRAIN), *map(str, FLAGS), "--output_dir", str(output_dir)]
    env = {**pretrain_env(tmp_path), "PYTHONUNBUFFERED": "1"}
    logs = [tmp_path / "run_a.log", tmp_path / "run_b.log"]
    processes = []
    try:
        for log in logs:  # started together: whichever takes the folder first is the one that must win
            with open(log, "w") as out:
                processes.append(subprocess.Popen(command, env=env, cwd=tmp_path, stdout=out, stderr=out))
        winner = _wait_for_line(logs, processes, r"^Training for", timeout=120)
        # Hold the winner still (it keeps whatever lock it took) until the other run has given up.
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

    loser_log = logs[1 - winner].read_text()
    assert loser.returncode not in (0, KILLED), f"the second run was not refused:\n{loser_log[-3000:]}"
    assert "Traceback" not in loser_log, loser_log[-3000:]
    assert error_lines(loser_log, "in use"), f"the refusal does not say the folder is in use:\n{loser_log[-3000:]}"
    assert processes[winner].returncode == 0, logs[winner].read_text()[-5000:]
    assert_same_weights(reference, output_dir)
    assert_notes_kept(output_dir)


def test_a_killed_run_leaves_no_stuck_lock(reference, tmp_path):
    output_dir = output_with_notes(tmp_path / "model")
    killed = run_killed_after_line([*FLAGS, "--output_dir", output_dir], r"^Training for", 0.0,
                                   env=pretrain_env(tmp_path), cwd=tmp_path)
    assert killed.returncode == KILLED, describe(killed)

    resumed = pretrain(output_dir, *RESUME, tmp_path=tmp_path)
    assert_completed(resumed)
    assert_same_weights(reference, output_dir)
    assert_notes_kept(output_dir)


# ---------------------------------------------------------------- disk full


def _bytes_on_tmpfs(folder: Path) -> int:
    """What the files under `folder` take on a tmpfs: whole 4 KiB pages each."""
    return sum(-(-path.stat().st_size // 4096) * 4096 for path in folder.rglob("*") if path.is_file())


def test_disk_full_keeps_the_last_checkpoint_and_says_so(reference, tmp_path, mounted):
    # Room for the tokenizer, the metrics and two and a half checkpoints: checkpoint 3 (or the export) cannot fit.
    checkpoint = _bytes_on_tmpfs(reference / "checkpoints" / "step_1")
    small = _bytes_on_tmpfs(reference / "checkpoints" / "tokenizer") + 16 * 4096
    size_kib = (small + checkpoint * 5 // 2) // 1024
    with mounted(tmp_path / "small", f"{size_kib}k") as output_dir:
        output_with_notes(output_dir)
        result = pretrain(output_dir, tmp_path=tmp_path)
        assert result.returncode not in (0, KILLED), f"the run did not fail on a full disk\n{describe(result)}"
        assert "Traceback" not in result.stderr, describe(result)
        lines = error_lines(result.stderr, "no space")
        assert lines, f"no error line says the disk is full\n{describe(result)}"
        line = lines[-1]
        assert str(output_dir) in line, f"the error does not name the path being written: {line!r}"

        steps = sorted(int(m[1]) for m in map(re.compile(r"step_(\d+)$").match, os.listdir(output_dir / "checkpoints"))
                       if m)
        assert steps and steps[-1] < STEPS, sorted(os.listdir(output_dir / "checkpoints"))
        newest = steps[-1]
        assert "intact" in line and re.search(rf"step[ _]{newest}\b", line), (
            f"the error does not say that checkpoint step_{newest} is intact: {line!r}")
        weights = load_file(output_dir / "checkpoints" / f"step_{newest}" / "model.safetensors")
        assert weights and all(torch.isfinite(tensor).all() for tensor in weights.values())
        assert_notes_kept(output_dir)
        moved = tmp_path / "moved"
        shutil.copytree(output_dir, moved, symlinks=True)

    resumed = pretrain(moved, *RESUME, tmp_path=tmp_path)
    assert_completed(resumed)
    assert_same_weights(reference, moved)
    assert_notes_kept(moved)


# ---------------------------------------------------------------- a Hub that never answers


def test_silent_hub_ends_in_bounded_time_with_the_model_kept_locally(tmp_path):
    from tests.test_hub import assert_token_nowhere

    token = "hf_silent" + os.urandom(16).hex()
    output_dir = output_with_notes(tmp_path / "model")
    with silent_server() as server:
        env = {k: v for k, v in pretrain_env(tmp_path).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))}
        env.update(HF_ENDPOINT=server.url, HF_TOKEN=token, HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0",
                   HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        start = time.monotonic()
        try:
            result = pretrain(output_dir, "--push_to_hub", "--hub_model_id", "me/tiny", "--hub_timeout", 10,
                              "--checkpointing_steps", 2, tmp_path=tmp_path, env=env, timeout=150)
        except subprocess.TimeoutExpired:
            pytest.fail("training/pretrain.py still waited on a silent Hub after 150 s")
        elapsed = time.monotonic() - start
        connections = server.connections

    assert result.returncode == 1 and "Traceback" not in result.stderr, describe(result)  # as finetune.py
    assert connections >= 1, "the run never reached the (silent) Hub: HF_ENDPOINT was not used"
    assert elapsed < 120, f"{elapsed:.0f} s on a Hub that never answers"
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "config.json").is_file()
    assert re.search(r"not pushed", result.stdout + result.stderr, re.IGNORECASE), describe(result)
    assert_notes_kept(output_dir)
    assert_token_nowhere(token, [tmp_path], [result.stdout, result.stderr])


def test_finetune_killed_while_saving_leaves_the_previous_model_whole(tmp_path):
    """A second fine-tune replacing the first (--overwrite_output_dir), killed while it saves: first when its weights
    are written (the folder still holds the first run's files, byte for byte), then after two of its files were moved
    in (the new weights beside the first run's config: the folder still loads); a third run then saves completely,
    leaving no staging folder."""
    from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
    from tests.test_finetune import FINETUNE, QUICK, prompt_records, write_jsonl

    build_tiny_model(vocab_size=320).save_pretrained(tmp_path / "base")
    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", prompt_records(16))
    tuned = tmp_path / "tuned"
    command = ["--model_name_or_path", "base", "--train_file", "train.jsonl", "--output_dir", "tuned", *QUICK]
    again = [*command, "--learning_rate", "1e-3", "--overwrite_output_dir"]  # weights that differ from the first's
    files = lambda: {path.name: path.read_bytes() for path in tuned.iterdir()  # noqa: E731
                     if path.is_file() and path.name != ".lock"}  # the model's files, not the run's lock

    first = subprocess.run([sys.executable, str(FINETUNE), *command], cwd=tmp_path, env=pretrain_env(tmp_path),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, describe(first)
    saved = files()
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(saved)

    killed = run_killed_at(again, env=pretrain_env(tmp_path), cwd=tmp_path, function="safetensors.torch.save_file",
                           match="model.safetensors", when="after", script=FINETUNE)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    assert files() == saved, "the killed save changed the folder's model"

    killed = run_killed_at(again, env=pretrain_env(tmp_path), cwd=tmp_path, function=MOVES, match=STAGING, nth=2,
                           when="after", script=FINETUNE)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    assert files()["config.json"] == saved["config.json"], "the config is moved in last"
    assert files()["model.safetensors"] != saved["model.safetensors"], "the weights are moved in first"
    assert AutoModelForCausalLM.from_pretrained(tuned).config.model_type == "tinytx"  # a kill mid-save: still loads

    last = subprocess.run([sys.executable, str(FINETUNE), *again], cwd=tmp_path, env=pretrain_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, describe(last)
    assert files()["model.safetensors"] != saved["model.safetensors"]
    assert AutoModelForCausalLM.from_pretrained(tuned).config.model_type == "tinytx"
    assert not (tuned / STAGING).exists(), "staging folder left behind"


def test_silent_hub_bounds_the_finetune_upload_too(tmp_path):
    """training/finetune.py's one upload at the end waits at most --hub_timeout; the fine-tuned model stays on disk."""
    from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
    from tests.test_finetune import FINETUNE, QUICK, prompt_records, write_jsonl

    build_tiny_model(vocab_size=320).save_pretrained(tmp_path / "base")
    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", prompt_records(16))
    with silent_server() as server:
        env = {k: v for k, v in pretrain_env(tmp_path).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))}
        env.update(HF_ENDPOINT=server.url, HF_TOKEN="hf_silent" + os.urandom(8).hex(), HF_HUB_OFFLINE="0",
                   TRANSFORMERS_OFFLINE="0", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        command = [sys.executable, str(FINETUNE), "--model_name_or_path", "base", "--train_file", "train.jsonl",
                   "--output_dir", "tuned", "--push_to_hub", "--hub_model_id", "me/tuned", "--hub_timeout", "5",
                   *QUICK]
        start = time.monotonic()
        try:
            result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
        except subprocess.TimeoutExpired:
            pytest.fail("training/finetune.py still waited on a silent Hub after 150 s")
        elapsed = time.monotonic() - start
        connections = server.connections

    assert result.returncode == 1, describe(result)  # the push was asked for and did not happen: not a success
    assert connections >= 1, "the run never reached the (silent) Hub: HF_ENDPOINT was not used"
    assert elapsed < 120, f"{elapsed:.0f} s on a Hub that never answers"
    assert "did not finish within 5 s" in result.stdout and "was NOT pushed" in result.stderr, describe(result)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tuned")  # complete on disk
    assert model.config.model_type == "tinytx"


# ---------------------------------------------------------------- random kills


def test_kill_campaign_quick(tmp_path):
    """Two trials per command (pretrain, finetune, convert): a SIGKILL at a random time or an exact call, and a
    SIGTERM mid-training; convert also publishes over a model of another shape and over planted links, killed at a
    move. Every rerun ends bit for bit on the straight run, nothing is lost or written through a link, and every
    stop signal keeps its promise (a stop line and exit 128 + signal, or a finished run)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.kill_campaign", "--quick", "--out", str(tmp_path / "results")],
        cwd=REPO_ROOT, env=pretrain_env(tmp_path), capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, describe(result)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "kill_campaign" and summary["mode"] == "quick"
    assert summary["commands"] == ["pretrain", "finetune", "convert"], summary["commands"]
    for command, counts in summary["per_command"].items():
        tried = 4 if command == "convert" else 2  # convert: also a publish of another shape, and planted links
        assert counts["tried"] == tried and counts["lost"] == 0 and counts["bit_for_bit"] == tried, (command, counts)
        assert f"{command}: {tried} tried, {tried} resumed bit for bit, 0 lost" in result.stdout
    convert = summary["per_command"]["convert"]
    assert convert["shape_trials"] == 1 and convert["link_trials"] == 1 and convert["written_through_links"] == 0
    assert "planted links: 1 trials, 0 written through" in result.stdout
    assert "overall: 8 tried, 8 resumed bit for bit, 0 lost; 0 written through a planted link" in result.stdout
    failed = [trial for trial in summary["trials"] if not trial["equal"] or trial["lost"] or trial["error"]]
    assert not failed, json.dumps(failed, indent=1)
    # every SIGKILL landed (--quick draws only moments every run reaches), every stop signal kept its promise
    assert all(trial["killed"] for trial in summary["trials"] if trial["stop"] is None), summary["trials"]
    assert summary["signal_trials"] == 2 and summary["stop_promises_kept"] == 2, summary["stops"]
    assert not (tmp_path / "results").exists()  # --quick writes no results
