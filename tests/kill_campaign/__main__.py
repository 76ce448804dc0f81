"""Random kills and stop signals against every command that writes a user's files: training/pretrain.py
(and its token store), training/finetune.py and `python -m hf_tinytx.convert --to llama`. Does rerunning
(`--resume_from_checkpoint latest`, or convert's same command) always end with exactly the result of a run
never interrupted, does a file of the user's in the output folder always survive, and does the folder hold,
at every moment seen after a kill, no model yet or one that loads (for convert: the old model or the new one,
never neither)?

    python -m tests.kill_campaign                   # all five, 61 trials: about 23 minutes on 2 shared cores
    python -m tests.kill_campaign --quick           # 2 trials per command (convert 3), 3 minutes; writes
                                                    # nothing
    python -m tests.kill_campaign --commands store --out benchmarks/results/kill_campaign_store
    python -m tests.kill_campaign --commands finetune --finetune_trials 12 --seed 1
    python -m tests.kill_campaign --commands nodes --out benchmarks/results/kill_campaign_nodes

Run it from the repository root (`-m`): the faults come from tests/helpers/faults.py and
tests/helpers/launch.py, shared with the tests; nothing in training/ or hf_tinytx/ knows of them.

Per command (pretrain_trials.py, finetune_trials.py, convert_trials.py), first a straight reference
run, timed (and, for finetune and convert, run under call_tracer.py, which counts the exact calls a
trial may be killed at). Then each trial starts the same command into a fresh folder holding
my_notes.txt and stops it at a moment drawn from --seed:

- time: SIGKILL uniformly over the reference run's duration;
- export / publish: SIGKILL uniformly over the final export (pretrain) or publish (finetune), counted from the
  output line that opens it;
- call: SIGKILL right before or after the Nth call of a file function (a checkpoint's weights or states, a
  rename out of a checkpoint's staging folder, a move out of .tinytx-staging; for convert each os.replace into
  the destination), through tests/helpers/launch.py, which patches that function in a child Python;
- SIGTERM / SIGINT (pretrain, finetune): at a random time of the run or of its training phase; the run must
  exit 128 + the signal with its one stop line (torchrun: 1, with the line), or 0 if it had already finished.

Two configs look at what the output folder holds before the run (issue 40): "shape" (pretrain
--overwrite_output_dir and convert --overwrite over the model of a 3-layer run, the new one has 2; killed in
the publish: after each kill the folder loads as the old model or the new one, or refuses to load in one line
for want of a config, never a mix) and "links" (pretrain, finetune and convert with links planted at the names
each writes, its lock, records, staging folders, leading to a user's file and folder: what they lead to must
never change). --shape_trials and --link_trials count them per command; --quick runs one of each for convert.

Outside --quick, "nodes" (nodes_trials.py) trains pretrain on two simulated nodes (two torchrun launches,
c10d) and injects a node's fault: its worker or its agent killed (kill -9), or its worker frozen (SIGSTOP); it
measures how soon every other process is gone (0 may hang past the bound), then resumes on 1 process or on 2
nodes until the run ends, bit for bit equal to one process with the same --total_batch_size.

"store" (store_trials.py) runs pretrain with --train_file on a generated text of several shards (one a MB)
and --token_store STORE, the user's notes in STORE's parent, and faults the build at a random moment of the
reference's: SIGKILL of a tokenizing worker (exit 1 and one line), SIGKILL of the main process (-9), or
SIGTERM (143 and one line). The run must end within a bound, no process of it left; the same command, rerun,
must end with the clean build's store byte for byte (shards, journal lines, tokenizer) and the reference's
weights. Its "foreign" trials (--store_foreign_trials) first give a STORE holding a user's train.bin: refused
in one line, nothing written; the user moves the file beside the notes, where it must stay as it was.

Finetune also runs (outside --quick) trials of a 2-process launch (torchrun --nproc_per_node 2): SIGTERM
or SIGINT to the launcher, or SIGKILL of the rank that reaches a checkpoint's weights first; and "merge"
trials (--use_peft --merge, --merge_trials), SIGKILLed at a move of the merged model into
output_dir/merged or at a random moment of the publish, whose merged weights are compared with the
reference's. Pretrain's dropout trials (attention dropout 0.1) are killed at a checkpoint in the middle
of the run, so that the rerun trains again.

After each kill the folder is looked at (what a user would find); then the command is rerun until a run exits
0 (at most 3 reruns; outside --quick, a one-process rerun but the last may itself be SIGKILLed once, at a
random time), and the final model compared with the reference's, tensor by tensor and bit for bit (convert:
every file, byte for byte, and the source folder's bytes too). A trial "lost" something when my_notes.txt
changed or went, the source changed, or the folder held a model that did not load (or, for convert, loaded as
neither model) after a kill, or a file a planted link led to changed.

Prints a table per command, the line "N tried, N resumed bit for bit, N lost" per command and overall, then
one JSON line. Without --quick it writes kill_campaign.txt and kill_campaign.json to --out (default
benchmarks/results/), with the command, the source commit and the load average in the header.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path


try:
    from tests.helpers.tiny import REPO_ROOT, pretrain_env
    from tests.kill_campaign.common import row, say, table
    from tests.kill_campaign.convert_trials import Convert
    from tests.kill_campaign.finetune_trials import Finetune
    from tests.kill_campaign.nodes_trials import Nodes
    from tests.kill_campaign.pretrain_trials import Pretrain
    from tests.kill_campaign.store_trials import Store
except ModuleNotFoundError as error:
    if error.name not in ("tests", "benchmarks"):
        raise
    sys.exit("kill_campaign: run it from the repository root as `python -m tests.kill_campaign`.")


# nodes: pretrain on two simulated nodes (not in --quick)
COMMANDS = ("pretrain", "finetune", "convert", "store", "nodes")
PRETRAIN_ALONE_TRIALS = 20  # the pretrain-only campaign's count, before finetune and convert joined it


def source_version() -> str:
    """The commit the product was at, "-dirty" when its files had uncommitted changes."""
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT, capture_output=True,
                               text=True)
    return described.stdout.strip() or "unknown"


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commands", default=None, help=f"Which commands' trials, comma-separated: of "
                        f"{', '.join(COMMANDS)} (default: all; --quick: all but nodes).")
    parser.add_argument("--trials", type=int, default=12, help="pretrain: SIGKILL trials.")
    parser.add_argument(
        "--dropout_trials", type=int, default=2, help="pretrain: how many of --trials use dropout."
    )
    parser.add_argument("--signal_trials", type=int, default=4, help="pretrain: SIGTERM/SIGINT trials.")
    parser.add_argument("--steps", type=int, default=6, help="pretrain: --max_train_steps of every run.")
    parser.add_argument("--finetune_trials", type=int, default=9, help="finetune: one-process trials.")
    parser.add_argument("--ddp_trials", type=int, default=2, help="finetune: 2-process (torchrun) trials.")
    parser.add_argument(
        "--merge_trials", type=int, default=2,
        help="finetune: --use_peft --merge trials, killed while the merged model is published.",
    )
    parser.add_argument("--convert_trials", type=int, default=6)
    parser.add_argument("--shape_trials", type=int, default=3, help=(
        "pretrain and convert: trials that publish a 2-layer model over a 3-layer one "
        "(--overwrite_output_dir, --overwrite), killed in the publish."))
    parser.add_argument("--link_trials", type=int, default=2, help=(
        "pretrain, finetune and convert: trials with links planted at the names the command writes, leading "
        "to a user's file and folder."))
    parser.add_argument("--node_trials", type=int, default=6, help=(
        "nodes: two-node trials (kill -9 of a worker or an agent, SIGSTOP), half with --max-restarts 1."))
    parser.add_argument("--store_trials", type=int, default=10, help="store: trials faulted in the build.")
    parser.add_argument(
        "--store_foreign_trials", type=int, default=2,
        help="store: how many of --store_trials first give a STORE holding a user's file (refused).",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true",
        help="2 trials per command (convert: 1, a shape and a links trial), no killed reruns, no 2-process "
        "trials; writes nothing.",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--keep", action="store_true", help="Keep the trials' folders (printed) to look into."
    )
    args = parser.parse_args()
    default = ",".join(name for name in COMMANDS if not (args.quick and name == "nodes"))
    args.commands = [name.strip() for name in (args.commands or default).split(",") if name.strip()]
    unknown = sorted(set(args.commands) - set(COMMANDS))
    if unknown:
        parser.error(f"--commands: unknown {unknown}; choose from {', '.join(COMMANDS)}")
    if args.quick:
        args.trials, args.dropout_trials, args.signal_trials, args.steps = 1, 0, 1, 4
        args.finetune_trials, args.ddp_trials, args.convert_trials, args.node_trials = 2, 0, 1, 2
        args.shape_trials, args.link_trials = 0, 0
        args.store_trials, args.store_foreign_trials = 2, 1
    args.dropout_trials = min(args.dropout_trials, args.trials)
    return args


def campaigns(args, folder: Path, env: dict) -> list:
    made = {
        "pretrain": lambda: Pretrain(
            folder, env, args.quick, args.trials, args.dropout_trials, args.signal_trials, args.steps,
            args.seed, args.shape_trials, args.link_trials,
        ),
        "finetune": lambda: Finetune(
            folder, env, args.quick, args.finetune_trials, args.ddp_trials, args.seed, args.link_trials,
            args.merge_trials,
        ),
        # --quick: one shape-changing publish and one with planted links, for convert (seconds each)
        "convert": lambda: Convert(
            folder, env, args.quick, args.convert_trials, args.seed, 1 if args.quick else args.shape_trials,
            1 if args.quick else args.link_trials,
        ),
        "store": lambda: Store(
            folder, env, args.quick, args.store_trials, args.store_foreign_trials, args.seed
        ),
        "nodes": lambda: Nodes(folder, env, args.quick, args.node_trials, args.seed),
    }
    return [made[name]() for name in args.commands]


def counts(rows: list[dict]) -> dict:
    signalled = [row for row in rows if row["stop"] is not None]
    return {
        "tried": len(rows),
        "killed": sum(row["killed"] for row in rows),
        "rerun_kills": sum(row["rerun_kills"] for row in rows),
        "bit_for_bit": sum(row["equal"] for row in rows),
        "lost": sum(row["lost"] for row in rows),
        "hung": sum(bool(row.get("hung")) for row in rows),
        "separate_runs": sum(bool(row.get("split")) for row in rows),
        "shape_trials": sum(row["config"] == "shape" for row in rows),
        "shape_kills_refused": sum(
            "refused" in row["after_kill"] or "none+w" in row["after_kill"]
            for row in rows
            if row["config"] == "shape"
        ),
        "link_trials": sum(row["config"] == "links" for row in rows),
        "written_through_links": sum(bool(row.get("through_link")) for row in rows),
        "left_running": sum(bool(row.get("left_running")) for row in rows),
        "foreign_trials": sum(row["config"] == "foreign" for row in rows),
        "foreign_refused": sum(row.get("refused") is True for row in rows),
        "signal_trials": len(signalled),
        "stop_promises_kept": sum(bool(row["promise"]) for row in signalled),
        "stops": {
            outcome: sum(row["stop"] == outcome for row in signalled)
            for outcome in ("stopped", "finished", "late", "broken")
        },
    }


def stops_line(c: dict) -> str:
    stops = c["stops"]
    return (
        f"SIGTERM/SIGINT: {c['signal_trials']} sent, {stops['stopped']} stopped the run with its line, "
        f"{stops['finished']} came after the run had finished (exit 0), {stops['late']} came as the process "
        f"left after publishing its model (exit -signal; torchrun 1), {stops['broken']} broke the promise"
    )


def nodes_line(rows: list[dict], c: dict, summary: dict) -> str:
    gone = [r["seconds_to_gone"] for r in rows if r.get("seconds_to_gone") is not None]
    spread = f"{min(gone):.0f}-{max(gone):.0f} s" if gone else "-"
    return (
        f"after a node's fault every other process was gone in {spread} (bound {summary['bound_seconds']} "
        f"s); {c['hung']} hung past the bound; {c['separate_runs']} launches trained with fewer processes "
        "than launched"
    )


def store_line(rows: list[dict], c: dict, summary: dict) -> str:
    ended = [r["seconds_to_end"] for r in rows if r.get("seconds_to_end") is not None]
    spread = f"{min(ended):.1f}-{max(ended):.1f} s" if ended else "-"
    endings = Counter(r.get("outcome", "?") for r in rows)
    return (
        f"after a fault in the build the run ended in {spread} (bound {summary['bound_seconds']} s); "
        f"{c['hung']} hung; {c['left_running']} left a process running; endings: "
        + ", ".join(f"{count} {name}" for name, count in sorted(endings.items()))
    )


def folders_line(c: dict) -> str:
    parts = (
        [
            f"shape-changing publishes: {c['shape_trials']} tried, {c['shape_kills_refused']} of them left a "
            "folder that refused to load (no config yet) after a kill, the others the old or the new model"
        ]
        if c["shape_trials"]
        else []
    )
    if c["link_trials"]:
        parts.append(
            f"planted links: {c['link_trials']} trials, {c['written_through_links']} written through"
        )
    if c["foreign_trials"]:
        parts.append(f"a user's file in the store's folder: {c['foreign_trials']} trials, "
                     f"{c['foreign_refused']} refused in one line with nothing written")
    return "; ".join(parts)


def counts_line(c: dict) -> str:
    return f"{c['tried']} tried, {c['bit_for_bit']} resumed bit for bit, {c['lost']} lost"


def section(name: str, summary: dict, rows: list[dict], c: dict) -> str:
    references = ", ".join(
        f"{config} {seconds:.1f} s" for config, seconds in summary["reference_seconds"].items()
    )
    lines = [
        f"{name}: {' '.join(map(str, summary['command']))}",
        *(
            [f"2 procs: {' '.join(summary['command_2_procs'])}"]
            if "2 procs" in summary["reference_seconds"]
            else []
        ),
        f"(reference runs: {references})",
        "",
        table(rows),
        "",
        f"{c['killed']} of {c['tried']} first runs stopped; {c['rerun_kills']} reruns killed as well",
        *([stops_line(c)] if c["signal_trials"] else []),
        *([nodes_line(rows, c, summary)] if name == "nodes" else []),
        *([store_line(rows, c, summary)] if name == "store" else []),
        *([folders_line(c)] if c["shape_trials"] or c["link_trials"] or c["foreign_trials"] else []),
        f"{name}: {counts_line(c)}",
    ]
    return "\n".join(lines)


class LoadSampler(threading.Thread):
    """The 1-minute load average every 10 s while the campaign runs (its own runs count:
    on 2 CPUs a one-process trial alone shows about 1, a 2-process one about 2; more
    means something else ran beside it)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples, self.done = [os.getloadavg()[0]], threading.Event()

    def run(self):
        while not self.done.wait(10):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict:
        self.done.set()
        self.samples.append(os.getloadavg()[0])
        return {"start": round(self.samples[0], 2), "end": round(self.samples[-1], 2),
                "mean": round(sum(self.samples) / len(self.samples), 2), "max": round(max(self.samples), 2)}


def main():
    args = parse_args()
    began, began_clock, load = time.monotonic(), datetime.now(timezone.utc), LoadSampler()
    load.start()
    # again at the end: a commit landing meanwhile would change what later trials ran
    source = source_version()
    folder = Path(tempfile.mkdtemp(prefix="kill-campaign-"))
    env = {**pretrain_env(folder), "PYTHONUNBUFFERED": "1"}
    rows, summaries = {}, {}
    try:
        for campaign in campaigns(args, folder, env):
            campaign.prepare()
            plans = campaign.plans()
            rows[campaign.name] = []
            # progress on stderr; the report on stdout
            say(f"\n{campaign.name}: {len(plans)} trials\n{table([])}")
            for plan in plans:
                try:
                    rows[campaign.name].append(campaign.run_trial(plan))
                # A hung or crashed trial is a row, not the campaign's end.
                except Exception as error:  # noqa: BLE001
                    rows[campaign.name].append(
                        row(
                            plan, moment=str(plan["kind"]),
                            error=f"the trial itself failed: {type(error).__name__}: {str(error)[:300]}",
                        )
                    )
                say("\n".join(table(rows[campaign.name][-1:]).splitlines()[2:]))
            summaries[campaign.name] = campaign.summary()
    finally:
        if args.keep:
            print(f"trial folders kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)

    seconds, loads, ended_clock = time.monotonic() - began, load.stop(), datetime.now(timezone.utc)
    every = [trial for name in rows for trial in rows[name]]
    overall = counts(every)
    per_command = {name: {**counts(rows[name]), **summaries[name]} for name in rows}
    notes = []
    if "pretrain" in rows and len(rows) > 1 and args.trials < PRETRAIN_ALONE_TRIALS and not args.quick:
        notes.append(f"pretrain runs {args.trials} SIGKILL trials here (a pretrain-only campaign ran "
                     f"{PRETRAIN_ALONE_TRIALS}), so that all three commands fit in about 15 minutes")
    summary = {
        "benchmark": "kill_campaign",
        "mode": "quick" if args.quick else "full",
        "seed": args.seed,
        "commands": list(rows),
        **overall,
        "per_command": per_command,
        "seconds": round(seconds, 1),
        "load_average_1min": loads,
        "cpus": os.cpu_count(),
        "notes": notes,
        "source": (
            source
            if source_version() == source
            else f"{source} .. {source_version()} (changed during the run)"
        ),
        "trials": every,
    }
    report = "\n\n".join(
        [
            *(section(name, summaries[name], rows[name], per_command[name]) for name in rows),
            f"overall: {counts_line(overall)}"
            + (
                f"; {overall['written_through_links']} written through a planted link"
                if overall["link_trials"]
                else ""
            )
            + (
                f"; {overall['stop_promises_kept']} of {overall['signal_trials']} stop signals kept their "
                "promise"
                if overall["signal_trials"]
                else ""
            ),
        ]
    )
    print("\n" + report)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        header = (
            f"python -m tests.kill_campaign {' '.join(sys.argv[1:])}".rstrip()
            + f"  (source {summary['source']}; {began_clock:%Y-%m-%d %H:%M}-{ended_clock:%H:%M} UTC, "
            f"{seconds:.0f} s, {os.cpu_count()} CPUs, 1-minute load average {loads['start']:.2f} at the "
            f"start, {loads['mean']:.2f} on average (max {loads['max']:.2f}, sampled every 10 s), "
            f"{loads['end']:.2f} at the end)"
        )
        (args.out / "kill_campaign.txt").write_text(
            header + "\n" + "".join(f"# {note}\n" for note in notes) + "\n" + report + "\n")
        (args.out / "kill_campaign.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
