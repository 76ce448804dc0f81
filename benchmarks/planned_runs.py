"""Does the run's plan (training/plan/) pay? Held-out bits per byte, side by side in one sitting, of:

    (a) planned   --train_file and --max_train_seconds alone: the run plans itself
    (b) defaults  the run before plans existed: the micro model and its recipe, on the same clock
    (t) tuned     benchmarks/shakespeare.py's recipe (2.2M parameters, tuned on Tiny Shakespeare at 160 s)
    (c) grid      the best of: sizes of the ladder with the planner's recipe, the tuned recipe, and the
                  planned size at two other Muon learning rates

    python -m benchmarks.planned_runs                              # Tiny Shakespeare, 160 s
    python -m benchmarks.planned_runs --budgets 160 600 --text my.txt

Each arm is the real training/pretrain.py on the same split (benchmarks/shakespeare.py: the last 10% held
out), one run at a time on the idle machine, every arm once per budget in turn. Prints a table and one JSON
line; --out keeps the JSON.
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
from benchmarks.shakespeare import DEFAULT_TEXT, default_flags, read_metrics, split_text
from hf_tinytx_training.plan.choose import precision
from hf_tinytx_training.plan.ladder import RECIPE, VOCAB, by_name


REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "training" / "pretrain.py"
QUIET = ["--num_probes_per_kind", "0", "--num_samples", "0", "--eval_steps", str(10**9)]
GRID = ("96x3", "128x4", "256x5")  # with the planner's recipe; 192x4 with it is the tuned recipe
RATES = ("1e-2", "3e-2")  # Muon's rate tried on the size the plan chose (the recipe's: 2e-2)


def size_flags(name: str) -> list[str]:
    """A size of the ladder with the planner's recipe, as flags (a size flag turns the plan off)."""
    recipe = {**by_name(name).flags(), "vocab_size": VOCAB, "weight_decay": 1.0,
              "mixed_precision": precision(),
              **{flag: value for flag, value in RECIPE.items() if flag != "optimizer"}}
    return [part for flag, value in recipe.items() for part in (f"--{flag}", str(value))]


def arms(planned_size: str | None = None) -> dict[str, list[str]]:
    """Each arm's flags (before the data, the budget and the output folder); the learning-rate arms once the
    planned run has said its size."""
    if planned_size is None:
        return {"planned": [], "defaults": ["--model_preset", "micro"], "tuned": default_flags(),
                **{f"grid {name}": size_flags(name) for name in GRID}}
    return {f"grid {planned_size} muon {rate}": [*size_flags(planned_size), "--muon_learning_rate", rate]
            for rate in RATES}


def run_arm(flags: list[str], train: Path, validation: Path, seconds: float, work: Path,
            output: Path | None = None) -> dict:
    output = output or work / "model"
    command = [sys.executable, str(PRETRAIN), *flags, *QUIET, "--train_file", str(train),
               "--validation_file", str(validation), "--max_train_seconds", str(seconds),
               "--output_dir", str(output), "--overwrite_output_dir"]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=str(work / "datasets_cache"))
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"planned_runs.py: error: pretrain.py failed:\n{result.stdout[-2000:]}"
                         f"{result.stderr[-3000:]}")
    metrics = read_metrics(output / "metrics.jsonl")
    plan = next((line for line in result.stdout.splitlines() if line.startswith("Plan: ")), None)
    args = json.loads((output / "training_args.json").read_text())
    size = args["plan"]["size"] if args.get("plan") else None
    config = json.loads((output / "config.json").read_text())  # the model as built (a preset's sizes too)
    return {"bits_per_byte": metrics["last_eval"]["bits_per_byte"], "steps": metrics["last_train"]["step"],
            "tokens": metrics["last_train"]["tokens"],
            "train_seconds": metrics["last_train"]["elapsed_seconds"],
            "hidden_size": config["hidden_size"], "num_hidden_layers": config["num_hidden_layers"],
            "size": size,
            "mixed_precision": args["mixed_precision"],
            "wall_seconds": time.perf_counter() - start, "plan": plan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", default=str(DEFAULT_TEXT),
                        help="A plain-text file (default: Tiny Shakespeare).")
    parser.add_argument("--budgets", type=float, nargs="+", default=[160.0], help="Training seconds per run.")
    parser.add_argument("--arms", nargs="+", default=None, help="Only these arms (names as in the table).")
    parser.add_argument("--out", default=None, help="Also write the JSON here.")
    parser.add_argument("--planned_size", default=None,
                        help="With --arms and no planned arm: the size whose learning rates the grid tries.")
    parser.add_argument("--keep_planned", default=None,
                        help="Keep each planned run's model folder here (DIR/160s, ...), to sample from.")
    args = parser.parse_args()
    train_text, validation_text = split_text(Path(args.text).read_text(encoding="utf-8"), 0.1)
    results = []
    with tempfile.TemporaryDirectory(prefix="planned_runs_") as tmp:
        work = Path(tmp)
        (work / "train.txt").write_text(train_text, encoding="utf-8")
        (work / "validation.txt").write_text(validation_text, encoding="utf-8")
        for seconds in args.budgets:
            todo = {**arms(), **(arms(args.planned_size) if args.planned_size else {})}
            while todo:
                name = next(iter(todo))  # in order; the planned run adds the learning-rate arms
                flags = todo.pop(name)
                if args.arms and not any(name.startswith(arm) for arm in args.arms):
                    continue
                keep = Path(args.keep_planned) / f"{seconds:g}s" if args.keep_planned and name == "planned" \
                    else None
                row = {"arm": name, "budget_seconds": seconds,
                       **run_arm(flags, work / "train.txt", work / "validation.txt", seconds, work, keep)}
                print(json.dumps(row), flush=True)
                results.append(row)
                if name == "planned":
                    todo.update(arms(row["size"]))
    rows = []
    for seconds in args.budgets:
        mine = [row for row in results if row["budget_seconds"] == seconds]
        grid = [row for row in mine if row["arm"].startswith(("grid", "tuned"))]
        best = min(grid, key=lambda row: row["bits_per_byte"]) if grid else None
        for row in mine:
            rows.append((f"{seconds:g} s | {row['arm']} ({row['hidden_size']}x{row['num_hidden_layers']})",
                         f"{row['bits_per_byte']:.4f} bits/byte, {row['steps']} steps, "
                         f"{row['tokens']:,} tokens"))
        if best:
            rows.append((f"{seconds:g} s | (c) best of the grid",
                         f"{best['arm']}: {best['bits_per_byte']:.4f}"))
    summary = {"benchmark": "planned_runs", "text": args.text, "runs": results,
               "command": "python -m benchmarks.planned_runs " + " ".join(sys.argv[1:])}
    print_report(rows, summary, args.out)


if __name__ == "__main__":
    main()
