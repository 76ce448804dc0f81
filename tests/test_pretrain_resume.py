"""Checkpoints: a run killed while saving keeps its previous checkpoint, and resuming from it continues exactly."""

import dataclasses
import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.tiny import kill_after_call


STEPS = 8


def test_killed_during_checkpoint_then_resumed_matches_straight_run(run_pretrain, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_pretrain("--output_dir", straight, "--max_train_steps", STEPS)

    # Checkpoints every 2 steps; the process is killed (SIGKILL, from a wrapper around Accelerate's save_state) right
    # after the third save_state returns, while step 6's checkpoint is still under its temporary name.
    crashed = run_pretrain(
        "--output_dir", resumed, "--max_train_steps", STEPS, "--checkpointing_steps", 2,
        launcher=kill_after_call("accelerate.Accelerator.save_state", nth=3), check=False,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    checkpoints = resumed / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == [".tmp_step_6", "step_2", "step_4", "tokenizer"]
    assert not (resumed / "model.safetensors").exists()  # no final export from a crashed run
    # The previous checkpoint is complete: its weights load, and its state says where it stopped.
    weights = load_file(checkpoints / "step_4" / "model.safetensors")
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    assert json.loads((checkpoints / "step_4" / "trainer_state.json").read_text())["step"] == 4

    result = run_pretrain("--output_dir", resumed, "--max_train_steps", STEPS, "--checkpointing_steps", 2,
                          "--resume_from_checkpoint", "latest")
    assert "Resumed from" in result.stdout and "at step 4" in result.stdout

    straight_weights = load_file(straight / "model.safetensors")
    resumed_weights = load_file(resumed / "model.safetensors")
    assert straight_weights.keys() == resumed_weights.keys()
    for name, tensor in straight_weights.items():
        assert torch.equal(tensor, resumed_weights[name]), f"{name} differs after resuming"

    # Old checkpoints pruned to the last two, the stale temporary one replaced, every step logged exactly once.
    assert sorted(os.listdir(checkpoints)) == ["step_6", "step_8", "tokenizer"]
    assert [row["step"] for row in train_rows(resumed)] == list(range(1, STEPS + 1))

    # The two runs agree because they are seeded alike (--seed, default 42): the resumed one logged the same first
    # loss, and a run with another seed starts from other weights on other batches, so its first loss is another.
    reseeded = tmp_path / "reseeded"
    run_pretrain("--output_dir", reseeded, "--max_train_steps", 1, "--seed", 7)
    first_losses = [train_rows(folder)[0]["loss"] for folder in (straight, resumed, reseeded)]
    assert first_losses[0] == first_losses[1] != first_losses[2], first_losses

    # Resuming with another batch size could not replay the same data order: refused before any training.
    refused = run_pretrain("--output_dir", resumed, "--max_train_steps", 12, "--resume_from_checkpoint", "latest",
                           "--per_device_train_batch_size", 4, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "resume with the same --seed, --block_size and --total_batch_size (on any process count)" in refused.stderr
    assert sorted(os.listdir(checkpoints)) == ["step_6", "step_8", "tokenizer"]

    # A changed optimizer flag would be undone by the optimizer state the checkpoint holds (the weights would equal
    # the unchanged run's while the record said otherwise): refused, naming the flag and both values.
    for flag, value, was in (("--learning_rate", "1e-3", "0.003"), ("--weight_decay", "0.0", "0.1"),
                             ("--adam_beta2", "0.99", "0.95")):
        refused = run_pretrain("--output_dir", resumed, "--max_train_steps", 12, "--resume_from_checkpoint",
                               "latest", flag, value, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        line = refused.stderr.strip().splitlines()[-1]
        assert f"was trained with {flag} {was}, but this run has {flag} {float(value)}" in line, line
        assert f"resume with {flag} {was}, or start a new run" in line and "--init_from" in line, line
    assert sorted(os.listdir(checkpoints)) == ["step_6", "step_8", "tokenizer"]

    # The schedule's shape and length are read from the command line on resume, and applied: four more steps at the
    # constant rate after warm-up (the finished run had decayed on its cosine).
    result = run_pretrain("--output_dir", resumed, "--max_train_steps", 12, "--resume_from_checkpoint", "latest",
                          "--lr_scheduler_type", "constant_with_warmup", "--overwrite_output_dir")
    assert "at step 8" in result.stdout
    rows = train_rows(resumed)
    assert [row["step"] for row in rows] == list(range(1, 13))
    assert [row["lr"] for row in rows[8:]] == [pytest.approx(3e-3)] * 4, rows[8:]


def test_the_checkpoint_state_reads_back_and_one_without_a_field_is_refused_in_one_line(tmp_path):
    """trainer_state.json as pretrain.py has always written it reads back whole; one that lacks a field a resume needs
    (not written by pretrain.py) is one line naming the field, not a KeyError."""
    from hf_tinytx_training import checkpoints
    from hf_tinytx_training.errors import UserInputError

    signature = {"seed": 42, "block_size": 64, "global_batch": 8, "gradient_accumulation_steps": 1, "num_processes": 1}
    written = {"step": 6, "epoch": 1, "batch_in_epoch": 3, "run_signature": signature, "planned_steps": 8,
               "train_seconds": 2.5}
    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps(written))
    state = checkpoints.read_training_state(str(tmp_path))
    assert dataclasses.asdict(state) == written

    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps({"step": 6, "run_signature": signature}))
    with pytest.raises(UserInputError, match=r"has no epoch, batch_in_epoch: it is not a checkpoint of pretrain\.py"):
        checkpoints.read_training_state(str(tmp_path))


def train_rows(output_dir) -> list[dict]:
    """The run's logged training steps (metrics.jsonl also holds evaluation rows)."""
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "loss" in row]
