"""The run plans itself (training/plan/): the plan is a function of the text, the budget and the speeds; the
user's flags win; it is printed, recorded in the card, training_args.json and every checkpoint; a resume reads
it back instead of measuring again; --plan_only writes nothing."""

import json
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hf_tinytx_training.plan import choose
from hf_tinytx_training.plan.ladder import LADDER, VOCAB
from tests.helpers.faults import KILL_MARK, run_killed_at
from tests.helpers.tiny import REPO_ROOT, pretrain_env


PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
# tokens/s a process trains each size at: a made-up machine, ten times faster for the small sizes
SPEEDS = {size.name: 2e6 / size.parameters(VOCAB) ** 0.8 for size in LADDER}


def words_text(paragraphs: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(300)]
    return "\n\n".join(" ".join(rng.choice(vocabulary) for _ in range(60)) for _ in range(paragraphs)) + "\n"


def test_the_plan_is_a_function_of_text_budget_and_speeds():
    first = choose.make_plan(4e5, 160.0, None, SPEEDS, 1, frozenset())
    assert first == choose.make_plan(4e5, 160.0, None, SPEEDS, 1, frozenset())
    assert first.tokens == pytest.approx(SPEEDS[first.size] * 160.0)
    assert first.settings["max_train_seconds"] == 160.0
    assert first.settings["hidden_size"] == next(s for s in LADDER if s.name == first.size).hidden
    # twice the machine: a size at least as large; a text too small for any but the smallest: the smallest
    faster = choose.make_plan(4e5, 160.0, None, {k: 2 * v for k, v in SPEEDS.items()}, 1, frozenset())
    names = [size.name for size in LADDER]
    assert names.index(faster.size) >= names.index(first.size)
    assert choose.make_plan(100.0, 160.0, None, SPEEDS, 1, frozenset()).size == LADDER[0].name


def test_steps_the_user_gave_plan_without_measuring():
    plan = choose.make_plan(4e5, None, 2048 * 50, None, 1, frozenset({"max_train_steps"}))
    assert plan.tokens == 2048 * 50 and plan.seconds is None and plan.tokens_per_second is None
    assert "max_train_seconds" not in plan.settings
    assert "tokens/s" not in plan.line()


def test_the_users_flags_win():
    explicit = frozenset({"vocab_size", "weight_decay", "learning_rate", "max_train_seconds"})
    plan = choose.make_plan(4e5, 60.0, None, SPEEDS, 1, explicit)
    assert not explicit & set(plan.settings)
    model = SimpleNamespace(vocab_size=4096, hidden_size=None, model_preset="micro", intermediate_size=None,
                            num_hidden_layers=None, num_attention_heads=None, num_key_value_heads=None)
    train = SimpleNamespace(weight_decay=0.3, learning_rate=1e-3, muon_learning_rate=None, num_warmup_steps=5,
                            max_train_seconds=60.0)
    choose.apply(plan, explicit, model, SimpleNamespace(), train)
    assert (model.vocab_size, train.weight_decay, train.learning_rate) == (4096, 0.3, 1e-3)
    assert model.hidden_size is not None and train.num_warmup_steps == 30
    # a recorded plan (a resume) sets every flag it holds but those the user gives now
    recorded = choose.make_plan(4e5, 60.0, None, SPEEDS, 1, frozenset())
    train.learning_rate = 1e-3
    choose.apply(recorded, frozenset({"learning_rate"}), model, SimpleNamespace(), train)
    assert (train.learning_rate, train.weight_decay) == (1e-3, recorded.settings["weight_decay"])


def test_without_seconds_or_steps_a_planned_run_takes_the_default_budget():
    train = SimpleNamespace(per_device_train_batch_size=16, gradient_accumulation_steps=1,
                            max_train_steps=None, max_train_tokens=None, max_train_seconds=0.0)
    data = SimpleNamespace(block_size=128)
    assert choose.budget(train, data, 1) == (choose.DEFAULT_SECONDS, None) == (300.0, None)
    train.max_train_steps = 10
    assert choose.budget(train, data, 2) == (None, 10 * 16 * 2 * 128)


def test_a_plan_from_another_version_is_refused_in_one_line():
    from hf_tinytx_training.errors import UserInputError

    with pytest.raises(UserInputError, match="another version of hf_tinytx"):
        choose.from_dict({"size": "huge", "unknown_field": 1})
    # a checkpoint (from the Hub, say) whose plan would set a flag no plan sets
    planted = choose.make_plan(4e5, 60.0, None, SPEEDS, 1, frozenset()).to_dict()
    assert choose.from_dict(planted).settings == planted["settings"]
    planted["settings"] = {**planted["settings"], "output_dir": "/somewhere/else"}
    with pytest.raises(UserInputError, match="sets flags no plan sets"):
        choose.from_dict(planted)


def run(args, tmp_path, **kwargs):
    return subprocess.run([sys.executable, PRETRAIN, *map(str, args)], cwd=tmp_path,
                          env=pretrain_env(tmp_path), capture_output=True, text=True, timeout=600, **kwargs)


def plan_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("Plan: "))


def test_plan_only_prints_the_plan_and_writes_nothing(tmp_path):
    (tmp_path / "text.txt").write_text(words_text(200))
    result = run(["--train_file", "text.txt", "--output_dir", "out", "--max_train_seconds", "30",
                  "--plan_only"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    line = plan_line(result.stdout)
    assert "tokens/s measured" in line and "passes over" in line and "predicted validation loss" in line
    assert not (tmp_path / "out").exists()


def test_a_planned_run_records_its_plan_and_a_resume_reads_it_back(tmp_path):
    """Planned on the clock (so the plan holds this machine's measured speed), killed after its first
    checkpoint, resumed: the resumed run prints the very same plan, measured speed included, instead of
    measuring again, and the card, training_args.json and the checkpoint hold it."""
    (tmp_path / "text.txt").write_text(words_text(200))
    args = ["--train_file", "text.txt", "--output_dir", "out", "--max_train_seconds", "4",
            "--checkpointing_steps", "1", "--eval_steps", "1000", "--num_probes_per_kind", "0",
            "--num_samples", "0"]
    killed = run_killed_at(args, env=pretrain_env(tmp_path), cwd=tmp_path,
                           function="os.replace", match="step_1", when="after")
    assert killed.stderr.strip().splitlines()[-1].startswith(KILL_MARK), killed.stderr[-3000:]
    first = plan_line(killed.stdout)
    state = json.loads((tmp_path / "out" / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    assert state["plan"]["size"] in first

    resumed = run([*args, "--resume_from_checkpoint", "latest"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert plan_line(resumed.stdout) == first
    assert "Resumed from" in resumed.stdout
    recorded = json.loads((tmp_path / "out" / "training_args.json").read_text())
    assert recorded["plan"] == state["plan"]
    assert recorded["hidden_size"] == state["plan"]["settings"]["hidden_size"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Planned for the text, the budget and the machine" in card and state["plan"]["size"] in card
