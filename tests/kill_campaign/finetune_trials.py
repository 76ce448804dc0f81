"""The kill campaign's trials of training/finetune.py (__main__.py explains the design): a tiny base model and
data made here; one process, two under torchrun, "links" and "merge" (--use_peft --merge, killed while
output_dir/merged is published, compared on the merged weights)."""

import json
import random
import sys
import time
from pathlib import Path

from tests.helpers.faults import run_killed_at
from tests.helpers.tiny import REPO_ROOT, build_byte_bpe_tokenizer, build_tiny_model
from tests.kill_campaign.common import (
    KILLED,
    MOVES,
    TORCHRUN,
    StoppedRuns,
    killed_at,
    last_error,
    model_state,
    plan_call,
    plant_links,
    quiet_transformers,
    read_calls,
    rerun_kills,
    resume_and_judge,
    run_process,
    same_model,
    say,
    traced,
    write_notes,
)


FINETUNE = REPO_ROOT / "training" / "finetune.py"
STEPS, SAVE_STEPS = 16, 4  # checkpoints 4, 8, 12 and 16 (the newest two kept)
TRAINING_LINE = r"'loss'"  # Trainer's log of step 1 (--logging_steps 1): training is under way
PUBLISH_LINE = r'"train_loss":'  # finetune's metrics line, printed right before the final save
FINISHED_LINE = "Model saved to "  # printed once the model is published
CHECKPOINT_STAGING, STAGING = ".tmp_checkpoint", ".tinytx-staging"
CALLS = {  # label: (functions, text in an argument), each call of them counted in the reference run
    "checkpoint weights": (("safetensors.torch.save_file",), CHECKPOINT_STAGING),
    "checkpoint torch.save": (("torch.save",), CHECKPOINT_STAGING),
    "rename from .tmp_checkpoint": (MOVES, CHECKPOINT_STAGING),
    "publish move": (MOVES, STAGING),
}
MERGE_CALLS = {"merged publish move": (MOVES, f"merged/{STAGING}")}  # the merged model's moves into merged/
KINDS = {  # the first run's stop, cycled through the trials
    "1 proc": (
        "call", "SIGTERM training", "time", "call", "SIGINT training", "publish", "call", "SIGTERM time",
        "SIGINT time",
    ),
    "2 procs": ("SIGTERM training", "call", "SIGINT training", "call"),
    "merge": ("call", "publish"),
}
QUICK_KINDS = ("call", "SIGTERM training")
LINK_KINDS = ("call", "time", "publish")
LINKED_FILES, LINKED_FOLDERS = [".lock", ".tinytx-written.json.new"], [
    STAGING, f"checkpoints/{CHECKPOINT_STAGING}",
]


def prompt_records(n: int) -> list[dict]:
    return [{"prompt": f"Q: add {i} and {i + 1}\nA:", "response": f" {2 * i + 1}"} for i in range(n)]


def flags(config: str) -> list[str]:
    values = ["--model_name_or_path", "base", "--train_file", "train.jsonl", "--max_steps", STEPS,
              "--save_steps", SAVE_STEPS, "--learning_rate", "5e-3", "--logging_steps", 1, "--seed", 0,
              "--disable_tqdm", "true"]
    # Two processes take half the batch each (no --use_cpu: the script sets CPU data parallelism up itself).
    values += ["--per_device_train_batch_size", 2] if config == "2 procs" else [
        "--per_device_train_batch_size", 4, "--use_cpu"]
    values += ["--use_peft", "--merge"] if config == "merge" else []
    return [str(value) for value in values]


def traced_calls(config: str) -> dict:
    return {**CALLS, **MERGE_CALLS} if config == "merge" else CALLS


class Finetune(StoppedRuns):
    name, program, phase = "finetune", "finetune.py", "publish"
    phase_line, training_line, finished_line = PUBLISH_LINE, TRAINING_LINE, FINISHED_LINE

    def __init__(self, folder: Path, env: dict, quick: bool, trials: int, ddp_trials: int, seed: int,
                 link_trials: int = 0, merge_trials: int = 0):
        self.folder, self.quick, self.seed, self.link_trials = folder / "finetune", quick, seed, link_trials
        self.counts = {
            "1 proc": trials, "2 procs": 0 if quick else ddp_trials, "merge": 0 if quick else merge_trials,
        }
        # 2 processes on a small machine: one thread each
        self.env = {"1 proc": env, "2 procs": {**env, "OMP_NUM_THREADS": "1"}, "merge": env}
        self.references = {}

    def prefix(self, config: str) -> list[str]:
        return TORCHRUN if config == "2 procs" else [sys.executable]

    def command(self, config: str, output_dir: Path, *extra) -> list[str]:
        return [*self.prefix(config), str(FINETUNE), *flags(config), "--output_dir", str(output_dir), *extra]

    def prepare(self) -> None:
        """The base model and data, then a straight run per configuration: timed, its exact calls counted."""
        self.folder.mkdir()
        quiet_transformers()
        tokenizer = build_byte_bpe_tokenizer()
        build_tiny_model(vocab_size=320).save_pretrained(self.folder / "base")
        tokenizer.save_pretrained(self.folder / "base")
        (self.folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompt_records(16)))
        wanted = [
            name for name, count in self.counts.items() if count or (name == "1 proc" and self.link_trials)
        ]
        for config in wanted:
            output_dir = self.folder / f"reference_{config.replace(' ', '_')}"
            calls_file = output_dir.with_name(f"{output_dir.name}.calls")
            command = [
                *traced(self.prefix(config), calls_file, traced_calls(config)), str(FINETUNE), *flags(config),
                "--output_dir", str(output_dir),
            ]
            result, times = self.timed_reference(command, self.env[config], self.folder,
                                                 f"finetune reference ({config})", timeout=600)
            calls = read_calls(calls_file)
            missing = [label for label in traced_calls(config) if not calls.get(label)]
            if missing:
                sys.exit(f"kill_campaign: the finetune reference ({config}) made no call of {missing}.")
            self.references[config] = {**times, "output_dir": output_dir, "calls": calls}
            say(
                f"finetune reference ({config}): {result.seconds:.1f} s, training from "
                f"{times['training_start']:.1f} s, publish phase {times['publish_seconds']:.2f} s; calls: "
                + ", ".join(f"{label} {len(calls[label])}" for label in traced_calls(config))
            )

    def plans(self) -> list[dict]:
        rng, plans = random.Random(f"{self.seed}-finetune"), []
        for config, count in self.counts.items():
            kinds = QUICK_KINDS if self.quick else KINDS[config]
            for index in range(count):
                kind = kinds[index % len(kinds)]
                plan = {"trial": len(plans) + 1, "command": self.name, "config": config, "kind": kind,
                        # --quick: early in the phase, so that a faster trial than the
                        # reference still stops mid-run
                        "fraction": rng.uniform(0.0, 0.1) if self.quick else rng.random()}
                if kind == "call":
                    calls = self.references[config]["calls"]
                    # --quick: a checkpoint's weights, which every run writes; a launch: one rank's call; a
                    # merge: the merged model's publish
                    labels = ["checkpoint weights"] if self.quick or config == "2 procs" else \
                        list(MERGE_CALLS) if config == "merge" else list(CALLS)
                    choices = [(label, *traced_calls(config)[label]) for label in labels]
                    plan["call"] = plan_call(rng, calls, choices)
                plan["rerun_kills"] = rerun_kills(rng, never=self.quick or config != "1 proc")
                plans.append(plan)
        # their own draws: a seed still names the trials above
        rng = random.Random(f"{self.seed}-finetune-links")
        for index in range(self.link_trials):
            kind = LINK_KINDS[index % len(LINK_KINDS)]
            plan = {"trial": len(plans) + 1, "command": self.name, "config": "links", "runs_as": "1 proc",
                    "kind": kind, "fraction": rng.random(), "rerun_kills": rerun_kills(rng)}
            if kind == "call":
                plan["call"] = plan_call(rng, self.references["1 proc"]["calls"],
                                         [(label, *CALLS[label]) for label in CALLS])
            plans.append(plan)
        return plans

    def run_trial(self, plan: dict) -> dict:
        config, kind = plan.get("runs_as", plan["config"]), plan["kind"]
        reference, env = self.references[config], self.env[config]
        output_dir = self.folder / f"trial_{plan['trial']:02d}"
        write_notes(output_dir)
        # links: a checkpoints/ folder stands there already, which only a resume may meet (of nothing, here)
        extra = ["--resume_from_checkpoint", "latest"] if plan["config"] == "links" else []
        if plan["config"] == "links":
            plant_links(output_dir, LINKED_FILES, LINKED_FOLDERS)
        started, stop, error = time.monotonic(), None, None
        if kind == "call":
            call = plan["call"]
            moment = f"{call['when']} {call['label']} {call['nth']}/{call['count']}"
            if config != "2 procs":
                first = run_killed_at(
                    [*flags(config), "--output_dir", output_dir, *extra], env=env, cwd=self.folder,
                    function=tuple(call["function"]), match=call["match"], nth=call["nth"], when=call["when"],
                    script=FINETUNE,
                )
            else:
                first = run_process(
                    [
                        *killed_at(TORCHRUN, call), str(FINETUNE), *flags(config),
                        "--output_dir", str(output_dir),
                    ],
                    env,
                    self.folder,
                    timeout=600,
                )
        else:
            moment, first, stop = self.stopped_run(
                plan, reference, self.command(config, output_dir, *extra), env, self.folder,
                launched=config == "2 procs", signal_timeout=600,
            )
        if stop == "broken":
            error = f"the stop broke its promise: exit {first.returncode}: {last_error(first)}"
        killed = first.returncode != 0
        if not killed:
            moment += " (after the end)" if stop is not None else " (not reached)"
        if stop == "late":
            moment += " (after the publish)"
        elif stop is None and first.returncode != KILLED and config != "2 procs":
            error = f"exit {first.returncode}: {last_error(first)}"

        def rerun(fraction):
            resume = self.command(config, output_dir, "--resume_from_checkpoint", "latest")
            at = None if fraction is None else fraction * reference["seconds"]
            return run_process(resume, env, self.folder, at=at, timeout=600)

        model = "merged" if config == "merge" else ""  # the model compared: finetune's merged/ for "merge"
        return resume_and_judge(
            plan, output_dir, first, rerun, killed, moment=moment, error=error, started=started,
            observe=lambda: model_state(output_dir / model),
            compare=same_model(reference["output_dir"] / model, output_dir / model),
            promise=None if stop is None else stop != "broken", stop=stop,
            call=plan.get("call", {}).get("target"),
        )

    def summary(self) -> dict:
        return {
            "reference_seconds": {
                config: round(ref["seconds"], 2) for config, ref in self.references.items()
            },
            "steps": STEPS,
            "save_steps": SAVE_STEPS,
            "calls": {
                config: {label: len(calls) for label, calls in ref["calls"].items()}
                for config, ref in self.references.items()
            },
            "command": ["python", "training/finetune.py", *flags("1 proc")],
            "command_2_procs": [
                "torchrun", "--nproc_per_node", "2", "training/finetune.py", *flags("2 procs"),
            ],
            **(
                {"command_merge": ["python", "training/finetune.py", *flags("merge")]}
                if self.counts["merge"]
                else {}
            ),
        }
