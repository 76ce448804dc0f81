"""Does a busy machine slow a run in proportion to its load, never x10? The README's quick start
(`python training/pretrain.py`, the default run) on the idle machine, then beside busy loops (pure-Python
`while True: pass`, one core each), in turn, --repeats rounds.

    python -m benchmarks.busy_machine                          # idle, then beside 2 busy loops
    python -m benchmarks.busy_machine --loops 1 2 --repeats 3 -- --max_train_steps 500
    python -m benchmarks.busy_machine --one_thread                  # also idle with OMP_NUM_THREADS=1

Each run is the real script in its own folder. Per run: the wall time to the saved model, the training's
tokens/s, and the CPU threads the run chose (its training_args.json records them). The ratio of each busy
run to the idle run of its round; the median of those ratios. With --one_thread each round also runs idle
with one thread. That gives the kernel's fair share as a bound: beside L loops on C cores a one-thread run
gets at most C / (L + 1) of a core, so it trains at most that share of the idle one-thread speed.
Flags after `--` go to training/pretrain.py.
Prints a table and one JSON line; --out keeps the JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import print_report
from benchmarks.shakespeare import read_metrics


REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "training" / "pretrain.py"


def busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run_once(flags: list[str], output: Path, threads: int | None = None) -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    env.pop("OMP_NUM_THREADS", None)  # the run chooses its threads itself: that is what is measured
    if threads:  # ... except in the one-thread arm
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(PRETRAIN), *flags, "--output_dir", str(output)], env=env,
                            capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"busy_machine.py: error: pretrain.py failed:\n{result.stdout[-2000:]}"
                         f"{result.stderr[-3000:]}")
    train = read_metrics(output / "metrics.jsonl")["last_train"]
    threads = json.loads((output / "training_args.json").read_text()).get("torch_threads")
    return {"wall_seconds": round(wall, 2), "train_seconds": train["elapsed_seconds"],
            "steps": train["step"], "tokens_per_second": round(train["tokens"] / train["elapsed_seconds"]),
            "threads": threads}


def table_row(run: dict) -> tuple[str, str]:
    name = f"beside {run['loops']} busy loops" if run["loops"] else "idle"
    name += ", OMP_NUM_THREADS=1" if run.get("one_thread") else ""
    return (f"{name}, round {run['round']}",
            f"{run['wall_seconds']:.1f} s wall, {run['tokens_per_second']:,} tokens/s, "
            f"{run['threads']} threads, {run['steps']} steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loops", type=int, nargs="+", default=[2], help="Busy loops beside each busy run.")
    parser.add_argument("--repeats", type=int, default=1, help="Rounds (each: idle, then every --loops).")
    parser.add_argument("--one_thread", action="store_true",
                        help="Also run idle with one thread each round: the fair-share bound of each ratio.")
    parser.add_argument("--out", default=None, help="Also write the JSON here.")
    args, flags = parser.parse_known_args()
    flags = [flag for flag in flags if flag != "--"]
    runs = []
    one_thread = [(0, 1)] if args.one_thread else []
    arms = [(0, None), *one_thread, *((loops, None) for loops in args.loops)]  # (loops, forced threads)
    with tempfile.TemporaryDirectory(prefix="busy_machine_") as tmp:
        for repeat in range(args.repeats):
            for loops, threads in arms:
                started = busy_loops(loops)
                try:
                    row = {"round": repeat, "loops": loops, **({"one_thread": True} if threads else {}),
                           **run_once(flags, Path(tmp) / f"run_{repeat}_{loops}_{threads}", threads)}
                finally:
                    for loop in started:
                        loop.kill()
                        loop.wait()
                print(json.dumps(row), flush=True)
                runs.append(row)
    idle = {row["round"]: row for row in runs if row["loops"] == 0 and not row.get("one_thread")}
    busy = [row for row in runs if row["loops"]]
    ratios = {loops: statistics.median(row["wall_seconds"] / idle[row["round"]]["wall_seconds"]
                                       for row in busy if row["loops"] == loops) for loops in args.loops}
    rows = [table_row(row) for row in runs]
    rows += [(f"beside {loops} busy loops / idle", f"x{ratio:.2f} wall (median of {args.repeats})")
             for loops, ratio in ratios.items()]
    cores = len(os.sched_getaffinity(0))
    summary = {"benchmark": "busy_machine", "cores": cores, "runs": runs,
               "wall_ratio": {str(loops): round(ratio, 3) for loops, ratio in ratios.items()},
               "command": "python -m benchmarks.busy_machine " + " ".join(sys.argv[1:])}
    if args.one_thread:
        bounds = fair_share_bounds(runs, idle, cores)
        rows += [(f"beside {loops} busy loops / idle, tokens/s", f"x{measured:.2f} (the fair share's bound: "
                  f"x{bound:.2f})") for loops, (measured, bound) in bounds.items()]
        summary["tokens_per_second_ratio"] = {str(loops): round(m, 3) for loops, (m, _) in bounds.items()}
        summary["fair_share_bound"] = {str(loops): round(b, 3) for loops, (_, b) in bounds.items()}
    print_report(rows, summary, args.out)


def fair_share_bounds(runs: list[dict], idle: dict, cores: int) -> dict[int, tuple[float, float]]:
    """{loops: (idle / busy tokens/s, the least that ratio can be)}, medians over the rounds. Beside `loops`
    loops a one-thread run gets at most cores / (loops + 1) of a core: the idle one-thread speed times that
    share is the fastest it can train."""
    one = {row["round"]: row for row in runs if row.get("one_thread")}
    bounds = {}
    for loops in sorted({row["loops"] for row in runs if row["loops"]}):
        share = min(1.0, cores / (loops + 1))
        measured, bound = [], []
        for row in (row for row in runs if row["loops"] == loops):
            fastest = idle[row["round"]]["tokens_per_second"]
            measured.append(fastest / row["tokens_per_second"])
            bound.append(fastest / (one[row["round"]]["tokens_per_second"] * share))
        bounds[loops] = (statistics.median(measured), statistics.median(bound))
    return bounds


if __name__ == "__main__":
    main()
