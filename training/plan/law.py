"""The held-out loss a size reaches after `tokens` of training on a text of `unique` tokens, as the sweep
(benchmarks/plan_sweep.py) measured it on Tiny Shakespeare:

    loss = E + A / N**alpha + B / D**beta

N is the model's parameters, D the tokens it trained on, counted as Muennighoff et al. (2023, "Scaling
data-constrained language models") count repeated text: each pass after the first is worth less, and past
~REPEATS passes more reading adds next to nothing. The sweep reads 1 MB up to 12 times, so it measures both
the size's pull and the repetition's cost. A text larger than the tokens read repeats nothing.
"""

import math


REPEATS = 15.4  # Muennighoff et al.'s R*_D: the passes after which repeating stops paying
BYTES_PER_TOKEN = 2.26  # a 1,024-token BPE on Tiny Shakespeare (the sweep's eval loss / bits per byte)
SWEEP_UNIQUE = 1_003_855 / BYTES_PER_TOKEN  # the sweep's training text, in tokens

# Fitted by `python -m benchmarks.plan_sweep` (its "law" line) to results/plan_sweep.jsonl.
FITTED = {"E": 0.0, "A": 0.0, "alpha": 1.0, "B": 0.0, "beta": 1.0}


def effective_tokens(tokens: float, unique: float | None) -> float:
    """`tokens` read from a text of `unique` tokens, repeated passes discounted (None: an unbounded text)."""
    if unique is None or tokens <= unique:
        return tokens
    repeats = tokens / unique - 1
    return unique + unique * REPEATS * (1 - math.exp(-repeats / REPEATS))


def predicted_loss(parameters: float, tokens: float, unique: float | None, law: dict = FITTED) -> float:
    """Validation loss in nats per token (on a text like the sweep's)."""
    seen = effective_tokens(tokens, unique)
    return law["E"] + law["A"] / parameters ** law["alpha"] + law["B"] / seen ** law["beta"]


def fit(points: list[tuple[float, float, float]], unique: float) -> dict | None:
    """The law's constants by least squares on (parameters, tokens, loss) of one text of `unique` tokens: for
    each pair of exponents on a grid, E, A and B are a linear fit; the pair of least error whose E, A and B
    are all positive wins (a negative floor fits a few points and predicts nonsense past them)."""
    import torch

    columns = list(zip(*points))
    params, loss = (torch.tensor(column, dtype=torch.float64) for column in (columns[0], columns[2]))
    seen = torch.tensor([effective_tokens(tokens, unique) for tokens in columns[1]], dtype=torch.float64)
    grid = [step / 100 for step in range(5, 101)]
    best = None
    for alpha in grid:
        for beta in grid:
            design = torch.stack([torch.ones_like(params), params ** -alpha, seen ** -beta], dim=1)
            solution = torch.linalg.lstsq(design, loss[:, None]).solution[:, 0]
            error = ((design @ solution - loss) ** 2).mean().item()
            if (solution > 0).all() and (best is None or error < best[0]):
                best = (error, alpha, beta, solution.tolist())
    if best is None:  # too few points, or none that a positive law fits
        return None
    error, alpha, beta, (e, a, b) = best
    return {"E": e, "A": a, "alpha": alpha, "B": b, "beta": beta, "rms": math.sqrt(error)}
