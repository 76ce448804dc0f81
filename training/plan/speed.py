"""How many tokens a second this machine trains each size at: a few real steps (forward, backward, the
run's optimizer) of the smallest sizes, then the larger ones by their arithmetic from the two largest
measured.
Measuring stops once it has taken MEASURE_SECONDS, so a slow machine spends seconds here, not minutes."""

import time
from types import SimpleNamespace

from hf_tinytx_training.plan.ladder import LADDER, Size


MEASURE_SECONDS = 4.0  # at most this long measuring, a step or two past it at worst
TIMED_STEPS = 2  # after one untimed step (allocations, kernels chosen)


def flops_per_token(size: Size, vocab: int, block: int) -> float:
    """Forward and backward: 6 per weight a token passes through, plus attention over the block."""
    return 6 * (size.parameters(vocab) - vocab * size.hidden) + 6 * size.layers * block * size.hidden


def step_seconds(size: Size, vocab: int, batch: int, block: int, train_args, device, bf16: bool) -> float:
    """Median seconds of a training step of `size` on random tokens."""
    import torch

    from hf_tinytx import TinyTxConfig, TinyTxForCausalLM
    from hf_tinytx_training.optim.optimizers import make_optimizer

    config = TinyTxConfig(vocab_size=vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
                          num_hidden_layers=size.layers, num_attention_heads=size.heads,
                          num_key_value_heads=size.heads, max_position_embeddings=max(block, 128),
                          tie_word_embeddings=size.preset == "micro")
    model = TinyTxForCausalLM(config).to(device)
    optimizer = make_optimizer(model, train_args)
    tokens = torch.randint(vocab, (batch, block), device=device)
    times = []
    for _ in range(1 + TIMED_STEPS):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def measure(vocab: int, batch: int, block: int, recipe: dict, device, bf16: bool) -> dict[str, float]:
    """Tokens per second of every size of the ladder on this process: measured from the smallest up while
    time allows, the rest extrapolated (time per token linear in FLOPs through the last two measured)."""
    import torch

    train_args = SimpleNamespace(adam_beta2=0.95, weight_decay=0.1, **recipe)
    torch.manual_seed(0)
    measured, started = {}, time.perf_counter()
    for size in LADDER:
        if len(measured) >= 2 and time.perf_counter() - started > MEASURE_SECONDS:
            break
        seconds = step_seconds(size, vocab, batch, block, train_args, device, bf16)
        measured[size.name] = batch * block / seconds
    (low, low_speed), (high, high_speed) = [(size, measured[size.name]) for size in LADDER
                                            if size.name in measured][-2:]
    low_flops, high_flops = (flops_per_token(size, vocab, block) for size in (low, high))
    per_flop = max((1 / high_speed - 1 / low_speed) / (high_flops - low_flops), 1e-18)
    speeds = dict(measured)
    for size in LADDER[len(measured):]:
        more_flops = flops_per_token(size, vocab, block) - high_flops
        speeds[size.name] = 1 / (1 / high_speed + per_flop * more_flops)
    return speeds
