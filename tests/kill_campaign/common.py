"""What the kill campaign's trials share (__main__.py explains the design): a run stopped from
outside at a moment, a timed reference, the user's file and planted links, what a folder holds
after a kill, a trial's row and table."""

import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from tests.helpers.faults import KILL_MARK, KILLED, LAUNCH, run_process
from tests.helpers.tiny import REPO_ROOT


NOTES = "My own notes, kept in the output folder: no training run may touch them.\n"
MOVES = ("os.replace", "os.rename")  # either may move a file into place; they share one call count
MAX_RERUNS = 3
RERUN_KILL_CHANCE = 0.3
TRACE = Path(__file__).with_name("call_tracer.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


# ---------------------------------------------------------------- running a command, stopped from outside


def traced(command_prefix: list, calls_file: Path, counted: dict) -> list:
    """The prefix that runs a script under call_tracer.py, counting {label: (functions, text)}."""
    specs = [f"--count={label}={','.join(functions)}:{text}" for label, (functions, text) in counted.items()]
    return [*command_prefix, str(TRACE), "--calls", str(calls_file), *specs]


def read_calls(calls_file: Path) -> dict:
    """{label: [calls]} of the traced run; of a launch, the rank that made the most of them (each process
    counts its own calls, so an Nth call up to that many is reached by some rank)."""
    merged = {}
    for path in sorted(calls_file.parent.glob(f"{calls_file.name}.rank*.json")):
        for label, calls in json.loads(path.read_text()).items():
            if len(calls) >= len(merged.get(label, [])):
                merged[label] = calls
    return merged


def killed_at(prefix: list, call: dict) -> list:
    """The prefix that runs a script under tests/helpers/launch.py, SIGKILLed at `call` (see plan_call)."""
    spec = f"{call['when']}:{','.join(call['function'])}:{call['nth']}:{call['match']}"
    return [*prefix, str(LAUNCH), "--kill-at", spec]


def plan_call(rng, calls: dict, choices: list) -> dict:
    """One exact moment: a kind of call drawn from `choices` [(label, functions, text)], one of its calls in
    the reference run (nth), before or after it."""
    label, functions, text = rng.choice(choices)
    count = len(calls[label])
    nth = rng.randint(1, count)
    return {"label": label, "function": list(functions), "match": text, "nth": nth, "count": count,
            "when": rng.choice(("before", "after")), "target": tail(calls[label][nth - 1])}


def tail(texts: str) -> str:
    """The last path of a traced call, shortened to its last two parts (what the table shows)."""
    last = texts.split(" -> ")[-1]
    return "/".join(Path(last).parts[-2:])


def rerun_kills(rng, never: bool = False) -> list:
    """Per rerun, the fraction of the reference's time at which it is SIGKILLed,
    or None; never the last rerun."""
    return [None if never or rerun == MAX_RERUNS - 1 or rng.random() >= RERUN_KILL_CHANCE else rng.random()
            for rerun in range(MAX_RERUNS)]


class StoppedRuns:
    """Pretrain's and finetune's reference runs and first runs: the lines that open training and the final
    phase (export, publish), the program's stop line and the line it prints once finished."""

    program = phase = phase_line = training_line = finished_line = ""

    def timed_reference(self, command, env, cwd, what: str, timeout: float = 300):
        """A straight run, timed: the result, and the seconds of the run, its training and its final phase."""
        marks = {"training": self.training_line, self.phase: self.phase_line}
        result = run_process(command, env, cwd, timeout=timeout, marks=marks)
        if result.returncode != 0:
            sys.exit(f"kill_campaign: the {what} failed:\n{result.stderr[-3000:]}")
        if set(result.marks) != set(marks):
            sys.exit(f"kill_campaign: the {self.program[:-3]} reference printed no line matching "
                     f"{self.training_line!r} or {self.phase_line!r}; update them.")
        training, phase = result.marks["training"], result.marks[self.phase]
        return result, {
            "seconds": result.seconds, "training_start": training, "training_seconds": phase - training,
            f"{self.phase}_seconds": result.seconds - phase,
        }

    def stopped_run(
        self, plan: dict, reference: dict, command: list, env: dict, cwd: Path, launched: bool = False,
        signal_timeout: float = 300,
    ):
        """The first run, stopped as the plan's kind says: SIGKILL at a time of the run ("time") or of
        its final phase ("export", "publish"), or SIGTERM/SIGINT at a time of the run or of its
        training ("SIGINT training"). Returns the moment as the table shows it, the result, and what a
        stop signal did (None for SIGKILL)."""
        name, _, part = plan["kind"].rpartition(" ")
        signum = SIGNALS.get(name, signal.SIGKILL)
        if part == "time":
            at, after = plan["fraction"] * reference["seconds"], None
            moment = f"{name or 'SIGKILL'} t={at:.2f}s of {reference['seconds']:.1f}s"
        else:  # counted from the line that opens the phase
            seconds = reference[f"{part}_seconds"]
            at, after = plan["fraction"] * seconds, (
                self.training_line if part == "training" else self.phase_line
            )
            moment = f"{name or 'SIGKILL'} {part} +{at:.2f}s of {seconds:.2f}s"
        first = run_process(command, env, cwd, at=at, signum=signum, after=after,
                            timeout=signal_timeout if name else 300)
        stop = stop_outcome(first, signum, self.program, launched, self.finished_line) if name else None
        return moment, first, stop


# ---------------------------------------------------------------- what a trial checks


def write_notes(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_notes.txt").write_text(NOTES)


def notes_kept(folder: Path) -> bool:
    path = folder / "my_notes.txt"
    return path.is_file() and path.read_text() == NOTES


LINKED = "A file of the user's that a planted link leads to: no command may write through the link.\n"


def plant_links(folder: Path, files: list[str], folders: list[str]) -> None:
    """Links at the names a command writes: `files` to a user's file, `folders` to a user's folder, both
    beside them in `folder` (so that the links pass the links-out check and the writes meet them)."""
    (folder / "linked" / "kept").mkdir(parents=True, exist_ok=True)
    (folder / "linked" / "file.txt").write_text(LINKED)
    (folder / "linked" / "kept" / "kept.txt").write_text(LINKED)
    for names, target in ((files, folder / "linked" / "file.txt"), (folders, folder / "linked" / "kept")):
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).symlink_to(target, target_is_directory=target.is_dir())


def links_kept(folder: Path) -> bool:
    """Whether what the planted links led to is as it was (nothing written through a link)."""
    linked = folder / "linked"
    return (not linked.exists() or (linked / "file.txt").read_text() == LINKED
            and file_digests(linked / "kept") == {"kept.txt": hashlib.sha256(LINKED.encode()).hexdigest()})


def file_digests(folder: Path) -> dict:
    """{relative path: sha256} of every file under `folder` (what must not change, byte for byte)."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def same_weights(expected: Path, actual: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    if not actual.is_file():
        return False
    a, b = load_file(expected), load_file(actual)
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def model_state(folder: Path) -> str:
    """What a user finds in a model folder: "none" (no config.json yet: not a model folder; "none+w" when
    weights already stand there, as in a first publish, which moves the config last), "loadable" (the config
    loads and the weights match it: no missing, unexpected or mis-shaped tensor), or "BROKEN: why"."""
    from transformers import AutoModelForCausalLM

    import hf_tinytx  # noqa: F401  (registers "tinytx")

    quiet_transformers()
    if not (folder / "config.json").exists():
        return "none+w" if (folder / "model.safetensors").exists() else "none"
    try:
        _, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    except Exception as error:  # noqa: BLE001  (whatever a user would meet)
        return f"BROKEN: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    problems = {key: value for key, value in info.items() if value and key != "error_msgs"} | (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    return f"BROKEN: {json.dumps(problems, default=str)[:160]}" if problems else "loadable"


def lost_reasons(states: list[str], notes_lost: bool, source_changed: bool = False,
                 written_through_link: bool = False) -> list[str]:
    """What a trial lost: the user's file, the source's bytes, a file a planted link led to, or a
    loadable model at a moment after a kill."""
    reasons = ["my_notes.txt gone or changed"] if notes_lost else []
    if written_through_link:
        reasons.append("a file a planted link led to was written")
    if source_changed:
        reasons.append("the source folder's bytes changed")
    reasons += [f"after a kill the folder held {state}" for state in states if state.startswith("BROKEN")][:1]
    return reasons


def said_lines(result) -> list[str]:
    """What a run said on stderr: its lines, less the kill helper's mark and progress bars."""
    return [line.strip() for line in result.stderr.splitlines()
            if line.strip() and not line.startswith(KILL_MARK) and "%|" not in line]


def last_error(result) -> str | None:
    lines = said_lines(result)
    return lines[-1][:200] if lines else None


def stop_outcome(result, signum: int, program: str, launched: bool, finished_line: str) -> str:
    """What a SIGTERM or SIGINT did: "stopped" (exit 128 + the signal, torchrun's 1, with one line saying how
    to resume), "finished" (exit 0: the run had finished before it could stop), "late" (the run had published
    its model, `finished_line` printed, and the signal came as the process was leaving: the interpreter's
    shutdown restores the default handlers, so exit -signal, or torchrun's 1 with its SignalException; nothing
    was left to do), or "broken" (any other exit: the stop broke its promise)."""
    if result.returncode == 0:
        return "finished"
    lines = [line for line in result.stderr.splitlines()
             if line.startswith(f"{program}: stopped") and "--resume_from_checkpoint latest" in line]
    # torchrun prints its own SignalException's traceback; a single process prints none
    if result.returncode == (1 if launched else 128 + signum) and len(lines) == 1 and (
            launched or "Traceback" not in result.stderr):
        return "stopped"
    if result.returncode == (1 if launched else -signum) and not lines and finished_line in result.stdout:
        return "late"
    return "broken"


def resumed_from(stdout: str) -> str:
    found = re.search(r"(?:Resumed|Resuming) from (\S+)", stdout)
    return Path(found[1]).name if found else ("scratch" if "from scratch" in stdout else "?")


def rerun_until_done(first, rerun, observe, kills: list, folder: Path) -> dict:
    """Reruns (`rerun(None)`, or `rerun(fraction)` for a rerun SIGKILLed at that fraction of the
    reference's time) until a run exits 0, at most MAX_RERUNS times; `observe()` says what the folder
    holds after each killed rerun. Returns the last result, the counts, the states observed, whether
    my_notes.txt ever went, and the last error."""
    result, reruns, rerun_kills, states, lost, error = first, 0, 0, [], False, None
    while result.returncode != 0 and reruns < MAX_RERUNS:
        fraction = kills[reruns] if reruns < len(kills) else None
        result = rerun(fraction)
        if fraction is not None and result.returncode == KILLED:
            rerun_kills += 1
            states.append(observe())
        reruns += 1
        lost |= not notes_kept(folder)
        if result.returncode not in (0, KILLED):
            error = f"rerun exit {result.returncode}: {last_error(result)}"
    return {
        "result": result, "reruns": reruns, "rerun_kills": rerun_kills, "states": states, "notes_lost": lost,
        "error": error, "resumed_from": resumed_from(result.stdout) if reruns else "-",
    }


def resume_and_judge(
    plan: dict,
    output_dir: Path,
    first,
    rerun,
    killed: bool,
    *,
    moment: str,
    error,
    started: float,
    observe,
    compare,
    promise=None,
    stop=None,
    source_changed=None,
    resumed=None,
    files_lost=None,
    **extra,
) -> dict:
    """A trial's end: what the folder held after the first run (`observe()`), the reruns until one
    finishes (`rerun_until_done`), then its row. `compare()`: None when the final result is the
    reference's, else why ("" for no more than the verdict's own words); `resumed`: the row's "resumed
    from" in place of the rerun's own line; `files_lost()`: why other files of the user's went or changed
    ([]: they did not)."""
    states = [observe()] if killed else []
    notes_lost = not notes_kept(output_dir)
    done = rerun_until_done(first, rerun, observe, plan["rerun_kills"], output_dir)
    result, states = done["result"], states + done["states"]
    why = compare() if result.returncode == 0 else None
    equal = result.returncode == 0 and why is None
    through_link = not links_kept(output_dir)
    lost_because = lost_reasons(states, notes_lost or done["notes_lost"] or not notes_kept(output_dir),
                                bool(source_changed and source_changed()), through_link)
    lost_because += files_lost() if files_lost else []
    return row(
        plan,
        moment=moment,
        killed=killed,
        first_exit=first.returncode,
        after_kill=states,
        through_link=through_link,
        reruns=done["reruns"],
        rerun_kills=done["rerun_kills"],
        resumed_from=resumed if resumed and done["reruns"] else done["resumed_from"],
        exit=result.returncode,
        equal=equal,
        lost=bool(lost_because),
        promise=promise,
        stop=stop,
        error=verdict(
            equal, lost_because, promise, error if promise is False else why or done["error"] or error, result
        ),
        **extra,
        seconds=round(time.monotonic() - started, 1),
    )


def same_model(reference: Path, output_dir: Path):
    """A `compare` for resume_and_judge: the final weights are the reference's, bit for bit."""
    return lambda: (
        None if same_weights(reference / "model.safetensors", output_dir / "model.safetensors") else ""
    )


def verdict(equal: bool, lost_because: list[str], promise, error: str | None, result) -> str | None:
    """The one line a failed trial gets under its row (None for a trial that held)."""
    if lost_because:
        return "LOST: " + "; ".join(lost_because)
    if promise is False:
        return error or "the stop broke its promise"
    if equal:
        return None
    if result.returncode != 0:
        return (
            error or f"no run exited 0 in {MAX_RERUNS} reruns: exit {result.returncode}: {last_error(result)}"
        )
    return error or "the final model differs from the uninterrupted run's"


def row(plan: dict, **values) -> dict:
    base = {
        "trial": plan["trial"], "command": plan["command"], "config": plan["config"], "kind": plan["kind"],
        "moment": "", "killed": False, "first_exit": None, "after_kill": [], "reruns": 0, "rerun_kills": 0,
        "resumed_from": "-", "exit": None, "equal": False, "lost": False, "promise": None, "stop": None,
        "through_link": False, "error": None, "seconds": 0.0,
    }
    base.update(values)
    return base


def table(rows: list[dict]) -> str:
    header = (f"{'trial':>5}  {'config':<9}  {'moment':<50}  {'exit':>4}  {'after kill':<14}  {'reruns':>6}  "
              f"{'resumed from':<13}  {'equal?':<6}  lost?")
    lines = [header, "-" * len(header)]
    for r in rows:
        reruns = f"{r['reruns']}" + (f" ({r['rerun_kills']}k)" if r["rerun_kills"] else "")
        after = ",".join(r["after_kill"]) or "-"
        after = "BROKEN" if "BROKEN" in after else after
        exit_code = "-" if r["first_exit"] is None else str(r["first_exit"])
        lines.append(f"{r['trial']:>5}  {r['config'][:9]:<9}  {r['moment'][:50]:<50}  {exit_code:>4}  "
                     f"{after[:14]:<14}  {reruns:>6}  {r['resumed_from'][:13]:<13}  "
                     f"{'yes' if r['equal'] else 'NO':<6}  {'YES' if r['lost'] else 'no'}")
        if r["error"]:
            lines.append(f"{'':>7}{r['error']}")
    return "\n".join(lines)


def quiet_transformers() -> None:
    """No progress bars from this process's loads and saves (the trials' own
    output is captured, not shown)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def repo_env(env: dict) -> dict:
    """The environment with the repository on PYTHONPATH (for `-m hf_tinytx.convert` from another folder)."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))}
