"""The reference runs of the two training commands (never interrupted, trained once per test process:
conftest's `reference_pretrain` and `reference_finetune`), and how tests run, stop and read them. Every
interrupted or resumed run of the same flags must end with the reference's weights, bit for bit."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers.faults import run_killed_at
from tests.helpers.tiny import (
    REPO_ROOT,
    TINY_PRETRAIN_ARGS,
    build_byte_bpe_tokenizer,
    build_tiny_model,
    pretrain_env,
)


FINETUNE = REPO_ROOT / "training" / "finetune.py"
# called once a step by both scripts: a signal after call N lands in step N
STEP = "accelerate.Accelerator.backward"


@dataclasses.dataclass
class Command:
    name: str
    script: Path
    flags: list
    cwd: Path
    steps: int
    interval: int  # the checkpoint interval of `every`
    resumed: str  # the start of the line a resume prints
    optimizer_file: str
    reference: Path | None = None

    def every(self, limit=100) -> list:
        """Flags for a checkpoint every `interval` steps, the newest `limit` kept."""
        if self.name == "pretrain":
            return ["--checkpointing_steps", self.interval, "--checkpoints_total_limit", limit]
        return ["--save_steps", self.interval, "--save_total_limit", limit]

    def command(self, output_dir, *flags) -> list:
        return [sys.executable, str(self.script), *map(str, self.flags), "--output_dir", str(output_dir),
                *map(str, flags)]

    def run(self, output_dir, *flags, env=None, timeout=300) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(output_dir, *flags), cwd=self.cwd, env=env or pretrain_env(self.cwd),
            capture_output=True, text=True, timeout=timeout,
        )

    def at_call(self, output_dir, *flags, function, nth, match="", when="after", signum=signal.SIGKILL):
        """The run, sent `signum` by itself right `when` the `nth` call of
        `function` (tests/helpers/launch.py)."""
        return run_killed_at(
            [*self.flags, "--output_dir", output_dir, *flags], env=pretrain_env(self.cwd), cwd=self.cwd,
            function=function, match=match, nth=nth, when=when, script=self.script, signum=signum,
        )

    def checkpoint(self, output_dir, step) -> Path:
        return (
            Path(output_dir)
            / "checkpoints"
            / (f"step_{step}" if self.name == "pretrain" else f"checkpoint-{step}")
        )

    def stop_line(self, output: str) -> tuple[int, str, str]:
        """(step, signal name, checkpoint) of the one line a stopped run prints."""
        found = re.findall(
            rf"^{self.name}\.py: stopped at step (\d+) of {self.steps} by (SIG\w+); checkpoint (\S+) is "
            r"saved, nothing was exported: resume with the same command and "
            r"--resume_from_checkpoint latest\.$",
            output,
            re.MULTILINE,
        )
        assert len(found) == 1, output[-4000:]
        return int(found[0][0]), found[0][1], found[0][2]

    def steps_logged(self, output_dir, final=True) -> list[int]:
        """pretrain's metrics.jsonl: the training steps logged, each once, and (with
        `final`) one final evaluation."""
        rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
        if final:
            assert len([row for row in rows if row.get("final") and "eval_loss" in row]) == 1
        return [row["step"] for row in rows if "loss" in row]


def describe(result) -> str:
    # without progress bars
    stderr = "\n".join(line for line in result.stderr.splitlines() if "%|" not in line)
    return f"returncode {result.returncode}\nSTDOUT:\n{result.stdout[-3000:]}\nSTDERR:\n{stderr[-5000:]}"


def succeeded(result):
    assert result.returncode == 0 and "Traceback" not in result.stderr, describe(result)


def error_line(result, program, *words) -> str:
    """The one error line of a failed run (no traceback), holding each of `words`."""
    assert result.returncode != 0 and "Traceback" not in result.stderr, describe(result)
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{program}.py: error:")]
    assert len(lines) == 1, describe(result)
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def pretrain_command(tmp_path_factory) -> Command:
    cwd = tmp_path_factory.mktemp("pretrain")
    flags = [*TINY_PRETRAIN_ARGS, "--max_train_steps", 6, "--eval_steps", 100, "--num_probes_per_kind", 0,
             "--num_samples", 0]
    command = Command("pretrain", REPO_ROOT / "training" / "pretrain.py", flags, cwd, steps=6, interval=1,
                      resumed="Resumed from", optimizer_file="optimizer.bin")
    succeeded(command.run(cwd / "reference", "--checkpointing_steps", 2, "--checkpoints_total_limit", 10))
    command.reference = cwd / "reference"
    return command


def finetune_command(tmp_path_factory) -> Command:
    """The reference also pushes to a (local) Hub with --hub_token: the token must be in no byte it wrote,
    Trainer's pickled training_args.bin included, and a warning names the safe ways once."""
    from tests.helpers.hub_server import LocalHub
    from tests.training.sft.test_finetune import prompt_records, write_jsonl

    cwd = tmp_path_factory.mktemp("finetune")
    build_tiny_model(vocab_size=320).save_pretrained(cwd / "base")
    build_byte_bpe_tokenizer().save_pretrained(cwd / "base")
    write_jsonl(cwd / "train.jsonl", prompt_records(16))
    flags = ["--model_name_or_path", "base", "--train_file", "train.jsonl", "--max_steps", 30,
             "--per_device_train_batch_size", 4, "--learning_rate", "5e-3", "--logging_steps", 1, "--use_cpu",
             "--seed", 0, "--disable_tqdm", "true"]
    command = Command("finetune", FINETUNE, flags, cwd, steps=30, interval=5, resumed="Resuming from",
                      optimizer_file="optimizer.pt")
    with LocalHub(user="tester") as hub:
        env = {
            k: v for k, v in pretrain_env(cwd).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))
        }
        env.update(hub.client_env(cwd / "hf_home", token=None))
        result = command.run(cwd / "reference", *command.every(limit=2), "--push_to_hub", "--hub_model_id",
                             "tester/reference", "--hub_token", hub.token, env=env)
        pushed, token = hub.repo_files("tester/reference"), hub.token
    succeeded(result)
    warning = "finetune.py: warning: --hub_token puts the token on the command line"
    assert [line for line in result.stderr.splitlines() if line.startswith(warning) and "HF_TOKEN" in line
            and "hf auth login" in line] != [] and result.stderr.count(warning) == 1, describe(result)
    assert "model.safetensors" in pushed and ".lock" not in pushed
    written = [path for path in (cwd / "reference").rglob("*") if path.is_file()]
    assert any(path.name == "training_args.bin" for path in written)
    assert token not in result.stdout + result.stderr
    assert not [path for path in written if token.encode() in path.read_bytes()], "the Hub token was written"
    command.reference = cwd / "reference"
    return command
