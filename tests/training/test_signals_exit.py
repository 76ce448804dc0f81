"""Stop signals sent from outside during the final Hub push (a server that never answers), to a main process whose
tokenization workers run, and again while it exits: each ends the run with 128 + the signal, leaving nothing behind."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers.faults import silent_server
from tests.helpers.processes import alive, descendants
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env


pytestmark = pytest.mark.deep

PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
FINETUNE = str(REPO_ROOT / "training" / "finetune.py")
FAST = [*TINY_PRETRAIN_ARGS, "--max_train_steps", "4", "--eval_steps", "100", "--num_probes_per_kind", "0",
        "--num_samples", "0"]
LONG_WAIT = "300"  # a --hub_timeout no test may sit out: a stop must end the wait long before
PROMPT = 60  # seconds a stop may take to end the process; generous, so that a loaded machine does not fail the test


class Running:
    """A command started in the background; its stdout and stderr (together) read line by line as they come."""

    def __init__(self, command, env, cwd):
        self.process = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        pending = b""
        for chunk in iter(lambda: self.process.stdout.read1(65536), b""):
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)
            self.lines += [line.decode(errors="replace") for line in lines]
        self.lines.append(pending.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 240) -> None:
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        while not any(regex.search(line) for line in list(self.lines)):
            assert self.process.poll() is None, f"ended before {pattern!r}:\n{self.output[-4000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n{self.output[-4000:]}"
            time.sleep(0.05)

    def finish(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"still running {timeout} s after the signal:\n{self.output[-4000:]}")
        finally:
            self._reader.join(timeout=10)


def silent_hub_env(server, tmp_path) -> dict:
    env = {k: v for k, v in pretrain_env(tmp_path).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))}
    env.update(HF_ENDPOINT=server.url, HF_TOKEN="hf_silent" + os.urandom(8).hex(), HF_HUB_OFFLINE="0",
               TRANSFORMERS_OFFLINE="0", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return env


def assert_stopped_during_push(run: Running, code: int, signum: int, program: str, folder) -> None:
    output = run.output
    assert code == 128 + signum, f"returncode {code}\n{output[-4000:]}"
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-4000:]
    lines = [line for line in run.lines if line.startswith(f"{program}: stopped by {signal.Signals(signum).name}")]
    assert len(lines) == 1, output[-4000:]
    assert f"the local folder {folder} is complete: push it with `hf upload " in lines[0], lines[0]
    from transformers import AutoModelForCausalLM

    import hf_tinytx  # noqa: F401

    assert AutoModelForCausalLM.from_pretrained(folder).config.model_type == "tinytx"


def test_sigterm_during_a_pretrain_push_that_never_finishes_ends_it_at_once(tmp_path):
    out = tmp_path / "out"
    with silent_server() as server:
        run = Running([sys.executable, PRETRAIN, *FAST, "--output_dir", str(out), "--push_to_hub", "--hub_model_id",
                       "me/tiny", "--hub_timeout", LONG_WAIT], silent_hub_env(server, tmp_path), tmp_path)
        run.wait_for(r"^Model folder: ")
        time.sleep(1)  # inside the wait for the upload
        run.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = run.finish(timeout=PROMPT)
    assert time.monotonic() - started < PROMPT
    assert_stopped_during_push(run, code, signal.SIGTERM, "pretrain.py", out)
    assert not (out / ".lock").exists()


def test_ctrl_c_three_times_during_a_finetune_push_that_never_finishes_ends_it_at_once(tmp_path):
    from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
    from tests.training.test_finetune import QUICK, prompt_records, write_jsonl

    build_tiny_model(vocab_size=320).save_pretrained(tmp_path / "base")
    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", prompt_records(16))
    with silent_server() as server:
        run = Running([sys.executable, FINETUNE, "--model_name_or_path", "base", "--train_file", "train.jsonl",
                       "--output_dir", "tuned", "--push_to_hub", "--hub_model_id", "me/tuned", "--hub_timeout",
                       LONG_WAIT, *QUICK], silent_hub_env(server, tmp_path), tmp_path)
        run.wait_for(r"^Model saved to ")
        time.sleep(1)
        for _ in range(3):
            run.process.send_signal(signal.SIGINT)
            time.sleep(0.1)
        code = run.finish(timeout=PROMPT)
    assert_stopped_during_push(run, code, signal.SIGINT, "finetune.py", tmp_path / "tuned")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the workers' death is Linux's prctl")
def test_sigterm_to_the_main_process_alone_takes_its_tokenization_workers_along(tmp_path):
    # Enough text that tokenizing it with 2 workers takes a while: the signal lands while they work.
    words = "the miller kept his grain in the old mill by the river and sold bread".split()
    with open(tmp_path / "big.txt", "w", encoding="utf-8") as f:
        for i in range(200_000):  # 20 MB
            f.write(" ".join(words[(i + j) % len(words)] for j in range(18)) + ".\n\n")
    command = [sys.executable, PRETRAIN, *FAST, "--train_file", str(tmp_path / "big.txt"),
               "--preprocessing_num_workers", "2", "--output_dir", str(tmp_path / "out")]
    run = Running(command, pretrain_env(tmp_path), tmp_path)
    deadline, workers = time.monotonic() + 240, set()
    while len(workers) < 2:  # what torchrun does to a rank: SIGTERM to that process, not its group
        assert run.process.poll() is None and time.monotonic() < deadline, run.output[-4000:]
        workers = set(descendants(run.process.pid))
        time.sleep(0.05)
    run.process.send_signal(signal.SIGTERM)
    code = run.finish(timeout=PROMPT)
    assert code == 128 + signal.SIGTERM, f"returncode {code}\n{run.output[-4000:]}"
    deadline = time.monotonic() + 10
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, workers)), f"workers {sorted(filter(alive, workers))} outlived their parent"


def test_a_second_sigterm_while_a_stopped_run_exits_keeps_its_status(tmp_path):
    # Started as `tinytx pretrain` (its module form), so its lines name it so, not "pretrain.py".
    command = [sys.executable, "-m", "hf_tinytx_training", "pretrain", *TINY_PRETRAIN_ARGS, "--max_train_steps", "60",
               "--num_probes_per_kind", "0", "--num_samples", "0", "--output_dir", str(tmp_path / "out")]
    run = Running(command, pretrain_env(tmp_path), tmp_path)
    run.wait_for(r"^train:.*\| *[1-9]\d*/")
    run.process.send_signal(signal.SIGTERM)
    run.wait_for(r"^tinytx pretrain: stopped at step \d+ of 60 by SIGTERM")
    while run.process.poll() is None:  # again and again while it exits, up to its very last moments
        run.process.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    code = run.finish(timeout=PROMPT)
    assert code == 128 + signal.SIGTERM, f"returncode {code}\n{run.output[-4000:]}"
