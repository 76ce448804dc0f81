"""Checkpoints and what a resume accepts: a kill mid-checkpoint or a damaged file falls back to the newest
intact checkpoint, bit for bit; a finished run's resume rules; seeds; a later epoch; a resume that changes
what decides the model or the data, or a planted pickle, is refused in one line."""

import dataclasses
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.faults import KILL_MARK, KILLED
from tests.helpers.reference import describe, error_line, succeeded
from tests.helpers.tiny import REPO_ROOT, assert_same_weights, pretrain_env
from tests.training.sft.test_finetune import prompt_records, write_jsonl


deep = pytest.mark.deep


def flip_last_bytes(path: Path):
    data = bytearray(path.read_bytes())
    data[-8:-4] = bytes(255 - b for b in data[-8:-4])
    path.write_bytes(bytes(data))



def test_a_kill_mid_checkpoint_and_damage_fall_back_to_the_newest_intact_checkpoint(command, tmp_path):
    """Killed in the fifth checkpoint; then `latest` sets aside a damaged one and
    one without optimizer state."""
    out = tmp_path / "run"
    killed = command.at_call(out, *command.every(), function="safetensors.torch.save_file",
                             match=f"checkpoints{os.sep}.tmp", nth=5)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    intact = [command.interval * n for n in (1, 2, 3, 4)]
    checkpoints = out / "checkpoints"
    assert sorted(
        name for name in os.listdir(checkpoints) if not name.startswith((".", "tokenizer"))
    ) == sorted(command.checkpoint(out, step).name for step in intact)
    assert not (out / "model.safetensors").exists()  # no final export from a killed run
    newest = command.checkpoint(out, intact[-1])
    weights = load_file(newest / "model.safetensors")
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    state = json.loads((newest / "trainer_state.json").read_text())
    assert state.get("step", state.get("global_step")) == intact[-1]

    flip_last_bytes(newest / "model.safetensors")
    (command.checkpoint(out, intact[-2]) / command.optimizer_file).unlink()
    resumed = command.run(out, *command.every(limit=2), "--resume_from_checkpoint", "latest")
    succeeded(resumed)
    assert re.search(rf"{newest.name}\b.*model\.safetensors does not match its checksum", resumed.stdout)
    assert re.search(rf"{intact[-2]}\b.*{command.optimizer_file} is missing", resumed.stdout), describe(
        resumed
    )
    assert f"{command.resumed} {command.checkpoint(out, intact[-3])} at step {intact[-3]}" in resumed.stdout
    assert_same_weights(command.reference, out)
    names = set(os.listdir(checkpoints))
    assert {f"abandoned_{command.checkpoint(out, step).name}" for step in intact[-2:]} <= names
    assert sorted(name for name in names if name.startswith(("step_", "checkpoint-"))) == sorted(
        command.checkpoint(out, step).name for step in (command.steps - command.interval, command.steps))
    assert not [name for name in names if name.startswith(".tmp")], names
    if command.name == "pretrain":
        assert command.steps_logged(out) == list(range(1, command.steps + 1))



@deep
def test_pretrain_resume_rules_on_a_finished_run(pretrain, tmp_path):
    """On a copy of the finished reference (checkpoints 2, 4 and 6)."""
    out = tmp_path / "run"
    shutil.copytree(pretrain.reference, out)
    checkpoints = out / "checkpoints"
    resume = ["--resume_from_checkpoint", "latest"]
    refused = pretrain.run(out, *resume, "--per_device_train_batch_size", 4)
    assert (
        "resume with the same --seed, --block_size and --total_batch_size (on any process count)"
        in error_line(refused, "pretrain")
    )
    for flag, value, was in (("--learning_rate", "1e-3", "0.005"), ("--weight_decay", "0.0", "0.1"),
                             ("--adam_beta2", "0.99", "0.95")):
        refused = pretrain.run(out, *resume, flag, value)
        line = error_line(
            refused, "pretrain", f"was trained with {flag} {was}, but this run has {flag} {float(value)}",
            f"resume with {flag} {was}, or start a new run", "--init_from",
        )
        assert refused.returncode == 2, line
    assert sorted(os.listdir(checkpoints)) == ["step_2", "step_4", "step_6", "tokenizer"]

    again = pretrain.run(out, *resume)
    assert "at step 6" in again.stdout
    assert_same_weights(pretrain.reference, out)
    assert pretrain.steps_logged(out) == list(range(1, 7))

    (checkpoints / "abandoned_step_4").mkdir()  # set aside by an earlier resume: the new one is numbered
    older = pretrain.run(out, *pretrain.every(limit=10), "--resume_from_checkpoint", checkpoints / "step_2")
    succeeded(older)
    assert "at step 2" in older.stdout
    assert "Set aside abandoned_step_4.1: this run continues from step 2." in older.stdout
    assert "Set aside abandoned_step_6: this run continues from step 2." in older.stdout
    assert_same_weights(pretrain.reference, out)

    longer = pretrain.run(
        out, *resume, "--max_train_steps", 10, "--lr_scheduler_type", "constant_with_warmup",
        "--overwrite_output_dir",
    )
    assert "at step 6" in longer.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "loss" in row]
    assert [row["step"] for row in rows] == list(range(1, 11))
    assert [row["lr"] for row in rows[6:]] == [pytest.approx(5e-3)] * 4, rows[6:]

    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"
    (out / "metrics.jsonl").write_text("".join(lines))
    exported = (out / "model.safetensors").read_bytes()
    damaged = pretrain.run(out, *resume, "--max_train_steps", 10)
    assert damaged.returncode == 1
    error_line(damaged, "pretrain", f"{out / 'metrics.jsonl'} line 3 is not a metrics row")
    assert (out / "model.safetensors").read_bytes() == exported


@deep
def test_pretrain_seeds_decide_the_run(pretrain, tmp_path):
    """Resumes agree with the reference because they are seeded alike: another
    --seed gives another first loss."""
    def first_loss(folder):
        return next(json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()
                    if '"loss"' in line)

    succeeded(pretrain.run(tmp_path / "same", "--max_train_steps", 1))
    succeeded(pretrain.run(tmp_path / "other", "--max_train_steps", 1, "--seed", 7))
    losses = [first_loss(folder) for folder in (pretrain.reference, tmp_path / "same", tmp_path / "other")]
    assert losses[0] == losses[1] != losses[2], losses



EPOCHS_OF_THREE = ["--num_train_documents", 80, "--per_device_train_batch_size", 48]


@deep
def test_pretrain_killed_with_attention_dropout_resumes_bit_for_bit_in_a_later_epoch(pretrain, tmp_path):
    """Dropout's random numbers, and the second epoch's order of blocks
    (resumes once read epoch 0's again)."""
    values = json.loads((REPO_ROOT / "training" / "configs" / "model-tiny.json").read_text())
    (tmp_path / "dropout.json").write_text(json.dumps({**values, "attention_dropout": 0.1}))
    flags = ["--model_config", tmp_path / "dropout.json", *EPOCHS_OF_THREE, *pretrain.every()]
    ran = pretrain.run(tmp_path / "straight", *flags)
    succeeded(ran)
    blocks = int(re.search(r"([\d,]+) training and", ran.stdout).group(1).replace(",", ""))
    assert blocks // 48 == 3, f"{blocks} blocks: not three batches an epoch any more; change EPOCHS_OF_THREE"
    # Killed right after step 5's checkpoint weights were written: the run resumes
    # from step 4, in the second epoch.
    out = tmp_path / "run"
    killed = pretrain.at_call(out, *flags, function="safetensors.torch.save_file", match="checkpoints", nth=5)
    assert killed.returncode == KILLED and KILL_MARK in killed.stderr, describe(killed)
    assert "step_4" in os.listdir(out / "checkpoints") and "step_5" not in os.listdir(out / "checkpoints")
    resumed = pretrain.run(out, *flags, "--resume_from_checkpoint", "latest")
    succeeded(resumed)
    assert re.search(r"Resumed from \S*step_4\b", resumed.stdout), describe(resumed)
    assert_same_weights(tmp_path / "straight", out)


@deep
def test_a_resume_that_changes_what_decides_the_model_is_refused_in_one_line(pretrain, finetune, tmp_path):
    """Once ignored (or a traceback mid-load), now refused before anything is written; moved data resumes."""
    from tests.helpers.tiny import build_byte_bpe_tokenizer, run_side_by_side, write_text

    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "other-tokenizer")
    lora, on_file, sft = tmp_path / "lora", tmp_path / "on-file", tmp_path / "sft"
    text, other_text, records = tmp_path / "data.txt", tmp_path / "other.txt", tmp_path / "sft.jsonl"
    write_text(text, 0.05), write_text(other_text, 0.05, seed=1), write_jsonl(records, prompt_records(16))
    other_records = write_jsonl(tmp_path / "other.jsonl", prompt_records(16, offset=16))
    short = {"pretrain": ["--max_train_steps", 2, "--checkpointing_steps", 2], "finetune": ["--max_steps", 2,
                                                                                           "--save_steps", 2]}
    started = {"lora": (finetune, lora, [*short["finetune"], "--use_peft"]),
               "on-file": (pretrain, on_file, [*short["pretrain"], "--train_file", text]),
               "sft": (finetune, sft, [*short["finetune"], "--train_file", records])}
    trained = run_side_by_side({name: (command.command(out, *flags), command.cwd, pretrain_env(command.cwd))
                                for name, (command, out, flags) in started.items()})
    for result in trained.values():
        succeeded(result)
    (tmp_path / "moved").mkdir()
    moved = Path(shutil.copy2(text, tmp_path / "moved" / "data.txt"))  # its name and times kept
    with text.open("a") as f:  # the same files, written again
        f.write("A paragraph added after the run.\n")
    write_jsonl(records, prompt_records(17))
    resume = ["--resume_from_checkpoint", "latest"]
    cases = {  # name: (command, its finished run, flags, words of the one line)
        "hidden_size": (
            pretrain,
            pretrain.reference,
            ["--hidden_size", 32],
            [
                "holds a model with hidden_size 64, head_dim 16, but this run builds one with hidden_size "
                "32, head_dim 8",
                "resume with the sizes it was started with",
            ],
        ),
        "vocab_size": (
            pretrain,
            pretrain.reference,
            ["--vocab_size", 400],
            [
                "was trained with --vocab_size 320, but this run has --vocab_size 400",
                "keeps the tokenizer it saved",
            ],
        ),
        "tokenizer_name": (
            pretrain, pretrain.reference, ["--tokenizer_name", tmp_path / "other-tokenizer"],
            ["was trained with --tokenizer_name None, but this run has --tokenizer_name"],
        ),
        "lora_r": (
            finetune, lora, ["--use_peft", "--lora_r", 4],
            ["holds a LoRA adapter trained with --lora_r 8, but this run has --lora_r 4"],
        ),
        "lora_trainable_tokens": (
            finetune, lora, ["--use_peft", "--lora_trainable_tokens", "0123"],
            ["holds a LoRA adapter trained with the token ids of --lora_trainable_tokens None, but this run "
             "has the token ids of --lora_trainable_tokens "],
        ),
        "lora_without_peft": (
            finetune, lora, [], ["holds a LoRA adapter, but this run fine-tunes every weight"],
        ),
        "full_with_peft": (
            finetune, finetune.reference, ["--use_peft"],
            ["holds a full fine-tune's weights, but this run trains a LoRA adapter"],
        ),
        "pretrain_file_rewritten": (
            pretrain,
            on_file,
            ["--train_file", text],
            [
                "step_2 was trained on other data: --train_file data.txt changed since",
                "resume with the same data flags and unchanged files, or start a new run on this data from "
                "its weights (--init_from ",
            ],
        ),
        "pretrain_another_file": (
            pretrain, on_file, ["--train_file", other_text],
            ["--train_file was data.txt, this run has other.txt"],
        ),
        "pretrain_corpus_size": (
            pretrain, pretrain.reference, ["--num_train_documents", 200],
            ["--num_train_documents was 300, this run has 200"],
        ),
        "finetune_file_rewritten": (
            finetune,
            sft,
            ["--train_file", records],
            [
                "checkpoint-2 was trained on other data: --train_file sft.jsonl changed since",
                "or fine-tune anew (another --output_dir, or --overwrite_output_dir)",
            ],
        ),
        "finetune_another_file": (
            finetune, finetune.reference, ["--train_file", other_records],
            ["--train_file was train.jsonl, this run has other.jsonl"],
        ),
    }
    resumed = {"moved_data": (pretrain, on_file, ["--train_file", moved, "--max_train_steps", 4])}
    runs = {}
    for name, (command, finished, flags, *_) in {**cases, **resumed}.items():
        shutil.copytree(finished, tmp_path / name)
        runs[name] = (
            command.command(tmp_path / name, *resume, *flags), command.cwd, pretrain_env(command.cwd),
        )
    # The data is compared before anything is tokenized or moved: the token store and the checkpoints stay.
    before = {name: folder_state(tmp_path / name) for name in cases}
    results = run_side_by_side(runs, timeout=600)
    for name, (command, finished, _, words) in cases.items():
        line = error_line(results[name], command.name, *words)
        assert results[name].returncode == 2, line
        weights = "adapter_model.safetensors" if finished == lora else "model.safetensors"
        assert (tmp_path / name / weights).read_bytes() == (finished / weights).read_bytes()
        after = folder_state(tmp_path / name)
        assert after == before[name], (
            name,
            sorted(k for k in after.keys() | before[name].keys() if after.get(k) != before[name].get(k)),
        )
    succeeded(results["moved_data"])
    assert re.search(r"Resumed from \S*step_2\b", results["moved_data"].stdout), describe(
        results["moved_data"]
    )


def folder_state(folder: Path) -> dict:
    """Every file's size and modification time."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*") if path.is_file()}


class Planted:
    """What an attacker puts in a checkpoint's state file: unpickling it would run a command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@deep
def test_a_planted_pickle_in_any_state_file_is_refused_in_one_line(pretrain, finetune, tmp_path):
    """Checksum recomputed: once torch's traceback advising weights_only=False."""
    import pickle

    from hf_tinytx_training import checkpoints
    from tests.helpers.tiny import run_side_by_side

    cases = {"pretrain": (pretrain, ["optimizer.bin", "scheduler.bin"]),
             "finetune": (finetune, ["optimizer.pt", "scheduler.pt", "rng_state.pth"])}
    runs, expected = {}, {}
    for command, names in cases.values():
        for name in names:
            out = tmp_path / f"{command.name}-{name}"
            shutil.copytree(command.reference, out)
            checkpoint = command.checkpoint(out, command.steps)
            (checkpoint / name).write_bytes(pickle.dumps(Planted(tmp_path / f"ran-{name}"), protocol=2))
            (checkpoint / checkpoints.CHECKSUM_FILE).unlink()
            checkpoints.write_json(checkpoint / checkpoints.CHECKSUM_FILE, checkpoints.checksums(checkpoint))
            runs[name] = (command.command(out, "--resume_from_checkpoint", "latest"), command.cwd,
                          pretrain_env(command.cwd))
            expected[name] = (command.name, checkpoint / name)
    results = run_side_by_side(runs, timeout=600)
    for name, (program, path) in expected.items():
        line = error_line(results[name], program, f"Refused to load {path}: it holds posix.system",
                          "unpickling it could run code")
        assert results[name].returncode == 1, line
        assert not (tmp_path / f"ran-{name}").exists(), "the planted pickle ran"



def test_the_checkpoint_state_reads_back_and_one_without_a_field_is_refused_in_one_line(tmp_path):
    """A trainer_state.json that lacks a field a resume needs is one line naming it, not a KeyError."""
    from hf_tinytx_training import checkpoints
    from hf_tinytx_training.errors import UserInputError

    signature = {
        "seed": 42, "block_size": 64, "global_batch": 8, "gradient_accumulation_steps": 1, "num_processes": 1,
    }
    written = {"step": 6, "epoch": 1, "batch_in_epoch": 3, "run_signature": signature, "planned_steps": 8,
               "train_seconds": 2.5, "trained_seconds": 4.0, "launches": 2, "torch_threads": 2,
               "plan": {"size": "micro"}}
    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps(written))
    state = checkpoints.read_training_state(str(tmp_path))
    assert dataclasses.asdict(state) == written

    # a checkpoint of before they were recorded: one launch
    del written["trained_seconds"], written["launches"], written["torch_threads"], written["plan"]
    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps(written))
    assert (checkpoints.read_training_state(str(tmp_path)).launches, state.launches) == (1, 2)

    (tmp_path / checkpoints.STATE_FILE).write_text(json.dumps({"step": 6, "run_signature": signature}))
    with pytest.raises(
        UserInputError, match=r"has no epoch, batch_in_epoch: it is not a checkpoint of pretrain\.py"
    ):
        checkpoints.read_training_state(str(tmp_path))


def test_the_data_fingerprint_names_each_change_and_data_of_the_same_bytes_is_the_same(tmp_path):
    """checkpoints.refuse_data_change without a run; a checkpoint from before the
    fingerprint has nothing to compare."""
    from types import SimpleNamespace

    from hf_tinytx_training import checkpoints
    from hf_tinytx_training.data.fingerprint import finetune_data
    from hf_tinytx_training.errors import UserInputError

    data, other = write_jsonl(tmp_path / "a.jsonl", prompt_records(4)), write_jsonl(tmp_path / "b.jsonl", [])
    flags = {"train_file": str(data), "validation_file": None, "max_seq_length": None, "packing": False}
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    how = "or fine-tune anew"
    # none recorded
    checkpoints.refuse_data_change(str(checkpoint), finetune_data(SimpleNamespace(**flags)), how)
    checkpoints.write_json(checkpoint / checkpoints.DATA_FILE, finetune_data(SimpleNamespace(**flags)))

    (tmp_path / "moved").mkdir()
    moved = shutil.copy2(data, tmp_path / "moved" / "a.jsonl")
    # Before (issue 69): a touch, or a copy without -p, was refused though no byte changed.
    (tmp_path / "copied").mkdir()
    copied = shutil.copy(data, tmp_path / "copied" / "a.jsonl")
    os.utime(copied, ns=(time.time_ns(), time.time_ns() + 5 * 10**9))
    for same in ({}, {"train_file": moved}, {"train_file": copied}):
        checkpoints.refuse_data_change(
            str(checkpoint), finetune_data(SimpleNamespace(**{**flags, **same})), how
        )
    write_jsonl(data, prompt_records(4, offset=1))  # the same size, other text
    os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))
    for changed, words in [
        ({}, "--train_file a.jsonl changed since (other bytes)"),
        ({"train_file": str(other)}, "--train_file was a.jsonl, this run has b.jsonl"),
        ({"train_file": moved, "packing": True}, "--packing was False, this run has True"),
    ]:
        with pytest.raises(UserInputError) as refused:
            checkpoints.refuse_data_change(
                str(checkpoint), finetune_data(SimpleNamespace(**{**flags, **changed})), how
            )
        assert str(refused.value).startswith(
            f"{checkpoint} was trained on other data: {words}"
        ), refused.value
        assert str(refused.value).endswith(
            "resume with the same data flags and unchanged files, or fine-tune anew."
        )
