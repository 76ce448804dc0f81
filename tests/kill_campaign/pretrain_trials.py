"""The kill campaign's trials of training/pretrain.py (__main__.py explains the design): SIGKILL at a time, in
the export or at an exact call; SIGTERM and SIGINT; and the "shape" and "links" configs."""

import json
import random
import shutil
import sys
import time
from pathlib import Path

from tests.helpers.faults import PRETRAIN, run_killed_at
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS
from tests.kill_campaign.common import (
    KILLED,
    MOVES,
    StoppedRuns,
    last_error,
    model_state,
    plant_links,
    rerun_kills,
    resume_and_judge,
    run_process,
    same_model,
    say,
    write_notes,
)


FINISHED_LINE = "Model folder: "  # printed once the export is complete
# printed after the final evaluation; the final checkpoint and the export follow
EXPORT_LINE = r"validation: loss"
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


def exact_call(rng, moment: tuple, last: int, first: int = 1) -> dict:
    """The `first`-to-`last` call of a moment of CALLS, drawn, and before or after it."""
    functions, match, _, label = moment
    return {"function": list(functions), "match": match, "label": label, "nth": rng.randint(first, last),
            "when": rng.choice(("before", "after"))}


def dropout_config(folder: Path) -> Path:
    """training/configs/model-tiny.json with attention_dropout 0.1 (the test flags override its sizes)."""
    values = json.loads((REPO_ROOT / "training" / "configs" / "model-tiny.json").read_text())
    values["attention_dropout"] = 0.1
    path = folder / "model-tiny-dropout.json"
    path.write_text(json.dumps(values, indent=2))
    return path


class Pretrain(StoppedRuns):
    name, program, phase = "pretrain", "pretrain.py", "export"
    phase_line, training_line, finished_line = EXPORT_LINE, TRAINING_LINE, FINISHED_LINE

    def __init__(
        self, folder: Path, env: dict, quick: bool, trials: int, dropout_trials: int, signal_trials: int,
        steps: int, seed: int, shape_trials: int = 0, link_trials: int = 0,
    ):
        self.folder, self.env, self.quick, self.steps = folder / "pretrain", env, quick, steps
        self.folder.mkdir()
        self.trials, self.dropout_trials, self.signal_trials, self.seed = (
            trials, dropout_trials, signal_trials, seed,
        )
        self.shape_trials, self.link_trials = shape_trials, link_trials
        self.configs = {"plain": None}
        if dropout_trials:
            self.configs["dropout"] = dropout_config(self.folder)
        self.references = {}

    def command(self) -> list[str]:
        return ["python", "training/pretrain.py", *command_flags(self.steps, None)]

    def prepare(self) -> None:
        """Runs the command straight through (per config), timed: its duration, and
        when training and export began."""
        for name, config in self.configs.items():
            output_dir = self.folder / f"reference_{name}"
            command = [sys.executable, str(PRETRAIN), *command_flags(self.steps, config), "--output_dir",
                       str(output_dir)]
            result, times = self.timed_reference(command, self.env, self.folder, "pretrain reference run")
            self.references[name] = {**times, "output_dir": output_dir}
            say(
                f"pretrain reference ({name}): {result.seconds:.1f} s, training from "
                f"{times['training_start']:.1f} s, export phase {times['export_seconds']:.2f} s"
            )
        for name in ("shape", "links"):  # trained as plain; they differ in what the output folder holds
            self.references[name] = self.references["plain"]
        if self.shape_trials:
            old = [*command_flags(self.steps, None), "--num_hidden_layers", str(OLD_LAYERS), "--output_dir",
                   str(self.folder / "old_3_layers")]
            if run_process([sys.executable, str(PRETRAIN), *old], self.env, self.folder).returncode != 0:
                sys.exit("kill_campaign: the pretrain run of the 3-layer model failed")

    def plans(self) -> list[dict]:
        """Every random choice, made up front so that a seed names the same campaign whatever
        happens in it. The kill trials draw from random.Random(seed) as before the signal trials
        existed, so a seed keeps naming them."""
        rng, count, steps, quick = random.Random(self.seed), self.trials, self.steps, self.quick
        plans = []
        for index in range(count):
            plan = {"trial": index + 1, "command": self.name,
                    "config": "dropout" if index >= count - self.dropout_trials else "plain",
                    "kind": ("time", "export", "call")[index % 3]}
            # In --quick every kill must land: keep time kills off the very end, exact
            # calls on ones every run makes.
            plan["fraction"] = rng.uniform(0.05, 0.6) if quick else rng.random()
            moment = CALLS[0] if quick else rng.choice(CALLS)
            plan["call"] = exact_call(rng, moment, 4 if moment[2] is None else moment[2] * steps)
            if plan["config"] == "dropout":
                # Dropout only matters when the rerun trains steps again: kill while a checkpoint in the
                # middle of the run is being written, so that the rerun resumes from the one before it.
                plan["kind"] = "call"
                plan["call"] = exact_call(rng, CALLS[0], max(2, steps - 1), first=2)
            plan["rerun_kills"] = rerun_kills(rng, never=quick)
            plans.append(plan)
        rng = random.Random(f"{self.seed}-pretrain-signals")
        for index in range(self.signal_trials):
            name = ("SIGTERM", "SIGINT")[index % 2]
            phase = "training" if quick else ("time", "training")[index // 2 % 2]
            plans.append({"trial": count + index + 1, "command": self.name, "config": "plain",
                          "kind": f"{name} {phase}",
                          "fraction": rng.uniform(0.0, 0.1) if quick else rng.random(),  # --quick: mid-run
                          "rerun_kills": rerun_kills(rng, never=True)})
        return plans + self.folder_plans(len(plans))

    def folder_plans(self, done: int) -> list[dict]:
        """The "shape" and "links" trials, numbered after the others and drawn from their own generator."""
        rng, plans = random.Random(f"{self.seed}-pretrain-folders"), []
        for index in range(self.shape_trials + self.link_trials):
            config = "shape" if index < self.shape_trials else "links"
            kind = (
                ("call", "export")[index % 2] if config == "shape" else ("time", "export", "call")[index % 3]
            )
            moment = CALLS[3] if config == "shape" else rng.choice(CALLS)
            last = EXPORT_MOVES if moment[2] is None else moment[2] * self.steps
            plans.append({"trial": done + index + 1, "command": self.name, "config": config, "kind": kind,
                          "fraction": rng.random(), "call": exact_call(rng, moment, last),
                          "rerun_kills": rerun_kills(rng)})
        return plans

    def trial_folder(self, plan: dict) -> tuple[Path, list[str]]:
        """The trial's output folder, as the config has it before the first run,
        and the flags the config adds."""
        output_dir = self.folder / f"trial_{plan['trial']:02d}"
        if plan["config"] == "shape":
            shutil.copytree(self.folder / "old_3_layers", output_dir)
        write_notes(output_dir)
        if plan["config"] == "links":
            plant_links(output_dir, LINKED_FILES, LINKED_FOLDERS)
        # links: the metrics log's name stands there already, which only a resume (of nothing, here) may meet
        return output_dir, {
            "shape": ["--overwrite_output_dir"], "links": ["--resume_from_checkpoint", "latest"],
        }.get(plan["config"], [])

    def run_trial(self, plan: dict) -> dict:
        reference = self.references[plan["config"]]
        output_dir, extra = self.trial_folder(plan)
        args = [
            *command_flags(self.steps, self.configs.get(plan["config"])), *extra,
            "--output_dir", str(output_dir),
        ]
        env, cwd, started = self.env, self.folder, time.monotonic()
        if plan["kind"] == "call":
            call, stop = plan["call"], None
            moment = f"{call['when']} {call['label']} #{call['nth']}"
            first = run_killed_at(
                args, env=env, cwd=cwd, function=tuple(call["function"]), match=call["match"],
                nth=call["nth"], when=call["when"],
            )
        else:
            moment, first, stop = self.stopped_run(
                plan, reference, [sys.executable, str(PRETRAIN), *args], env, cwd
            )
        if stop is None:
            killed = first.returncode == KILLED
            error = (
                None if first.returncode in (0, KILLED) else f"exit {first.returncode}: {last_error(first)}"
            )
        else:
            killed = first.returncode != 0
            error = None if stop != "broken" else (f"the stop broke its promise: exit {first.returncode}: "
                                                   f"{last_error(first)}")
        if not killed:
            moment += " (not reached)" if stop is None else " (after the end)"
        if stop == "late":
            moment += " (after the publish)"

        def rerun(fraction):  # "shape": the same command, which starts afresh; "links" resumes already
            command = [
                sys.executable, str(PRETRAIN), *args,
                *([] if extra else ["--resume_from_checkpoint", "latest"]),
            ]
            at = None if fraction is None else fraction * reference["seconds"]
            return run_process(command, env, cwd, at=at)

        return resume_and_judge(
            plan, output_dir, first, rerun, killed, moment=moment, error=error, started=started,
            observe=lambda: model_state(output_dir), compare=same_model(reference["output_dir"], output_dir),
            promise=None if stop is None else stop != "broken", stop=stop,
        )

    def summary(self) -> dict:
        return {
            "reference_seconds": {name: round(ref["seconds"], 2) for name, ref in self.references.items()},
            "steps": self.steps, "command": self.command(),
        }
