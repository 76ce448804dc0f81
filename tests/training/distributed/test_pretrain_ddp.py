"""Data parallelism on CPU: `torchrun --nproc_per_node 2` really trains as two cooperating processes."""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.tiny import LAUNCH, pretrain_env


pytestmark = pytest.mark.deep

STEPS = 6
TOLERANCE = 1e-5  # two processes average their gradients in another order: float32 rounding, not bit for bit
# metrics.jsonl rounds to 5 decimals: values 1e-7 apart may print 1e-5 apart
LOGGED_LOSS_TOLERANCE = 1e-5 + 1e-9


def test_two_processes_match_one_process_with_the_same_global_batch(run_pretrain, tmp_path):
    # tests/helpers/launch.py hashes each rank's weights at end_training and marks whether its shutdown ran.
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", LAUNCH,
        "--hash-weights", str(tmp_path / "ddp_checksum"), "--mark-at-exit", str(tmp_path / "shutdown"),
    ]
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    # --max_eval_batches counts batches over all processes: 8 of 8 blocks (2 ranks)
    # or of 16 (1 process) hold all 27.
    common = ["--max_train_steps", STEPS, "--num_probes_per_kind", 0, "--num_samples", 0, "--eval_steps", 3,
              "--max_eval_batches", 8]
    # No ACCELERATE_USE_CPU in the environment: the script itself must ask
    # Accelerate for CPU data parallelism.
    env = pretrain_env(tmp_path, OMP_NUM_THREADS="1")
    env.pop("ACCELERATE_USE_CPU", None)
    ddp = run_pretrain(
        "--output_dir", ddp_dir, "--per_device_train_batch_size", 8, "--per_device_eval_batch_size", 8,
        *common, env=env, launcher=torchrun,
    )
    single = run_pretrain(
        "--output_dir", single_dir, "--per_device_train_batch_size", 16, "--per_device_eval_batch_size", 16,
        *common, env=pretrain_env(tmp_path, OMP_NUM_THREADS="1"),
    )

    assert "2 process(es) on cpu" in ddp.stdout and "DistributedType.MULTI_CPU" in ddp.stdout
    ranks = [json.loads((tmp_path / f"ddp_checksum.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(rank["num_processes"] == 2 for rank in ranks)
    assert ranks[0]["sha256"] == ranks[1]["sha256"], "the two processes hold different weights"
    # A finished rank leaves without the interpreter's shutdown, where gloo's worker threads could abort it.
    assert not list(tmp_path.glob("shutdown.rank*"))

    ddp_weights, single_weights = load_file(ddp_dir / "model.safetensors"), load_file(
        single_dir / "model.safetensors"
    )
    assert ddp_weights.keys() == single_weights.keys()
    max_diff = max((ddp_weights[k] - single_weights[k]).abs().max().item() for k in ddp_weights)
    print(f"max |ddp - single| after {STEPS} steps: {max_diff:.3e}")
    assert max_diff < TOLERANCE
    # Same global batch: both runs logged the same number of tokens per step.
    ddp_rows, single_rows = (
        [row for row in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if "loss" in row]
        for folder in (ddp_dir, single_dir)
    )
    assert [r["tokens"] for r in ddp_rows] == [r["tokens"] for r in single_rows]
    ddp_losses = torch.tensor([r["loss"] for r in ddp_rows])
    assert torch.isfinite(ddp_losses).all() and ddp_losses[-1] < ddp_losses[0]  # it trained, not just agreed
    assert_same_numbers(ddp_dir, single_dir, single.stdout)


def assert_same_numbers(ddp_dir, single_dir, single_stdout):
    """2 ranks log and write into the card the 1-process run's figures (27
    validation blocks, each counted once)."""
    assert "27 validation blocks" in single_stdout  # 27 = 16 + 11: the 2-rank evaluation pads its last batch
    ddp_rows, single_rows = (
        [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for folder in (ddp_dir, single_dir)
    )
    pairs = list(zip(ddp_rows, single_rows, strict=True))
    loss_diff = max(abs(a["loss"] - b["loss"]) for a, b in pairs if "loss" in a)
    evaluations = [(a, b) for a, b in pairs if "eval_loss" in a]
    assert [a["step"] for a, _ in evaluations] == [3, STEPS]
    eval_diff = max(abs(a[key] - b[key]) for a, b in evaluations for key in ("eval_loss", "bits_per_byte"))
    perplexity_diff = max(abs(a["perplexity"] / b["perplexity"] - 1) for a, b in evaluations)
    print(f"2 ranks vs 1 process: training loss {loss_diff:.2e}, eval loss and bits/byte {eval_diff:.2e}, "
          f"perplexity (relative) {perplexity_diff:.2e}")
    assert loss_diff <= LOGGED_LOSS_TOLERANCE and eval_diff < TOLERANCE and perplexity_diff < TOLERANCE
    assert all(a["eval_tokens"] == b["eval_tokens"] == 27 * 63 for a, b in evaluations)
    card_lines = [[line for line in (folder / "README.md").read_text().splitlines()
                   if line.startswith(("On ", "| Validation loss", "| Perplexity", "| Bits per byte"))]
                  for folder in (ddp_dir, single_dir)]
    assert len(card_lines[0]) == 4 and card_lines[0] == card_lines[1]


def test_two_processes_on_one_clock_with_muon_stay_identical(run_pretrain, tmp_path):
    """Each process's clock differs a little: they agree on one, else their rates
    drift and one may stop first."""
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", LAUNCH,
        "--hash-weights", str(tmp_path / "clock_checksum"),
    ]
    out = tmp_path / "clock"
    result = run_pretrain("--output_dir", out, "--optimizer", "muon", "--max_train_seconds", 4,
                          "--eval_steps", 10**6, "--num_probes_per_kind", 0, "--num_samples", 0,
                          env=pretrain_env(tmp_path, OMP_NUM_THREADS="1"), launcher=torchrun)
    assert "runs on the clock" in result.stdout
    ranks = [json.loads((tmp_path / f"clock_checksum.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["sha256"] == ranks[1]["sha256"], "the two processes hold different weights"
    train = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]
    assert len(train) >= 3 and train[-1]["loss"] < train[0]["loss"]
    assert train[-1]["lr"] < 0.5 * 3e-3  # the schedule ran down on the clock
