"""Training step speed: TinyTx vs transformers' LlamaForCausalLM with identical shape and weights.

One step = forward + loss + backward + AdamW step, on random token ids, fp32 on CPU, sdpa attention for both.
Both models run in the same process, interleaved, and we report the median ms/step, tokens/s and the ratio
TinyTx / Llama (below 1 means TinyTx is faster).

    python benchmarks/train_step.py                 # both shapes, 20 steps each side
    python benchmarks/train_step.py --quick         # fewer steps

Prints a table, then one JSON line with every figure.
"""

import argparse
import json

import torch

from common import SHAPES, build_pair, count_parameters, interleaved_samples, medians, paired_ratio


def make_step(model: torch.nn.Module, batch: torch.Tensor):
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats

    results = []
    for shape in args.shapes:
        models, batch_size, seq_len = build_pair(shape)
        vocab_size = models["tinytx"].config.vocab_size
        batch = torch.randint(0, vocab_size, (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
        steps = {name: make_step(model, batch) for name, model in models.items()}
        samples = interleaved_samples(steps, repeats=repeats, warmup=3)
        seconds = medians(samples)
        tokens = batch_size * seq_len
        results.append(
            {
                "shape": shape,
                "parameters": count_parameters(models["tinytx"]),
                "batch_size": batch_size,
                "seq_len": seq_len,
                "tinytx_ms_per_step": seconds["tinytx"] * 1e3,
                "llama_ms_per_step": seconds["llama"] * 1e3,
                "tinytx_tokens_per_s": tokens / seconds["tinytx"],
                "llama_tokens_per_s": tokens / seconds["llama"],
                # Median of the per-round ratios (each round times both models back to back).
                "time_ratio_tinytx_over_llama": paired_ratio(samples, "tinytx", "llama"),
            }
        )

    header = f"{'shape':>6} | {'params':>9} | {'TinyTx ms':>9} | {'Llama ms':>8} | {'TinyTx tok/s':>12} | {'Llama tok/s':>11} | {'time ratio':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['shape']:>6} | {r['parameters']:>9,} | {r['tinytx_ms_per_step']:>9.1f} | {r['llama_ms_per_step']:>8.1f} | "
            f"{r['tinytx_tokens_per_s']:>12,.0f} | {r['llama_tokens_per_s']:>11,.0f} | {r['time_ratio_tinytx_over_llama']:>10.3f}"
        )
    print(json.dumps({"benchmark": "train_step", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "repeats": repeats, "results": results}))


if __name__ == "__main__":
    main()
