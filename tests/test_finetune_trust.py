"""training/finetune.py has pretrain's guarantees, each shown from outside the script (tests/helpers/faults.py): a
stop by SIGTERM or Ctrl-C saves a checkpoint and says how to resume, a kill or bit rot in a checkpoint is routed
around, a full disk is one line, a second run on a busy or finished folder is refused, and the Hub token reaches no
file. Every resumed run ends with exactly the weights of a run that was never interrupted."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from tests.helpers.faults import KILL_MARK, KILLED, run_killed_at
from tests.helpers.tiny import assert_same_weights, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env
from tests.test_finetune import FINETUNE, prompt_records, write_jsonl


pytestmark = pytest.mark.deep

STEPS = 30  # ~70 ms a step here: a signal sent after the first logged step lands well before the last
FLAGS = ["--model_name_or_path", "base", "--train_file", "train.jsonl", "--max_steps", STEPS,
         "--per_device_train_batch_size", 4, "--learning_rate", "5e-3", "--logging_steps", 1, "--use_cpu",
         "--seed", 0, "--disable_tqdm", "true"]
EVERY_5 = ["--save_steps", 5]  # checkpoints 5, 10, ... (the default save_total_limit 2 keeps the newest two)
RESUME = ["--resume_from_checkpoint", "latest"]
STOP_LINE = re.compile(
    r"^finetune\.py: stopped at step (\d+) of 30 by (SIG\w+); checkpoint (\S+) is saved, nothing was exported: "
    r"resume with the same command and --resume_from_checkpoint latest\.$"
)
NOTES = "my notes: no fine-tune may touch them\n"


def command(output_dir, *flags):
    return [sys.executable, str(FINETUNE), *map(str, FLAGS), "--output_dir", str(output_dir), *map(str, flags)]


def finetune(root, output_dir, *flags, env=None):
    return subprocess.run(command(output_dir, *flags), cwd=root, env=env or pretrain_env(root), capture_output=True,
                          text=True, timeout=300)


def describe(result) -> str:
    return f"returncode {result.returncode}\nSTDOUT:\n{result.stdout[-3000:]}\nSTDERR:\n{result.stderr[-4000:]}"


def succeeded(result):
    assert result.returncode == 0 and "Traceback" not in result.stderr, describe(result)


def one_line(result, prefix="finetune.py: ") -> str:
    assert "Traceback" not in result.stderr, describe(result)
    lines = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, describe(result)
    return lines[0]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The base model and data every run reads (the working directory of each run)."""
    root = tmp_path_factory.mktemp("finetune_trust")
    build_tiny_model(vocab_size=320).save_pretrained(root / "base")
    build_byte_bpe_tokenizer().save_pretrained(root / "base")
    write_jsonl(root / "train.jsonl", prompt_records(16))
    return root


@pytest.fixture(scope="module")
def straight(root) -> Path:
    """The uninterrupted run, checkpointing and pushed to a (local) Hub with --hub_token: the token must be in no byte
    it wrote, Trainer's pickled training_args.bin included."""
    from tests.helpers.hub_server import LocalHub

    with LocalHub(user="tester") as hub:
        env = {k: v for k, v in pretrain_env(root).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))}
        env.update(hub.client_env(root / "hf_home", token=None))
        result = finetune(root, "straight", *EVERY_5, "--push_to_hub", "--hub_model_id", "tester/straight",
                          "--hub_token", hub.token, env=env)
        pushed = hub.repo_files("tester/straight")
        token = hub.token
    succeeded(result)
    warning = "finetune.py: warning: --hub_token puts the token on the command line"  # once, naming the safe ways
    assert [line for line in result.stderr.splitlines() if line.startswith(warning) and "HF_TOKEN" in line
            and "hf auth login" in line] != [] and result.stderr.count(warning) == 1, describe(result)
    assert "model.safetensors" in pushed and ".lock" not in pushed
    written = [path for path in (root / "straight").rglob("*") if path.is_file()]
    assert any(path.name == "training_args.bin" for path in written)
    assert token not in result.stdout + result.stderr
    assert not [path for path in written if token.encode() in path.read_bytes()], "the Hub token was written"
    return root / "straight"


@pytest.mark.parametrize(
    "signal_number, flags",
    [(signal.SIGTERM, []), (signal.SIGINT, ["--enable_jit_checkpoint"])],
    ids=["sigterm-default-flags", "sigint-jit-flag"],
)
def test_a_signal_saves_a_checkpoint_stops_and_the_resume_is_bit_for_bit(root, straight, tmp_path, signal_number,
                                                                         flags):
    """What a scheduler (SIGTERM) or a user (Ctrl-C) sends mid-run: the step ends, a checkpoint is saved, nothing is
    published as the final model, and the exit status and one line say how to resume. Resuming (by `latest` after
    SIGTERM, by the checkpoint's path after SIGINT) ends with the straight run's weights."""
    output_dir = tmp_path / "run"
    env = {**pretrain_env(root), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command(output_dir, *flags), cwd=root, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if "'loss'" in line:  # step 1 is logged: training is under way
            process.send_signal(signal_number)
            signalled = time.monotonic()
            break
    stdout, stderr = process.communicate(timeout=120)
    seconds = time.monotonic() - signalled
    stopped = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    assert process.returncode == 128 + signal_number, describe(stopped)
    match = STOP_LINE.match(one_line(stopped))
    assert match and match[2] == signal.Signals(signal_number).name, describe(stopped)
    step, checkpoint = int(match[1]), Path(match[3])
    assert 1 <= step < STEPS and checkpoint == output_dir / "checkpoints" / f"checkpoint-{step}"
    assert seconds < 30, f"{seconds:.0f} s from the signal to the exit"
    assert not (output_dir / "model.safetensors").exists() and not (output_dir / "config.json").exists()

    resume = RESUME if signal_number == signal.SIGTERM else ["--resume_from_checkpoint", checkpoint]
    if signal_number == signal.SIGTERM:  # the checkpoint's optimizer state would undo a changed rate: refused
        refused = finetune(root, output_dir, *flags, *resume, "--learning_rate", "1e-3")
        line = one_line(refused)
        assert refused.returncode == 2 and f"{checkpoint} was trained with --learning_rate 0.005, but this run has " \
            "--learning_rate 0.001" in line and "resume with --learning_rate 0.005" in line, describe(refused)
        assert checkpoint.is_dir() and not (output_dir / "model.safetensors").exists()
    resumed = finetune(root, output_dir, *flags, *resume)
    succeeded(resumed)
    assert f"Resuming from {checkpoint} at step {step}" in resumed.stdout
    assert_same_weights(straight, output_dir)


def test_a_signal_after_the_last_step_stops_with_its_checkpoint_and_the_resume_only_saves(root, straight, tmp_path):
    """A SIGTERM once the last step is logged lands during its checkpoint or the evaluation: as in pretrain, the run
    stops with that checkpoint instead of spending a preempted job's seconds on evaluating and saving the model. The
    resume trains no step and saves the straight run's weights."""
    output_dir, validation = tmp_path / "run", tmp_path / "validation.jsonl"
    write_jsonl(validation, prompt_records(64, offset=100))  # an evaluation that outlasts the signal's delivery
    flags = ["--validation_file", validation]
    env = {**pretrain_env(root), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command(output_dir, *flags), cwd=root, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    logged = 0
    for line in process.stdout:
        logged += "'loss'" in line
        if logged == STEPS:
            process.send_signal(signal.SIGTERM)
            break
    stdout, stderr = process.communicate(timeout=120)
    stopped = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    assert process.returncode == 128 + signal.SIGTERM, describe(stopped)
    match = STOP_LINE.match(one_line(stopped))
    checkpoint = output_dir / "checkpoints" / f"checkpoint-{STEPS}"
    assert match and int(match[1]) == STEPS and Path(match[3]) == checkpoint, describe(stopped)
    assert not (output_dir / "model.safetensors").exists() and not (output_dir / "config.json").exists()

    resumed = finetune(root, output_dir, *flags, *RESUME)
    succeeded(resumed)
    assert f"Resuming from {checkpoint} at step {STEPS}" in resumed.stdout
    assert "eval_loss" in resumed.stdout  # the evaluation the signal cut short
    assert_same_weights(straight, output_dir)


def test_a_kill_mid_checkpoint_and_bit_rot_fall_back_to_the_newest_intact_checkpoint(root, straight, tmp_path):
    """Killed right after checkpoint 15's weights were written: Trainer wrote them aside, so checkpoints/ holds 5 and
    10 whole. Bit rot then hits checkpoint 10: `latest` skips it with a word, sets it aside (renamed, kept) and
    resumes from 5, ending bit for bit on the straight run."""
    output_dir = tmp_path / "run"
    killed = run_killed_at([*FLAGS, "--output_dir", output_dir, *EVERY_5], env=pretrain_env(root), cwd=root,
                           function="safetensors.torch.save_file", match=".tmp_checkpoint", nth=3, when="after",
                           script=FINETUNE)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    checkpoints = output_dir / "checkpoints"
    assert sorted(name for name in os.listdir(checkpoints) if not name.startswith(".")) == [
        "checkpoint-10", "checkpoint-5"]

    weights = checkpoints / "checkpoint-10" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:-4] = bytes(255 - b for b in data[-8:-4])
    weights.write_bytes(bytes(data))
    resumed = finetune(root, output_dir, *EVERY_5, *RESUME)
    succeeded(resumed)
    assert (f"Skipping checkpoint {checkpoints / 'checkpoint-10'}: model.safetensors does not match its checksum"
            in resumed.stdout), describe(resumed)
    assert f"Resuming from {checkpoints / 'checkpoint-5'} at step 5" in resumed.stdout
    assert_same_weights(straight, output_dir)
    names = set(os.listdir(checkpoints))
    assert "abandoned_checkpoint-10" in names and {"checkpoint-25", "checkpoint-30"} <= names
    assert ".tmp_checkpoint" not in names, "the partial checkpoint's staging folder was left behind"


def test_a_second_run_is_refused_while_the_first_trains_and_after_it_finished(root, straight, tmp_path):
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text(NOTES)
    first = subprocess.Popen(command(output_dir), cwd=root, env={**pretrain_env(root), "PYTHONUNBUFFERED": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in first.stdout:
            if "'loss'" in line:
                first.send_signal(signal.SIGSTOP)  # held mid-run, holding its lock
                break
        busy = finetune(root, output_dir)
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    assert busy.returncode == 2
    assert f"is in use by another training run (process {first.pid})" in one_line(busy, "finetune.py: error:")
    assert_same_weights(straight, output_dir)

    saved = (output_dir / "model.safetensors").read_bytes()
    again = finetune(root, output_dir)
    assert again.returncode == 2
    error = one_line(again, "finetune.py: error:")
    assert "already holds an earlier run" in error and "--overwrite_output_dir to replace it" in error
    assert (output_dir / "model.safetensors").read_bytes() == saved

    (output_dir / "checkpoints" / "checkpoint-30" / "stale.txt").write_text("the earlier run's")
    replaced = finetune(root, output_dir, "--overwrite_output_dir", "--learning_rate", "1e-3")
    succeeded(replaced)
    assert (output_dir / "model.safetensors").read_bytes() != saved
    assert not (output_dir / "checkpoints" / "checkpoint-30" / "stale.txt").exists()
    assert (output_dir / "notes.txt").read_text() == NOTES


def test_a_full_disk_in_a_checkpoint_is_one_line_and_the_earlier_checkpoint_resumes(root, straight, tmp_path,
                                                                                     mounted):
    checkpoint = straight / "checkpoints" / "checkpoint-30"
    pages = sum(-(-path.stat().st_size // 4096) * 4096 for path in checkpoint.rglob("*") if path.is_file())
    output_dir = tmp_path / "small"
    with mounted(output_dir, f"{(pages * 3 // 2 + 16 * 4096) // 1024}k"):  # room for checkpoint 5, not for 10
        result = finetune(root, output_dir, *EVERY_5)
        assert result.returncode == 1, describe(result)
        error = one_line(result, "finetune.py: error:")
        staging = output_dir / "checkpoints" / ".tmp_checkpoint"
        assert error.startswith(f"finetune.py: error: No space left on the device while writing {staging} ")
        assert f"the earlier checkpoint {output_dir / 'checkpoints' / 'checkpoint-5'} is intact" in error
        assert not staging.exists(), "the partial checkpoint was left on the full disk"
        shutil.copytree(output_dir, tmp_path / "moved")
    resumed = finetune(root, tmp_path / "moved", *EVERY_5, *RESUME)
    succeeded(resumed)
    assert_same_weights(straight, tmp_path / "moved")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "moved").config.model_type == "tinytx"


def test_a_signal_while_the_libraries_load_ends_the_run_at_once_with_a_line(root, tmp_path):
    """The handler is installed before anything heavy is imported: a SIGTERM that lands while transformers loads
    (Python's import log, `-X importtime`, says when) ends the run with the stop line, not a bare -15."""
    from tests.test_pretrain_preemption import run_signalled

    command_line = [sys.executable, "-X", "importtime", *command(tmp_path / "out")[1:]]
    stopped = run_signalled(command_line, signal.SIGTERM, r"import time:.*\| +transformers\.", pretrain_env(root),
                            root)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout[-3000:]
    assert "Traceback" not in stopped.stdout
    assert any(line.startswith("finetune.py: stopped by SIGTERM before training started")
               for line in stopped.stdout.splitlines()), stopped.stdout[-3000:]
    assert not (tmp_path / "out" / "config.json").exists()


def test_an_overwrite_removes_what_the_earlier_run_wrote_and_this_one_does_not(root, tmp_path):
    """A LoRA run with --merge, then a full fine-tune with --overwrite_output_dir into the same folder: the adapter's
    files and merged/ go (they would sit beside the new model, and PEFT would load the old adapter); notes stay."""
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text(NOTES)
    succeeded(finetune(root, output_dir, "--max_steps", 2, "--use_peft", "--merge"))
    assert (output_dir / "adapter_config.json").is_file() and (output_dir / "merged" / "model.safetensors").is_file()

    succeeded(finetune(root, output_dir, "--max_steps", 2, "--overwrite_output_dir"))
    assert not list(output_dir.glob("adapter_*")) and not (output_dir / "merged").exists()
    assert (output_dir / "notes.txt").read_text() == NOTES
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    assert type(model).__name__ == "TinyTxForCausalLM"

    succeeded(finetune(root, output_dir, "--max_steps", 2, "--use_peft", "--overwrite_output_dir"))
    assert (output_dir / "adapter_config.json").is_file() and not (output_dir / "model.safetensors").exists()
