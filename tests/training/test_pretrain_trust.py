"""A training run you can trust: nothing trains on wrong numbers, evaluation and recomputation change nothing, bad
input is refused before anything is written. Interrupted runs and damaged checkpoints: test_interruptions.py."""

import json
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, assert_same_weights, pretrain_env, run_side_by_side


pytestmark = pytest.mark.deep

PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
QUIET = ["--num_probes_per_kind", 0, "--num_samples", 0]


def rows(folder):
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def one_line_error(result, *words):
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("pretrain.py: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def test_an_evaluation_that_reads_part_of_the_data_does_not_change_training(run_pretrain, tmp_path):
    """With gradient accumulation, evaluating on a few batches mid-run once left Accelerate stepping the optimizer on
    every micro-batch. Evaluation must not change what is trained."""
    flags = ["--gradient_accumulation_steps", 2, "--per_device_train_batch_size", 4, "--max_eval_batches", 2,
             "--max_train_steps", 6, *QUIET]
    run_pretrain("--output_dir", tmp_path / "often", *flags, "--eval_steps", 2)
    run_pretrain("--output_dir", tmp_path / "never", *flags, "--eval_steps", 1000)
    assert_same_weights(tmp_path / "often", tmp_path / "never")
    steps = [r for r in rows(tmp_path / "often") if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows(tmp_path / "often") if "eval_loss" in r] == [2, 4, 6]  # 6: the final one
    assert all(r["tokens"] == r["step"] * 8 * 64 for r in steps)  # 2 micro-batches of 4 blocks of 64 tokens a step


def test_gradient_checkpointing_trains_the_same_model(run_pretrain, tmp_path, reference_pretrain):
    """--gradient_checkpointing recomputes each layer's activations in the backward pass: the same arithmetic, so the
    same weights bit for bit, with no deprecation warning from transformers (the switch was renamed in 5.2x)."""
    result = run_pretrain("--output_dir", tmp_path / "run", "--max_train_steps", 6, "--gradient_checkpointing", *QUIET)
    assert "checkpointing_enable` is deprecated" not in result.stderr
    assert_same_weights(tmp_path / "run", reference_pretrain.reference)


def test_a_diverging_run_stops_before_its_weights_turn_to_nan(run_pretrain, tmp_path):
    out = tmp_path / "run"
    result = run_pretrain("--output_dir", out, "--learning_rate", 1e30, "--max_train_steps", 6,
                          "--checkpointing_steps", 1, *QUIET, check=False)
    error = one_line_error(result, "Stopped at step", "nothing was exported", "--learning_rate")
    assert result.returncode == 1 and ("nan" in error or "inf" in error)
    assert not (out / "model.safetensors").exists()
    saved = sorted(os.listdir(out / "checkpoints"))
    for name in saved:
        if name.startswith("step_"):
            weights = load_file(out / "checkpoints" / name / "model.safetensors")
            assert all(torch.isfinite(t).all() for t in weights.values())


def test_a_clock_the_user_set_says_where_it_stopped_and_resuming_goes_on(run_pretrain, tmp_path):
    """A clock next to a step count bounds each launch: the same command with --resume_from_checkpoint latest trains
    on from where the clock stopped it (once, a resumed run started with its seconds already spent, took no step and
    exported the model as if finished)."""
    out = tmp_path / "run"
    flags = ["--output_dir", out, "--max_train_steps", 500, "--max_train_seconds", 1, *QUIET]
    result = run_pretrain(*flags)
    final = [r for r in rows(out) if r.get("final") and "eval_loss" in r][0]
    assert final["stopped_by_clock"] and final["planned_steps"] == 500 and final["step"] < 500
    assert f"Stopped by the clock at step {final['step']} of 500 planned" in result.stdout
    assert f"stopped by the clock at step {final['step']} of 500 planned" in (out / "README.md").read_text()

    resumed = run_pretrain(*flags, "--resume_from_checkpoint", "latest")
    steps = [r["step"] for r in rows(out) if "loss" in r]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > final["step"]  # on from the step it stopped at
    again = [r for r in rows(out) if r.get("final") and "eval_loss" in r][-1]
    assert again["step"] == steps[-1]
    if again["step"] < 500:  # cut by the clock again: it says so again
        assert again["stopped_by_clock"]
        assert f"Stopped by the clock at step {again['step']} of 500 planned" in resumed.stdout


BAD_INPUTS = {
    "negative learning rate": (["--learning_rate", "-1"], "--learning_rate"),
    "infinite learning rate": (["--learning_rate", "inf"], "--learning_rate"),
    "nan weight decay": (["--weight_decay", "nan"], "--weight_decay"),
    "nan clipping": (["--max_grad_norm", "nan"], "--max_grad_norm"),
    "beta2 above one": (["--adam_beta2", "2"], "--adam_beta2"),
    "unknown schedule": (["--lr_scheduler_type", "sideways"], "--lr_scheduler_type"),
    "schedule needing a metric": (["--lr_scheduler_type", "reduce_lr_on_plateau"], "--lr_scheduler_type"),
    "unknown attention": (["--attn_implementation", "magic"], "--attn_implementation"),
    "invalid hub id": (["--push_to_hub", "--hub_model_id", "no spaces/in ids/here"], "--hub_model_id"),
    "a model too large": (["--hidden_size", "65536", "--intermediate_size", "262144", "--num_hidden_layers", "64"],
                          "smaller"),
    "a config that is a list": (["--model_config", "{tmp}/list.json"], "list.json"),
    "broken JSON": (["--model_config", "{tmp}/broken.json"], "broken.json"),
    "a binary training file": (["--train_file", "{tmp}/binary.txt"], "binary.txt"),
    "a typo in a local --init_from": (["--init_from", "{tmp}/modle"], "no such folder"),
    # The output folder ({tmp}/out) inside the folder the run starts from: it would write where it reads.
    "an --init_from folder holding --output_dir": (["--init_from", "{tmp}"], "is inside --init_from"),
}


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory) -> dict:
    """{case: (its folder, its run)}: each case of BAD_INPUTS in a folder and process of its own, all started
    together."""
    runs = {}
    for case, (flags, _) in BAD_INPUTS.items():
        folder = tmp_path_factory.mktemp("bad_input")
        (folder / "list.json").write_text("[1, 2, 3]")
        (folder / "broken.json").write_text('{"hidden_size": 64,')
        (folder / "binary.txt").write_bytes(bytes(range(256)) * 64)
        flags = [flag.format(tmp=folder) for flag in flags]
        command = [sys.executable, PRETRAIN, *TINY_PRETRAIN_ARGS, "--output_dir", str(folder / "out"), *flags]
        runs[case] = command, folder, pretrain_env(folder)
    finished = run_side_by_side(runs)
    return {case: (folder, finished[case]) for case, (_, folder, _) in runs.items()}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_refused_in_one_line_before_anything_is_written(bad_input_runs, case):
    folder, result = bad_input_runs[case]
    assert result.returncode == 2
    one_line_error(result, BAD_INPUTS[case][1])
    assert not (folder / "out").exists()


def test_a_half_written_tokenizer_is_named_when_a_resume_needs_it(run_pretrain, tmp_path):
    """The run's saved tokenizer, damaged, is named when a checkpoint is resumed (its ids are the ones trained); with
    no checkpoint beside it (a start that died first) a fresh start makes a new one instead."""
    out = tmp_path / "out"
    tokenizer_dir = out / "checkpoints" / "tokenizer"
    tokenizer_dir.mkdir(parents=True)
    (tokenizer_dir / "special_tokens_map.json").write_text("{}")
    run_pretrain("--output_dir", out, "--resume_from_checkpoint", "latest", "--max_train_steps", 2, *QUIET)
    assert (tokenizer_dir / "tokenizer.json").is_file()  # replaced by the fresh start's

    for name in os.listdir(tokenizer_dir):
        if name != "special_tokens_map.json":
            os.unlink(tokenizer_dir / name)
    result = run_pretrain("--output_dir", out, "--resume_from_checkpoint", "latest", "--max_train_steps", 4,
                          check=False)
    one_line_error(result, str(tokenizer_dir), "no tokenizer files")
