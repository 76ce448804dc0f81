"""The optimizer (AdamW, or Muon for the hidden matrices with AdamW for the rest) and the learning-rate
schedule, over optimizer steps or over the wall clock. Muon orthogonalises each matrix's momentum before the
update, as modded-nanogpt and nanochat do for the matrices inside the blocks."""

import functools
import math
from collections import defaultdict

import torch
from transformers import get_scheduler

from hf_tinytx_training.distributed import sharding
from hf_tinytx_training.optim.schedules import CLOCK_SHAPES, Clock


class StackedMuon(torch.optim.Muon):
    """torch.optim.Muon's update with its Newton-Schulz iteration run once per matrix shape, on a stack: the
    same state and arithmetic up to rounding, in a few large matmuls instead of dozens of small ones."""

    def __init__(self, params, momentum: float):
        # the scale _update applies
        super().__init__(params, momentum=momentum, adjust_lr_fn="match_rms_adamw")

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            # a (m, n) matrix joins the (n, m) ones: it is orthogonalised transposed
            by_shape = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[tuple(sorted(p.shape))].append(p)
            for params in by_shape.values():
                self._update(group, params)
        return loss

    def _update(self, group: dict, params: list) -> None:
        grads = [p.grad for p in params]
        buffers = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
        momentum = group["momentum"]
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        wide = [g.T if g.shape[0] > g.shape[1] else g for g in (  # Nesterov: look one momentum step ahead
            torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers)]
        ortho = newton_schulz(torch.stack(wide), group["ns_coefficients"], group["ns_steps"], group["eps"])
        updates = [o.T if p.shape[0] > p.shape[1] else o for o, p in zip(ortho.unbind(0), params)]
        torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        scale = group["lr"] * 0.2 * math.sqrt(max(params[0].shape))  # "match_rms_adamw": AdamW's update RMS
        torch._foreach_add_(params, [u.to(p.dtype) for u, p in zip(updates, params)], alpha=-scale)


def newton_schulz(stack: torch.Tensor, coefficients: tuple, steps: int, eps: float) -> torch.Tensor:
    """Pushes every singular value of each (m <= n) matrix in the stack towards 1 (Muon's quintic iteration):
    the update keeps the gradient's directions and drops their scale."""
    a, b, c = coefficients
    x = stack.to(iteration_dtype(stack.device.type))
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x


@functools.cache
def iteration_dtype(device_type: str) -> torch.dtype:
    """bf16, as torch.optim.Muon, except on a CPU without bf16 matrix
    instructions, where bf16 is the slow path."""
    if device_type == "cpu" and not sharding.cpu_runs_bf16_fast():
        return torch.float32
    return torch.bfloat16


class MuonWithAdamW(torch.optim.Optimizer):
    """StackedMuon and torch.optim.AdamW as one optimizer, with one state dict holding both."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], adam_betas: tuple[float, float],
                 muon_momentum: float = 0.95):
        self.muon = StackedMuon(muon_groups, momentum=muon_momentum)
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
        # Loading builds new group dicts inside Muon and AdamW: share those, or the
        # schedule would set unread rates.
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


def parameter_groups(model: torch.nn.Module) -> tuple[list, list]:
    """(matrices, vectors) in the model's order: weight decay applies to matrices only. Shapes are the full
    ones, even where ZeRO-3 holds a flat shard."""
    trained = [p for p in model.parameters() if p.requires_grad]
    return ([p for p in trained if len(sharding.full_shape(p)) >= 2],
            [p for p in trained if len(sharding.full_shape(p)) < 2])


def chosen_optimizer(name: str, sharded_by: str | None) -> str:
    """--optimizer as named, or for `auto` Muon, except where FSDP or DeepSpeed shard
    the matrices Muon needs whole."""
    if name != "auto":
        return name
    return "adamw" if sharded_by else "muon"


def make_optimizer(model: torch.nn.Module, train_args) -> torch.optim.Optimizer:
    """AdamW on everything, or Muon on the hidden matrices (at
    --muon_learning_rate) with AdamW on the rest."""
    matrices, vectors = parameter_groups(model)
    betas = (0.9, train_args.adam_beta2)
    decayed = {"weight_decay": train_args.weight_decay, "lr": train_args.learning_rate}
    plain = {"weight_decay": 0.0, "lr": train_args.learning_rate}
    if train_args.optimizer == "adamw":
        groups = [{"params": matrices, **decayed}, {"params": vectors, **plain}]
        return torch.optim.AdamW(groups, lr=train_args.learning_rate, betas=betas, fused=True)
    outer = {id(module.weight) for module in (model.get_input_embeddings(), model.get_output_embeddings())
             if module is not None}  # a lookup table and a classifier: not maps between hidden states
    # Muon's steps are scaled to AdamW's size
    muon_lr = train_args.muon_learning_rate or train_args.learning_rate
    muon = [{"params": [p for p in matrices if id(p) not in outer], "weight_decay": train_args.weight_decay,
             "lr": muon_lr}]
    adamw = [{"params": [p for p in matrices if id(p) in outer], **decayed}, {"params": vectors, **plain}]
    return MuonWithAdamW(muon, adamw, betas)


def make_schedule(optimizer, train_args, max_train_steps: int | None, num_processes: int, clock: Clock):
    """transformers' schedule over --max_train_steps, or for a run planned in seconds the same shapes over the
    clock: linear warm-up over --num_warmup_steps steps, then the shape of the time spent."""
    if max_train_steps is not None:
        # A prepared scheduler advances once per process per step (Accelerate's convention), hence the factor.
        return get_scheduler(
            train_args.lr_scheduler_type, optimizer=optimizer,
            num_warmup_steps=min(train_args.num_warmup_steps, max_train_steps) * num_processes,
            num_training_steps=max_train_steps * num_processes,
        )
    kind = train_args.lr_scheduler_type
    shape, warmup = CLOCK_SHAPES[kind], (
        0 if kind == "constant" else train_args.num_warmup_steps * num_processes
    )

    def factor(ticks: int) -> float:
        return min(1.0, (ticks + 1) / warmup if warmup else 1.0) * shape(clock.progress)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
