"""Pre-training you can trust, and its fast recipe: evaluation and recomputation change
nothing, a diverging run stops before NaN weights, Muon for the hidden matrices, a run planned
in seconds whose schedule ends on the clock."""

import copy
import json
import math
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from hf_tinytx import TinyTxForCausalLM
from hf_tinytx_training.distributed import sharding
from hf_tinytx_training.optim import optimizers
from hf_tinytx_training.optim.optimizers import (
    MuonWithAdamW,
    StackedMuon,
    make_optimizer,
    make_schedule,
    newton_schulz,
)
from hf_tinytx_training.optim.schedules import Clock
from hf_tinytx_training.pretrain_args import PretrainArguments
from tests.helpers.reference import error_line
from tests.helpers.tiny import assert_same_weights, build_tiny_config, kill_after_call, pretrain_env


pytestmark = pytest.mark.deep

QUIET = ["--num_probes_per_kind", 0, "--num_samples", 0]


def rows(folder):
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def train_rows(folder):
    return [row for row in rows(folder) if "loss" in row]


# ---- trust


def test_an_evaluation_that_reads_part_of_the_data_does_not_change_training(run_pretrain, tmp_path):
    """Once, with gradient accumulation, Accelerate stepped the optimizer on every
    micro-batch after an evaluation."""
    flags = ["--gradient_accumulation_steps", 2, "--per_device_train_batch_size", 4, "--max_eval_batches", 2,
             "--max_train_steps", 6, *QUIET]
    run_pretrain("--output_dir", tmp_path / "often", *flags, "--eval_steps", 2)
    run_pretrain("--output_dir", tmp_path / "never", *flags, "--eval_steps", 1000)
    assert_same_weights(tmp_path / "often", tmp_path / "never")
    steps = [r for r in rows(tmp_path / "often") if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows(tmp_path / "often") if "eval_loss" in r] == [2, 4, 6]  # 6: the final one
    # 2 micro-batches of 4 blocks of 64 tokens a step
    assert all(r["tokens"] == r["step"] * 8 * 64 for r in steps)


def test_gradient_checkpointing_trains_the_same_model(run_pretrain, tmp_path, reference_pretrain):
    """The same arithmetic, so the same weights, and no deprecation warning (the
    switch was renamed in 5.2x)."""
    result = run_pretrain(
        "--output_dir", tmp_path / "run", "--max_train_steps", 6, "--gradient_checkpointing", *QUIET
    )
    assert "checkpointing_enable` is deprecated" not in result.stderr
    assert_same_weights(tmp_path / "run", reference_pretrain.reference)


def test_a_diverging_run_stops_before_its_weights_turn_to_nan(run_pretrain, tmp_path):
    out = tmp_path / "run"
    result = run_pretrain("--output_dir", out, "--learning_rate", 1e30, "--max_train_steps", 6,
                          "--checkpointing_steps", 1, *QUIET, check=False)
    error = error_line(result, "pretrain", "Stopped at step", "nothing was exported", "--learning_rate")
    assert result.returncode == 1 and ("nan" in error or "inf" in error)
    assert not (out / "model.safetensors").exists()
    saved = sorted(os.listdir(out / "checkpoints"))
    for name in saved:
        if name.startswith("step_"):
            weights = load_file(out / "checkpoints" / name / "model.safetensors")
            assert all(torch.isfinite(t).all() for t in weights.values())


def test_a_clock_the_user_set_says_where_it_stopped_and_resuming_goes_on(run_pretrain, tmp_path):
    """Once a resume started with its seconds spent, took no step and exported the model as if finished."""
    out = tmp_path / "run"
    flags = ["--output_dir", out, "--max_train_steps", 500, "--max_train_seconds", 1, *QUIET]
    result = run_pretrain(*flags)
    final = [r for r in rows(out) if r.get("final") and "eval_loss" in r][0]
    assert final["stopped_by_clock"] and final["planned_steps"] == 500 and final["step"] < 500
    assert f"Stopped by the clock at step {final['step']} of 500 planned" in result.stdout
    assert f"stopped by the clock at step {final['step']} of 500 planned" in (out / "README.md").read_text()

    resumed = run_pretrain(*flags, "--resume_from_checkpoint", "latest")
    steps = [r["step"] for r in rows(out) if "loss" in r]
    # on from the step it stopped at
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > final["step"]
    again = [r for r in rows(out) if r.get("final") and "eval_loss" in r][-1]
    assert again["step"] == steps[-1]
    if again["step"] < 500:  # cut by the clock again: it says so again
        assert again["stopped_by_clock"]
        assert f"Stopped by the clock at step {again['step']} of 500 planned" in resumed.stdout


def test_a_half_written_tokenizer_is_named_when_a_resume_needs_it(run_pretrain, tmp_path):
    """A resume needs the ids trained; a fresh start (no checkpoint beside it) makes a new tokenizer."""
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
    error_line(result, "pretrain", str(tokenizer_dir), "no tokenizer files")


# ---- Muon


def muon_optimizer(seed=0):
    torch.manual_seed(seed)
    model = TinyTxForCausalLM(build_tiny_config(tie_word_embeddings=False))
    return model, make_optimizer(model, PretrainArguments(optimizer="muon", learning_rate=1e-2))


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    model, optimizer = muon_optimizer()
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(p): name for name, p in model.named_parameters()}
    on_muon = {names[id(p)] for group in optimizer.muon.param_groups for p in group["params"]}
    on_adamw = {names[id(p)] for group in optimizer.adamw.param_groups for p in group["params"]}
    assert on_muon == {name for name, p in model.named_parameters() if p.ndim == 2 and ".layers." in name}
    assert on_adamw == set(names.values()) - on_muon
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= on_adamw
    # Every group is also the wrapper's, so a schedule setting group["lr"] reaches both optimizers.
    assert len(optimizer.param_groups) == len(optimizer.muon.param_groups) + len(optimizer.adamw.param_groups)
    optimizer.param_groups[0]["lr"] = 0.5
    assert optimizer.muon.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_weight_decay_and_muon_learning_rate_reach_their_groups(optimizer):
    """Never decay on the norms' gains; without --muon_learning_rate Muon runs at --learning_rate."""
    model = TinyTxForCausalLM(build_tiny_config(tie_word_embeddings=False))
    names = {id(p): name for name, p in model.named_parameters()}
    for muon_lr, expected_muon_lr in ((None, 3e-3), (0.02, 0.02)):
        args = PretrainArguments(optimizer=optimizer, learning_rate=3e-3, weight_decay=0.25,
                                 muon_learning_rate=muon_lr)
        built = make_optimizer(model, args)
        muon_groups = built.muon.param_groups if optimizer == "muon" else []
        for group in built.param_groups:
            params = {names[id(p)] for p in group["params"]}
            matrices = all(model.get_parameter(name).ndim == 2 for name in params)
            assert group["weight_decay"] == (0.25 if matrices else 0.0), params
            on_muon = any(group is muon_group for muon_group in muon_groups)
            assert group["lr"] == (expected_muon_lr if on_muon else 3e-3), params
        assert sum(len(group["params"]) for group in built.param_groups) == len(names)


def test_stacked_muon_makes_torch_muons_update(monkeypatch):
    """Both in bf16, as torch's always is (ours is fp32 on a CPU without fast bf16: the next test)."""
    monkeypatch.setattr(optimizers, "iteration_dtype", lambda device_type: torch.bfloat16)
    shapes = [(32, 32), (32, 32), (88, 32), (32, 88), (88, 32)]
    generator = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(0.05 * torch.randn(shape, generator=generator)) for shape in shapes]
    torchs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    group = {"lr": 2e-2, "weight_decay": 0.5}
    stacked = StackedMuon([{"params": ours, **group}], momentum=0.95)
    reference = torch.optim.Muon([{"params": torchs, **group}], momentum=0.95, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):  # the momentum buffers carry over between steps
        before = [p.detach().clone() for p in ours]
        for a, b in zip(ours, torchs):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        stacked.step()
        reference.step()
        for a, b, old in zip(ours, torchs, before):
            ours_step, torch_step = a.detach() - old, b.detach() - old
            # bf16 inside both: equal to its rounding (a transposed or mis-scaled
            # update would be off by ~100%)
            assert (ours_step - torch_step).norm() <= 1e-2 * torch_step.norm()
    assert stacked.state_dict()["state"].keys() == reference.state_dict()["state"].keys()
    buffers = (stacked.state[ours[2]]["momentum_buffer"], reference.state[torchs[2]]["momentum_buffer"])
    torch.testing.assert_close(*buffers)


def test_newton_schulz_runs_in_bf16_only_where_bf16_is_fast():
    """On a CPU without AVX-512 or AMX a bf16 matmul takes a slow path (~40x
    fp32's): there the iteration is fp32."""
    expected = torch.bfloat16 if sharding.cpu_runs_bf16_fast() else torch.float32
    assert newton_schulz(torch.randn(3, 8, 16), (3.4445, -4.775, 2.0315), 5, 1e-7).dtype == expected


def test_muon_state_round_trips_so_the_next_step_is_the_same():
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))

    def step(model, optimizer):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    model, optimizer = muon_optimizer()
    step(model, optimizer)
    saved_weights = {k: v.clone() for k, v in model.state_dict().items()}
    # what a checkpoint holds (the live one changes in place)
    saved_state = copy.deepcopy(optimizer.state_dict())
    assert saved_state["muon"]["state"] and saved_state["adamw"]["state"]  # momentum buffers and Adam moments
    step(model, optimizer)

    fresh_model, fresh = muon_optimizer(seed=1)
    fresh_model.load_state_dict(saved_weights)
    # as Accelerate does when it prepares an optimizer, and when it resumes
    fresh.load_state_dict(saved_state)
    # what a schedule does to the wrapper's groups
    fresh.param_groups[0]["lr"] = fresh.param_groups[-1]["lr"] = 0.25
    assert fresh.muon.param_groups[0]["lr"] == fresh.adamw.param_groups[-1]["lr"] == 0.25
    for group in fresh.param_groups:
        group["lr"] = 1e-2
    step(fresh_model, fresh)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, fresh_model.state_dict()[name]), name


def test_a_muon_run_killed_while_checkpointing_resumes_bit_for_bit(run_pretrain, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    flags = ["--optimizer", "muon", "--max_train_steps", 6, "--checkpointing_steps", 2, *QUIET]
    run_pretrain("--output_dir", straight, *flags)
    assert json.loads((straight / "training_args.json").read_text())["optimizer"] == "muon"
    crashed = run_pretrain("--output_dir", resumed, *flags, check=False,
                           launcher=kill_after_call("accelerate.Accelerator.save_state", nth=2))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    run_pretrain("--output_dir", resumed, *flags, "--resume_from_checkpoint", "latest")
    assert_same_weights(straight, resumed)
    first = train_rows(straight)
    assert first[-1]["loss"] < first[0]["loss"]


# ---- a run planned in seconds

BUDGET = 8.0
PEAK_LR = 5e-3  # pretrain.py's default --learning_rate


def cosine(progress):
    return 0.5 * (1 + math.cos(math.pi * progress))


def assert_each_rate_follows_the_clock(train, warmup: int = 2):
    """Each step's rate is the cosine of the seconds the clock had read before it: the logged rate of
    step i (the one step i+1 takes) is the cosine at step i-1's logged seconds (the clock and the log
    read one timestamp). Exact up to the log's rounding of seconds to 0.01, however fast or slow the
    machine (warmup: TINY_PRETRAIN_ARGS's)."""
    for earlier, row in zip(train, train[1:]):
        if row["step"] > warmup:
            expected = PEAK_LR * cosine(min(1.0, earlier["elapsed_seconds"] / BUDGET))
            assert abs(row["lr"] - expected) <= 1e-5 * PEAK_LR + PEAK_LR * math.pi / BUDGET * 0.005, (
                row, expected,
            )


def test_a_run_planned_in_seconds_ends_its_schedule_at_the_last_second(run_pretrain, tmp_path):
    out = tmp_path / "run"
    result = run_pretrain("--output_dir", out, "--max_train_seconds", BUDGET, "--eval_steps", 10**6, *QUIET)
    assert f"Training for {BUDGET:g} s" in result.stdout and "runs on the clock" in result.stdout
    assert "Stopped by the clock" not in result.stdout  # the clock is the plan here, not a cut
    train = train_rows(out)
    # It stopped at the first step past the budget (the log rounds seconds to 0.01).
    assert train[-2]["elapsed_seconds"] <= BUDGET + 0.005 <= train[-1]["elapsed_seconds"] + 0.01
    lrs = [row["lr"] for row in train]
    assert max(lrs) <= PEAK_LR and all(later <= earlier for earlier, later in zip(lrs[1:], lrs[2:]))
    assert_each_rate_follows_the_clock(train)
    final = [row for row in rows(out) if row.get("final") and "eval_loss" in row][0]
    assert "stopped_by_clock" not in final and (out / "model.safetensors").exists()
    card = (out / "README.md").read_text()
    assert f"the learning-rate schedule ran on the clock to `--max_train_seconds {BUDGET}`" in card


def test_a_run_planned_in_seconds_resumes_on_the_clock_it_had_used(run_pretrain, tmp_path):
    out = tmp_path / "run"
    flags = [
        "--output_dir", out, "--max_train_seconds", BUDGET, "--eval_steps", 10**6, "--checkpointing_steps", 1,
        *QUIET,
    ]
    # Killed as step 2 saves (two steps fit in the budget on any machine): step_1 is resumed.
    crashed = run_pretrain(
        *flags, check=False, launcher=kill_after_call("accelerate.Accelerator.save_state", nth=2)
    )
    assert crashed.returncode == -signal.SIGKILL, (
        "the budget ran out before step 2:\n" + crashed.stdout[-2000:]
    )
    state = json.loads((out / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    assert 0 < state["train_seconds"] < BUDGET
    assert state["train_seconds"] == pytest.approx(train_rows(out)[0]["elapsed_seconds"], abs=0.006)
    assert state["trained_seconds"] == state["train_seconds"] and state["launches"] == 1

    result = run_pretrain(*flags, "--resume_from_checkpoint", "latest")
    assert "Resumed from" in result.stdout and "at step 1" in result.stdout
    after = [row for row in train_rows(out) if row["step"] > 1]
    assert after[0]["step"] == 2
    # It trained for what the budget had left, on the clock it resumed.
    assert after[-2]["elapsed_seconds"] <= BUDGET + 0.006 <= after[-1]["elapsed_seconds"] + 0.012
    assert after[0]["elapsed_seconds"] > state["trained_seconds"]
    assert_each_rate_follows_the_clock(after)


# ---- torch.compile


def test_a_compiled_run_exports_the_plain_model(run_pretrain, tmp_path):
    """A torch.compile wrapper would have saved every name under "_orig_mod.",
    which from_pretrained ignores."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    # Training compiles once, evaluation once more; the probes and samples of many lengths must not (they once
    # did). One layer: a cold cache's C++ compiles are most of this test's minute.
    result = run_pretrain(
        "--output_dir", out, "--torch_compile", "--max_train_steps", 3, "--num_hidden_layers", 1,
        env={**pretrain_env(tmp_path), "TORCH_LOGS": "recompiles"},
    )
    assert result.stderr.count("Recompiling function") == 1, result.stderr[-3000:]
    assert "sample: " in result.stdout
    saved = load_file(out / "model.safetensors")
    assert not any(name.startswith("_orig_mod") for name in saved)
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    loaded = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name
    assert len(train_rows(out)) == 3


# ---- bf16 on a CPU


def test_a_bf16_run_on_cpu_trains_in_bf16_and_saves_fp32(run_pretrain, tmp_path):
    """The losses differ from fp32's by rounding; the weights and the export stay fp32."""
    fp32, bf16 = tmp_path / "fp32", tmp_path / "bf16"
    run_pretrain("--output_dir", fp32, "--max_train_steps", 3, *QUIET)
    result = run_pretrain("--output_dir", bf16, "--mixed_precision", "bf16", "--max_train_steps", 3, *QUIET)
    # Where oneDNN has no bf16 kernels (an AVX2-only CPU) the run says bf16 is
    # slow here and how to train faster.
    assert (sharding.slow_bf16("--mixed_precision bf16") in result.stdout) == (
        not sharding.cpu_runs_bf16_fast()
    )
    fp32_losses = [row["loss"] for row in train_rows(fp32)]
    bf16_losses = [row["loss"] for row in train_rows(bf16)]
    assert len(bf16_losses) == 3 and all(math.isfinite(loss) for loss in bf16_losses)
    assert bf16_losses[0] != fp32_losses[0] and abs(bf16_losses[0] - fp32_losses[0]) < 0.05
    assert {tensor.dtype for tensor in load_file(bf16 / "model.safetensors").values()} == {torch.float32}


@pytest.mark.parametrize("kind, expected", [
    ("cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p))),
    ("linear", lambda p: 1 - p),
    ("constant", lambda p: 1.0),
    ("constant_with_warmup", lambda p: 1.0),
    ("warmup_stable_decay", lambda p: min(1.0, (1 - p) / 0.3)),
])
def test_every_clock_shape_is_its_formula_of_the_time_spent_after_the_warmup(kind, expected):
    """Whatever the step count; warm-up is counted in steps (none for `constant`)."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    args = PretrainArguments(lr_scheduler_type=kind, num_warmup_steps=4)
    clock = Clock(budget_seconds=100.0, accelerator=None)
    schedule = make_schedule(optimizer, args, max_train_steps=None, num_processes=1, clock=clock)
    warmup = 0 if kind == "constant" else 4
    for step, seconds in enumerate([0.0, 1.0, 2.0, 10.0, 35.0, 50.0, 69.0, 71.0, 85.0, 99.0, 100.0, 130.0]):
        clock.seconds = seconds
        optimizer.step()  # no gradients: nothing moves; the order torch expects
        schedule.step()  # the rate of step `step + 1`, read after the clock says `seconds`
        ramp = min(1.0, (step + 2) / warmup) if warmup else 1.0
        assert math.isclose(optimizer.param_groups[0]["lr"], ramp * expected(min(1.0, seconds / 100.0)),
                            abs_tol=1e-12), (kind, step, seconds)
