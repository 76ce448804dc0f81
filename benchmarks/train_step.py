"""Training step speed: TinyTx vs a GPT of nanoGPT's shape and transformers'
Llama, same parameter count and batch.

One step = forward + loss + backward + AdamW step, on random token ids, fp32 on CPU, sdpa attention
everywhere. TinyTx and Llama share the very same weights (same math: Llama is the kernel-for-kernel
reference); the GPT (benchmarks/gpt_baseline.py: learned positions, LayerNorm, fused qkv, GELU MLP, tied
head) has as many parameters within a few percent. All run in the same process, interleaved; we report
the median ms/step and tokens/s, and the ratios TinyTx / GPT and TinyTx / Llama (below 1 means TinyTx is
faster) as medians of per-round ratios. With `--compile`, each model also runs under `torch.compile` (the
same step, compiled forward and backward).

The process keeps freed memory for reuse as training/pretrain.py does on a CPU
(training/distributed/cpu_memory.py), for every model alike; `--glibc_malloc` leaves glibc's defaults
instead, under which TinyTx and Llama page-fault their activations back in every step, and the GPT far
fewer (benchmarks/results/train_step.txt).

    python -m benchmarks.train_step                 # both shapes, 20 steps each side
    python -m benchmarks.train_step --compile       # also compiled vs compiled
    python -m benchmarks.train_step --quick         # fewer steps
    python -m benchmarks.train_step --profile --shapes 0.8M   # where each eager step's time goes, by op
    python -m benchmarks.train_step --attribute     # TinyTx with its design choices swapped for the GPT's

Prints a table, then one JSON line with every figure.
"""

import argparse
import copy
import json
import resource
import statistics
from unittest import mock

from benchmarks.shapes import SHAPES


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--compile", action="store_true", help="also time every model under torch.compile")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="instead of timing: torch.profiler's busiest ops of 10 eager steps per model")
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="instead: eager TinyTx with LayerNorm for RMSNorm, without RoPE, with the GPT's GELU MLP, and "
        "all three, timed beside TinyTx and the GPT (what each choice costs)",
    )
    parser.add_argument(
        "--glibc_malloc", action="store_true",
        help="leave glibc's malloc settings as they are (default: as training/pretrain.py sets them)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":  # --help and a mistyped flag are answered before torch loads (~7 s on a small CPU)
    ARGS = parse_args()

import torch  # noqa: E402

from benchmarks.common import (  # noqa: E402
    build_pair,
    count_parameters,
    interleaved_samples,
    make_train_step,
    medians,
    paired_ratio,
)
from benchmarks.gpt_baseline import GPT  # noqa: E402
from hf_tinytx import TinyTxForCausalLM, modeling_tinytx  # noqa: E402
from hf_tinytx_training.distributed.cpu_memory import keep_freed_memory  # noqa: E402
from hf_tinytx_training.model.cpu_training import speed_up_cpu_training  # noqa: E402


def counting_faults(step, faults: list):
    """The step, noting how many pages the kernel faulted in during each call (freed memory coming back)."""

    def counted():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    return counted


def build_models(shape: str, compile_too: bool) -> tuple[dict, int, int]:
    models, batch_size, seq_len = build_pair(shape)
    speed_up_cpu_training(models["tinytx"])  # as tinytx pretrain and finetune train it on a CPU
    config = models["tinytx"].config
    torch.manual_seed(0)
    models["gpt"] = GPT(
        config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
        max_length=seq_len,
    )
    if compile_too:
        models |= {f"{name} compiled": torch.compile(model) for name, model in list(models.items())}
    return models, batch_size, seq_len


def main(args):
    malloc = "glibc defaults" if args.glibc_malloc or not keep_freed_memory() else "freed memory kept"
    repeats = 5 if args.quick else args.repeats
    if args.profile:
        return profile_steps(args.shapes)
    if args.attribute:
        return attribute_steps(args.shapes, repeats, malloc)

    results = []
    for shape in args.shapes:
        models, batch_size, seq_len = build_models(shape, args.compile)
        vocab_size = models["tinytx"].config.vocab_size
        batch = torch.randint(
            0, vocab_size, (batch_size, seq_len), generator=torch.Generator().manual_seed(0)
        )
        faults = {name: [] for name in models}
        steps = {
            name: counting_faults(make_train_step(model, batch), faults[name])
            for name, model in models.items()
        }
        samples = interleaved_samples(steps, repeats=repeats, warmup=3)
        seconds = medians(samples)
        for suffix in ("", " compiled") if args.compile else ("",):
            tinytx, gpt, llama = (f"{name}{suffix}" for name in ("tinytx", "gpt", "llama"))
            results.append(
                {
                    "shape": shape,
                    "compiled": bool(suffix),
                    "batch_size": batch_size,
                    "seq_len": seq_len,
                    "parameters": {
                        name: count_parameters(models[name]) for name in ("tinytx", "gpt", "llama")
                    },
                    "ms_per_step": {
                        name: seconds[f"{name}{suffix}"] * 1e3 for name in ("tinytx", "gpt", "llama")
                    },
                    "tokens_per_s": {
                        name: batch_size * seq_len / seconds[f"{name}{suffix}"]
                        for name in ("tinytx", "gpt", "llama")
                    },
                    # Medians of the per-round ratios (each round times every model back to back).
                    "time_ratio_tinytx_over_gpt": paired_ratio(samples, tinytx, gpt),
                    "time_ratio_tinytx_over_llama": paired_ratio(samples, tinytx, llama),
                    # Median over the timed rounds (not the warm-up): 0 once the process keeps its freed
                    # memory.
                    "page_faults_per_step": {
                        name: statistics.median(faults[f"{name}{suffix}"][-repeats:])
                        for name in ("tinytx", "gpt", "llama")
                    },
                }
            )
    print(f"malloc: {malloc}")
    print_table(results)
    print(
        json.dumps(
            {
                "benchmark": "train_step", "torch": torch.__version__, "threads": torch.get_num_threads(),
                "malloc": malloc, "repeats": repeats, "results": results,
            }
        )
    )


def profile_steps(shapes: list[str], steps: int = 10) -> None:
    """Per op: self CPU milliseconds per step and calls per step, TinyTx and the GPT side by side."""
    from torch.profiler import ProfilerActivity, profile

    for shape in shapes:
        models, batch_size, seq_len = build_models(shape, compile_too=False)
        batch = torch.randint(0, models["tinytx"].config.vocab_size, (batch_size, seq_len),
                              generator=torch.Generator().manual_seed(0))
        for name in ("tinytx", "gpt"):
            step = make_train_step(models[name], batch)
            for _ in range(3):
                step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    step()
            ops = sorted(prof.key_averages(), key=lambda op: op.self_cpu_time_total, reverse=True)
            total = sum(op.self_cpu_time_total for op in ops) / steps / 1e3
            print(f"\n{shape} {name}: {total:.1f} ms of self CPU time a step; the busiest ops")
            print(f"{'op':>45} | {'ms/step':>7} | {'calls/step':>10}")
            for op in ops[:12]:
                print(
                    f"{op.key[:45]:>45} | {op.self_cpu_time_total / steps / 1e3:>7.2f} | "
                    f"{op.count / steps:>10.0f}"
                )


def with_layernorm(model: TinyTxForCausalLM) -> TinyTxForCausalLM:
    """The model with each RMSNorm replaced by a LayerNorm (without bias), which has
    a native CPU kernel each way."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, modeling_tinytx.TinyTxRMSNorm):
                setattr(module, name, torch.nn.LayerNorm(child.weight.shape[0], bias=False))
    return model


def with_gelu_mlp(model: TinyTxForCausalLM) -> TinyTxForCausalLM:
    """A TinyTx of the same shape whose MLP is the GPT's: one GELU between two matmuls, 4x the width."""
    config = copy.deepcopy(model.config)
    config.mlp_type, config.hidden_act, config.intermediate_size = "plain", "gelu", 4 * config.hidden_size
    torch.manual_seed(0)
    return speed_up_cpu_training(TinyTxForCausalLM._from_config(config, attn_implementation="sdpa"))


def without_rope(step):
    """The step with queries and keys left unrotated (positions then enter
    nowhere: a timing ablation only)."""

    def unrotated():
        with mock.patch.object(modeling_tinytx, "apply_rotary_pos_emb", lambda q, k, cos, sin: (q, k)):
            step()

    return unrotated


def attribute_steps(shapes: list[str], repeats: int, malloc: str) -> None:
    """TinyTx with each design choice in turn swapped for the GPT's, and all three at once, beside TinyTx and
    the GPT: what each choice costs an eager step. What is left between "all three" and the GPT is
    transformers' plumbing around the same ops, q/k/v as three matmuls, and the learned positions' one add."""
    results = []
    for shape in shapes:
        models, batch_size, seq_len = build_models(shape, compile_too=False)
        tinytx = models["tinytx"]
        variants = {"TinyTx": tinytx, "LayerNorm": with_layernorm(copy.deepcopy(tinytx)),
                    "no RoPE": copy.deepcopy(tinytx), "GELU MLP": with_gelu_mlp(tinytx),
                    "all three": with_layernorm(with_gelu_mlp(tinytx)), "GPT": models["gpt"]}
        batch = torch.randint(0, tinytx.config.vocab_size, (batch_size, seq_len),
                              generator=torch.Generator().manual_seed(0))
        steps = {name: make_train_step(model, batch) for name, model in variants.items()}
        for name in ("no RoPE", "all three"):
            steps[name] = without_rope(steps[name])
        samples = interleaved_samples(steps, repeats=repeats, warmup=3)
        seconds = medians(samples)
        for name, model in variants.items():
            results.append({"shape": shape, "variant": name, "parameters": count_parameters(model),
                            "ms_per_step": seconds[name] * 1e3,
                            "time_ratio_over_gpt": paired_ratio(samples, name, "GPT"),
                            "time_ratio_over_tinytx": paired_ratio(samples, name, "TinyTx")})
    print(f"malloc: {malloc}")
    header = (
        f"{'shape':>5} | {'TinyTx with':>11} | {'params':>10} | {'ms':>7} | {'/ GPT':>6} | {'/ TinyTx':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['shape']:>5} | {r['variant']:>11} | {r['parameters']:>10,} | {r['ms_per_step']:>7.1f} | "
              f"{r['time_ratio_over_gpt']:>6.3f} | {r['time_ratio_over_tinytx']:>8.3f}")
    print(
        json.dumps(
            {
                "benchmark": "train_step_attribution", "torch": torch.__version__,
                "threads": torch.get_num_threads(), "malloc": malloc, "repeats": repeats, "results": results,
            }
        )
    )


def print_table(results: list[dict]) -> None:
    header = (
        f"{'shape':>5} | {'mode':>8} | {'params TinyTx/GPT':>21} | {'TinyTx ms':>9} | {'GPT ms':>7} | "
        f"{'Llama ms':>8} | {'TinyTx/GPT':>10} | {'TinyTx/Llama':>12} | {'page faults a step T/G/L':>24}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ms, params = r["ms_per_step"], r["parameters"]
        faults = "/".join(f"{r['page_faults_per_step'][name]:,.0f}" for name in ("tinytx", "gpt", "llama"))
        print(f"{r['shape']:>5} | {'compiled' if r['compiled'] else 'eager':>8} | "
              f"{params['tinytx']:>10,}/{params['gpt']:>10,} | {ms['tinytx']:>9.1f} | {ms['gpt']:>7.1f} | "
              f"{ms['llama']:>8.1f} | {r['time_ratio_tinytx_over_gpt']:>10.3f} | "
              f"{r['time_ratio_tinytx_over_llama']:>12.3f} | "
              f"{faults:>24}")


if __name__ == "__main__":
    main(ARGS)
