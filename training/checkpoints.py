"""Resumable checkpoints: save, verify, find, load, prune. This module owns `output_dir/checkpoints/`:

    checkpoints/tokenizer/   the run's tokenizer, saved once (a resumed run must reuse it)
    checkpoints/step_N/      Accelerate's `save_state` + trainer_state.json (`TrainingState`) +
                             data_fingerprint.json + checksums.json (sha256 of each file); under FSDP2 on CPUs
                             also sharded/ and scheduler.bin (torch.distributed.checkpoint)

A checkpoint is written under a temporary name, flushed, checksummed, then renamed: a kill mid-save leaves the
earlier ones as they were. A resume takes the newest intact one; those it will not continue from are set aside
(renamed, never deleted). Nothing is unpickled with `weights_only=False`, DeepSpeed's states included.
"""

import contextlib
import json
import os
import pickle
import re
import shutil
import types
from dataclasses import MISSING, asdict, dataclass, fields

from hf_tinytx.folders.safe import (
    STAGING_NAME,
    file_digest,
    fsync_dir,
    fsync_tree,
    is_disk_full,
    mib,
    open_new,
    remove_tree,
)
from hf_tinytx_training.data.fingerprint import data_changes
from hf_tinytx_training.errors import RunError, UserInputError


STEP_PREFIX = "step_"  # pretrain's step_N; finetune keeps Trainer's checkpoint-N (prefix "checkpoint-")
STATE_FILE = "trainer_state.json"
CHECKSUM_FILE = "checksums.json"
TOKENIZER_DIR = "tokenizer"
SHARDED_DIR = "sharded"
SCHEDULER_FILE = "scheduler.bin"
CONFIG_FILE = "config.json"
# what decided the data (data/fingerprint.py): a resume must read the same
DATA_FILE = "data_fingerprint.json"
THREADS_FILE = "cpu_threads.json"  # finetune's CPU threads (pretrain's are in trainer_state.json)
# What a resume must keep: the data order (the process count and accumulation may change: every
# step reads the same global batch), the values the optimizer's state holds, the tokenizer saved
# in checkpoints/, the tensors' shapes.
DATA_ORDER = ("seed", "block_size", "global_batch")
OPTIMIZER_STATE = ("optimizer", "learning_rate", "muon_learning_rate", "weight_decay", "adam_beta2")
TOKENIZER_FLAGS = ("tokenizer_name", "vocab_size")
ARCHITECTURE = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "mlp_type", "qk_norm", "tie_word_embeddings", "attention_bias",
    "mlp_bias",
)
TEMPORARY_PREFIX = ".tmp_"  # a checkpoint is written as .tmp_<name>, then renamed in whole
RANDOM_STATES = "random_states"  # Accelerate's random_states_<process index>.pkl
DEEPSPEED_DIR = "pytorch_model"  # where Accelerate has DeepSpeed write its states


@dataclass(frozen=True)
class Layout:
    """A run's checkpoints folder and how its checkpoints are named: pretrain's
    step_N, or Trainer's checkpoint-N."""

    folder: str
    prefix: str = STEP_PREFIX

    def path(self, step: int) -> str:
        return os.path.join(self.folder, f"{self.prefix}{step}")

    def steps(self) -> list[int]:
        if not os.path.isdir(self.folder):
            return []
        name = re.compile(rf"^{re.escape(self.prefix)}(\d+)$")
        return sorted(int(m.group(1)) for m in map(name.match, os.listdir(self.folder)) if m)

    def newest(self) -> str | None:
        steps = self.steps()
        return self.path(steps[-1]) if steps else None


@dataclass
class TrainingState:
    """Where a pretrain run stands, as trainer_state.json records it beside Accelerate's files."""

    step: int  # optimizer steps completed
    epoch: int
    batch_in_epoch: int  # micro-batches of the epoch already trained on
    run_signature: dict  # make_run_signature: what a resume must keep
    planned_steps: int | None = None  # None: planned in seconds
    train_seconds: float = 0.0  # on the run's clock (schedules.Clock): a schedule in seconds goes on from it
    trained_seconds: float = 0.0  # time in training of every launch up to this checkpoint (the card's total)
    launches: int = 1
    torch_threads: int | None = None  # CPU threads trained with (None: a GPU run, or an older checkpoint)
    plan: dict | None = None  # plan/choose.py's Plan of a run that planned itself (a resume keeps it)


def make_run_signature(
    train_args, block_size: int, global_batch: int, num_processes: int, model_args=None
) -> dict:
    """What a resume must keep (DATA_ORDER, OPTIMIZER_STATE, TOKENIZER_FLAGS) and what it may change."""
    return {
        "seed": train_args.seed, "block_size": block_size, "global_batch": global_batch,
        "gradient_accumulation_steps": train_args.gradient_accumulation_steps, "num_processes": num_processes,
        **{key: getattr(train_args, key) for key in OPTIMIZER_STATE},
        **{key: getattr(model_args, key) for key in TOKENIZER_FLAGS if model_args is not None},
    }


def save_state(
    accelerator, checkpoints_dir: str, state: TrainingState, keep: int | None, sharded, model_config,
    data: dict,
) -> str:
    """Writes checkpoints/step_N (every process takes part) and prunes all but the newest `keep`.
    `sharded`: (model, optimizer, scheduler) that Accelerate does not hold. The model's config goes
    beside the weights for --init_from."""
    layout = Layout(checkpoints_dir)
    final = layout.path(state.step)
    temporary = os.path.join(checkpoints_dir, TEMPORARY_PREFIX + os.path.basename(final))
    if accelerator.is_main_process:
        remove_tree(temporary)  # left by a run killed while saving this step (or a link planted at its name)
    accelerator.wait_for_everyone()
    with disk_space_guard(temporary, layout):
        accelerator.save_state(temporary)  # model (safetensors), optimizer, scheduler, RNG of every process
        if sharded:
            save_sharded(temporary, *sharded, is_main_process=accelerator.is_main_process)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            model_config.to_json_file(os.path.join(temporary, CONFIG_FILE))
            write_json(os.path.join(temporary, DATA_FILE), data)
            write_json(os.path.join(temporary, STATE_FILE), asdict(state))
            write_json(os.path.join(temporary, CHECKSUM_FILE), checksums(temporary))
            rename_into_place(temporary, final)
            prune(layout, keep)
    accelerator.wait_for_everyone()
    return final


def rename_into_place(temporary: str, final: str) -> None:
    """Flushes `temporary` and renames it to `final`, setting aside an abandoned checkpoint of that name."""
    fsync_tree(temporary)
    if os.path.exists(final):
        set_aside(final, "replaced")
    os.replace(temporary, final)
    fsync_dir(os.path.dirname(final))


def load_state(folder: str, accelerator, run_signature: dict, parts: tuple, sharded: bool,
               deepspeed_engine=None) -> TrainingState:
    """Puts what `save_state` wrote back into the model, optimizer and scheduler (`parts`) and the RNG (every
    process takes part). Another process count resumes too; what cannot is refused before anything loads."""
    state = read_training_state(folder)
    saved = state.run_signature
    if any(saved.get(key) != run_signature[key] for key in DATA_ORDER):
        was, now = ({key: values.get(key) for key in DATA_ORDER} for values in (saved, run_signature))
        raise UserInputError(
            f"{folder} was written with {was}, but this run has {now}; resume with the same --seed, "
            "--block_size and --total_batch_size (on any process count), or start a new run from its "
            f"weights with --init_from {folder}."
        )
    written_by, in_shards = saved.get("num_processes", 1), os.path.isdir(os.path.join(folder, SHARDED_DIR))
    refuse_optimizer_change(folder, saved, run_signature, OPTIMIZER_STATE,
                            f"start a new run with the new ones from its weights with --init_from {folder}")
    refuse_tokenizer_change(folder, saved, run_signature)
    refuse_layout_change(folder, written_by, accelerator.num_processes, in_shards, sharded, deepspeed_engine)
    random_state = read_random_state(folder, accelerator.process_index)
    if deepspeed_engine is not None:  # DeepSpeed reads every state file through this method, unpickling them
        deepspeed_engine.checkpoint_engine.load = load_weights_only
    with refusing_pickles(folder):
        if in_shards and not sharded:  # an FSDP2 checkpoint resumed whole: one process, or DDP
            load_sharded(folder, *parts)
            set_random_state(random_state)
        else:
            accelerator.load_state(folder)
            if sharded:
                load_sharded(folder, *parts)
    if written_by != accelerator.num_processes:
        # Accelerate steps the schedule once per process at every optimizer step (pretrain builds it so).
        scheduler = getattr(parts[2], "scheduler", parts[2])
        scheduler.last_epoch = state.step * accelerator.num_processes
    return state


def refuse_other_run(folder: str, run_signature: dict, config) -> None:
    """The rules of `load_state` that hold before the data is prepared (sizes may yet be fitted to a small
    text, so those wait for the load): the seed, the optimizer's values, the tokenizer, the model's shapes.
    A download from the Hub is refused by them before the run writes anything."""
    saved = read_training_state(folder).run_signature
    way_on = f"start a new run from its weights with --init_from {folder}"
    if changed := changed_values(saved, run_signature, ("seed",)):
        raise UserInputError(f"{folder} was trained with {changed[0]}, but this run has {changed[1]}: the "
                             f"seed decides the data order; resume with {changed[0]}, or {way_on}.")
    refuse_optimizer_change(folder, saved, run_signature, OPTIMIZER_STATE, way_on)
    refuse_tokenizer_change(folder, saved, run_signature)
    # the vocabulary's size is the tokenizer's, which the tokenizer flags decide
    refuse_architecture_change(folder, config, f"resume with the sizes it was trained with, or {way_on}",
                               unknown_yet=("vocab_size",))


def changed_values(saved: dict, now: dict, keys, dashes: str = "--") -> tuple[str, str] | None:
    """("--key old, ...", "--key new, ...") for the keys whose value changed, or None. A key `saved` lacks
    (recorded by an older checkpoint) has nothing to compare."""
    changed = [key for key in keys if key in saved and key in now and saved[key] != now[key]]
    if not changed:
        return None
    return tuple(", ".join(f"{dashes}{key} {values[key]}" for key in changed) for values in (saved, now))


def refuse_optimizer_change(folder: str, saved: dict, now: dict, flags: tuple, way_on: str) -> None:
    """A changed optimizer flag would be silently undone by the checkpoint's optimizer state: refused."""
    if changed := changed_values(saved, now, flags):
        raise UserInputError(
            f"{folder} was trained with {changed[0]}, but this run has {changed[1]}: its optimizer state "
            f"holds the old values; resume with {changed[0]}, or {way_on}."
        )


def refuse_tokenizer_change(folder: str, saved: dict, now: dict) -> None:
    """A resumed run keeps the tokenizer it saved: another --tokenizer_name or
    --vocab_size would be ignored."""
    if changed := changed_values(saved, now, TOKENIZER_FLAGS):
        raise UserInputError(
            f"{folder} was trained with {changed[0]}, but this run has {changed[1]}: a resumed run keeps the "
            f"tokenizer it saved in checkpoints/; resume with {changed[0]}, or start a new run with the new "
            "tokenizer (another --output_dir, or --overwrite_output_dir)."
        )


def refuse_data_change(folder: str, now: dict, how: str) -> None:
    """Other data than the checkpoint was trained on (`now`, data/fingerprint.py): refused,
    naming each change; `how`: the other way on ("or ..."). A checkpoint older than its
    fingerprint has none to compare."""
    path = os.path.join(folder, DATA_FILE)
    if not os.path.isfile(path):
        return
    changed = data_changes(read_json(path), now)
    if changed:
        raise UserInputError(
            f"{folder} was trained on other data: {'; '.join(changed)}. A resumed run must read the data it "
            f"was trained on: resume with the same data flags and unchanged files, {how}."
        )


def refuse_architecture_change(folder: str, config, how: str, unknown_yet=()) -> None:
    """The checkpoint's model (its config.json) and this run's differ in a field that fixes the tensors:
    refused, naming each field; `how`: what to do instead; `unknown_yet`: fields not compared."""
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(path):
        return
    compared = [key for key in ARCHITECTURE if key not in unknown_yet]
    if changed := changed_values(read_json(path), config.to_dict(), compared, dashes=""):
        raise UserInputError(
            f"{folder} holds a model with {changed[0]}, but this run builds one with {changed[1]}: its "
            f"weights fit only their own shapes; {how}."
        )


def refuse_layout_change(folder: str, written_by: int, processes: int, in_shards: bool, sharded: bool,
                         deepspeed_engine) -> None:
    """The changes of process count or layout a resume cannot make, refused with the way on."""
    way_on = f"or continue from its weights with --init_from {folder} (a fresh optimizer and schedule)"
    in_deepspeed = os.path.isdir(os.path.join(folder, DEEPSPEED_DIR))
    if (in_deepspeed or deepspeed_engine is not None) and (written_by != processes or not in_deepspeed
                                                           or deepspeed_engine is None):
        raise UserInputError(
            f"{folder} was written by {written_by} process(es){' under DeepSpeed' if in_deepspeed else ''}; "
            "DeepSpeed resumes its partitioned states only on as many processes and under DeepSpeed: resume "
            f"with the same launch, {way_on}."
        )
    if sharded and not in_shards:
        raise UserInputError(
            f"{folder} holds whole weights and optimizer state, which this FSDP2 run cannot shard: resume it "
            "without the FSDP2 config (one process, torchrun or accelerate-ddp.yaml, any process count), "
            f"{way_on}."
        )


def read_random_state(folder: str, process_index: int) -> dict | None:
    """This process's RNG state from Accelerate's file, which must load: Accelerate would skip it
    without a word (dropout would then draw other numbers). None: the checkpoint's run had no
    such process (the seed's state stays)."""
    from accelerate.utils import load  # torch.load with weights_only=True and numpy's RNG types allowed

    path = os.path.join(folder, f"{RANDOM_STATES}_{process_index}.pkl")
    if not os.path.exists(path):
        return None
    try:
        return load(path)
    except Exception as error:  # whatever the unpickler or a damaged file raises
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise RunError(
            f"{path} cannot be loaded ({reason}): resume from an earlier checkpoint "
            f"(--resume_from_checkpoint {os.path.dirname(folder)}/step_M) or start anew."
        ) from None


def set_random_state(states: dict | None) -> None:
    """This process's RNG state (`read_random_state`), where `accelerator.load_state` cannot be used."""
    import random

    import numpy as np
    import torch

    if states is None:
        return
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if torch.cuda.is_available() and "torch_cuda_manual_seed" in states:
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])


def recorded_threads(folder: str | None) -> int | None:
    """The CPU threads the checkpoint in `folder` trained with (pretrain's trainer_state.json, finetune's
    THREADS_FILE), or None: no checkpoint, a GPU run, or a checkpoint older than the record."""
    for name in (THREADS_FILE, STATE_FILE) if folder else ():
        path = os.path.join(folder, name)
        value = read_json(path).get("torch_threads") if os.path.isfile(path) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def read_training_state(folder: str) -> TrainingState:
    saved = read_json(os.path.join(folder, STATE_FILE))
    names = [f.name for f in fields(TrainingState)]
    missing = [f.name for f in fields(TrainingState) if f.name not in saved and f.default is MISSING]
    if missing:
        raise UserInputError(
            f"{folder}/{STATE_FILE} has no {', '.join(missing)}: it is not a checkpoint of pretrain.py; "
            "resume from one of its checkpoints/step_N folders, or start anew."
        )
    return TrainingState(**{name: saved[name] for name in names if name in saved})


def save_sharded(folder: str, model, optimizer, scheduler, is_main_process: bool) -> None:
    """The model's and the optimizer's state as each process holds it (one file per process in
    folder/sharded/), and the scheduler's (the same on every process)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, getattr(optimizer, "optimizer", optimizer))
    dcp.save(
        {"model": model_state, "optimizer": optimizer_state}, checkpoint_id=os.path.join(folder, SHARDED_DIR)
    )
    if is_main_process:
        torch.save(scheduler.state_dict(), os.path.join(folder, SCHEDULER_FILE))


def load_sharded(folder: str, model, optimizer, scheduler) -> None:
    """Reads what `save_sharded` wrote into the sharded model, optimizer and scheduler, in place."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    optimizer = getattr(optimizer, "optimizer", optimizer)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=os.path.join(folder, SHARDED_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(torch.load(os.path.join(folder, SCHEDULER_FILE), weights_only=True))


def load_weights_only(path: str, map_location=None, **_ignored):
    """torch.load(weights_only=True) for DeepSpeed's states, its three classes of plain data allowed."""
    import torch
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    try:
        with torch.serialization.safe_globals([LossScaler, ZeroStageEnum, fragment_address]):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise RunError(pickle_refused(path, error, "no DeepSpeed checkpoint holds")) from None


def pickle_refused(path: str, error: Exception, why: str = "no checkpoint of a training run holds") -> str:
    """The line for a state file torch.load(weights_only=True) refused, in place of torch's traceback
    (which suggests weights_only=False)."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = found.group(1) if found else "a Python object"
    return (
        f"Refused to load {path}: it holds {what}, which {why}, and unpickling it could run code. Resume "
        "from a checkpoint you trust (--resume_from_checkpoint PATH) or start anew with "
        "--overwrite_output_dir."
    )


@contextlib.contextmanager
def refusing_pickles(folder: str | None):
    """A file that the loads from `folder` within the block refuse to unpickle ends
    the run with one line naming it."""
    try:
        yield
    except pickle.UnpicklingError as error:
        if folder is None:
            raise
        raise RunError(pickle_refused(refused_file(folder) or folder, error)) from None


def refused_file(folder: str) -> str | None:
    """The first state file in `folder` that a resume's loads refuse to unpickle (torch's message does not
    name it). Trainer's training_args.bin, a full pickle, is never loaded on resume."""
    from accelerate.utils import load

    for directory, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            if name.endswith((".bin", ".pt", ".pth", ".pkl")) and name != "training_args.bin":
                try:
                    load(os.path.join(directory, name), map_location="cpu")
                except pickle.UnpicklingError:
                    return os.path.join(directory, name)
                except Exception:  # noqa: BLE001  (another kind of damage: not the file asked for)
                    continue
    return None


def is_checkpoint(folder: str | None) -> bool:
    return bool(folder) and os.path.isfile(os.path.join(folder, STATE_FILE))


def tokenizer_source(folder: str) -> str:
    """Where a model folder's tokenizer is: in it, or, for a checkpoint, in its
    run's checkpoints/tokenizer."""
    return (
        os.path.join(os.path.dirname(os.path.abspath(folder)), TOKENIZER_DIR)
        if is_checkpoint(folder)
        else folder
    )


def holds_whole_weights(folder: str) -> bool:
    """Whether `from_pretrained` can read the folder's weights (one process or
    DDP wrote it, or it is a model)."""
    return not is_checkpoint(folder) or os.path.isfile(os.path.join(folder, "model.safetensors"))


def load_partitioned_weights(model, folder: str) -> None:
    """--init_from on a checkpoint that FSDP2 (sharded/) or DeepSpeed ZeRO (pytorch_model/) wrote
    partitioned: its weights into a model built whole."""
    import torch

    if os.path.isdir(os.path.join(folder, SHARDED_DIR)):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=os.path.join(folder, SHARDED_DIR))  # the model's part only
        set_model_state_dict(model, state["model"])
        return
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with deepspeed_reads_weights_only():  # its consolidation unpickles with weights_only=False
        state = get_fp32_state_dict_from_zero_checkpoint(folder, tag=DEEPSPEED_DIR)
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.float32) for k, v in state.items()}, strict=False
    )
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise RunError(f"{folder}'s DeepSpeed states do not fit the model of its config.json (missing "
                       f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}).")
    model.tie_weights()


@contextlib.contextmanager
def deepspeed_reads_weights_only():
    """Within the block DeepSpeed's zero_to_fp32 loads through `load_weights_only`, not weights_only=False."""
    import deepspeed.utils.zero_to_fp32 as consolidation

    torch = consolidation.torch
    # torch as it sees it
    consolidation.torch = types.SimpleNamespace(**{**vars(torch), "load": load_weights_only})
    try:
        yield
    finally:
        consolidation.torch = torch


def checksums(folder: str) -> dict:
    """{relative path: sha256} of every file in the folder."""
    digests = {}
    for directory, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(directory, name)
            digests[os.path.relpath(path, folder)] = file_digest(path)
    return digests


def problem_with(folder: str) -> str | None:
    """Why `folder` cannot be resumed from (missing, unreadable or changed
    files), or None when it is intact."""
    try:
        expected = read_json(os.path.join(folder, CHECKSUM_FILE))
    except (OSError, ValueError):
        return f"{CHECKSUM_FILE} is missing or unreadable"
    if STATE_FILE not in expected or not any(map(holds_weights, expected)):
        return f"{CHECKSUM_FILE} does not list the trainer state and the model weights"
    try:
        actual = checksums(folder)
    except OSError as error:
        return f"cannot read it ({error.strerror})"
    for name, digest in expected.items():
        if name not in actual:
            return f"{name} is missing"
        if actual[name] != digest:
            return f"{name} does not match its checksum (damaged after it was written)"
    return None


def holds_weights(name: str) -> bool:
    """Whether a checkpoint file holds model weights: safetensors, FSDP2's
    .metadata, or DeepSpeed's model states."""
    return (name.endswith((".safetensors", "mp_rank_00_model_states.pt"))
            or os.path.basename(name) == ".metadata")


def find_resumable(resume_from: str | None, layout: Layout, say) -> str | None:
    """The checkpoint to continue from: the given folder, or with 'latest' the newest intact one (or None)."""
    if not resume_from:
        return None
    if resume_from != "latest":
        folder = os.path.abspath(resume_from)
        problem = problem_with(folder) if os.path.isdir(folder) else "it is not a folder"
        if problem:
            raise UserInputError(
                f"--resume_from_checkpoint {resume_from} cannot be resumed from: {problem}. Give an intact "
                f"checkpoints/{layout.prefix}N folder, or 'latest' for the newest intact one."
            )
        return folder
    for step in reversed(layout.steps()):
        folder = layout.path(step)
        problem = problem_with(folder)
        if problem is None:
            return folder
        say(f"Skipping checkpoint {folder}: {problem}.")
    return None


def set_aside_after(layout: Layout, step: int, say) -> None:
    """Renames every step_N with N > step so `latest` never picks it again."""
    for newer in layout.steps():
        if newer > step:
            folder = set_aside(layout.path(newer), "abandoned")
            say(f"Set aside {os.path.basename(folder)}: this run continues from step {step}.")


def set_aside(folder: str, reason: str) -> str:
    parent, name = os.path.split(folder)
    target, n = os.path.join(parent, f"{reason}_{name}"), 1
    while os.path.exists(target):
        target, n = os.path.join(parent, f"{reason}_{name}.{n}"), n + 1
    os.replace(folder, target)
    return target


def prune(layout: Layout, keep: int | None) -> None:
    for old in layout.steps()[:-keep] if keep else []:
        shutil.rmtree(layout.path(old))


def save_tokenizer(tokenizer, checkpoints_dir: str) -> None:
    """checkpoints/tokenizer, written under a temporary name first: a kill never leaves half a tokenizer."""
    os.makedirs(checkpoints_dir, exist_ok=True)
    final = os.path.join(checkpoints_dir, TOKENIZER_DIR)
    temporary = os.path.join(checkpoints_dir, f"{TEMPORARY_PREFIX}{TOKENIZER_DIR}")
    remove_tree(temporary)
    with disk_space_guard(temporary, Layout(checkpoints_dir)):
        tokenizer.save_pretrained(temporary)
        fsync_tree(temporary)
        # one a start that failed before its first checkpoint saved (a kill here: none, retrained)
        remove_tree(final)
        os.replace(temporary, final)
        fsync_dir(checkpoints_dir)


@contextlib.contextmanager
def disk_space_guard(path: str, layout: Layout):
    """"No space left" while writing `path` becomes a RunError naming the space needed and free and the newest
    intact checkpoint; the half-written `path` is removed."""
    try:
        yield
    except Exception as error:
        if not is_disk_full(error, path):
            raise
        written = folder_size(path)
        if os.path.isdir(path) and os.path.basename(path).startswith((TEMPORARY_PREFIX, STAGING_NAME)):
            shutil.rmtree(path, ignore_errors=True)
        raise RunError(disk_full_message(path, written, layout)) from None


def disk_full_message(path: str, needed_at_least: int, layout: Layout) -> str:
    previous = layout.newest()
    needed = max(needed_at_least, folder_size(previous) if previous else 0)
    free = shutil.disk_usage(os.path.dirname(path)).free
    intact = (
        f"the earlier checkpoint {previous} is intact: free some space and rerun with "
        "--resume_from_checkpoint latest"
        if previous
        else "no checkpoint was saved yet: free space and rerun"
    )
    return (
        f"No space left on the device while writing {path} (about {mib(needed)} needed, {mib(free)} free); "
        f"{intact}."
    )


def folder_size(path: str | None) -> int:
    if not path or not os.path.exists(path):
        return 0
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str | os.PathLike, values: dict, indent: int = 1) -> None:
    """A JSON file, keys sorted, opened by open_new (a link at its name is
    replaced, never written through)."""
    with open_new(path) as f:
        json.dump(values, f, indent=indent, sort_keys=True, default=str)
