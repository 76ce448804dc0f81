"""The kill campaign's trials of `python -m hf_tinytx.convert --to llama` (__main__.py explains the
design): an old and a new TinyTx model (seeds 0 and 1) and their conversions; each trial runs `convert
--to llama new DEST --overwrite` over the old conversion, SIGKILLed at a time or at a move into DEST.
After a kill DEST must load as the old or the new model (logits equal to one conversion's, bit for bit);
the rerun must end with the new one's files."""

import random
import shutil
import sys
import time
from pathlib import Path

from tests.helpers.faults import run_killed_at
from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
from tests.kill_campaign.common import (
    KILLED,
    MOVES,
    file_digests,
    last_error,
    plan_call,
    plant_links,
    quiet_transformers,
    read_calls,
    repo_env,
    rerun_kills,
    resume_and_judge,
    run_process,
    say,
    tail,
    traced,
    write_notes,
)


MANIFEST = ".tinytx-written.json"
# DEST is always .../llama; no other path the command touches says so
CALLS = {"move into DEST": (MOVES, "llama")}
KINDS, QUICK_KINDS = ("call", "time", "call"), ("call", "call")
OLD_SHAPE_LAYERS = 3  # the "shape" trials' earlier model; build_tiny_model's is 2
LINKED_FILES, LINKED_FOLDERS = [f"{MANIFEST}.new"], [".tinytx-staging"]
# `python -m hf_tinytx.convert` as a script file, so tests/helpers/launch.py (which
# runs a file) can wrap its calls.
SHIM = "import runpy\nrunpy.run_module('hf_tinytx.convert', run_name='__main__', alter_sys=True)\n"


class Convert:
    name = "convert"

    def __init__(self, folder: Path, env: dict, quick: bool, trials: int, seed: int, shape_trials: int = 0,
                 link_trials: int = 0):
        self.folder, self.env, self.quick, self.trials = folder / "convert", repo_env(env), quick, trials
        self.seed, self.shape_trials, self.link_trials = seed, shape_trials, link_trials
        self.logits = {}

    def args(self, destination: Path) -> list[str]:
        return ["--to", "llama", str(self.folder / "tinytx_new"), str(destination), "--overwrite"]

    def convert(self, source: str, destination: Path, prefix=None, **kill) -> object:
        command = [*(prefix or [sys.executable, "-m", "hf_tinytx.convert"]), "--to", "llama",
                   str(self.folder / source), str(destination), "--overwrite"]
        return run_process(command, self.env, self.folder, **kill)

    def prepare(self) -> None:
        """The two sources, their conversions into fresh folders, then the trials'
        command once, timed and traced."""
        self.folder.mkdir()
        (self.folder / "convert_shim.py").write_text(SHIM)
        quiet_transformers()
        tokenizer = build_byte_bpe_tokenizer()
        sources = {"old": (0, 2), "new": (1, 2), "old3": (0, OLD_SHAPE_LAYERS)}  # name: (seed, layers)
        for name, (seed, layers) in sources.items():
            build_tiny_model(seed=seed, num_hidden_layers=layers, vocab_size=len(tokenizer)).save_pretrained(
                self.folder / f"tinytx_{name}")
            tokenizer.save_pretrained(self.folder / f"tinytx_{name}")
            result = self.convert(f"tinytx_{name}", self.folder / f"ref_{name}" / "llama")
            if result.returncode != 0:
                sys.exit(f"kill_campaign: converting the {name} model failed:\n{result.stderr[-3000:]}")
            self.logits[name] = logits_of(self.folder / f"ref_{name}" / "llama")
        self.source_digests = file_digests(self.folder / "tinytx_new")
        self.calls, self.seconds = self.traced_reference("reference", "old", "the convert reference run")
        say(f"convert reference: {self.seconds:.1f} s; calls: "
            + ", ".join(f"{label} {len(calls)}" for label, calls in self.calls.items()))
        # the publish over the 3-layer conversion makes its own moves: traced on its own
        if self.shape_trials:
            self.shape_calls, _ = self.traced_reference("reference_shape", "old3",
                                                        "the convert run over the 3-layer model")

    def traced_reference(self, name: str, old: str, what: str) -> tuple[dict, float]:
        """The trials' command over the `old` conversion, its calls counted: they and its seconds."""
        destination, calls_file = self.destination(name, old), self.folder / f"{name}.calls"
        result = self.convert("tinytx_new", destination, prefix=[*traced([sys.executable], calls_file, CALLS),
                                                                  str(self.folder / "convert_shim.py")])
        problem = self.differs_from_new(destination) if result.returncode == 0 else last_error(result)
        if problem:
            new = "the new model" if old == "old" else "the new one"
            sys.exit(f"kill_campaign: {what} did not end with {new}: {problem}")
        return read_calls(calls_file), result.seconds

    def destination(self, name: str, old: str = "old") -> Path:
        """A destination holding an old conversion (with convert's record of it) and the user's notes."""
        destination = self.folder / name / "llama"
        shutil.copytree(self.folder / f"ref_{old}" / "llama", destination)
        write_notes(destination)
        return destination

    def plans(self) -> list[dict]:
        rng, plans = random.Random(f"{self.seed}-convert"), []
        for index in range(self.trials):
            kind = (QUICK_KINDS if self.quick else KINDS)[index % len(QUICK_KINDS if self.quick else KINDS)]
            plan = {"trial": index + 1, "command": self.name, "config": "overwrite", "kind": kind,
                    "fraction": rng.random()}
            if kind == "call":
                plan["call"] = plan_call(rng, self.calls, [(label, *value) for label, value in CALLS.items()])
            plan["rerun_kills"] = rerun_kills(rng, never=self.quick)
            plans.append(plan)
        # their own draws: a seed still names the trials above
        rng = random.Random(f"{self.seed}-convert-folders")
        for index in range(self.shape_trials + self.link_trials):
            config = "shape" if index < self.shape_trials else "links"
            kind = (
                "call"
                if config == "shape" or self.quick
                else ("call", "time")[(index - self.shape_trials) % 2]
            )
            plan = {"trial": len(plans) + 1, "command": self.name, "config": config, "kind": kind,
                    "fraction": rng.random()}
            if kind == "call":
                calls = self.shape_calls if config == "shape" else self.calls
                plan["call"] = plan_call(rng, calls, [(label, *value) for label, value in CALLS.items()])
                if config == "shape":  # spread over the publish's moves, first to last, rather than drawn
                    moves = calls["move into DEST"]
                    nth = 1 + round(index * (len(moves) - 1) / max(1, self.shape_trials - 1))
                    plan["call"].update(nth=nth, target=tail(moves[nth - 1]))
            plan["rerun_kills"] = rerun_kills(rng, never=self.quick)
            plans.append(plan)
        return plans

    def run_trial(self, plan: dict) -> dict:
        destination = self.destination(
            f"trial_{plan['trial']:02d}", "old3" if plan["config"] == "shape" else "old"
        )
        if plan["config"] == "links":
            plant_links(destination, LINKED_FILES, LINKED_FOLDERS)
        started, error = time.monotonic(), None
        if plan["kind"] == "time":
            at = plan["fraction"] * self.seconds
            moment = f"SIGKILL t={at:.2f}s of {self.seconds:.1f}s"
            first = self.convert("tinytx_new", destination, at=at)
        else:
            call = plan["call"]
            moment = f"{call['when']} move {call['nth']}/{call['count']} ({Path(call['target']).name})"
            first = run_killed_at(self.args(destination), env=self.env, cwd=self.folder,
                                  function=tuple(call["function"]), match=call["match"], nth=call["nth"],
                                  when=call["when"], script=self.folder / "convert_shim.py")
        killed = first.returncode == KILLED
        if not killed:
            moment += " (not reached)"
            if first.returncode != 0:
                error = f"exit {first.returncode}: {last_error(first)}"

        def rerun(fraction):
            return self.convert(
                "tinytx_new", destination, at=None if fraction is None else fraction * self.seconds
            )

        return resume_and_judge(
            plan, destination, first, rerun, killed, moment=moment, error=error, started=started,
            observe=lambda: self.state(destination), compare=lambda: self.differs_from_new(destination),
            source_changed=lambda: file_digests(self.folder / "tinytx_new") != self.source_digests,
            resumed="rerun", call=plan.get("call", {}).get("target"),
        )

    def state(self, destination: Path) -> str:
        """"old" or "new": which conversion DEST loads as (its logits equal that one's);
        "refused" when loading stops with a one-line error (a publish of another shape takes the
        old config out first); else "BROKEN: why".
        """
        import torch

        try:
            logits = logits_of(destination)
        except (OSError, ValueError) as error:
            if "\n" not in str(error).strip():
                return "refused"
            return f"BROKEN: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        except Exception as error:  # noqa: BLE001  (whatever a user would meet)
            return f"BROKEN: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        for name, expected in self.logits.items():
            if torch.equal(logits, expected):
                return "old" if name.startswith("old") else name
        return "BROKEN: loads, but as neither the old model nor the new"

    def differs_from_new(self, destination: Path) -> str | None:
        """Why DEST is not exactly the new conversion beside the user's notes (None when it is)."""
        expected = {name: digest for name, digest in file_digests(self.folder / "ref_new" / "llama").items()
                    if name != MANIFEST}
        found = {name: digest for name, digest in file_digests(destination).items()
                 if name not in (MANIFEST, "my_notes.txt") and not name.startswith("linked/")}
        different = sorted(name for name in expected if found.get(name) != expected[name])
        extra = sorted(set(found) - set(expected))
        if different or extra:
            return (f"files differ from the new conversion's: {different}; "
                    f"files that should not be there: {extra}")
        return None

    def summary(self) -> dict:
        return {
            "reference_seconds": {"overwrite": round(self.seconds, 2)},
            "calls": {label: len(calls) for label, calls in self.calls.items()},
            "command": ["python", "-m", "hf_tinytx.convert", "--to", "llama", "NEW", "DEST", "--overwrite"],
        }


def logits_of(folder: Path):
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.arange(3, 19).unsqueeze(0)).logits
