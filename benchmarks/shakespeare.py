"""Tiny Shakespeare in a fixed wall-clock budget: the real training/pretrain.py,
end to end, scored in bits per byte.

    python -m benchmarks.shakespeare                          # ../shared/data/tinyshakespeare.txt, 160 s of
                                                              # training
    python -m benchmarks.shakespeare --text my.txt --max_train_seconds 30 --model_preset small --learning_rate
                                                              1e-3

What happens:
1. The text is split at a blank line near 90%: the first part trains (tokenizer included), the last
   10% is held out. The two parts go to a temporary folder as .txt files, because pretrain.py reads
   .txt files one document per paragraph (blank-line block), and a paragraph of Shakespeare is one
   speech: a document that stands on its own. One document per line would put an EOS token after every
   verse line instead (a line is not a document).
2. The run is planned in seconds: pretrain.py gets --max_train_seconds and no step count, so its learning-rate
   schedule runs on the clock and reaches its end at the last second (the recipe any user gets by doing the
   same). Pass --max_train_steps to plan in steps instead (the clock then only cuts the run short).
3. pretrain.py runs as a subprocess (exactly the user's script, any extra flag passed through), evaluating
   once at the end on the whole held-out text; we read its metrics.jsonl.

Anchor: nanoGPT's character-level Shakespeare GPT on CPU reaches about 2.70 bits per byte (val loss ~1.88
nats). Prints a table, then one JSON line with every figure.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import print_report


REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "training" / "pretrain.py"
DEFAULT_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"

# Our defaults for pretrain.py: the best recipe measured for 160 s on 2 cores (results/shakespeare_sweep.txt).
# Any flag given on our command line comes later and so wins (argparse keeps the last).
DEFAULT_FLAGS = [
    "--model_preset", "tiny", "--hidden_size", "192", "--intermediate_size", "512",  # 2.2M parameters
    "--vocab_size", "1024", "--block_size", "128",
    "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "32",
    "--learning_rate", "3e-3", "--optimizer", "muon", "--muon_learning_rate", "2e-2", "--weight_decay", "1.0",
    # bf16 matmuls: ~1.3x the steps on a CPU with AMX (fp32 without: default_flags)
    "--mixed_precision", "bf16",
    # probes and sample prompts are for the synthetic corpus
    "--num_probes_per_kind", "0", "--num_samples", "0",
]


def default_flags() -> list[str]:
    """DEFAULT_FLAGS, in fp32 where bf16 would be slow: a CPU without AVX-512 or
    AMX has no fast bf16 matmul."""
    from hf_tinytx_training.distributed.sharding import cpu_runs_bf16_fast, has_gpu

    if has_gpu() or cpu_runs_bf16_fast():
        return DEFAULT_FLAGS
    at = DEFAULT_FLAGS.index("--mixed_precision")
    print("this CPU has no fast bf16 matmul: training in fp32 (--mixed_precision no)", flush=True)
    return [*DEFAULT_FLAGS[:at + 1], "no", *DEFAULT_FLAGS[at + 2:]]


def split_text(text: str, holdout: float) -> tuple[str, str]:
    """Cut at the first blank line after (1 - holdout) of the text, so no speech is split in two."""
    cut = text.find("\n\n", int(len(text) * (1 - holdout)))
    if cut < 0:  # no paragraph break in the tail: cut at a line break instead
        cut = text.find("\n", int(len(text) * (1 - holdout)))
    if cut <= 0:
        raise SystemExit(
            "shakespeare.py: error: the text has no line break near the 90% mark to split it at."
        )
    return text[:cut], text[cut:].lstrip("\n")


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
        epilog="Any other flag goes to training/pretrain.py unchanged (see `python training/pretrain.py "
               "--help`).",
    )
    parser.add_argument("--text", default=None,
                        help=f"A plain-text file (default: {DEFAULT_TEXT} when it exists).")
    parser.add_argument("--max_train_seconds", type=float, default=160.0,
                        help="Wall-clock budget of the training loop.")
    parser.add_argument(
        "--holdout", type=float, default=0.1, help="Fraction at the end of the text held out."
    )
    parser.add_argument("--output_dir", default=None,
                        help="Keep pretrain.py's model folder here (default: temporary).")
    parser.add_argument("--max_train_steps", type=int, default=None,
                        help="Plan the run in steps (the clock then only cuts it short).")
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
        # The tokenized splits go with the temp folder, and so do torch.compile's kernels: a run with
        # --torch_compile compiles from scratch inside its budget, as a user's first run does.
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=str(tmp / "datasets_cache"),
                   TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor_cache"))
        flags = [*default_flags(), *passthrough,
                 "--train_file", str(tmp / "train.txt"), "--validation_file", str(tmp / "validation.txt"),
                 "--max_train_seconds", str(args.max_train_seconds)]

        flags += ["--output_dir", str(output_dir), "--eval_steps", str(10**9)]  # one evaluation, at the end
        if args.max_train_steps is not None:
            flags += ["--max_train_steps", str(args.max_train_steps)]
        print(f"text {text_path}: {len(train_text.encode()):,} training bytes, "
              f"{len(validation_text.encode()):,} held out", flush=True)

        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, str(PRETRAIN), *flags], env=env, capture_output=True, text=True
        )
        wall_seconds = time.perf_counter() - start
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-5000:])
            raise SystemExit(
                f"shakespeare.py: error: pretrain.py failed with exit status {result.returncode}."
            )
        metrics = read_metrics(output_dir / "metrics.jsonl")

    import torch  # only for the thread count the subprocess got too (set OMP_NUM_THREADS to change it)

    last_train, last_eval = metrics["last_train"], metrics["last_eval"]
    summary = {
        "benchmark": "shakespeare",
        "text": str(text_path),
        "bits_per_byte": last_eval["bits_per_byte"],
        "eval_loss": last_eval["eval_loss"],
        "steps": last_train["step"],
        "final_lr": last_train["lr"],
        "tokens": last_train["tokens"],
        "train_seconds": last_train["elapsed_seconds"],
        "tokens_per_second": last_train["tokens_per_second"],
        "wall_seconds": wall_seconds,  # tokenizer training, tokenization, evaluation and export included
        "budget_seconds": args.max_train_seconds,
        "threads": torch.get_num_threads(),
        "pretrain_flags": [flag.replace(str(tmp), "$TMP") for flag in flags],
    }
    rows = [
        ("validation bits/byte", f"{summary['bits_per_byte']:.4f}"),
        ("validation loss (nats/token)", f"{summary['eval_loss']:.4f}"),
        ("steps", f"{summary['steps']}"),
        ("tokens", f"{summary['tokens']:,}"),
        ("training seconds (budget)", f"{summary['train_seconds']:.1f} ({args.max_train_seconds:g})"),
        ("tokens/s", f"{summary['tokens_per_second']:,}"),
        ("final learning rate", f"{summary['final_lr']:.2e}"),
        ("whole run, seconds", f"{wall_seconds:.1f}"),
    ]
    print_report(rows, summary)


if __name__ == "__main__":
    main()
