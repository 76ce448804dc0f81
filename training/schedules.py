"""The learning-rate shapes a run planned by the clock (--max_train_seconds alone) can take: plain math, read by the
flag checks (args.py, before torch loads) and by the schedule itself (optimization.py)."""

import math


CLOCK_SHAPES = {  # learning-rate factor as a function of the fraction of the budget spent
    "cosine": lambda progress: 0.5 * (1 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1 - progress,
    "constant": lambda progress: 1.0,
    "constant_with_warmup": lambda progress: 1.0,
    "warmup_stable_decay": lambda progress: min(1.0, (1 - progress) / 0.3),  # flat, then down to 0 over the last 30%
}
