"""Generation speed: TinyTx vs LlamaForCausalLM (same shape, same weights), greedy, 128 new tokens.

A 32-token prompt, batch 1 and 8, with the default dynamic cache and with the static cache. Both models run in the
same process, interleaved; we report median new tokens per second and the ratio TinyTx / Llama (above 1 means TinyTx
is faster). Both must produce the same tokens, which is checked before timing.

    python benchmarks/generate.py            # ~10M parameters
    python benchmarks/generate.py --quick    # fewer repeats

Prints a table, then one JSON line with every figure.
"""

import argparse
import json
import statistics

import torch

from common import build_pair, count_parameters, interleaved_samples, medians, paired_ratio


def make_generate(model, prompt, new_tokens, cache_implementation):
    model.eval()
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # no early stop at an EOS: every run does the same work
        do_sample=False,
        attention_mask=torch.ones_like(prompt),
        pad_token_id=0,
    )
    if cache_implementation != "dynamic":
        kwargs["cache_implementation"] = cache_implementation

    def generate():
        with torch.no_grad():
            return model.generate(prompt, **kwargs)

    return generate


def matmul_floor_seconds(weights: list[torch.Tensor], repeats: int) -> float:
    """Seconds per token spent in the decoding step's matrix-vector products alone: every projection and the LM head
    applied once to one vector, in forward order. Each token streams all the weights from memory, so this is the
    floor under any batch-1 decoder of these weights, before attention, norms, RoPE and `generate`'s own loop."""
    vectors = [torch.randn(1, 1, weight.shape[1]) for weight in weights]

    def one_token():
        for weight, vector in zip(weights, vectors):
            torch.nn.functional.linear(vector, weight)

    samples = interleaved_samples({"floor": lambda: [one_token() for _ in range(32)]}, repeats=repeats, warmup=1)
    return statistics.median(samples["floor"]) / 32


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="10M")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--caches", nargs="+", default=["dynamic", "static"])
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats

    models, _, _ = build_pair(args.shape)
    vocab_size = models["tinytx"].config.vocab_size
    results = []
    for batch_size in args.batch_sizes:
        prompt = torch.randint(2, vocab_size, (batch_size, args.prompt_len), generator=torch.Generator().manual_seed(1))
        for cache in args.caches:
            runs = {name: make_generate(model, prompt, args.new_tokens, cache) for name, model in models.items()}
            outputs = {name: run() for name, run in runs.items()}
            if not torch.equal(outputs["tinytx"], outputs["llama"]):
                raise RuntimeError(f"TinyTx and Llama generated different tokens (batch {batch_size}, {cache} cache)")
            samples = interleaved_samples(runs, repeats=repeats, warmup=1)
            seconds = medians(samples)
            new_tokens = batch_size * args.new_tokens
            results.append(
                {
                    "batch_size": batch_size,
                    "cache": cache,
                    "tinytx_tokens_per_s": new_tokens / seconds["tinytx"],
                    "llama_tokens_per_s": new_tokens / seconds["llama"],
                    # Median of the per-round ratios (each round times both models back to back).
                    "speedup_tinytx_over_llama": paired_ratio(samples, "llama", "tinytx"),
                }
            )

    weights = [module.weight.detach() for module in models["tinytx"].modules() if isinstance(module, torch.nn.Linear)]
    weight_megabytes = sum(weight.numel() * weight.element_size() for weight in weights) / 1e6
    with torch.no_grad():
        floor = matmul_floor_seconds(weights, repeats)
    header = f"{'batch':>5} | {'cache':>7} | {'TinyTx tok/s':>12} | {'Llama tok/s':>11} | {'speed-up':>8}"
    print(f"shape {args.shape}: {count_parameters(models['tinytx']):,} parameters, prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, greedy")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['batch_size']:>5} | {r['cache']:>7} | {r['tinytx_tokens_per_s']:>12.1f} | "
              f"{r['llama_tokens_per_s']:>11.1f} | {r['speedup_tinytx_over_llama']:>8.2f}")
    print(f"batch-1 floor: the matrix-vector products alone take {floor * 1e3:.2f} ms/token "
          f"({weight_megabytes:.1f} MB of weights streamed per token, {weight_megabytes / 1e3 / floor:.1f} GB/s), "
          f"i.e. at most {1 / floor:.0f} tokens/s before attention, norms and generate's loop")
    print(json.dumps({"benchmark": "generate", "shape": args.shape, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "repeats": repeats, "results": results,
                      "batch1_matmul_floor_ms_per_token": floor * 1e3, "weights_mb_per_token": weight_megabytes}))


if __name__ == "__main__":
    main()
