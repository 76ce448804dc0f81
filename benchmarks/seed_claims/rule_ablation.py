"""Is claim 4's rule learnt at all? One corpus model, trained as claim 4's are but with the corpus mix and the
model changed by flags, scored along the way on three kinds of "it" probe:

* seen nouns (`coref`): the frames' own nouns, which a model can answer from the noun's class;
* unseen nouns (`coref_new_nouns`): the held-out real nouns no training document contains;
* made-up nouns (`coref_made_up`): two fresh non-words, so only the rule (the adjective names the role, the
  answer copies the noun in that role) can answer. Chance is 0.50 for all three.

    python -m benchmarks.seed_claims.rule_ablation                 # claim 4's own settings and corpus, seed 0
    python -m benchmarks.seed_claims.rule_ablation --made_up 1.0   # every statement made up: the rule and
                                                                   # nothing else
    python -m benchmarks.seed_claims.rule_ablation --kind_weights 4 1 1 --made_up 0.5 --hidden 128 --lr 2e-3 \
        --steps 900 --out rule.json                                # close to claim 4's recipe before this one

Prints a table (step, seconds, loss, the three accuracies) and one JSON line;
--out also writes the JSON there.
"""

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time

import torch

from benchmarks.seed_claims import __main__ as claims
from hf_tinytx.corpus import made_up_coref_probes
from hf_tinytx.folders.safe import open_new


def parse_arguments(argv=None) -> argparse.Namespace:
    full = claims.SETTINGS["full"]
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.seed_claims.rule_ablation", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="claim 4's --quick settings (a toy model, seconds)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, help=f"training steps (default {full['train_steps']})")
    parser.add_argument("--every", type=int, default=150, help="score the probes every this many steps")
    parser.add_argument("--lr", type=float, help=f"peak learning rate (default {full['lr']})")
    parser.add_argument("--warmup", type=int, help=f"warm-up steps (default {full['warmup']})")
    parser.add_argument("--batch", type=int, help=f"blocks per step (default {full['batch_size']})")
    parser.add_argument("--vocab", type=int, help=f"BPE vocabulary (default {full['vocab_size']})")
    parser.add_argument("--documents", type=int, help=f"training documents (default {full['num_documents']})")
    parser.add_argument("--hidden", type=int, help=f"model width (default {full['model']['hidden_size']})")
    parser.add_argument("--layers", type=int, help=f"layers (default {full['model']['num_hidden_layers']})")
    parser.add_argument("--made_up", type=float, default=claims.RULE_MIX.made_up_share,
                        help="share of statements with two made-up nouns (default RULE_MIX's, %(default)s)")
    parser.add_argument(
        "--kind_weights", type=float, nargs=3, default=claims.RULE_MIX.kind_weights,
        metavar=("COREF", "RECALL", "COPY"), help="odds of each document kind (default RULE_MIX's)",
    )
    parser.add_argument(
        "--probes", type=int, help="probes per kind (default 200; scored every --every steps)"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    for name in (
        "steps", "every", "lr", "warmup", "batch", "vocab", "documents", "hidden", "layers", "probes",
        "threads",
    ):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive, got {value}.")
    if not 0.0 <= args.made_up <= 1.0:
        parser.error(f"--made_up is a share between 0 and 1, got {args.made_up}.")
    if min(args.kind_weights) < 0 or max(args.kind_weights) <= 0:
        parser.error(f"--kind_weights must be odds (>= 0, one of them > 0), got {args.kind_weights}.")
    # Checked now, not after the training: the JSON is the last thing written.
    if args.out and (
        os.path.isdir(args.out) or not os.path.isdir(os.path.dirname(os.path.abspath(args.out)))
    ):
        parser.error(
            f"--out must be a file path in an existing folder, got {args.out!r}; create the folder first."
        )
    return args


def settings_for(args: argparse.Namespace) -> dict:
    settings = dict(claims.SETTINGS["quick" if args.quick else "full"])
    settings["model"] = dict(settings["model"])
    for flag, key in (("steps", "train_steps"), ("lr", "lr"), ("warmup", "warmup"), ("batch", "batch_size"),
                      ("vocab", "vocab_size"), ("documents", "num_documents"),
                      ("probes", "probes_per_kind")):
        if getattr(args, flag) is not None:
            settings[key] = getattr(args, flag)
    if args.hidden is not None:
        settings["model"].update(hidden_size=args.hidden, intermediate_size=3 * args.hidden)
    if args.layers is not None:
        settings["model"]["num_hidden_layers"] = args.layers
    return settings


def probe_sets(settings: dict) -> list:
    count = settings["probes_per_kind"]
    probes = [
        p for p in claims.make_probes(count, recall_distances=()) if p.kind in ("coref", "coref_new_nouns")
    ]
    return probes + made_up_coref_probes(count)


def score_row(model, tokenizer, probes, step: int, seconds: float, recent_losses: list[float]) -> dict:
    """The three accuracies at this step, printed as a table row as soon as they are known."""
    model.eval()
    accuracy = claims.score_probes(model, tokenizer, probes, batch_size=16)
    row = {"step": step, "seconds": round(seconds, 1), "loss": sum(recent_losses) / len(recent_losses),
           **{kind: accuracy[kind] for kind in ("coref", "coref_new_nouns", "coref_made_up")}}
    print(
        f"| {step} | {seconds:.0f} | {row['loss']:.3f} | {row['coref']:.2f} | {row['coref_new_nouns']:.2f} "
        f"| {row['coref_made_up']:.2f} |",
        flush=True,
    )
    return row


def main(argv=None) -> dict:
    args = parse_arguments(argv)
    torch.set_num_threads(args.threads)
    settings = settings_for(args)
    mix = claims.Mix(tuple(args.kind_weights), args.made_up)
    tokenizer, blocks, _ = claims.build_data(settings, args.seed, mix)
    model = claims.build_tinytx(settings, tokenizer, args.seed)
    feed = claims.CorpusFeed(blocks, settings["batch_size"], args.seed)
    optimizer = claims.make_optimizer(model, settings["lr"])
    probes, steps, curve, losses, seconds = probe_sets(settings), settings["train_steps"], [], [], 0.0
    print(
        "| step | s | loss | seen nouns | unseen nouns | made-up nouns |\n|---|---|---|---|---|---|",
        flush=True,
    )
    for step in range(steps):
        input_ids, labels = feed.batch(step / steps)
        for group in optimizer.param_groups:
            group["lr"] = claims.scheduled_lr(settings["lr"], step, step / steps, settings["warmup"])
        start = time.perf_counter()
        model.train()
        losses.append(claims.training_step(model, optimizer, input_ids, labels)[0])
        seconds += time.perf_counter() - start
        if (step + 1) % args.every == 0 or step + 1 == steps:
            curve.append(score_row(model, tokenizer, probes, step + 1, seconds, losses[-10:]))
    flags = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "benchmarks.seed_claims.rule_ablation", *flags])
    result = {
        "benchmark": "seed_claims.rule_ablation", "command": command, "seed": args.seed,
        "mix": dataclasses.asdict(mix), "model": settings["model"], "vocab_size": len(tokenizer),
        "lr": settings["lr"], "batch_size": settings["batch_size"],
        "num_documents": settings["num_documents"], "probes_per_kind": settings["probes_per_kind"],
        "curve": curve,
    }
    print(json.dumps(result))
    if args.out:
        with open_new(args.out) as f:  # never through a link planted at --out
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
