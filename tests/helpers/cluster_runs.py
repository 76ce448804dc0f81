"""The run every cluster test trains, one process training it straight through, and the comparison every
launch must pass: equal weights, the same training loss at every step, the same final evaluation."""

import json
import os
import socket
import subprocess
import sys

from safetensors.torch import load_file

from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env


STEPS = 120  # ~21 steps an epoch: five epoch boundaries
FLAGS = [*TINY_PRETRAIN_ARGS, "--num_train_documents", "100", "--total_batch_size", "16", "--max_train_steps",
         str(STEPS), "--checkpointing_steps", "20", "--eval_steps", "1000", "--num_probes_per_kind", "0",
         "--num_samples", "0", "--learning_rate", "3e-3"]  # the rate the tolerances here were measured at
PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tmp_path, **extra):
    """Offline, one thread a process, with this interpreter's `python` (and `PATH`, when given) first."""
    path = os.pathsep.join([*filter(None, [extra.pop("PATH", None)]), os.path.dirname(sys.executable),
                            os.environ["PATH"]])
    return pretrain_env(tmp_path, OMP_NUM_THREADS="1", **{**extra, "PATH": path})


def start(command, tmp_path, **env):
    return subprocess.Popen(
        command, cwd=tmp_path, env=env_for(tmp_path, **env), text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )


def finish(process, timeout=300) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def run(command, tmp_path, timeout=300, **env) -> tuple[int, str]:
    return finish(start(command, tmp_path, **env), timeout)


def losses(folder) -> dict[int, float]:
    """step -> training loss, the last launch's value where a resumed run logged a step twice."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def assert_equal_runs(folder, straight, tolerance=0.0):
    weights, reference = load_file(folder / "model.safetensors"), load_file(straight / "model.safetensors")
    difference = max((weights[name] - reference[name]).abs().max().item() for name in reference)
    assert difference <= tolerance, f"max |weights - straight| = {difference:.3e}"
    mine, theirs = losses(folder), losses(straight)
    assert sorted(mine) == list(range(1, STEPS + 1))
    logged = 0.0 if tolerance == 0 else 1.0001e-5  # the log keeps 5 decimals: one step of its rounding
    assert max(abs(mine[step] - theirs[step]) for step in theirs) <= logged
    final = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    reference_final = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()][-1]
    assert abs(final["eval_loss"] - reference_final["eval_loss"]) <= 1e-5


def train_straight(folder):
    """One process, straight through: 16 blocks a step as 2 accumulated micro-batches of 8."""
    code, output = run([sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder)], folder.parent)
    assert code == 0, output[-3000:]
    return folder
