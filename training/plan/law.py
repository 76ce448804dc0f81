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


def fit(points: list[tuple[float, float, float]], unique: float) -> dict:
    """The law's constants by least squares on (parameters, tokens, loss) of one text of `unique` tokens:
    L-BFGS from a few starts, the exponents kept positive through their logarithms."""
    import torch

    params = torch.tensor([p for p, _, _ in points], dtype=torch.float64)
    seen = torch.tensor([effective_tokens(t, unique) for _, t, _ in points], dtype=torch.float64)
    loss = torch.tensor([l for _, _, l in points], dtype=torch.float64)
    best = None
    for alpha0 in (0.2, 0.4, 0.7):
        for beta0 in (0.2, 0.4, 0.7):
            # E free; A and B through their logarithms
            x = torch.tensor([1.0, math.log(alpha0), math.log(beta0), 5.0, 5.0], dtype=torch.float64,
                             requires_grad=True)
            optimizer = torch.optim.LBFGS([x], max_iter=500, line_search_fn="strong_wolfe")

            def error():
                optimizer.zero_grad()
                e, alpha, beta, log_a, log_b = x[0], x[1].exp(), x[2].exp(), x[3], x[4]
                guess = e + torch.exp(log_a - alpha * params.log()) + torch.exp(log_b - beta * seen.log())
                value = ((guess - loss) ** 2).mean()
                value.backward()
                return value

            value = optimizer.step(error).item()
            if math.isfinite(value) and (best is None or value < best[0]):
                best = (value, x.detach().clone())
    value, x = best
    return {"E": x[0].item(), "A": math.exp(x[3].item()), "alpha": math.exp(x[1].item()),
            "B": math.exp(x[4].item()), "beta": math.exp(x[2].item()), "rms": math.sqrt(value)}
