"""The held-out loss a size reaches after `tokens` of training on a text of `unique` tokens, as the sweep
(benchmarks/plan_sweep.py) measured it on Tiny Shakespeare:

    loss = E + A / N**alpha + B / D**beta   (+ the sweep's own error at this size, where it measured it)

N is the model's parameters, D the tokens it trained on, counted as Muennighoff et al. (2023, "Scaling
data-constrained language models") count repeated text: each pass after the first is worth less, and past
~REPEATS passes more reading adds next to nothing. The sweep reads 1 MB up to 12 times, so it measures both
the size's pull and the repetition's cost. A text larger than the tokens read repeats nothing.

The law misses single points by ~0.04 nats. So where the sweep measured a size, the prediction adds the law's
error there (interpolated in log tokens, held past the ends): at a measured point it is the measurement, and
the law only carries it to other token counts and texts.
"""

import math


REPEATS = 15.4  # Muennighoff et al.'s R*_D: the passes after which repeating stops paying
BYTES_PER_TOKEN = 2.26  # a 1,024-token BPE on Tiny Shakespeare (the sweep's eval loss / bits per byte)
SWEEP_UNIQUE = 1_003_855 / BYTES_PER_TOKEN  # the sweep's training text, in tokens

# Fitted by `python -m benchmarks.plan_sweep` (its "law" line) to results/plan_sweep.jsonl.
FITTED = {"E": 1.7851, "A": 39.0023, "alpha": 0.33, "B": 58.6052, "beta": 0.27}  # rms error 0.047 nats
# The sweep's points, size -> ((tokens, validation loss), ...): its "measured" line.
MEASURED: dict[str, tuple] = {
    "micro": ((250_000, 4.6302), (500_000, 4.2438), (1_000_000, 3.9007), (2_000_000, 3.6374),
        (4_000_000, 3.5272)),
    "96x3": ((250_000, 4.3173), (500_000, 4.0111), (1_000_000, 3.6889), (2_000_000, 3.4469),
        (4_000_000, 3.3382)),
    "128x4": ((250_000, 4.2234), (500_000, 3.9596), (1_000_000, 3.5765), (2_000_000, 3.3567),
        (4_000_000, 3.2561)),
    "192x4": ((250_000, 4.0909), (500_000, 3.851), (1_000_000, 3.4396), (2_000_000, 3.2727),
        (4_000_000, 3.2098)),
    "256x5": ((250_000, 4.0266), (500_000, 3.7559), (1_000_000, 3.3871), (2_000_000, 3.2391)),
    "320x6": ((250_000, 3.9945), (500_000, 3.7558), (1_000_000, 3.3736)),
    "384x8": ((250_000, 3.9728), (500_000, 3.7096)),
}


def effective_tokens(tokens: float, unique: float | None) -> float:
    """`tokens` read from a text of `unique` tokens, repeated passes discounted (None: an unbounded text)."""
    if unique is None or tokens <= unique:
        return tokens
    repeats = tokens / unique - 1
    return unique + unique * REPEATS * (1 - math.exp(-repeats / REPEATS))


def law_loss(parameters: float, tokens: float, unique: float | None, law: dict = FITTED) -> float:
    """The law alone, in nats per token."""
    seen = effective_tokens(tokens, unique)
    return law["E"] + law["A"] / parameters ** law["alpha"] + law["B"] / seen ** law["beta"]


def predicted_loss(name: str, parameters: float, tokens: float, unique: float | None, law: dict = FITTED,
                   measured: dict | None = None) -> float:
    """Validation loss in nats per token of the size `name` (on a text like the sweep's): the law, plus its
    error where the sweep measured this size."""
    points = sorted((measured if measured is not None else MEASURED).get(name, ()))
    base = law_loss(parameters, tokens, unique, law)
    if not points:
        return base
    logs = [math.log(count) for count, _ in points]
    errors = [loss - law_loss(parameters, count, SWEEP_UNIQUE, law) for count, loss in points]
    at = math.log(tokens)
    if at <= logs[0] or len(points) == 1:
        return base + errors[0]
    if at >= logs[-1]:
        return base + errors[-1]
    right = next(i for i, log in enumerate(logs) if log >= at)
    share = (at - logs[right - 1]) / (logs[right] - logs[right - 1])
    return base + errors[right - 1] + share * (errors[right] - errors[right - 1])


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
