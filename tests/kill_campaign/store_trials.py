"""The kill campaign's trials of the token store (__main__.py explains the design): training/pretrain.py on a
generated text of several shards with --token_store STORE, faulted while the store is built: a tokenizing
worker SIGKILLed (as the out-of-memory killer does), or the main process SIGKILLed or sent SIGTERM. The run
must end within BOUND seconds with its status and one line, and leave no process behind; the same command,
rerun, must end with the clean build's store, byte for byte, and the reference's weights. The user's notes
sit in STORE's parent; a "foreign" trial first gives a STORE holding a user's file, which must be refused in
one line with nothing written (the user then moves the file beside the notes and runs the command)."""

import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

from tests.helpers.faults import PRETRAIN
from tests.helpers.processes import command_line, descendants
from tests.helpers.refusals import snapshot
from tests.helpers.tiny import write_text
from tests.kill_campaign.common import (
    KILLED,
    file_digests,
    rerun_kills,
    resume_and_judge,
    run_process,
    said_lines,
    same_weights,
    say,
    stop_outcome,
    write_notes,
)
from tests.kill_campaign.pretrain_trials import FINISHED_LINE, command_flags


PROGRAM, STEPS, WORKERS = "pretrain.py", 3, 2
# a piece (a shard) holds at least 1 MiB of a file (documents.PIECE_BYTES): a shard a megabyte
MEGABYTES = {True: 6, False: 12}  # --quick, else
# more documents than the text holds: every one trains, so the weights read across the shards
EVERY_DOCUMENT = str(10**9)
BUILD_LINE = r"^Tokenizing \d+ piece"  # said as the build starts, right before the workers are forked
BUILT_LINE = r"^Tokenized \d+ piece"
BOUND = 60  # seconds from a fault to the run's end; more is a hang
GRACE = 5.0  # seconds the workers may take to follow a main process out (they die with it)
KINDS, QUICK_KINDS = ("kill worker", "SIGKILL", "SIGTERM"), ("kill worker", "SIGTERM")
WORKER_WORDS = ("ended abruptly", "run the same command again")  # the killed worker's one line says
FOREIGN, FOREIGN_BYTES = "train.bin", b"A nanoGPT train.bin of the user's: no store may read or remove it.\n"
JOURNAL = "shards.jsonl"


def flags(text, store, output_dir) -> list[str]:
    """One command for the first run and every rerun, as a requeued job has (a resume of nothing starts)."""
    return [*command_flags(STEPS, None), "--num_train_documents", EVERY_DOCUMENT, "--train_file", str(text),
            "--token_store", str(store), "--preprocessing_num_workers", str(WORKERS), "--output_dir",
            str(output_dir), "--resume_from_checkpoint", "latest"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_contents(store: Path) -> dict:
    """{name: sha256} of the store's files; the journal as its sorted lines (workers finish in any order)."""
    contents = file_digests(store) if store.is_dir() else {}
    journal = store / JOURNAL
    contents[JOURNAL] = sorted(journal.read_text().splitlines()) if journal.is_file() else None
    return contents


def recorded(store: Path) -> set[str]:
    """The shard files the journal names (a torn last line, from a kill, names none)."""
    journal, names = store / JOURNAL, set()
    for line in journal.read_text().splitlines() if journal.is_file() else []:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            names.add(json.loads(line)["file"])
    return names


def a_worker(choice: float):
    """`run_process`'s target for a worker kill: one of the main process's forked workers (its command line),
    drawn by `choice`, waited for a moment (the build line comes first); None when there is none."""
    def pick(main: int) -> int | None:
        deadline, workers = time.monotonic() + 5, []
        while not workers and time.monotonic() < deadline:
            workers = sorted(pid for pid in descendants(main) if command_line(pid) == command_line(main))
            time.sleep(0 if workers else 0.01)
        return workers[int(choice * len(workers))] if workers else None
    return pick


def ending(kind: str, first) -> tuple[str, str | None]:
    """How the faulted run ended, and why that broke the product's promise (None: it kept it): a killed
    worker ends it with exit 1 and one line; SIGTERM with 128 + 15 and one line (or 0 if it came too late);
    a SIGKILL of the main process with -9; and no process of the run outlives it by GRACE seconds."""
    lines = said_lines(first)
    if first.timed_out:
        return "hung", f"no end {first.seconds:.0f} s after the start (the fault: {first.sent_at or 0:.1f} s)"
    if kind == "SIGTERM":
        outcome = stop_outcome(first, signal.SIGTERM, PROGRAM, False, FINISHED_LINE)
        kept = outcome != "broken" and (outcome != "stopped" or len(lines) == 1)
    elif first.returncode == 0:
        outcome, kept = "finished", True  # the fault came once the build was done
    elif kind == "kill worker":
        outcome = "one line"
        kept = first.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"{PROGRAM}: error: ") and \
            all(word in lines[0] for word in WORKER_WORDS)
    else:
        outcome, kept = "killed", first.returncode == KILLED
    why = None if kept else f"exit {first.returncode}, {len(lines)} line(s): {(lines or ['-'])[-1][:150]}"
    if first.left_running:  # they could write into the store once the run has ended
        why = "; ".join(filter(None, [f"{len(first.left_running)} process(es) outlived the run", why]))
    return ("broken" if why else outcome), why


class Store:
    name = "store"

    def __init__(self, folder: Path, env: dict, quick: bool, trials: int, foreign_trials: int, seed: int):
        self.folder, self.env, self.quick, self.seed = folder / "store", env, quick, seed
        self.trials, self.foreign_trials = trials, min(foreign_trials, trials)
        self.text, self.reference = self.folder / "text.txt", {}

    def command(self, trial: Path) -> list[str]:
        return [sys.executable, str(PRETRAIN), *flags(self.text, trial / "store", trial / "out")]

    def prepare(self) -> None:
        """The text, then the command straight through into a new store, timed: its run and its build."""
        self.folder.mkdir()
        write_text(self.text, MEGABYTES[self.quick])
        self.source, folder = digest(self.text), self.folder / "reference"
        marks = {"build": BUILD_LINE, "built": BUILT_LINE}
        result = run_process(self.command(folder), self.env, self.folder, marks=marks)
        if result.returncode != 0 or set(result.marks) != set(marks):
            sys.exit(f"kill_campaign: the store reference run failed, or said no line matching "
                     f"{BUILD_LINE!r} and {BUILT_LINE!r}:\n{result.stderr[-3000:]}")
        contents = store_contents(folder / "store")
        self.reference = {"seconds": result.seconds, "build": result.marks["built"] - result.marks["build"],
                          "folder": folder, "store": contents, "out": sorted(os.listdir(folder / "out")),
                          "shards": {name: contents[name] for name in recorded(folder / "store")}}
        say(f"store reference: {result.seconds:.1f} s, build {self.reference['build']:.2f} s from "
            f"{result.marks['build']:.1f} s, {len(self.reference['shards'])} shards")

    def plans(self) -> list[dict]:
        """Every random choice up front, from the seed: the fault, its moment in the build, the worker, the
        reruns' kills. The "foreign" trials come last."""
        rng, kinds, plans = random.Random(f"{self.seed}-store"), QUICK_KINDS if self.quick else KINDS, []
        for index in range(self.trials):
            plans.append({
                "trial": index + 1, "command": self.name, "kind": kinds[index % len(kinds)],
                "config": "foreign" if index >= self.trials - self.foreign_trials else "plain",
                # --quick: inside the build even on a run faster than the reference, some shards done
                "fraction": rng.uniform(0.3, 0.6) if self.quick else rng.random(), "worker": rng.random(),
                "rerun_kills": rerun_kills(rng, never=self.quick),
            })
        return plans

    def refused(self, trial: Path) -> str | None:
        """A "foreign" trial's start: STORE holds a user's file and no store.json, so the run must be refused
        with exit 2 and one line naming the file, nothing written; the user then moves the file beside the
        notes. Why the refusal broke its promise (None: it held)."""
        (trial / "store").mkdir()
        (trial / "store" / FOREIGN).write_bytes(FOREIGN_BYTES)
        before = snapshot(trial)
        result = run_process(self.command(trial), self.env, self.folder, timeout=BOUND)
        lines, untouched = said_lines(result), snapshot(trial) == before
        if (trial / "store" / FOREIGN).is_file():
            (trial / "store" / FOREIGN).rename(trial / FOREIGN)
        if result.returncode == 2 and len(lines) == 1 and "is not a token store" in lines[0] and \
                FOREIGN in lines[0] and untouched:
            return None
        return (f"the refusal broke its promise: exit {result.returncode}, {len(lines)} line(s), files "
                f"{'untouched' if untouched else 'CHANGED'}: {(lines or ['-'])[-1][:120]}")

    def faulted(self, plan: dict, trial: Path):
        """The first run, faulted at the plan's moment of the build: the moment as the table shows it, and
        the result."""
        build, kind = self.reference["build"], plan["kind"]
        at = plan["fraction"] * build
        first = run_process(
            self.command(trial), self.env, self.folder, timeout=self.reference["seconds"] + BOUND, at=at,
            signum=signal.SIGTERM if kind == "SIGTERM" else signal.SIGKILL, after=BUILD_LINE,
            target=a_worker(plan["worker"]) if kind == "kill worker" else None, grace=GRACE,
        )
        moment = f"{kind} build +{at:.2f}s of {build:.2f}s"
        return moment + ("" if first.sent else " (not reached)"), first

    def run_trial(self, plan: dict) -> dict:
        trial, started = self.folder / f"trial_{plan['trial']:02d}", time.monotonic()
        write_notes(trial)  # in the store's parent
        refusal = self.refused(trial) if plan["config"] == "foreign" else None
        moment, first = self.faulted(plan, trial)
        outcome, why = ending(plan["kind"], first)
        to_end = None if first.sent_at is None else round(first.seconds - first.sent_at, 2)
        hung = first.timed_out or (to_end or 0) > BOUND

        def rerun(fraction):
            at = None if fraction is None else fraction * self.reference["seconds"]
            return run_process(self.command(trial), self.env, self.folder, at=at)

        return resume_and_judge(
            plan, trial, first, rerun, first.returncode != 0, moment=moment,
            error="; ".join(filter(None, [refusal, why])) or None, started=started,
            observe=lambda: self.state(trial / "store"), compare=lambda: self.differs(trial),
            promise=refusal is None and why is None, stop=outcome if plan["kind"] == "SIGTERM" else None,
            source_changed=lambda: digest(self.text) != self.source,
            files_lost=lambda: self.foreign_lost(trial, plan), outcome=outcome, seconds_to_end=to_end,
            hung=hung, left_running=len(first.left_running),
            refused=None if plan["config"] != "foreign" else refusal is None,
        )

    def state(self, store: Path) -> str:
        """What a user finds in STORE after a fault: how many of the clean build's shards the journal
        records, with their bytes, and how many recorded shards differ from them."""
        shards, found = self.reference["shards"], recorded(store)
        same = sum(name in shards and (store / name).is_file() and digest(store / name) == shards[name]
                   for name in found)
        return f"{same}/{len(shards)} shards" + (f" {len(found) - same} bad" if len(found) > same else "")

    def differs(self, trial: Path) -> str | None:
        """Why the end differs from the clean run's (None: it does not): the store's files byte for byte, the
        output folder's names (no killed run's leftovers), the final weights bit for bit."""
        found, expected, why = store_contents(trial / "store"), self.reference["store"], []
        if changed := sorted(name for name in {*found, *expected} if found.get(name) != expected.get(name)):
            why.append(f"the store's files differ from the clean build's: {changed[:4]}")
        names = sorted(os.listdir(trial / "out")) if (trial / "out").is_dir() else []
        if names != self.reference["out"]:
            why.append(f"the output folder's names differ from the reference's: "
                       f"{sorted(set(names) ^ set(self.reference['out']))}")
        if not same_weights(self.reference["folder"] / "out" / "model.safetensors",
                            trial / "out" / "model.safetensors"):
            why.append("the final weights differ from the reference run's")
        return "; ".join(why) or None

    def foreign_lost(self, trial: Path, plan: dict) -> list[str]:
        path = trial / FOREIGN
        if plan["config"] != "foreign" or path.is_file() and path.read_bytes() == FOREIGN_BYTES:
            return []
        return [f"the user's {FOREIGN} gone or changed"]

    def summary(self) -> dict:
        return {
            "reference_seconds": {"clean build": round(self.reference["seconds"], 2)},
            "build_seconds": round(self.reference["build"], 2), "text_megabytes": MEGABYTES[self.quick],
            "shards": len(self.reference["shards"]), "steps": STEPS, "bound_seconds": BOUND,
            "command": ["python", "training/pretrain.py", *flags("TEXT", "STORE", "OUT")],
        }
