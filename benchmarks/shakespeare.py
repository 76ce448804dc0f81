"""Tiny Shakespeare in a fixed wall-clock budget: the real training/pretrain.py, end to end, scored in bits per byte.

    python benchmarks/shakespeare.py                          # ../shared/data/tinyshakespeare.txt, 160 s of training
    python benchmarks/shakespeare.py my.txt --max_train_seconds 30 --model_preset small --learning_rate 1e-3

What happens:
1. The text is split at a blank line near 90%: the first part trains (tokenizer included), the last 10% is held out.
   The two parts go to a temporary folder as .txt files, because pretrain.py reads .txt files one document per
   paragraph (blank-line block), and a paragraph of Shakespeare is one speech: a document that stands on its own.
   One document per line would put an EOS token after every verse line instead (a line is not a document).
2. The step count is fitted to the budget. pretrain.py's cosine schedule is step-based (--max_train_steps) and
   --max_train_seconds only cuts the loop short, which would leave the learning rate high at the end. So we time a
   short calibration run of the script itself first (30 steps, its own metrics.jsonl gives the loop's true pace) and
   pass --max_train_steps = budget / seconds-per-step,
   keeping --max_train_seconds as the hard stop (warm-up: a tenth of the steps, at most 30). Guessing a little
   long costs nearly nothing (the cosine is down to ~2% of its peak at 90% of its length); guessing short would
   waste budget. Pass --max_train_steps yourself to skip the timing.
3. pretrain.py runs as a subprocess (exactly the user's script, any extra flag passed through), evaluating once at
   the end on the whole held-out text; we read its metrics.jsonl.

Anchor: nanoGPT's character-level Shakespeare GPT on CPU reaches about 2.70 bits per byte (val loss ~1.88 nats).
Prints a table, then one JSON line with every figure.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "training" / "pretrain.py"
DEFAULT_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"

# Our defaults for pretrain.py; any flag given on our command line comes later and so wins (argparse keeps the last).
DEFAULT_FLAGS = [
    "--model_preset", "tiny", "--vocab_size", "1024", "--block_size", "128",
    "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "32",
    "--learning_rate", "3e-3",
    "--num_probes_per_kind", "0", "--num_samples", "0",  # probes and sample prompts are for the synthetic corpus
]


def split_text(text: str, holdout: float) -> tuple[str, str]:
    """Cut at the first blank line after (1 - holdout) of the text, so no speech is split in two."""
    cut = text.find("\n\n", int(len(text) * (1 - holdout)))
    if cut < 0:  # no paragraph break in the tail: cut at a line break instead
        cut = text.find("\n", int(len(text) * (1 - holdout)))
    if cut <= 0:
        raise SystemExit("shakespeare.py: error: the text has no line break near the 90% mark to split it at.")
    return text[:cut], text[cut:].lstrip("\n")


def seconds_per_step(pretrain_flags: list[str], env: dict, workdir: Path, steps: int = 30) -> float:
    """Seconds per step of pretrain.py's own loop with these flags, from a short calibration run of the script.

    Timing the model alone in this process underestimates the loop (data loading, Accelerate, per-step logging) by
    about a fifth, which ended the cosine schedule early; the script's own metrics.jsonl has the true pace."""
    calibration_dir = workdir / "calibration"
    flags = [*pretrain_flags, "--output_dir", str(calibration_dir), "--max_train_steps", str(steps),
             "--eval_steps", str(10 * steps), "--num_warmup_steps", "1"]
    result = subprocess.run([sys.executable, str(PRETRAIN), *flags], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-3000:] + result.stderr[-5000:])
        raise SystemExit(f"shakespeare.py: error: the calibration run of pretrain.py failed ({result.returncode}).")
    rows = [json.loads(line) for line in (calibration_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    elapsed = [row["elapsed_seconds"] for row in rows if "loss" in row]
    settled = len(elapsed) // 3  # the first steps pay for first-call allocations
    return (elapsed[-1] - elapsed[settled]) / (len(elapsed) - 1 - settled)


def read_metrics(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [row for row in rows if "loss" in row]
    evals = [row for row in rows if "bits_per_byte" in row]
    if not train or not evals:
        raise SystemExit(f"shakespeare.py: error: {path} has no training or evaluation rows.")
    return {"last_train": train[-1], "last_eval": evals[-1]}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other flag goes to training/pretrain.py unchanged (see `python training/pretrain.py --help`).",
    )
    parser.add_argument("text", nargs="?", default=None,
                        help=f"A plain-text file (default: {DEFAULT_TEXT} when it exists).")
    parser.add_argument("--max_train_seconds", type=float, default=160.0,
                        help="Wall-clock budget of the training loop.")
    parser.add_argument("--holdout", type=float, default=0.1, help="Fraction at the end of the text held out.")
    parser.add_argument("--output_dir", default=None,
                        help="Keep pretrain.py's model folder here (default: temporary).")
    parser.add_argument("--max_train_steps", type=int, default=None, help="Skip the timing and train this many steps.")
    args, passthrough = parser.parse_known_args()

    text_path = Path(args.text) if args.text else DEFAULT_TEXT
    if not text_path.is_file():
        parser.error(f"no text file at {text_path}; give the path of a plain-text file "
                     "(Tiny Shakespeare: https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                     "tinyshakespeare/input.txt)")
    if not 0 < args.holdout < 1:
        parser.error("--holdout must lie between 0 and 1.")
    text = text_path.read_text(encoding="utf-8")
    train_text, validation_text = split_text(text, args.holdout)

    with tempfile.TemporaryDirectory(prefix="shakespeare_") as tmp:
        tmp = Path(tmp)
        (tmp / "train.txt").write_text(train_text, encoding="utf-8")
        (tmp / "validation.txt").write_text(validation_text, encoding="utf-8")
        output_dir = Path(args.output_dir).resolve() if args.output_dir else tmp / "model"
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false",
                   HF_DATASETS_CACHE=str(tmp / "datasets_cache"))  # the tokenized splits go with the temp folder
        flags = [*DEFAULT_FLAGS, *passthrough,
                 "--train_file", str(tmp / "train.txt"), "--validation_file", str(tmp / "validation.txt"),
                 "--max_train_seconds", str(args.max_train_seconds)]

        step_seconds = None
        if args.max_train_steps is None:
            step_seconds = seconds_per_step(flags, env, tmp)
            max_train_steps = max(1, math.floor(args.max_train_seconds / step_seconds))
        else:
            max_train_steps = args.max_train_steps
        flags += ["--output_dir", str(output_dir)]
        flags += ["--max_train_steps", str(max_train_steps), "--eval_steps", str(max_train_steps)]  # one final eval
        if "--num_warmup_steps" not in passthrough:  # warm up for a tenth of a short run, 30 steps at most
            flags += ["--num_warmup_steps", str(min(30, max(1, max_train_steps // 10)))]
        print(f"text {text_path}: {len(train_text.encode()):,} training bytes, "
              f"{len(validation_text.encode()):,} held out"
              + (f"; {step_seconds * 1e3:.0f} ms/step measured -> {max_train_steps} steps" if step_seconds else ""),
              flush=True)

        start = time.perf_counter()
        result = subprocess.run([sys.executable, str(PRETRAIN), *flags], env=env, capture_output=True, text=True)
        wall_seconds = time.perf_counter() - start
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-5000:])
            raise SystemExit(f"shakespeare.py: error: pretrain.py failed with exit status {result.returncode}.")
        metrics = read_metrics(output_dir / "metrics.jsonl")

    import torch  # only for the thread count the subprocess got too (set OMP_NUM_THREADS to change it)

    last_train, last_eval = metrics["last_train"], metrics["last_eval"]
    summary = {
        "benchmark": "shakespeare",
        "text": str(text_path),
        "bits_per_byte": last_eval["bits_per_byte"],
        "eval_loss": last_eval["eval_loss"],
        "steps": last_train["step"],
        "planned_steps": max_train_steps,
        "stopped_by_clock": last_train["step"] < max_train_steps,
        "final_lr": last_train["lr"],
        "tokens": last_train["tokens"],
        "train_seconds": last_train["elapsed_seconds"],
        "tokens_per_second": last_train["tokens_per_second"],
        "wall_seconds": wall_seconds,  # tokenizer training, tokenization, evaluation and export included
        "budget_seconds": args.max_train_seconds,
        "threads": torch.get_num_threads(),
        "measured_ms_per_step": step_seconds * 1e3 if step_seconds else None,
        "pretrain_flags": [flag.replace(str(tmp), "$TMP") for flag in flags],
    }
    rows = [
        ("validation bits/byte", f"{summary['bits_per_byte']:.4f}"),
        ("validation loss (nats/token)", f"{summary['eval_loss']:.4f}"),
        ("steps (planned)", f"{summary['steps']} ({max_train_steps})"),
        ("tokens", f"{summary['tokens']:,}"),
        ("training seconds (budget)", f"{summary['train_seconds']:.1f} ({args.max_train_seconds:g})"),
        ("tokens/s", f"{summary['tokens_per_second']:,}"),
        ("final learning rate", f"{summary['final_lr']:.2e}"),
        ("whole run, seconds", f"{wall_seconds:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}} | {value}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
