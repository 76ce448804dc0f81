"""The optimizer (AdamW, or Muon for the hidden matrices with AdamW for the rest) and the learning-rate schedule,
planned over optimizer steps or over the wall clock.

Muon (torch.optim.Muon) orthogonalises each weight matrix's momentum before the update, as modded-nanogpt and
nanochat do for the matrices inside the blocks; the token embeddings, the output head and the norm gains stay on
AdamW, where Muon's argument does not apply (a lookup table and a classifier, not a linear map between hidden states).
"""

import math

import torch
from transformers import get_scheduler

from training import distributed


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon and torch.optim.AdamW as one optimizer: one object for the training loop, the learning-rate
    schedule (which scales every group's own peak rate) and the checkpoints (one state dict holding both)."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], adam_betas: tuple[float, float],
                 muon_momentum: float = 0.95):
        self.muon = torch.optim.Muon(muon_groups, momentum=muon_momentum, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(adamw_groups, betas=adam_betas, fused=True)
        # The same group dicts, so a schedule that sets group["lr"] here sets it in Muon and AdamW too.
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        # Loading builds new group dicts inside Muon and AdamW: share those, or the schedule would set unread rates.
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


def parameter_groups(model: torch.nn.Module) -> tuple[list, list]:
    """(matrices, vectors) in the model's order: weight decay pulls matrices towards zero; norm gains and biases
    (1-D) are left alone. Shapes are the full ones, even where ZeRO-3 holds a flat shard."""
    trained = [p for p in model.parameters() if p.requires_grad]
    return ([p for p in trained if len(distributed.full_shape(p)) >= 2],
            [p for p in trained if len(distributed.full_shape(p)) < 2])


def make_optimizer(model: torch.nn.Module, train_args) -> torch.optim.Optimizer:
    """AdamW on everything (--optimizer adamw), or Muon on the hidden matrices (at --muon_learning_rate, default
    --learning_rate) with AdamW on the rest at --learning_rate (--optimizer muon)."""
    matrices, vectors = parameter_groups(model)
    betas = (0.9, train_args.adam_beta2)
    decayed = {"weight_decay": train_args.weight_decay, "lr": train_args.learning_rate}
    plain = {"weight_decay": 0.0, "lr": train_args.learning_rate}
    if train_args.optimizer == "adamw":
        groups = [{"params": matrices, **decayed}, {"params": vectors, **plain}]
        return torch.optim.AdamW(groups, lr=train_args.learning_rate, betas=betas, fused=True)
    outer = {id(module.weight) for module in (model.get_input_embeddings(), model.get_output_embeddings())
             if module is not None}  # a lookup table and a classifier: not maps between hidden states
    muon_lr = train_args.muon_learning_rate or train_args.learning_rate  # Muon's steps are scaled to AdamW's size
    muon = [{"params": [p for p in matrices if id(p) not in outer], "weight_decay": train_args.weight_decay,
             "lr": muon_lr}]
    adamw = [{"params": [p for p in matrices if id(p) in outer], **decayed}, {"params": vectors, **plain}]
    return MuonWithAdamW(muon, adamw, betas)


class Clock:
    """The training seconds every process agrees on: the slowest process's, so all of them take the same learning
    rate and stop at the same step. Carried across a resume in the checkpoint state."""

    def __init__(self, budget_seconds: float, accelerator):
        self.budget = budget_seconds
        self.accelerator = accelerator
        self.before = 0.0  # trained by the runs this one resumes (set from the checkpoint)
        self.seconds = 0.0

    def resume_at(self, seconds: float) -> None:
        self.before = self.seconds = seconds

    def read(self, seconds_this_process: float) -> float:
        seconds = torch.tensor(self.before + seconds_this_process, dtype=torch.float64)
        if self.accelerator.num_processes > 1:
            seconds = seconds.to(self.accelerator.device)
            torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
        self.seconds = seconds.item()
        return self.seconds

    @property
    def progress(self) -> float:
        return min(1.0, self.seconds / self.budget) if self.budget else 0.0

    @property
    def ran_out(self) -> bool:
        return bool(self.budget) and self.seconds >= self.budget


CLOCK_SHAPES = {  # learning-rate factor as a function of the fraction of the budget spent
    "cosine": lambda progress: 0.5 * (1 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1 - progress,
    "constant": lambda progress: 1.0,
    "constant_with_warmup": lambda progress: 1.0,
    "warmup_stable_decay": lambda progress: min(1.0, (1 - progress) / 0.3),  # flat, then down to 0 over the last 30%
}


def make_schedule(optimizer, train_args, max_train_steps: int | None, num_processes: int, clock: Clock):
    """transformers' schedule over --max_train_steps, or, for a run planned in seconds (max_train_steps None), the
    same shapes over the clock: linear warm-up over --num_warmup_steps steps, then the shape of the time spent."""
    if max_train_steps is not None:
        # A prepared scheduler advances once per process per step (Accelerate's convention), hence the factor.
        return get_scheduler(
            train_args.lr_scheduler_type, optimizer=optimizer,
            num_warmup_steps=min(train_args.num_warmup_steps, max_train_steps) * num_processes,
            num_training_steps=max_train_steps * num_processes,
        )
    kind = train_args.lr_scheduler_type
    shape, warmup = CLOCK_SHAPES[kind], 0 if kind == "constant" else train_args.num_warmup_steps * num_processes

    def factor(ticks: int) -> float:
        return min(1.0, (ticks + 1) / warmup if warmup else 1.0) * shape(clock.progress)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
