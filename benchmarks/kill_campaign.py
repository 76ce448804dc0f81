"""Random SIGKILLs against training/pretrain.py: does `--resume_from_checkpoint latest` always finish the run with
exactly the weights of a run never interrupted, and does a file of the user's in --output_dir always survive?

    python -m benchmarks.kill_campaign                   # 20 trials, 2 of them with attention dropout
    python -m benchmarks.kill_campaign --quick           # 3 trials, about a minute on 2 cores; writes nothing
    python -m benchmarks.kill_campaign --trials 50 --seed 1

Run it from the repository root (`-m`): the faults come from tests/helpers/faults.py, shared with tests/test_faults.py.

First a straight reference run of the command (and one with attention_dropout 0.1 when there are dropout trials),
timed. Then each trial starts the same command, a checkpoint every step, into a fresh folder holding my_notes.txt,
and kills it with SIGKILL at a moment drawn from --seed:

- time: uniformly over the reference run's duration;
- export: uniformly over the export phase, counted from the output line that opens it (the final validation);
- call: right before or after the Nth call of a file function (a checkpoint's weights or optimizer state, a rename in
  checkpoints/, a move out of the export's staging folder), through a child Python that patches that function.
  Dropout trials are all of this kind, at a checkpoint in the middle of the run, so that the rerun trains again.

Then it reruns the command with --resume_from_checkpoint latest until a run exits 0 (at most 3 reruns; outside
--quick each rerun but the last may itself be killed once, at a random time), compares the final model.safetensors
with the reference's, tensor by tensor and bit for bit, and checks that my_notes.txt is still there, unchanged.

Prints a table of trials, the line "N tried, N resumed bit for bit, N lost", then one JSON line. Without --quick it
writes kill_campaign.txt and kill_campaign.json to --out (default benchmarks/results/).
"""

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from tests.helpers.faults import KILL_MARK, KILLED, PRETRAIN, run_killed_after, run_killed_after_line, run_killed_at
    from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env
except ModuleNotFoundError as error:
    if error.name != "tests":
        raise
    sys.exit("kill_campaign.py: run it from the repository root as `python -m benchmarks.kill_campaign`.")


NOTES = "My own notes, kept in the output folder: no training run may touch them.\n"
EXPORT_LINE = r"validation: loss"  # printed after the final evaluation; the final checkpoint and the export follow
STAGING = ".tinytx-staging"
MOVES = ("os.replace", "os.rename")
MAX_RERUNS = 3
RERUN_KILL_CHANCE = 0.3
# Exact moments: (functions, text in an argument, calls per step (None: per run), label).
CALLS = [
    (("safetensors.torch.save_file",), "checkpoints", 1, "checkpoint weights"),
    (("torch.save",), "checkpoints", 3, "checkpoint optimizer/scheduler/RNG"),
    (MOVES, "checkpoints", 1, "rename in checkpoints/"),
    (MOVES, STAGING, None, "export move"),
]


def command_flags(steps: int, model_config: Path | None) -> list[str]:
    flags = [*TINY_PRETRAIN_ARGS, "--max_train_steps", steps, "--checkpointing_steps", 1,
             "--num_probes_per_kind", 0, "--num_samples", 0]
    if model_config:
        flags += ["--model_config", model_config]
    return [str(flag) for flag in flags]


def dropout_config(folder: Path) -> Path:
    """training/configs/model-tiny.json with attention_dropout 0.1 (the test flags override its sizes)."""
    values = json.loads((REPO_ROOT / "training" / "configs" / "model-tiny.json").read_text())
    values["attention_dropout"] = 0.1
    path = folder / "model-tiny-dropout.json"
    path.write_text(json.dumps(values, indent=2))
    return path


def timed_reference(flags: list[str], output_dir: Path, env: dict, cwd: Path) -> dict:
    """Runs the command straight through; returns its duration and when the export phase began."""
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, str(PRETRAIN), *flags, "--output_dir", str(output_dir)], env=env,
                               cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output, export_start = [], None
    for line in iter(process.stdout.readline, b""):
        output.append(line)
        if export_start is None and re.search(EXPORT_LINE, line.decode(errors="replace")):
            export_start = time.monotonic() - start
    seconds = time.monotonic() - start
    if process.wait() != 0:
        sys.exit(f"kill_campaign.py: the reference run failed:\n{b''.join(output).decode(errors='replace')[-3000:]}")
    if export_start is None:
        sys.exit(f"kill_campaign.py: the reference run printed no line matching {EXPORT_LINE!r}; update EXPORT_LINE.")
    return {"seconds": seconds, "export_seconds": seconds - export_start, "output_dir": output_dir}


def plan_trials(rng: random.Random, count: int, dropout_trials: int, steps: int, quick: bool) -> list[dict]:
    """Every random choice, made up front so that a seed names the same campaign whatever happens in it."""
    plans = []
    for index in range(count):
        plan = {"trial": index + 1, "config": "dropout" if index >= count - dropout_trials else "plain",
                "kind": ("time", "export", "call")[index % 3]}
        # In --quick every kill must land: keep time kills off the very end, exact calls on ones every run makes.
        plan["fraction"] = rng.uniform(0.05, 0.6) if quick else rng.random()
        functions, match, per_step, label = CALLS[0] if quick else rng.choice(CALLS)
        last = 4 if per_step is None else per_step * steps
        plan["call"] = {"function": list(functions), "match": match, "label": label,
                        "nth": rng.randint(1, last), "when": rng.choice(("before", "after"))}
        if plan["config"] == "dropout":
            # Dropout only matters when the rerun trains steps again: kill while a checkpoint in the middle of the
            # run is being written, so that the rerun resumes from the one before it.
            functions, match, _, label = CALLS[0]
            plan["kind"] = "call"
            plan["call"] = {"function": list(functions), "match": match, "label": label,
                            "nth": rng.randint(2, max(2, steps - 1)), "when": rng.choice(("before", "after"))}
        plan["rerun_kills"] = [None if quick or rerun == MAX_RERUNS - 1 or rng.random() >= RERUN_KILL_CHANCE
                               else rng.random() for rerun in range(MAX_RERUNS)]
        plans.append(plan)
    return plans


def notes_kept(output_dir: Path) -> bool:
    path = output_dir / "my_notes.txt"
    return path.is_file() and path.read_text() == NOTES


def same_weights(expected: Path, actual: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    if not actual.is_file():
        return False
    a, b = load_file(expected), load_file(actual)
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def last_error(result) -> str | None:
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip() and not line.startswith(KILL_MARK)]
    return lines[-1][:200] if lines else None


def run_trial(plan: dict, reference: dict, flags: list[str], folder: Path, env: dict) -> dict:
    output_dir = folder / f"trial_{plan['trial']:02d}"
    output_dir.mkdir()
    (output_dir / "my_notes.txt").write_text(NOTES)
    args, started = [*flags, "--output_dir", str(output_dir)], time.monotonic()

    if plan["kind"] == "time":
        at = plan["fraction"] * reference["seconds"]
        moment = f"t={at:.2f}s of {reference['seconds']:.1f}s"
        first = run_killed_after(args, at, env=env, cwd=folder)
    elif plan["kind"] == "export":
        delay = plan["fraction"] * reference["export_seconds"]
        moment = f"export +{delay:.2f}s of {reference['export_seconds']:.2f}s"
        first = run_killed_after_line(args, EXPORT_LINE, delay, env=env, cwd=folder)
    else:
        call = plan["call"]
        moment = f"{call['when']} {call['label']} #{call['nth']}"
        first = run_killed_at(args, env=env, cwd=folder, function=tuple(call["function"]), match=call["match"],
                              nth=call["nth"], when=call["when"])
    killed = first.returncode == KILLED
    if not killed:
        moment += " (not reached)"
    lost = not notes_kept(output_dir)

    result, reruns, rerun_kills, resumed_from, error = first, 0, 0, "-", None
    if first.returncode not in (0, KILLED):
        error = last_error(first)
    while result.returncode != 0 and reruns < MAX_RERUNS:
        fraction = plan["rerun_kills"][reruns]
        rerun_args = [*args, "--resume_from_checkpoint", "latest"]
        if fraction is None:
            result = subprocess.run([sys.executable, str(PRETRAIN), *rerun_args], env=env, cwd=folder,
                                    capture_output=True, text=True)
        else:
            result = run_killed_after(rerun_args, fraction * reference["seconds"], env=env, cwd=folder)
            rerun_kills += result.returncode == KILLED
        reruns += 1
        lost |= not notes_kept(output_dir)
        if result.returncode not in (0, KILLED):
            error = last_error(result)
        found = re.search(r"Resumed from (\S+)", result.stdout)
        resumed_from = Path(found[1]).name if found else ("scratch" if "from scratch" in result.stdout else "?")

    equal = result.returncode == 0 and same_weights(reference["output_dir"] / "model.safetensors",
                                                    output_dir / "model.safetensors")
    return {**{k: plan[k] for k in ("trial", "config", "kind")}, "moment": moment, "killed": killed,
            "reruns": reruns, "rerun_kills": rerun_kills, "resumed_from": resumed_from,
            "exit": result.returncode, "equal": equal, "lost": lost, "error": None if equal else error,
            "seconds": round(time.monotonic() - started, 1)}


def table(rows: list[dict]) -> str:
    header = f"{'trial':>5}  {'config':<7}  {'moment':<46}  {'reruns':>6}  {'resumed from':<12}  {'equal?':<6}  lost?"
    lines = [header, "-" * len(header)]
    for row in rows:
        reruns = f"{row['reruns']}" + (f" ({row['rerun_kills']}k)" if row["rerun_kills"] else "")
        lines.append(f"{row['trial']:>5}  {row['config']:<7}  {row['moment'][:46]:<46}  {reruns:>6}  "
                     f"{row['resumed_from']:<12}  {'yes' if row['equal'] else 'NO':<6}  {'YES' if row['lost'] else 'no'}")
        if row["error"]:
            lines.append(f"{'':>7}exit {row['exit']}: {row['error']}")
    return "\n".join(lines)


def source_version() -> str:
    """The commit the product was at, "-dirty" when its files had uncommitted changes."""
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT, capture_output=True,
                               text=True)
    return described.stdout.strip() or "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--dropout_trials", type=int, default=2, help="How many of the trials use attention dropout.")
    parser.add_argument("--steps", type=int, default=6, help="--max_train_steps of every run.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 trials, no dropout, no killed reruns; writes nothing.")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--keep", action="store_true", help="Keep the trials' folders (printed) to look into.")
    args = parser.parse_args()
    trials, dropout_trials, steps = (3, 0, 4) if args.quick else (args.trials, min(args.dropout_trials, args.trials),
                                                                   args.steps)

    source = source_version()  # again at the end: a commit landing meanwhile would change what later trials ran
    folder = Path(tempfile.mkdtemp(prefix="kill-campaign-"))
    env = {**pretrain_env(folder), "PYTHONUNBUFFERED": "1"}
    configs = {"plain": None}
    if dropout_trials:
        configs["dropout"] = dropout_config(folder)
    try:
        references = {name: timed_reference(command_flags(steps, config), folder / f"reference_{name}", env, folder)
                      for name, config in configs.items()}
        for name, reference in references.items():
            print(f"reference ({name}): {reference['seconds']:.1f} s, export phase {reference['export_seconds']:.2f} s",
                  file=sys.stderr, flush=True)
        rows = []
        print(table([]), file=sys.stderr, flush=True)  # progress on stderr: the table proper follows on stdout
        for plan in plan_trials(random.Random(args.seed), trials, dropout_trials, steps, args.quick):
            config = plan["config"]
            rows.append(run_trial(plan, references[config], command_flags(steps, configs[config]), folder, env))
            print("\n".join(table(rows[-1:]).splitlines()[2:]), file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"trial folders kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)

    summary = {
        "benchmark": "kill_campaign", "mode": "quick" if args.quick else "full", "seed": args.seed, "steps": steps,
        "tried": len(rows), "killed": sum(row["killed"] for row in rows),
        "bit_for_bit": sum(row["equal"] for row in rows), "lost": sum(row["lost"] for row in rows),
        "reference_seconds": {name: round(ref["seconds"], 2) for name, ref in references.items()},
        "source": source if source_version() == source else f"{source} .. {source_version()} (changed during the run)",
        "command": ["python", "training/pretrain.py", *command_flags(steps, None)],
        "trials": rows,
    }
    counts = f"{summary['tried']} tried, {summary['bit_for_bit']} resumed bit for bit, {summary['lost']} lost"
    report = "\n".join([
        table(rows), "",
        f"{summary['killed']} of {summary['tried']} first runs killed; "
        f"{sum(row['rerun_kills'] for row in rows)} reruns killed as well",
        counts,
    ])
    print("\n" + report)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        flags = " ".join(sys.argv[1:])
        header = f"python -m benchmarks.kill_campaign {flags}".rstrip() + f"  (source {summary['source']})"
        (args.out / "kill_campaign.txt").write_text(header + "\n\n" + report + "\n")
        (args.out / "kill_campaign.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
