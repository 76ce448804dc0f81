"""What the benchmarks share: a model pair of each shape they compare
(shapes.py) and a fair, interleaved timer.

Fair means: both sides built from the same weights (TinyTx converted to Llama), run in the same process, one
sample of each in turn (so a noisy neighbour slows both), reported as medians.
"""

import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from benchmarks.shapes import SHAPES
from hf_tinytx import TinyTxConfig, TinyTxForCausalLM
from hf_tinytx.convert import tinytx_to_llama


def build_pair(shape: str, attn_implementation: str = "sdpa", seed: int = 0):
    """A random TinyTx and the Llama model with the very same weights."""
    fields, batch_size, seq_len = SHAPES[shape]
    torch.manual_seed(seed)
    config = TinyTxConfig(max_position_embeddings=2048, bos_token_id=0, eos_token_id=1, **fields)
    tinytx = TinyTxForCausalLM._from_config(config, attn_implementation=attn_implementation)
    llama = tinytx_to_llama(tinytx)
    return {"tinytx": tinytx, "llama": llama}, batch_size, seq_len


def make_train_step(model: torch.nn.Module, batch: torch.Tensor, dtype: torch.dtype = torch.float32):
    """One AdamW step on `batch` as a function of no arguments. bf16 autocasts over fp32 master
    weights, the usual mixed precision."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    autocast = (
        (lambda: torch.autocast(batch.device.type, dtype=dtype)) if dtype != torch.float32 else nullcontext
    )

    def step():
        with autocast():
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once by .parameters()


def interleaved_samples(
    runs: dict[str, Callable[[], None]], repeats: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds per call of each function, `repeats` rounds, each round sampling every function once in turn.

    A function that returns a number is taken to have timed itself (a worker in another process reports its
    own seconds, without the round trip to it)."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    samples = {name: [] for name in runs}
    order = list(runs)
    for repeat in range(repeats):
        # Alternate the order each round: whichever runs first after the other pays for cache and allocator
        # state it left behind (measured here at about +-7%), so neither side may always go first.
        for name in order if repeat % 2 == 0 else reversed(order):
            start = time.perf_counter()
            seconds = runs[name]()
            elapsed = time.perf_counter() - start
            samples[name].append(seconds if isinstance(seconds, float) else elapsed)
    return samples


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def interleaved_medians(
    runs: dict[str, Callable[[], None]], repeats: int, warmup: int = 2
) -> dict[str, float]:
    """Median seconds per call of each function, sampling them in turn so drift hits all of them alike."""
    return medians(interleaved_samples(runs, repeats, warmup))


def paired_ratio(samples: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of numerator time / denominator time measured in the same round.

    On a shared machine the load drifts over seconds; two samples taken back to back see the same load, so
    their ratio is steadier than the ratio of two medians taken over the whole run.
    """
    return statistics.median(a / b for a, b in zip(samples[numerator], samples[denominator]))
