"""The training step of the tinyshakespeare recipe, side by side: torch.optim.Muon vs our StackedMuon (the
optimizer step alone), and a whole step (forward, backward, clipping, Muon + AdamW) in fp32 vs bf16 autocast.

    python -m benchmarks.recipe_step                  # the tiny preset, vocabulary 1,024, 16 x 128 tokens a
                                                      # step
    python -m benchmarks.recipe_step --hidden_size 192 --intermediate_size 512

Both sides of each row run in the same process, in alternating order each round; ratios are medians of the
per-round ratios. Prints a table, then one JSON line.
"""

import argparse
import json


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab_size", type=int, default=1024)
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--intermediate_size", type=int, default=352)
    parser.add_argument("--num_hidden_layers", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    return parser.parse_args(argv)


if __name__ == "__main__":  # --help and a mistyped flag are answered before torch loads (~7 s on a small CPU)
    ARGS = parse_args()

import torch  # noqa: E402

from benchmarks.common import interleaved_samples, medians, paired_ratio  # noqa: E402
from hf_tinytx import TinyTxConfig, TinyTxForCausalLM  # noqa: E402
from hf_tinytx_training.model.cpu_training import speed_up_cpu_training  # noqa: E402
from hf_tinytx_training.optim.optimizers import StackedMuon, make_optimizer  # noqa: E402
from hf_tinytx_training.pretrain_args import PretrainArguments  # noqa: E402


def build(args):
    torch.manual_seed(0)
    config = TinyTxConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                          intermediate_size=args.intermediate_size, num_hidden_layers=args.num_hidden_layers,
                          num_attention_heads=4, bos_token_id=1, eos_token_id=2)
    # With the CPU speed paths, as tinytx pretrain trains it (the fp32 attention
    # under bf16 autocast among them).
    return speed_up_cpu_training(TinyTxForCausalLM._from_config(config, attn_implementation="sdpa").train())


def muon_steps(model) -> dict:
    """One optimizer step of each Muon over the block matrices, on fixed random gradients."""
    runs = {}
    for name, make in (
        ("torch Muon", lambda ps: torch.optim.Muon(ps, lr=2e-2, adjust_lr_fn="match_rms_adamw")),
        ("StackedMuon", lambda ps: StackedMuon(ps, momentum=0.95)),
    ):
        params = [torch.nn.Parameter(p.detach().clone()) for n, p in model.named_parameters()
                  if p.ndim == 2 and ".layers." in n]
        for p in params:
            p.grad = torch.randn_like(p)
        runs[name] = make(params).step
    return runs


def train_steps(model, args) -> dict:
    optimizer = make_optimizer(model, PretrainArguments(optimizer="muon", learning_rate=3e-3,
                                                        muon_learning_rate=2e-2, weight_decay=1.0))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), generator=generator)

    def step(bf16: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return {"fp32 step": lambda: step(False), "bf16 step": lambda: step(True)}


def main(args):
    model = build(args)
    rows = []
    for (slow, fast), runs in ((("torch Muon", "StackedMuon"), muon_steps(model)),
                               (("fp32 step", "bf16 step"), train_steps(model, args))):
        samples = interleaved_samples(runs, args.repeats)
        ms = {name: 1e3 * seconds for name, seconds in medians(samples).items()}
        rows.append({"baseline": slow, "ours": fast, "baseline_ms": ms[slow], "ours_ms": ms[fast],
                     "speedup": paired_ratio(samples, slow, fast)})
    print(f"{'baseline':>10} | {'ms':>7} | {'ours':>11} | {'ms':>7} | speed-up (median of paired rounds)")
    for row in rows:
        print(
            f"{row['baseline']:>10} | {row['baseline_ms']:7.1f} | {row['ours']:>11} | {row['ours_ms']:7.1f} "
            f"| {row['speedup']:.2f}x"
        )
    print(
        json.dumps(
            {
                "benchmark": "recipe_step", "torch": torch.__version__, "threads": torch.get_num_threads(),
                "repeats": args.repeats, "shape": vars(args), "results": rows,
            }
        )
    )


if __name__ == "__main__":
    main(ARGS)
