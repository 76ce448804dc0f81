"""Preemption, from outside: SIGTERM (what SLURM and Kubernetes send before a kill) and SIGINT (Ctrl-C), sent by the
test to a running training/pretrain.py with the default flags, one process or two ranks under torchrun. The run saves a
checkpoint at the next step boundary, exits 128 + the signal's number with one line saying how to resume, exports
nothing, and the resumed run ends bit for bit equal to an uninterrupted one. Also: a torn line in metrics.jsonl (what
a full disk leaves mid-append), written into a stopped run's folder before it resumes."""

import json
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, assert_same_weights, pretrain_env


pytestmark = pytest.mark.deep

PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
# 60 steps of ~20 ms: a signal sent at the first progress bar lands mid-run with steps to spare.
STEPS = 60
FLAGS = [*TINY_PRETRAIN_ARGS, "--max_train_steps", str(STEPS), "--num_probes_per_kind", "0", "--num_samples", "0"]
RESUME = ["--resume_from_checkpoint", "latest"]
TRAINING = r"^train:.*\| *[1-9]\d*/"  # the progress bar after a step (not "Tokenizing train:")
STOP_LINE = re.compile(rf"^pretrain\.py: stopped at step (\d+) of {STEPS} by (SIG\w+); checkpoint step_\1 is saved, "
                       r"nothing was exported: resume with the same command and --resume_from_checkpoint latest\.$",
                       re.MULTILINE)


def run_signalled(command, signum, pattern: str, env, cwd, timeout=300) -> subprocess.CompletedProcess:
    """Runs `command`, sends it `signum` once a line of its output (a line ends at \\n or \\r) matches `pattern`, and
    waits for it to end. The output is stdout and stderr together."""
    process = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    chunks, regex = [], re.compile(pattern)

    def read():
        pending, sent = b"", False
        for chunk in iter(lambda: process.stdout.read1(65536), b""):
            chunks.append(chunk)
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)
            if not sent and any(regex.search(line.decode(errors="replace")) for line in lines):
                process.send_signal(signum)
                sent = True

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
        reader.join(timeout=10)
    return subprocess.CompletedProcess(command, process.returncode, b"".join(chunks).decode(errors="replace"), "")


def run(command, env, cwd) -> subprocess.CompletedProcess:
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr
    return result


def training_steps(folder) -> list[int]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert len([row for row in rows if row.get("final") and "eval_loss" in row]) == 1
    return [row["step"] for row in rows if "loss" in row]


def training_steps_logged(folder) -> list[int]:
    return [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


def assert_stopped(result, signum, folder) -> int:
    """The stopped run's promises: status 128 + signal, the one line, a checkpoint of that step, no model exported."""
    output = result.stdout
    assert result.returncode == 128 + signum, f"returncode {result.returncode}\n{output[-4000:]}"
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-4000:]
    lines = STOP_LINE.findall(output)
    assert len(lines) == 1, output[-4000:]
    step, name = int(lines[0][0]), lines[0][1]
    assert name == signal.Signals(signum).name and 1 <= step < STEPS
    assert (folder / "checkpoints" / f"step_{step}" / "checksums.json").is_file()
    assert not (folder / "model.safetensors").exists() and not (folder / "config.json").exists()
    return step


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight")
    run([sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(tmp / "out")], pretrain_env(tmp), tmp)
    return tmp / "out"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_saves_a_checkpoint_and_the_resume_ends_bit_for_bit(straight, tmp_path, signum):
    out = tmp_path / "out"
    command = [sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(out)]
    stopped = run_signalled(command, signum, TRAINING, pretrain_env(tmp_path), tmp_path)
    step = assert_stopped(stopped, signum, out)
    assert training_steps_logged(out) == list(range(1, step + 1))
    if signum == signal.SIGTERM:  # a full disk mid-append tears the last line: the resume drops it and says so
        with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write('{"step": %d, "loss": 4.1' % (step + 1))

    resumed = run([*command, *RESUME], pretrain_env(tmp_path), tmp_path)
    assert f"Resumed from {out / 'checkpoints' / f'step_{step}'} at step {step}" in resumed.stdout
    torn = [line for line in resumed.stdout.splitlines() if "torn last line" in line]
    assert len(torn) == (1 if signum == signal.SIGTERM else 0), resumed.stdout[-3000:]
    if torn:
        assert f"line {step + 1} of {out / 'metrics.jsonl'}" in torn[0]
    assert_same_weights(straight, out)
    assert training_steps(out) == list(range(1, STEPS + 1))  # every step once, the final evaluation once


def test_a_stop_signal_before_training_ends_the_run_at_once_with_a_line(tmp_path):
    command = [sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(tmp_path / "out")]
    stopped = run_signalled(command, signal.SIGTERM, r"^Training a byte-level BPE tokenizer", pretrain_env(tmp_path),
                            tmp_path)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout
    assert ("pretrain.py: stopped by SIGTERM before training started; resume with the same command and "
            "--resume_from_checkpoint latest.") in stopped.stdout.splitlines()


def test_a_damaged_line_inside_metrics_is_named_in_one_line(straight, tmp_path):
    """Only an append can tear a line, and only the last: a line before it that is not JSON is damage the resume must
    not guess about. The run stops with the file and the line named, before anything is trained or exported."""
    out = tmp_path / "out"
    shutil.copytree(straight, out)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"
    (out / "metrics.jsonl").write_text("".join(lines))
    exported = (out / "model.safetensors").read_bytes()
    result = subprocess.run([sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(out), *RESUME],
                            env=pretrain_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("pretrain.py: error:")]
    assert len(errors) == 1 and f"{out / 'metrics.jsonl'} line 3 is not a metrics row" in errors[0], errors
    assert (out / "model.safetensors").read_bytes() == exported


def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_the_resume_ends_bit_for_bit(tmp_path):
    """torchrun forwards SIGTERM to each rank (then SIGKILLs after --shutdown_timeout, 30 s): the ranks may get it a
    step apart, agree on one step in the step's all-reduce, save one checkpoint together, and stop. torchrun itself
    then exits 1 with its own SignalException; the run's line is rank 0's."""
    env = pretrain_env(tmp_path, OMP_NUM_THREADS="1")
    command = [*TORCHRUN, PRETRAIN, *FLAGS, "--per_device_train_batch_size", "4"]
    run([*command, "--output_dir", str(tmp_path / "straight")], env, tmp_path)
    out = tmp_path / "out"
    stopped = run_signalled([*command, "--output_dir", str(out)], signal.SIGTERM, TRAINING, env, tmp_path)
    assert stopped.returncode == 1, stopped.stdout[-4000:]  # torchrun's status after a signal
    lines = STOP_LINE.findall(stopped.stdout)
    assert len(lines) == 1 and lines[0][1] == "SIGTERM", stopped.stdout[-4000:]
    step = int(lines[0][0])
    assert (out / "checkpoints" / f"step_{step}" / "checksums.json").is_file()
    assert not (out / "model.safetensors").exists()

    run([*command, "--output_dir", str(out), *RESUME], env, tmp_path)
    assert_same_weights(tmp_path / "straight", out)
    assert training_steps(out) == list(range(1, STEPS + 1))
