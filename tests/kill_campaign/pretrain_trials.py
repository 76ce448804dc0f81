"""The kill campaign's trials of training/pretrain.py (__main__.py explains the design).

Kills: SIGKILL at a random time, during the export (counted from the line that opens it), or right before/after an
exact call (a checkpoint's weights or optimizer state, a rename in checkpoints/, a move out of the export's staging
folder); dropout trials at a checkpoint in the middle of the run, so that the rerun trains again. Then SIGTERM and
SIGINT trials: a stop signal at a random time of the run or of its training phase. Then (outside --quick) "shape"
trials: --overwrite_output_dir over the export of a 3-layer run, killed in the publish of the 2-layer model (a move
out of the staging folder, or a random moment of the export), rerun as the same command; and "links" trials: links
planted at the names pretrain writes (its lock, its metrics log and its temporary, its staging folder), leading to a
user's file and folder, then a kill drawn as for the plain trials."""

import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.faults import PRETRAIN, run_killed_after, run_killed_after_line, run_killed_at
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS
from tests.kill_campaign.common import (
    KILLED,
    MAX_RERUNS,
    MOVES,
    RERUN_KILL_CHANCE,
    SIGNALS,
    last_error,
    plant_links,
    resume_and_judge,
    run_process,
    say,
    stop_outcome,
    write_notes,
)


FINISHED_LINE = "Model folder: "  # printed once the export is complete
EXPORT_LINE = r"validation: loss"  # printed after the final evaluation; the final checkpoint and the export follow
TRAINING_LINE = r"^train:.*\| *[1-9]\d*/"  # the progress bar after a step (not "Tokenizing train:")
STAGING = ".tinytx-staging"
# Exact moments: (functions, text in an argument, calls per step (None: per run), label).
CALLS = [
    (("safetensors.torch.save_file",), "checkpoints", 1, "checkpoint weights"),
    (("torch.save",), "checkpoints", 3, "checkpoint optimizer/scheduler/RNG"),
    (MOVES, "checkpoints", 1, "rename in checkpoints/"),
    (MOVES, STAGING, None, "export move"),
]
EXPORT_MOVES = 4  # the export's moves out of the staging folder a kill may land on (it makes more)
LINKED_FILES, LINKED_FOLDERS = [".lock", "metrics.jsonl", "metrics.jsonl.tmp"], [STAGING]
OLD_LAYERS = 3  # the "shape" trials' earlier model; the trials' own has TINY_PRETRAIN_ARGS' 2


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


class Pretrain:
    name = "pretrain"

    def __init__(self, folder: Path, env: dict, quick: bool, trials: int, dropout_trials: int, signal_trials: int,
                 steps: int, seed: int, shape_trials: int = 0, link_trials: int = 0):
        self.folder, self.env, self.quick, self.steps = folder / "pretrain", env, quick, steps
        self.folder.mkdir()
        self.trials, self.dropout_trials, self.signal_trials, self.seed = trials, dropout_trials, signal_trials, seed
        self.shape_trials, self.link_trials = shape_trials, link_trials
        self.configs = {"plain": None}
        if dropout_trials:
            self.configs["dropout"] = dropout_config(self.folder)
        self.references = {}

    def command(self) -> list[str]:
        return ["python", "training/pretrain.py", *command_flags(self.steps, None)]

    def prepare(self) -> None:
        """Runs the command straight through (per config), timed: its duration, and when training and export began."""
        for name, config in self.configs.items():
            output_dir = self.folder / f"reference_{name}"
            result = run_process([sys.executable, str(PRETRAIN), *command_flags(self.steps, config), "--output_dir",
                                  str(output_dir)], self.env, self.folder,
                                 marks={"training": TRAINING_LINE, "export": EXPORT_LINE})
            if result.returncode != 0:
                sys.exit(f"kill_campaign: the pretrain reference run failed:\n{result.stderr[-3000:]}")
            if "export" not in result.marks or "training" not in result.marks:
                sys.exit(f"kill_campaign: the pretrain reference printed no line matching {EXPORT_LINE!r} or "
                         f"{TRAINING_LINE!r}; update them.")
            self.references[name] = {"seconds": result.seconds, "output_dir": output_dir,
                                     "export_seconds": result.seconds - result.marks["export"],
                                     "training_start": result.marks["training"],
                                     "training_seconds": result.marks["export"] - result.marks["training"]}
            say(f"pretrain reference ({name}): {result.seconds:.1f} s, training from {result.marks['training']:.1f} s,"
                f" export phase {result.seconds - result.marks['export']:.2f} s")
        for name in ("shape", "links"):  # trained as plain; they differ in what the output folder holds
            self.references[name] = self.references["plain"]
        if self.shape_trials:
            old = [*command_flags(self.steps, None), "--num_hidden_layers", str(OLD_LAYERS), "--output_dir",
                   str(self.folder / "old_3_layers")]
            if run_process([sys.executable, str(PRETRAIN), *old], self.env, self.folder).returncode != 0:
                sys.exit("kill_campaign: the pretrain run of the 3-layer model failed")

    def plans(self) -> list[dict]:
        """Every random choice, made up front so that a seed names the same campaign whatever happens in it. The kill
        trials draw from random.Random(seed) as before the signal trials existed, so a seed keeps naming them."""
        rng, count, steps, quick = random.Random(self.seed), self.trials, self.steps, self.quick
        plans = []
        for index in range(count):
            plan = {"trial": index + 1, "command": self.name,
                    "config": "dropout" if index >= count - self.dropout_trials else "plain",
                    "kind": ("time", "export", "call")[index % 3]}
            # In --quick every kill must land: keep time kills off the very end, exact calls on ones every run makes.
            plan["fraction"] = rng.uniform(0.05, 0.6) if quick else rng.random()
            functions, match, per_step, label = CALLS[0] if quick else rng.choice(CALLS)
            last = 4 if per_step is None else per_step * steps
            plan["call"] = {"function": list(functions), "match": match, "label": label,
                            "nth": rng.randint(1, last), "when": rng.choice(("before", "after"))}
            if plan["config"] == "dropout":
                # Dropout only matters when the rerun trains steps again: kill while a checkpoint in the middle of
                # the run is being written, so that the rerun resumes from the one before it.
                functions, match, _, label = CALLS[0]
                plan["kind"] = "call"
                plan["call"] = {"function": list(functions), "match": match, "label": label,
                                "nth": rng.randint(2, max(2, steps - 1)), "when": rng.choice(("before", "after"))}
            plan["rerun_kills"] = [None if quick or rerun == MAX_RERUNS - 1 or rng.random() >= RERUN_KILL_CHANCE
                                   else rng.random() for rerun in range(MAX_RERUNS)]
            plans.append(plan)
        rng = random.Random(f"{self.seed}-pretrain-signals")
        for index in range(self.signal_trials):
            name = ("SIGTERM", "SIGINT")[index % 2]
            phase = "training" if quick else ("time", "training")[index // 2 % 2]
            plans.append({"trial": count + index + 1, "command": self.name, "config": "plain",
                          "kind": f"{name} {phase}", "signal": name, "phase": phase,
                          "fraction": rng.uniform(0.0, 0.1) if quick else rng.random(),  # --quick: mid-run
                          "rerun_kills": [None] * MAX_RERUNS})
        return plans + self.folder_plans(len(plans))

    def folder_plans(self, done: int) -> list[dict]:
        """The "shape" and "links" trials, numbered after the others and drawn from their own generator."""
        rng, plans = random.Random(f"{self.seed}-pretrain-folders"), []
        for index in range(self.shape_trials + self.link_trials):
            config = "shape" if index < self.shape_trials else "links"
            kind = ("call", "export")[index % 2] if config == "shape" else ("time", "export", "call")[index % 3]
            functions, match, per_step, label = CALLS[3] if config == "shape" else rng.choice(CALLS)
            last = EXPORT_MOVES if per_step is None else per_step * self.steps
            plans.append({"trial": done + index + 1, "command": self.name, "config": config, "kind": kind,
                          "fraction": rng.random(),
                          "call": {"function": list(functions), "match": match, "label": label,
                                   "nth": rng.randint(1, last), "when": rng.choice(("before", "after"))},
                          "rerun_kills": [None if rerun == MAX_RERUNS - 1 or rng.random() >= RERUN_KILL_CHANCE
                                          else rng.random() for rerun in range(MAX_RERUNS)]})
        return plans

    def trial_folder(self, plan: dict) -> tuple[Path, list[str]]:
        """The trial's output folder, as the config has it before the first run, and the flags the config adds."""
        output_dir = self.folder / f"trial_{plan['trial']:02d}"
        if plan["config"] == "shape":
            shutil.copytree(self.folder / "old_3_layers", output_dir)
        write_notes(output_dir)
        if plan["config"] == "links":
            plant_links(output_dir, LINKED_FILES, LINKED_FOLDERS)
        # links: the metrics log's name stands there already, which only a resume (of nothing, here) may meet
        return output_dir, {"shape": ["--overwrite_output_dir"], "links": ["--resume_from_checkpoint", "latest"]}.get(
            plan["config"], [])

    def run_trial(self, plan: dict) -> dict:
        reference = self.references[plan["config"]]
        flags = command_flags(self.steps, self.configs.get(plan["config"]))
        output_dir, extra = self.trial_folder(plan)
        args, started = [*flags, *extra, "--output_dir", str(output_dir)], time.monotonic()
        env, cwd = self.env, self.folder
        promise = stop = None
        if plan["kind"] == "time":
            at = plan["fraction"] * reference["seconds"]
            moment = f"SIGKILL t={at:.2f}s of {reference['seconds']:.1f}s"
            first = run_killed_after(args, at, env=env, cwd=cwd)
        elif plan["kind"] == "export":
            delay = plan["fraction"] * reference["export_seconds"]
            moment = f"SIGKILL export +{delay:.2f}s of {reference['export_seconds']:.2f}s"
            first = run_killed_after_line(args, EXPORT_LINE, delay, env=env, cwd=cwd)
        elif plan["kind"] == "call":
            call = plan["call"]
            moment = f"{call['when']} {call['label']} #{call['nth']}"
            first = run_killed_at(args, env=env, cwd=cwd, function=tuple(call["function"]), match=call["match"],
                                  nth=call["nth"], when=call["when"])
        else:
            signum = SIGNALS[plan["signal"]]
            command = [sys.executable, str(PRETRAIN), *args]
            if plan["phase"] == "training":
                delay = plan["fraction"] * reference["training_seconds"]
                moment = f"{plan['signal']} training +{delay:.2f}s of {reference['training_seconds']:.2f}s"
                first = run_process(command, env, cwd, at=delay, signum=signum, after=TRAINING_LINE)
            else:
                at = plan["fraction"] * reference["seconds"]
                moment = f"{plan['signal']} t={at:.2f}s of {reference['seconds']:.1f}s"
                first = run_process(command, env, cwd, at=at, signum=signum)
            stop = stop_outcome(first, signum, "pretrain.py", launched=False, finished_line=FINISHED_LINE)
            promise = stop != "broken"
        if plan["kind"] in ("time", "export", "call"):
            killed = first.returncode == KILLED
            error = None if first.returncode in (0, KILLED) else f"exit {first.returncode}: {last_error(first)}"
        else:
            killed = first.returncode != 0
            error = None if promise else f"the stop broke its promise: exit {first.returncode}: {last_error(first)}"
        if not killed:
            moment += " (not reached)" if stop is None else " (after the end)"
        if stop == "late":
            moment += " (after the publish)"
        def rerun(fraction):  # "shape": the same command, which starts afresh; "links" resumes already
            rerun_args = args if extra else [*args, "--resume_from_checkpoint", "latest"]
            if fraction is None:
                return subprocess.run([sys.executable, str(PRETRAIN), *rerun_args], env=env, cwd=cwd,
                                      capture_output=True, text=True)
            return run_killed_after(rerun_args, fraction * reference["seconds"], env=env, cwd=cwd)

        return resume_and_judge(plan, reference, output_dir, first, rerun, killed, moment=moment, promise=promise,
                                stop=stop, error=error, started=started)

    def summary(self) -> dict:
        return {"reference_seconds": {name: round(ref["seconds"], 2) for name, ref in self.references.items()},
                "steps": self.steps, "command": self.command()}
