"""What the kill campaign's trials of every command share (__main__.py explains the design): running a
command and stopping it from outside at a moment, a reference run timed and its exact calls counted, the user's file,
what a folder holds after a kill, the row of a trial and its table."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.helpers.faults import KILL_MARK, KILLED, LAUNCH
from tests.helpers.tiny import REPO_ROOT


NOTES = "My own notes, kept in the output folder: no training run may touch them.\n"
MOVES = ("os.replace", "os.rename")  # either may move a file into place; they share one call count
MAX_RERUNS = 3
RERUN_KILL_CHANCE = 0.3
TRACE = Path(__file__).with_name("call_tracer.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


# ---------------------------------------------------------------- running a command, stopped from outside


def run_process(command, env, cwd, timeout=300, at=None, signum=signal.SIGKILL, after=None, marks=None):
    """Runs `command` (its own process group) and sends `signum` to it (the launcher, under torchrun) `at` seconds
    after it started, or `at` seconds after a line of its output matches the pattern `after` (lines end at \\n or
    \\r). `marks`: {name: pattern}, the seconds at which a line first matched each. On a timeout the whole group is
    killed and the result's returncode is "timeout". Returns a CompletedProcess with .seconds, .sent (whether the
    signal went out to a live process), .marks and .timed_out."""
    process = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    start, outputs, seen = time.monotonic(), {"stdout": [], "stderr": []}, {}
    patterns = {name: re.compile(pattern) for name, pattern in (marks or {}).items()}
    trigger = re.compile(after) if after else None
    triggered, sent = threading.Event(), [False]

    def send_later(deadline):
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        if process.poll() is None:
            process.send_signal(signum)
            sent[0] = True

    def read(stream, name):
        pending = b""
        for chunk in iter(lambda: stream.read1(65536), b""):
            outputs[name].append(chunk)
            if not patterns and (trigger is None or triggered.is_set()):
                continue
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)
            for line in (text.decode(errors="replace") for text in lines):
                for mark, pattern in patterns.items():
                    if mark not in seen and pattern.search(line):
                        seen[mark] = time.monotonic() - start
                if trigger is not None and not triggered.is_set() and trigger.search(line):
                    triggered.set()
                    threading.Thread(target=send_later, args=(time.monotonic() + at,), daemon=True).start()

    readers = [threading.Thread(target=read, args=(process.stdout, "stdout"), daemon=True),
               threading.Thread(target=read, args=(process.stderr, "stderr"), daemon=True)]
    for reader in readers:
        reader.start()
    if at is not None and trigger is None:
        threading.Thread(target=send_later, args=(start + at,), daemon=True).start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for reader in readers:
        reader.join(timeout=30)
    with_leftovers_killed(process.pid)
    stderr = b"".join(outputs["stderr"]).decode(errors="replace")
    if timed_out:
        stderr += f"\nkill_campaign: no end after {timeout} s: the run was killed\n"
    # a run that hung must not pass for one the trial killed: its status says so instead of -9
    result = subprocess.CompletedProcess(command, "timeout" if timed_out else process.returncode,
                                         b"".join(outputs["stdout"]).decode(errors="replace"), stderr)
    result.seconds, result.sent, result.marks, result.timed_out = time.monotonic() - start, sent[0], seen, timed_out
    return result


def with_leftovers_killed(group: int) -> None:
    """A launcher killed outright leaves its workers behind; they are in its process group, which only we made."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def traced(command_prefix: list, calls_file: Path, counted: dict) -> list:
    """The prefix that runs a script under call_tracer.py, counting {label: (functions, text)}."""
    specs = [f"--count={label}={','.join(functions)}:{text}" for label, (functions, text) in counted.items()]
    return [*command_prefix, str(TRACE), "--calls", str(calls_file), *specs]


def read_calls(calls_file: Path) -> dict:
    """{label: [calls]} of the traced run; of a launch, the rank that made the most of them (each process counts
    its own calls, so an Nth call up to that many is reached by some rank)."""
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
    """One exact moment: a kind of call drawn from `choices` [(label, functions, text)], one of its calls in the
    reference run (nth), before or after it."""
    label, functions, text = rng.choice(choices)
    count = len(calls[label])
    nth = rng.randint(1, count)
    return {"label": label, "function": list(functions), "match": text, "nth": nth, "count": count,
            "when": rng.choice(("before", "after")), "target": tail(calls[label][nth - 1])}


def tail(texts: str) -> str:
    """The last path of a traced call, shortened to its last two parts (what the table shows)."""
    last = texts.split(" -> ")[-1]
    return "/".join(Path(last).parts[-2:])


# ---------------------------------------------------------------- what a trial checks


def write_notes(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_notes.txt").write_text(NOTES)


def notes_kept(folder: Path) -> bool:
    path = folder / "my_notes.txt"
    return path.is_file() and path.read_text() == NOTES


LINKED = "A file of the user's that a planted link leads to: no command may write through the link.\n"


def plant_links(folder: Path, files: list[str], folders: list[str]) -> None:
    """Links at the names a command writes: `files` to a user's file, `folders` to a user's folder, both beside them
    in `folder` (so that the links pass the links-out check and the writes meet them)."""
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
    """What a user finds in a model folder: "none" (no config.json yet: not a model folder; "none+w" when weights
    already stand there, as in a first publish, which moves the config last), "loadable" (the config loads and the
    weights match it: no missing, unexpected or mis-shaped tensor), or "BROKEN: why"."""
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
    """What a trial lost: the user's file, the source's bytes, a file a planted link led to, or a loadable model at
    a moment after a kill."""
    reasons = ["my_notes.txt gone or changed"] if notes_lost else []
    if written_through_link:
        reasons.append("a file a planted link led to was written")
    if source_changed:
        reasons.append("the source folder's bytes changed")
    reasons += [f"after a kill the folder held {state}" for state in states if state.startswith("BROKEN")][:1]
    return reasons


def last_error(result) -> str | None:
    lines = [line.strip() for line in result.stderr.splitlines()
             if line.strip() and not line.startswith(KILL_MARK) and "%|" not in line]
    return lines[-1][:200] if lines else None


def stop_outcome(result, signum: int, program: str, launched: bool, finished_line: str) -> str:
    """What a SIGTERM or SIGINT did: "stopped" (exit 128 + the signal, torchrun's 1, with one line saying how to
    resume), "finished" (exit 0: the run had finished before it could stop), "late" (the run had published its
    model, `finished_line` printed, and the signal came as the process was leaving: the interpreter's shutdown
    restores the default handlers, so exit -signal, or torchrun's 1 with its SignalException; nothing was left to
    do), or "broken" (any other exit: the stop broke its promise)."""
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
    """Reruns (`rerun(None)`, or `rerun(fraction)` for a rerun SIGKILLed at that fraction of the reference's time)
    until a run exits 0, at most MAX_RERUNS times; `observe()` says what the folder holds after each killed rerun.
    Returns the last result, the counts, the states observed, whether my_notes.txt ever went, and the last error."""
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
    return {"result": result, "reruns": reruns, "rerun_kills": rerun_kills, "states": states, "notes_lost": lost,
            "error": error, "resumed_from": resumed_from(result.stdout) if reruns else "-"}


def resume_and_judge(plan: dict, reference: dict, output_dir: Path, first, rerun, killed: bool, *, moment: str,
                     promise, stop, error, started: float, model: str = "", **extra) -> dict:
    """A trial's end, for every command that resumes: what the folder held after the first run, the reruns until one
    finishes (`rerun_until_done`), then its row: the reference's weights bit for bit? anything lost? promise kept?
    `model`: the sub-folder of output_dir that holds the model to look at and compare (finetune's merged/)."""
    states = [model_state(output_dir / model)] if killed else []
    notes_lost = not notes_kept(output_dir)
    done = rerun_until_done(first, rerun, lambda: model_state(output_dir / model), plan["rerun_kills"], output_dir)
    result, states = done["result"], states + done["states"]
    equal = result.returncode == 0 and same_weights(reference["output_dir"] / model / "model.safetensors",
                                                    output_dir / model / "model.safetensors")
    through_link = not links_kept(output_dir)
    lost_because = lost_reasons(states, notes_lost or done["notes_lost"] or not notes_kept(output_dir),
                                written_through_link=through_link)
    return row(plan, moment=moment, killed=killed, first_exit=first.returncode, after_kill=states,
               through_link=through_link, reruns=done["reruns"], rerun_kills=done["rerun_kills"],
               resumed_from=done["resumed_from"], exit=result.returncode, equal=equal, lost=bool(lost_because),
               promise=promise, stop=stop,
               error=verdict(equal, lost_because, promise, error if promise is False else done["error"] or error,
                             result),
               **extra, seconds=round(time.monotonic() - started, 1))


def verdict(equal: bool, lost_because: list[str], promise, error: str | None, result) -> str | None:
    """The one line a failed trial gets under its row (None for a trial that held)."""
    if lost_because:
        return "LOST: " + "; ".join(lost_because)
    if promise is False:
        return error or "the stop broke its promise"
    if equal:
        return None
    if result.returncode != 0:
        return error or f"no run exited 0 in {MAX_RERUNS} reruns: exit {result.returncode}: {last_error(result)}"
    return error or "the final model differs from the uninterrupted run's"


def row(plan: dict, **values) -> dict:
    base = {"trial": plan["trial"], "command": plan["command"], "config": plan["config"], "kind": plan["kind"],
            "moment": "", "killed": False, "first_exit": None, "after_kill": [], "reruns": 0, "rerun_kills": 0,
            "resumed_from": "-", "exit": None, "equal": False, "lost": False, "promise": None, "stop": None,
            "through_link": False, "error": None,
            "seconds": 0.0}
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
    """No progress bars from this process's loads and saves (the trials' own output is captured, not shown)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def repo_env(env: dict) -> dict:
    """The environment with the repository on PYTHONPATH (for `-m hf_tinytx.convert` from another folder)."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))}

