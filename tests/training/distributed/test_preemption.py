"""Stop signals to pretrain and finetune (tests/helpers/faults.py sends them from outside): mid-run, in the
last step, while the run starts, to torchrun's ranks, during a push that never finishes, to a main process
whose workers tokenize, or while it exits. The run stops with a checkpoint and one line, exits 128 + the
signal, and `--resume_from_checkpoint latest` ends with the weights of the run never stopped."""

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from transformers import AutoModelForCausalLM

from tests.helpers.faults import run_signalled, silent_hub_env, silent_server
from tests.helpers.processes import alive, descendants
from tests.helpers.reference import STEP, describe, error_line, succeeded
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, assert_same_weights, pretrain_env
from tests.training.sft.test_finetune import prompt_records, write_jsonl


deep = pytest.mark.deep


# ---------------------------------------------------------------- stop signals


@deep
@pytest.mark.parametrize(
    "which, signum", [("pretrain", signal.SIGTERM), ("finetune", signal.SIGINT)],
    ids=["pretrain-SIGTERM", "finetune-SIGINT"],
)
def test_a_stop_signal_mid_run_saves_a_checkpoint_and_the_resume_ends_bit_for_bit(
    request, tmp_path, which, signum
):
    """A scheduler's SIGTERM or a user's Ctrl-C: a checkpoint, no export, exit 128 + signal, a line on
    resuming. One signal per command: both signals reach one handler (training/distributed/preemption.py)."""
    command = request.getfixturevalue(f"reference_{which}")
    out = tmp_path / "run"
    flags = ["--enable_jit_checkpoint"] if command.name == "finetune" else []
    stopped = command.at_call(out, *flags, function=STEP, nth=3, signum=signum)
    assert stopped.returncode == 128 + signum, describe(stopped)
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr, describe(stopped)
    step, name, checkpoint = command.stop_line(stopped.stdout + stopped.stderr)
    assert (step, name) == (3, signal.Signals(signum).name)
    assert checkpoint in (f"step_{step}", str(command.checkpoint(out, step)))
    assert (command.checkpoint(out, step) / "checksums.json").is_file()
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()

    resume = [
        "--resume_from_checkpoint", "latest" if signum == signal.SIGTERM else command.checkpoint(out, step),
    ]
    # the checkpoint's optimizer state would undo a changed rate: refused
    refused = command.run(out, *flags, *resume, "--learning_rate", "1e-3")
    line = error_line(
        refused, command.name, "resume with --learning_rate", "but this run has --learning_rate"
    )
    assert refused.returncode == 2 and re.search(
        r"was trained with --learning_rate 0\.00[35],", line
    ), line
    assert not (out / "model.safetensors").exists()
    if command.name == "pretrain":
        assert command.steps_logged(out, final=False) == list(range(1, step + 1))
        # a full disk mid-append tears the last line: the resume drops it and says so
        if signum == signal.SIGTERM:
            with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write('{"step": %d, "loss": 4.1' % (step + 1))
    resumed = command.run(out, *flags, *resume)
    succeeded(resumed)
    assert f"{command.resumed} {command.checkpoint(out, step)} at step {step}" in resumed.stdout, describe(
        resumed
    )
    assert_same_weights(command.reference, out)
    if command.name == "pretrain":
        torn = [line for line in resumed.stdout.splitlines() if "torn last line" in line]
        assert len(torn) == (signum == signal.SIGTERM), resumed.stdout[-3000:]
        assert not torn or f"line {step + 1} of {out / 'metrics.jsonl'}" in torn[0]
        assert command.steps_logged(out) == list(range(1, command.steps + 1))
        # The log and the card count both launches' time: the log's seconds go on from the stopped launch's.
        seconds = [
            json.loads(line)["elapsed_seconds"]
            for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line
        ]
        assert seconds == sorted(seconds) and seconds[step] > seconds[step - 1] > 0, seconds
        assert (
            "in 2 launches (the run was resumed 1 time; the last launch trained"
            in (out / "README.md").read_text()
        )


@deep
def test_ctrl_c_that_also_ends_the_reader_of_the_output_still_stops_with_a_checkpoint(finetune, tmp_path):
    """`finetune.py ... | tee log` and Ctrl-C, which ends tee too: once a
    BrokenPipeError mid-step and no checkpoint."""
    out = tmp_path / "run"
    process = subprocess.Popen(
        finetune.command(out, *finetune.every()), cwd=finetune.cwd,
        env={**pretrain_env(finetune.cwd), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    for line in process.stdout:
        if "'loss'" in line:
            break
    process.stdout.close()
    process.stdout = None
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    result = subprocess.CompletedProcess(process.args, process.returncode, "", err)
    assert process.returncode == 130, describe(result)
    step, name, checkpoint = finetune.stop_line(err)
    assert name == "SIGINT" and finetune.checkpoint(out, step).is_dir(), describe(result)
    assert "Traceback" not in err and not (out / "checkpoints" / ".tmp_checkpoint").exists(), describe(result)


@deep
def test_a_stop_signal_in_the_last_step_stops_with_its_checkpoint_and_the_resume_only_saves(
    command, tmp_path
):
    """A preempted job spends no seconds on evaluating and saving: the resume trains
    no step, evaluates and saves."""
    out, flags = tmp_path / "run", []
    if command.name == "finetune":
        flags = [
            "--validation_file", write_jsonl(tmp_path / "validation.jsonl", prompt_records(64, offset=100)),
        ]
    stopped = command.at_call(out, *flags, function=STEP, nth=command.steps, signum=signal.SIGTERM)
    assert stopped.returncode == 128 + signal.SIGTERM, describe(stopped)
    assert command.stop_line(stopped.stdout + stopped.stderr)[0] == command.steps
    assert not (out / "model.safetensors").exists() and not (out / "config.json").exists()

    resumed = command.run(out, *flags, "--resume_from_checkpoint", "latest")
    succeeded(resumed)
    assert (
        f"{command.resumed} {command.checkpoint(out, command.steps)} at step {command.steps}"
        in resumed.stdout
    )
    # the evaluation the signal cut
    assert "eval_loss" in resumed.stdout or "validation: loss" in resumed.stdout
    assert_same_weights(command.reference, out)
    if command.name == "pretrain":
        assert command.steps_logged(out) == list(range(1, command.steps + 1))


@deep
def test_a_stop_signal_while_the_run_starts_ends_it_at_once_with_a_line(command, tmp_path):
    """The handler comes before the heavy imports: the stop line, not a bare -15."""
    args = command.command(tmp_path / "out")[1:]
    when = r"import time:.*\| +transformers\."
    if command.name == "pretrain":
        when = r"^Training a byte-level BPE tokenizer"
    stopped = run_signalled([sys.executable, "-X", "importtime", *args], signal.SIGTERM, when,
                            pretrain_env(command.cwd), command.cwd)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout
    assert (
        f"{command.name}.py: stopped by SIGTERM before training started; resume with the same command and "
        "--resume_from_checkpoint latest."
    ) in stopped.stdout.splitlines(), stopped.stdout[-3000:]
    assert not (tmp_path / "out" / "config.json").exists()



@deep
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_the_resume_ends_bit_for_bit(pretrain, tmp_path):
    """The ranks may get torchrun's SIGTERM a step apart: they agree on one step and save one checkpoint."""
    env = pretrain_env(tmp_path, OMP_NUM_THREADS="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [*torchrun, *pretrain.command(tmp_path / "straight")[1:], "--per_device_train_batch_size", 4,
               "--max_train_steps", 60]
    straight = subprocess.run(list(map(str, command)), env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
    succeeded(straight)
    out = tmp_path / "run"
    command = [str(out) if part == str(tmp_path / "straight") else str(part) for part in command]
    stopped = run_signalled(command, signal.SIGTERM, r"^train:.*\| *[1-9]\d*/", env, tmp_path)
    assert stopped.returncode == 1, stopped.stdout[-4000:]  # torchrun's status after a signal
    found = re.findall(r"^pretrain\.py: stopped at step (\d+) of 60 by SIGTERM; checkpoint step_\1 is saved",
                       stopped.stdout, re.MULTILINE)
    assert len(found) == 1, stopped.stdout[-4000:]
    assert (out / "checkpoints" / f"step_{found[0]}" / "checksums.json").is_file()
    assert not (out / "model.safetensors").exists()

    succeeded(subprocess.run([*command, "--resume_from_checkpoint", "latest"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300))
    assert_same_weights(tmp_path / "straight", out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == list(range(1, 61))



# ---------------------------------------------------------------- stops during
# the push, the workers, the exit

PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
FINETUNE = str(REPO_ROOT / "training" / "finetune.py")
FAST = [*TINY_PRETRAIN_ARGS, "--max_train_steps", "4", "--eval_steps", "100", "--num_probes_per_kind", "0",
        "--num_samples", "0"]
LONG_WAIT = "300"  # a --hub_timeout no test may sit out: a stop must end the wait long before
# seconds a stop may take to end the process; generous, so that a loaded machine does not fail the test
PROMPT = 60


class Running:
    """A command started in the background; its stdout and stderr (together)
    read line by line as they come."""

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


def assert_stopped_during_push(run: Running, code: int, signum: int, program: str, folder) -> None:
    output = run.output
    assert code == 128 + signum, f"returncode {code}\n{output[-4000:]}"
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-4000:]
    lines = [
        line for line in run.lines if line.startswith(f"{program}: stopped by {signal.Signals(signum).name}")
    ]
    assert len(lines) == 1, output[-4000:]
    assert f"the local folder {folder} is complete: push it with `hf upload " in lines[0], lines[0]

    import hf_tinytx  # noqa: F401

    assert AutoModelForCausalLM.from_pretrained(folder).config.model_type == "tinytx"


@deep
def test_sigterm_during_a_pretrain_push_that_never_finishes_ends_it_at_once(tmp_path):
    out = tmp_path / "out"
    with silent_server() as server:
        run = Running(
            [
                sys.executable, PRETRAIN, *FAST, "--output_dir", str(out), "--push_to_hub",
                "--hub_model_id", "me/tiny", "--hub_timeout", LONG_WAIT,
            ],
            silent_hub_env(server, tmp_path),
            tmp_path,
        )
        run.wait_for(r"^Model folder: ")
        time.sleep(1)  # inside the wait for the upload
        run.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = run.finish(timeout=PROMPT)
    assert time.monotonic() - started < PROMPT
    assert_stopped_during_push(run, code, signal.SIGTERM, "pretrain.py", out)
    assert not (out / ".lock").exists()


@deep
def test_ctrl_c_three_times_during_a_finetune_push_that_never_finishes_ends_it_at_once(tmp_path):
    from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
    from tests.training.sft.test_finetune import QUICK

    build_tiny_model(vocab_size=320).save_pretrained(tmp_path / "base")
    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", prompt_records(16))
    with silent_server() as server:
        run = Running(
            [
                sys.executable, FINETUNE, "--model_name_or_path", "base", "--train_file", "train.jsonl",
                "--output_dir", "tuned", "--push_to_hub", "--hub_model_id", "me/tuned",
                "--hub_timeout", LONG_WAIT, *QUICK,
            ],
            silent_hub_env(server, tmp_path),
            tmp_path,
        )
        run.wait_for(r"^Model saved to ")
        time.sleep(1)
        for _ in range(3):
            run.process.send_signal(signal.SIGINT)
            time.sleep(0.1)
        code = run.finish(timeout=PROMPT)
    assert_stopped_during_push(run, code, signal.SIGINT, "finetune.py", tmp_path / "tuned")


@deep
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc; the workers' death is Linux's prctl"
)
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


@deep
def test_a_second_sigterm_while_a_stopped_run_exits_keeps_its_status(tmp_path):
    # Started as `tinytx pretrain` (its module form), so its lines name it so, not "pretrain.py".
    command = [
        sys.executable, "-m", "hf_tinytx_training", "pretrain", *TINY_PRETRAIN_ARGS,
        "--max_train_steps", "60", "--num_probes_per_kind", "0", "--num_samples", "0",
        "--output_dir", str(tmp_path / "out"),
    ]
    run = Running(command, pretrain_env(tmp_path), tmp_path)
    run.wait_for(r"^train:.*\| *[1-9]\d*/")
    run.process.send_signal(signal.SIGTERM)
    run.wait_for(r"^tinytx pretrain: stopped at step \d+ of 60 by SIGTERM")
    while run.process.poll() is None:  # again and again while it exits, up to its very last moments
        run.process.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    code = run.finish(timeout=PROMPT)
    assert code == 128 + signal.SIGTERM, f"returncode {code}\n{run.output[-4000:]}"
