"""The sweep the run's planner learns from (training/plan/): held-out bits per byte of each model of
the planner's ladder after a fixed number of training tokens.

    python -m benchmarks.plan_sweep               # the grid below on ../shared/data/tinyshakespeare.txt
    python -m benchmarks.plan_sweep --jobs 1 --out F.jsonl

Each point is one `python -m benchmarks.shakespeare` run planned in steps (not seconds) on one thread, so
neither the host's speed nor its load moves a score: the same flags give the same bits per byte. Speed is
the planner's other input and is measured where the run happens, not here. Points already in --out are
skipped, so a stopped sweep continues. Ends with a table (size x tokens) and one JSON line.
"""

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.report import print_report
from hf_tinytx_training.plan import law
from hf_tinytx_training.plan.ladder import BATCH, BLOCK, LADDER, RECIPE, VOCAB


REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "plan_sweep.jsonl"
# (ladder rung, training tokens): the tokens of a 160 s and a 10 min run on a 2-core CPU, per size
GRID = [
    (rung, tokens)
    for rung, budgets in [
        (0, (0.25e6, 0.5e6, 1e6, 2e6, 4e6)),
        (1, (0.25e6, 0.5e6, 1e6, 2e6, 4e6)),
        (2, (0.25e6, 0.5e6, 1e6, 2e6, 4e6)),
        (3, (0.25e6, 0.5e6, 1e6, 2e6, 4e6)),
        (4, (0.25e6, 0.5e6, 1e6, 2e6)),
        (5, (0.25e6, 0.5e6, 1e6)),
        (6, (0.25e6, 0.5e6)),
    ]
    for tokens in budgets
]


def flags(rung: int, tokens: float) -> list[str]:
    steps = round(tokens / (BATCH * BLOCK))
    shape = [part for name, value in LADDER[rung].flags().items() for part in (f"--{name}", str(value))]
    return [
        *shape, "--vocab_size", str(VOCAB), "--block_size", str(BLOCK), "--per_device_train_batch_size",
        str(BATCH), "--learning_rate", str(RECIPE["learning_rate"]),
        "--muon_learning_rate", str(RECIPE["muon_learning_rate"]), "--weight_decay", "1.0",
        "--mixed_precision", "no", "--max_train_steps", str(steps), "--max_train_seconds", "100000",
    ]


def run_point(rung: int, tokens: float, text: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "benchmarks.shakespeare", *(["--text", text] if text else []),
               *flags(rung, tokens)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"plan_sweep.py: error: rung {rung} at {tokens:g} tokens failed:\n"
                         + result.stdout[-2000:] + result.stderr[-3000:])
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    return {"rung": rung, "tokens": int(tokens), "size": LADDER[rung].name,
            "parameters": LADDER[rung].parameters(VOCAB),
            **{key: summary[key] for key in ("bits_per_byte", "eval_loss", "steps", "tokens_per_second",
                                                 "wall_seconds")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", default=None, help="A plain-text file (default: Tiny Shakespeare).")
    parser.add_argument("--out", default=str(OUT),
                        help="JSON lines, one per point; points in it are skipped.")
    parser.add_argument("--jobs", type=int, default=2, help="Points run side by side (one thread each).")
    parser.add_argument("--points", nargs="+", default=None, metavar="RUNG:TOKENS",
                        help="These points instead of the grid, e.g. 0:250000 3:1e6 (rung 0 is micro).")
    args = parser.parse_args()
    grid = [(int(rung), float(tokens)) for rung, tokens in (point.split(":") for point in args.points)] \
        if args.points else GRID
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    todo = [(rung, tokens) for rung, tokens in grid
            if not any(row["rung"] == rung and row["tokens"] == int(tokens) for row in done)]
    todo.sort(key=lambda item: item[1] * LADDER[item[0]].parameters(1024))  # cheapest first

    def point(item):
        row = run_point(*item, args.text)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return row

    with ThreadPoolExecutor(args.jobs) as pool:
        done += list(pool.map(point, todo))
    rows = [(f"{LADDER[row['rung']].name} at {row['tokens'] / 1e6:g}M tokens", f"{row['bits_per_byte']:.4f}")
            for row in sorted(done, key=lambda row: (row["rung"], row["tokens"]))]
    fitted = law.fit([(row["parameters"], row["tokens"], row["eval_loss"]) for row in done], law.SWEEP_UNIQUE)
    constants = json.dumps({name: round(value, 4) for name, value in fitted.items()}) if fitted \
        else "too few points to fit"
    rows.append(("law (training/plan/law.py's FITTED)", constants))
    measured = {}
    for row in sorted(done, key=lambda row: (row["rung"], row["tokens"])):
        measured.setdefault(LADDER[row["rung"]].name, []).append((row["tokens"], round(row["eval_loss"], 4)))
    rows.append(("measured (law.py's MEASURED)", json.dumps(measured)))
    print_report(rows, {"benchmark": "plan_sweep", "points": done, "law": fitted, "measured": measured})


if __name__ == "__main__":
    main()
