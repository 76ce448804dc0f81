"""The plan: from the text's size, the time budget and this machine's speed, the size of the ladder the law
predicts best, with its vocabulary and recipe. `make_plan` is a pure function of those three, so the same
text, budget and speeds give the same plan; `apply` sets only the flags the user left out; a resume reads the
plan back from its checkpoint (`recorded`) instead of measuring again."""

import os
from dataclasses import asdict, dataclass

from hf_tinytx_training.data.files import matching_files
from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.plan import law
from hf_tinytx_training.plan.ladder import BLOCK, LADDER, RECIPE, VOCAB, by_name


DEFAULT_SECONDS = 300.0  # the budget of a planned run given neither seconds nor steps
# No size above this many parameters per token of text: the most the sweep measured (320x6 on 1 MB), past
# which the law would extrapolate blind (on a paragraph it would pick the largest size: all read it as often).
PARAMETERS_PER_TOKEN = 18.0
HEAVY_DECAY = 2.0  # passes over the text from which weight decay 1.0 beats 0.1 (shakespeare_sweep.txt)


@dataclass(frozen=True)
class Plan:
    size: str
    parameters: int
    vocab: int
    text_tokens: float | None  # the training text, estimated from its bytes (None: a Hub dataset, unknown)
    seconds: float | None  # the budget on the clock; None: the user's steps or tokens fix it
    tokens: float  # tokens the run is expected to train on
    tokens_per_second: float | None  # measured (or extrapolated) for this size on this machine
    predicted_loss: float  # nats per token, on a text like the sweep's
    settings: dict  # the flags the plan set (never one the user gave)
    mixed_precision: str = "no"  # this machine's choice (`precision`): a resume elsewhere may differ

    def summary(self) -> str:
        """What the plan chose and expects, in one sentence (the card's line)."""
        text = (f"{self.tokens / self.text_tokens:.1f} passes over ~{self.text_tokens / 1e6:.2f}M tokens"
                if self.text_tokens else "a text of unknown size")
        speed = (f" in {self.seconds:g} s at {self.tokens_per_second:,.0f} tokens/s measured"
                 if self.seconds else "")
        bits = self.predicted_loss / 0.6931471805599453 / law.BYTES_PER_TOKEN
        bf16 = ", bf16" if self.mixed_precision == "bf16" else ""
        return (f"Plan: {self.size} ({self.parameters / 1e6:.2f}M parameters{bf16}), "
                f"vocabulary {self.vocab:,}; "
                f"{self.tokens / 1e6:.2f}M tokens{speed} ({text}); predicted validation loss "
                f"{self.predicted_loss:.2f} ({bits:.2f} bits/byte on text like Tiny Shakespeare).")

    def line(self) -> str:
        """The summary as the run prints it, with what the user can do about it."""
        return f"{self.summary()} --plan_only prints this and stops; a size flag replaces it."

    def to_dict(self) -> dict:
        return asdict(self)


def precision() -> str:
    """bf16 where its matmuls are fast (a GPU that has it, a CPU with AVX-512 or AMX: ~1.3x the steps of fp32
    on Tiny Shakespeare at the same loss per step), else fp32. Decided before the accelerator starts."""
    import torch

    from hf_tinytx_training.distributed import sharding

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if not sharding.has_gpu() and sharding.cpu_runs_bf16_fast() else "no"


def text_tokens(data_args) -> float | None:
    """The training text in tokens, estimated from the files' bytes (less the share held out for validation
    when no --validation_file is given); None for a Hub dataset."""
    if not data_args.train_file:
        return None
    size = sum(os.path.getsize(path) for path in matching_files(data_args.train_file))
    if not data_args.validation_file:
        size *= 1 - data_args.validation_split_percentage / 100
    return max(size / law.BYTES_PER_TOKEN, 1.0)


def best_size(unique: float | None, tokens_of) -> tuple:
    """(size, tokens, predicted loss) of the size the law predicts lowest; `tokens_of(size)` is what the
    budget buys it. Sizes too large for the text are left out, the smallest never."""
    allowed = [size for size in LADDER
               if unique is None or size.parameters(VOCAB) <= PARAMETERS_PER_TOKEN * unique] or [LADDER[0]]
    scored = [(law.predicted_loss(size.name, size.parameters(VOCAB), tokens_of(size), unique), size)
              for size in allowed]
    loss, size = min(scored, key=lambda pair: pair[0])
    return size, tokens_of(size), loss


def make_plan(unique: float | None, seconds: float | None, fixed_tokens: float | None, speeds: dict | None,
              processes: int, explicit: frozenset, mixed_precision: str = "no") -> Plan:
    """The plan for a text of `unique` tokens and a budget of `seconds` (at `speeds` tokens/s a process) or
    of `fixed_tokens` (the user's steps)."""
    if fixed_tokens is not None:
        size, tokens, loss = best_size(unique, lambda size: fixed_tokens)
    else:
        size, tokens, loss = best_size(unique, lambda size: speeds[size.name] * processes * seconds)
    passes = tokens / unique if unique else 1.0
    settings = {**size.flags(), "vocab_size": VOCAB, **{k: v for k, v in RECIPE.items() if k != "optimizer"},
                "weight_decay": 1.0 if passes >= HEAVY_DECAY else 0.1}
    if fixed_tokens is None and "max_train_seconds" not in explicit:
        settings["max_train_seconds"] = seconds
    settings = {name: value for name, value in settings.items() if name not in explicit}
    vocab = settings.get("vocab_size", VOCAB)
    return Plan(size.name, size.parameters(vocab), vocab, unique,
                seconds if fixed_tokens is None else None, tokens,
                speeds[size.name] * processes if speeds else None, loss, settings, mixed_precision)


def budget(train_args, data_args, processes: int) -> tuple[float | None, float | None]:
    """(seconds, fixed tokens): the user's steps or tokens if given, else their seconds or DEFAULT_SECONDS."""
    per_step = train_args.per_device_train_batch_size * train_args.gradient_accumulation_steps * processes
    if train_args.max_train_steps:
        return None, float(train_args.max_train_steps * per_step * data_args.block_size)
    if train_args.max_train_tokens:
        return None, float(train_args.max_train_tokens)
    return train_args.max_train_seconds or DEFAULT_SECONDS, None


def plan_run(model_args, data_args, train_args, explicit: frozenset, processes: int, device) -> Plan:
    """Measures this machine only when the budget is in seconds."""
    seconds, fixed = budget(train_args, data_args, processes)
    speeds = None
    if fixed is None:
        from hf_tinytx_training.plan.speed import measure

        batch = train_args.per_device_train_batch_size * train_args.gradient_accumulation_steps
        speeds = measure(VOCAB, batch, data_args.block_size or BLOCK, RECIPE, device,
                         train_args.mixed_precision == "bf16")
    return make_plan(text_tokens(data_args), seconds, fixed, speeds, processes, explicit,
                     train_args.mixed_precision)


def apply(plan: Plan, explicit: frozenset, *parts) -> None:
    """Sets each of the plan's flags on the dataclass that has it, unless the user gave it (a resume whose
    flags differ from the recorded plan's is then refused by the checkpoint's own checks, in one line)."""
    for name, value in plan.settings.items():
        if name in explicit:
            continue
        owner = next(part for part in parts if hasattr(part, name))
        setattr(owner, name, value)


# What a recorded plan may set: a checkpoint from the Hub is not trusted to set any other flag.
PLANNED_FLAGS = frozenset({*LADDER[0].flags(), "vocab_size", "weight_decay", "max_train_seconds",
                           *(name for name in RECIPE if name != "optimizer")})


def from_dict(values: dict) -> Plan:
    """A recorded plan, refused in one line when this version cannot read it or it sets other flags."""
    try:
        plan = Plan(**values)
        by_name(plan.size)
        values_ok = all(isinstance(value, (int, float, str)) and not isinstance(value, bool)
                        for value in plan.settings.values())
        settings_ok = set(plan.settings) <= PLANNED_FLAGS and values_ok
    except (TypeError, KeyError):
        settings_ok = False
    if not settings_ok:
        raise UserInputError(
            "The checkpoint's plan was made by another version of hf_tinytx, or sets flags no plan sets; "
            "resume with that version, or give the sizes it recorded (training_args.json) as flags."
        )
    return plan


def recorded(resume_from: str | None, checkpoints_dir: str, own_repo: str, token: str | None) -> Plan | None:
    """The plan the run being resumed made: from its newest local checkpoint that holds one, the folder named,
    or the Hub's last-checkpoint/; None when there is none yet (the run then plans anew)."""
    from hf_tinytx_training import checkpoints
    from hf_tinytx_training.publish import hub_checkpoint

    # the checkpoint a local resume would pick (checksums verified), quietly: the resume says what it skips
    local = None if hub_checkpoint.hub_reference(resume_from, own_repo) else resume_from
    layout = checkpoints.Layout(checkpoints_dir)
    folder = checkpoints.find_resumable(local or "latest", layout, lambda _: None)
    if folder:
        saved = checkpoints.read_training_state(folder).plan
        if saved:
            return from_dict(saved)
    state = hub_checkpoint.state_on_hub(resume_from, own_repo, token)
    return from_dict(state["plan"]) if state and state.get("plan") else None
