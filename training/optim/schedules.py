"""The run's clock (--max_train_seconds): the learning-rate shapes over it, and the
seconds every process agrees on."""

import math


CLOCK_SHAPES = {  # learning-rate factor as a function of the fraction of the budget spent
    "cosine": lambda progress: 0.5 * (1 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1 - progress,
    "constant": lambda progress: 1.0,
    "constant_with_warmup": lambda progress: 1.0,
    # flat, then down to 0 over the last 30%
    "warmup_stable_decay": lambda progress: min(1.0, (1 - progress) / 0.3),
}


class Clock:
    """The slowest process's training seconds, so all take the same learning
    rate and stop at the same step."""

    def __init__(self, budget_seconds: float, accelerator):
        self.budget = budget_seconds
        self.accelerator = accelerator
        self.before = 0.0  # trained by the runs this one resumes (set from the checkpoint)
        self.seconds = 0.0

    def resume_at(self, seconds: float) -> None:
        self.before = self.seconds = seconds

    def read(self, seconds_this_process: float) -> float:
        import torch  # not at the top: pretrain_args.py reads CLOCK_SHAPES before torch loads

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
