"""Supervised fine-tuning with transformers' Trainer, optionally LoRA: the run that
finetune.py starts once its input is checked.

`finetune`: arguments -> `setup` -> the output folder (locked) -> `fit` (Trainer) ->
`save_folders` -> `push_result`. As in pretrain_run.py, SIGTERM or Ctrl-C ends the step with a
checkpoint and exit 128 + the signal's number.
"""

import contextlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from accelerate import PartialState
from datasets import Dataset
from transformers import Trainer, TrainingArguments, set_seed

import hf_tinytx  # noqa: F401  (registers the "tinytx" model type with the Auto classes)
from hf_tinytx.commands.quiet import quiet_notices
from hf_tinytx.folders.safe import folders_to_create, is_disk_full, mib, remove_created, remove_tree
from hf_tinytx_training import checkpoints
from hf_tinytx_training.cli import program_name
from hf_tinytx_training.data.fingerprint import finetune_data
from hf_tinytx_training.distributed import cluster, cpu_memory, sharding
from hf_tinytx_training.distributed.cpu_threads import set_threads
from hf_tinytx_training.distributed.preemption import Stopped, stop_message, stop_requests
from hf_tinytx_training.errors import RunError, UserInputError
from hf_tinytx_training.model.cpu_training import speed_up_cpu_training
from hf_tinytx_training.pretrain_args import hub_repo_id, write_args_json
from hf_tinytx_training.publish import cards, hub_checkpoint
from hf_tinytx_training.publish.hub import HubPusher, push_final
from hf_tinytx_training.publish.output_dir import (
    claim,
    refuse_links_out,
    release_lock,
    remove_earlier_merge,
    replacing_earlier_files,
)
from hf_tinytx_training.sft import callbacks
from hf_tinytx_training.sft.data import build_examples, pad_collator
from hf_tinytx_training.sft.finetune_args import (
    WRITER,
    FinetuneArguments,
    check_args,
    check_destinations,
    finetune_parser,
    model_source,
    output_dir_flags,
)
from hf_tinytx_training.sft.model import add_lora, check_vocabulary, load_base_model_tokenizer, load_model
from hf_tinytx_training.sft.records import read_records


PROGRAM = program_name("finetune")  # "tinytx finetune" or "finetune.py", as the user started it
STOP = stop_requests(PROGRAM)  # SIGTERM and SIGINT: a checkpoint at the next step's end, then a clean stop
# sft_records' kinds, as the card says
RECORD_KINDS = {"text": "text", "prompt": "prompt/response", "chat": "chat"}


def finetune(argv=None):
    """The run of finetune.py's flags (`argv`, else the command line's), from the data to the push."""
    quiet_notices()
    args, training_args = parse_args(argv)
    where = destinations(args, training_args)
    set_seed(training_args.seed)  # before the LoRA weights are drawn
    if training_args.device.type == "cpu" and training_args.process_index == 0:
        cpu_memory.train_on_cpu("--bf16" if training_args.bf16 else None)
    cluster.check_shared_folder(where.output_dir, training_args.world_size, training_args.process_index == 0)
    tokenizer, model, train_dataset, eval_dataset, facts = setup(args, training_args)
    data = finetune_data(args)
    found = hub_resume_point(training_args, where, model, data)  # checked before anything is written
    lock = claim_output_dir(args, training_args, where)  # held until the model is saved
    pusher = hub_pusher(training_args, where)
    try:
        take_resume_point(training_args, where, found)
        trainer, metrics, threads = fit(model, tokenizer, train_dataset, eval_dataset, training_args, where,
                                        data, pusher)
    except UserInputError:  # a refused resume leaves the folder as it found it
        release_lock(lock, where.output_dir)
        raise
    except RuntimeError as error:  # a collective another process broke (frozen past --ddp_timeout, or gone)
        if STOP.received or not cluster.is_peer_failure(error):
            raise
        message = cluster.lost_peer_message(
            error, training_args.ddp_timeout, "", where.layout.newest(), how=""
        )
        raise RunError(message) from None
    if not trainer.is_world_process_zero():
        return  # under torchrun every process holds the same weights: one writes them, and pushes
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    facts.update(cards.training_facts(args, training_args, trainer, metrics), torch_threads=threads)
    save_folders(trainer.model, tokenizer, args, where, metrics, facts)
    try:
        not_pushed = (
            push_result(args, where, trainer.state.global_step, pusher) if where.pushed_dir else None
        )
    finally:
        # no stale .lock in the finished folder, also when a signal ended the push
        release_lock(lock, where.output_dir)
    if not_pushed:
        raise RunError(not_pushed)  # exit 1, as pretrain.py: a push that was asked for and did not happen


def setup(args: FinetuneArguments, training_args: TrainingArguments):
    """(tokenizer, model, training rows, validation rows or None, facts for the
    cards); the data before the model."""
    train_records = read_records(args.train_file)
    validation_records = read_records(args.validation_file) if args.validation_file else []
    chat = any(record["kind"] == "chat" for record in train_records + validation_records)
    tokenizer = load_base_model_tokenizer(args, chat=chat)
    model = load_model(args)
    check_vocabulary(model, tokenizer, args.model_name_or_path)
    if training_args.device.type == "cpu":
        speed_up_cpu_training(model)
    train_dataset, eval_dataset, max_seq_length = build_datasets(args, tokenizer, model, train_records,
                                                                 validation_records)
    facts = {  # for the model cards
        "num_train_records": len(train_records), "num_train_rows": len(train_dataset),
        "num_validation_records": len(validation_records), "num_validation_rows": len(eval_dataset or []),
        "record_kinds": ", ".join(sorted({RECORD_KINDS[record["kind"]] for record in train_records})),
        "max_seq_length": max_seq_length, "chat": bool(tokenizer.chat_template),
        "train_counts": asdict(train_dataset.counts),  # records cut or dropped, tokens kept
        "validation_counts": asdict(eval_dataset.counts) if eval_dataset is not None else None,
    }
    if args.use_peft:
        model = add_lora(model, tokenizer, args, training_args)
    return tokenizer, model, train_dataset, eval_dataset, facts


def fit(
    model, tokenizer, train_dataset, eval_dataset, training_args: TrainingArguments, where: "Destinations",
    data: dict, pusher: HubPusher | None = None,
):
    """Trainer's run, resumed if asked, then the evaluation: (trainer, metrics, CPU threads or None). `data`
    (data/fingerprint.py) and the threads go into every checkpoint; `pusher` takes each whole to the Hub
    (--hub_strategy checkpoint). A stop signal ends it at a step's end with a checkpoint, as `Stopped`."""
    resume_dir = resume_point(training_args, where, model, data)
    threads = None  # a GPU run keeps torch's count: its threads only feed the GPU
    if training_args.device.type == "cpu":
        threads = set_threads(checkpoints.recorded_threads(resume_dir), training_args.process_index == 0)
    whole = pusher if where.hub_strategy in hub_checkpoint.WHOLE else None
    aside = callbacks.CheckpointsAside(where, resume_dir, data, threads, whole)
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                      data_collator=pad_collator(tokenizer), processing_class=tokenizer, callbacks=[aside])
    trainer.add_callback(callbacks.StopAtStepEnd(trainer.accelerator, STOP))
    STOP.training()  # a signal from now on is honoured at the end of the step under way, with a checkpoint
    with (
        checkpoints.disk_space_guard(where.checkpoint_staging, where.layout),
        checkpoints.refusing_pickles(resume_dir),
    ):
        result = trainer.train(resume_from_checkpoint=resume_dir)
    if trainer.is_world_process_zero():
        with contextlib.suppress(OSError):
            os.rmdir(where.checkpoint_staging)  # empty once every checkpoint has moved in
    stop_if_asked(trainer, aside)
    metrics = dict(result.metrics)
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
        # a signal during the evaluation: the final checkpoint is there, the save waits
        stop_if_asked(trainer, aside)
    return trainer, metrics, threads


def stop_if_asked(trainer: Trainer, aside: callbacks.CheckpointsAside) -> None:
    """`Stopped` if any process got a stop signal and the step reached has its
    checkpoint (else the run goes on)."""
    signum = STOP.asked(trainer.accelerator)
    step = trainer.state.global_step
    if signum is not None and aside.saved is not None and aside.saved[0] == step:
        if trainer.is_world_process_zero():  # its checkpoint, queued whole as it was moved in
            hub_checkpoint.wait_at_stop(aside.pusher, aside.where.hub_stop_timeout, STOP.received, step,
                                        print)
        trainer.accelerator.wait_for_everyone()  # none leaves first: the launcher would end the rest
        raise Stopped(stop_message(PROGRAM, signum, step, trainer.state.max_steps, aside.saved[1]), signum)


@dataclass
class Destinations:
    output_dir: str  # the fine-tuned model or the adapter; Trainer's checkpoints in its checkpoints/
    merged_dir: str  # with --merge
    pushed_dir: str | None  # the folder --push_to_hub uploads (None: no push)
    hub_model_id: str
    checkpoints_dir: str  # checkpoint-N, each complete (CheckpointsAside)
    checkpoint_staging: str  # Trainer's output_dir: where it writes a checkpoint before it is moved in
    # --save_total_limit, applied here: Trainer would only ever see the staging folder
    keep_checkpoints: int | None
    # for HubPusher only: never in TrainingArguments' pickle
    hub_token: str | None = field(default=None, repr=False)
    hub_strategy: str = "every_save"  # Trainer's value; checkpoint, all_checkpoints: pushed whole as saved
    hub_private: bool = False
    hub_stop_timeout: float = 0.0  # at a stop signal, the wait for the stop's checkpoint to reach the Hub

    @property
    def layout(self) -> checkpoints.Layout:
        return checkpoints.Layout(self.checkpoints_dir, callbacks.CHECKPOINT)


def destinations(args: FinetuneArguments, training_args: TrainingArguments) -> Destinations:
    """Where the run writes. Trainer writes into checkpoints/'s staging folder, and is kept from the Hub and
    the token (it pickles its arguments into every checkpoint; the push is ours, after saving)."""
    output_dir, merged_dir = check_destinations(args, training_args)  # links out of either refused there too
    hub_model_id = hub_repo_id(training_args.hub_model_id, training_args.output_dir)
    checkpoints_dir = os.path.join(output_dir, "checkpoints")
    training_args.output_dir = os.path.join(checkpoints_dir, callbacks.CHECKPOINT_STAGING)
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    hub_token, training_args.hub_token = training_args.hub_token, None
    keep, training_args.save_total_limit = training_args.save_total_limit, None
    training_args.enable_jit_checkpoint = False  # StopAtStepEnd saves at a step's end instead, always on
    pushed_dir = (merged_dir if args.merge else output_dir) if push_to_hub else None
    strategy = getattr(training_args.hub_strategy, "value", training_args.hub_strategy)
    # a whole checkpoint holds the run's state: private unless the user says otherwise
    private = training_args.hub_private_repo
    return Destinations(output_dir, merged_dir, pushed_dir, hub_model_id, checkpoints_dir,
                        training_args.output_dir, keep, hub_token, strategy,
                        strategy in hub_checkpoint.WHOLE if private is None else private,
                        args.hub_stop_timeout)


def claim_output_dir(args: FinetuneArguments, training_args: TrainingArguments, where: Destinations):
    """The main process's lock on output_dir, taken once it is asked again, under
    the lock, for an earlier run."""
    if training_args.process_index != 0:
        return None
    lock = claim(where.output_dir, where.checkpoints_dir, args.overwrite_output_dir,
                 recheck=output_dir_flags(args, training_args))
    # a killed save's partial checkpoint (never resumable), or a planted link
    remove_tree(where.checkpoint_staging)
    return lock


def hub_resume_point(training_args: TrainingArguments, where: Destinations, model, data: dict):
    """For --resume_from_checkpoint hub|REPO_ID[@REVISION]: what the main process found (a local folder, a
    downloaded and checked `HubCheckpoint`, or None), on every process; "local" for a local resume."""
    if hub_checkpoint.hub_reference(training_args.resume_from_checkpoint, where.hub_model_id) is None:
        return "local"
    main = SimpleNamespace(is_main_process=training_args.process_index == 0,
                           num_processes=training_args.world_size)
    return cluster.decided_by_main(main, lambda: hub_checkpoint.resume_point(
        training_args.resume_from_checkpoint, where.hub_model_id, where.layout, where.hub_token,
        lambda folder: check_resumable(folder, training_args, model, data), print))


def take_resume_point(training_args: TrainingArguments, where: Destinations, found) -> None:
    """Once the folder is claimed: a checkpoint from the Hub copied into checkpoints/checkpoint-N, and
    --resume_from_checkpoint set to the folder the run resumes from (None: from scratch)."""
    if found == "local":
        return
    if isinstance(found, hub_checkpoint.HubCheckpoint):
        if training_args.process_index == 0:
            hub_checkpoint.keep_locally(found, where.layout.path(found.step))
        found = where.layout.path(found.step)
    training_args.resume_from_checkpoint = found
    PartialState().wait_for_everyone()


def hub_pusher(training_args: TrainingArguments, where: Destinations) -> HubPusher | None:
    """The main process's uploader, when the run pushes (None otherwise)."""
    if not where.pushed_dir or training_args.process_index != 0:
        return None
    return HubPusher(where.hub_model_id, token=where.hub_token, private=where.hub_private)


def resume_point(training_args: TrainingArguments, where: Destinations, model, data: dict) -> str | None:
    """The checkpoint --resume_from_checkpoint names (a folder, or latest), checked against this run's model,
    optimizer flags and data; those newer than it are set aside."""
    if not training_args.resume_from_checkpoint:
        return None
    main_process = training_args.process_index == 0
    say = print if main_process else (lambda *_: None)
    with training_args.main_process_first(desc="finding the checkpoint to resume"):  # one process renames
        folder = checkpoints.find_resumable(training_args.resume_from_checkpoint, where.layout, say)
        if folder is None:
            say(f"No intact checkpoint in {where.checkpoints_dir} yet: starting from scratch.")
            return None
        step = checkpoints.read_json(os.path.join(folder, checkpoints.STATE_FILE))["global_step"]
        check_resumable(folder, training_args, model, data)
        if main_process:
            checkpoints.set_aside_after(where.layout, step, say)
    say(f"Resuming from {folder} at step {step}")
    return folder


def check_resumable(folder: str, training_args: TrainingArguments, model, data: dict) -> None:
    """The rules a resume keeps: the optimizer flags, the kind and shapes of the model, the data."""
    path = os.path.join(folder, callbacks.OPTIMIZER_FLAGS_FILE)
    if os.path.isfile(path):
        checkpoints.refuse_optimizer_change(
            folder, checkpoints.read_json(path), callbacks.optimizer_flags(training_args),
            callbacks.OPTIMIZER_FLAGS, "fine-tune its model anew with the new ones from --model_name_or_path",
        )
    refuse_model_change(folder, model)
    checkpoints.refuse_data_change(folder, data, NEW_RUN)


NEW_RUN = "or fine-tune anew (another --output_dir, or --overwrite_output_dir)"
LORA_FLAGS = {"r": "--lora_r", "lora_alpha": "--lora_alpha", "lora_dropout": "--lora_dropout",
              "target_modules": "--lora_target_modules", "base_model_name_or_path": "--model_name_or_path",
              "trainable_token_indices": "the token ids of --lora_trainable_tokens"}


def refuse_model_change(folder: str, model) -> None:
    """A checkpoint resumes only into the same kind (LoRA adapter or full weights), the same
    adapter flags or a model of the same shapes: Trainer would fail mid-load, or train an adapter
    the run's record does not describe."""
    saved_adapter = os.path.join(folder, "adapter_config.json")
    lora = getattr(model, "peft_config", {}).get("default")
    if os.path.isfile(saved_adapter) and lora is None:
        raise UserInputError(
            f"{folder} holds a LoRA adapter, but this run fine-tunes every weight: resume with --use_peft "
            f"and the LoRA flags it was started with, {NEW_RUN}."
        )
    if lora is not None and not os.path.isfile(saved_adapter):
        raise UserInputError(f"{folder} holds a full fine-tune's weights, but this run trains a LoRA adapter "
                             f"(--use_peft): resume without --use_peft, {NEW_RUN}.")
    if lora is None:
        checkpoints.refuse_architecture_change(
            folder, model.config, f"resume with the --model_name_or_path it started from, {NEW_RUN}")
        return
    saved = checkpoints.read_json(saved_adapter)
    pairs = [(flag, comparable(saved.get(key)), comparable(getattr(lora, key, None)))
             for key, flag in LORA_FLAGS.items()]
    if changed := [(flag, old, new) for flag, old, new in pairs if old != new]:
        was = ", ".join(f"{flag} {old}" for flag, old, _ in changed)
        raise UserInputError(f"{folder} holds a LoRA adapter trained with {was}, but this run has "
                             f"{', '.join(f'{flag} {new}' for flag, _, new in changed)}: resume with {was}, "
                             f"{NEW_RUN}.")


def comparable(value):
    """A PEFT config value as saved and as built alike: module names (or token ids) as one sorted,
    comma-separated string."""
    if isinstance(value, dict):  # trainable_token_indices by embedding name: {"embed_tokens": [ids]}
        return "; ".join(f"{name} {comparable(ids)}" for name, ids in sorted(value.items()))
    return ",".join(sorted(map(str, value))) if isinstance(value, (list, set, tuple)) else value


def save_folders(
    model, tokenizer, args: FinetuneArguments, where: Destinations, metrics: dict, facts: dict
) -> None:
    """The model (or adapter) folder, then with --merge the merged one, each
    published through a staging folder."""
    with saving_into(where.output_dir, model, where) as staged:
        model.save_pretrained(staged)  # PEFT writes a placeholder README.md, which write_card replaces
        tokenizer.save_pretrained(staged)
        write_args_json(staged / "finetune_args.json", args, {"max_seq_length": facts["max_seq_length"],
                                                              "torch_threads": facts["torch_threads"]})
        checkpoints.write_json(staged / "finetune_metrics.json", metrics, indent=2)
        cards.write_card(where.output_dir, staged, "adapter" if args.use_peft else "full", facts, where)
    print(f"{'LoRA adapter' if args.use_peft else 'Model'} saved to {where.output_dir}")

    if args.merge:
        merged = model.merge_and_unload()  # W + (alpha/r) * B @ A, in place: a plain transformers model again
        with saving_into(where.merged_dir, merged, where, saved=where.output_dir) as staged:
            merged.save_pretrained(staged)  # a TinyTx also gets its code files and auto_map here
            tokenizer.save_pretrained(staged)
            cards.write_card(where.merged_dir, staged, "merged", facts, where)
        print(f"Merged model saved to {where.merged_dir}")
    # an earlier run's merged/ is part of the folder
    elif os.path.dirname(where.merged_dir) == where.output_dir:
        remove_earlier_merge(where.merged_dir, WRITER)


@contextlib.contextmanager
def saving_into(folder: str, model, where: Destinations, saved: str | None = None):
    """`replacing_earlier_files(folder)`; on a full disk, the folders it created are removed and one line
    names the space needed. `saved`: the folder this run saved already (the adapter)."""
    created = folders_to_create(folder)
    try:
        with replacing_earlier_files(folder, WRITER) as staged:
            yield staged
    except Exception as error:
        full = is_disk_full(error, folder)
        remove_created(created)
        if not full:
            raise
        needed = sum(p.numel() * p.element_size() for p in model.parameters())
        existing = next(path for path in (folder, *map(str, Path(folder).parents)) if os.path.exists(path))
        free = shutil.disk_usage(existing).free
        newest = where.layout.newest()
        if saved:
            kept = f"the LoRA adapter in {saved} is saved; rerun with --overwrite_output_dir"
        elif newest:
            name = os.path.basename(newest)
            kept = f"the checkpoint {name} is intact: rerun with --resume_from_checkpoint latest"
        else:
            kept = "rerun the same command"
        raise RunError(
            f"No space left on the device while saving {folder} (about {mib(needed)} needed, {mib(free)} "
            "free); the partial save was removed: free some space there, or point "
            f"{'--merged_output_dir' if saved else '--output_dir'} at another disk, and {kept}."
        ) from None


def build_datasets(args, tokenizer, model, train_records, validation_records):
    """(training rows, validation rows or None, row length), the length checked
    against the model's context."""
    context = getattr(model.config, "max_position_embeddings", None) or 1024
    max_seq_length = args.max_seq_length or min(1024, context)
    if max_seq_length > context:
        raise UserInputError(
            f"--max_seq_length {max_seq_length} exceeds the model's context ({context} tokens)."
        )
    train_dataset = to_dataset(train_records, tokenizer, max_seq_length, args.packing, args.train_file)
    eval_dataset = (
        to_dataset(validation_records, tokenizer, max_seq_length, args.packing, args.validation_file)
        if validation_records
        else None
    )
    rows = f"{len(train_dataset)} training rows" + (
        f", {len(eval_dataset)} validation rows" if eval_dataset else ""
    )
    print(f"{rows} of at most {max_seq_length} tokens ({'packed' if args.packing else 'padded'})")
    return train_dataset, eval_dataset, max_seq_length


def push_result(args, where: Destinations, steps: int, pusher: HubPusher) -> str | None:
    """The upload at the end, after the checkpoints queued: the merged model with --merge, else output_dir's
    files without its sub-folders and hidden files (the .lock). None once pushed, else the line to end the
    run with."""
    what = "merged model" if args.merge else ("LoRA adapter" if args.use_peft else "model")
    names = [
        name for name in refuse_links_out(where.pushed_dir) if os.sep not in name and not name.startswith(".")
    ]
    return push_final(
        pusher, where.pushed_dir, names, f"Fine-tuned {what} ({steps} steps)", what, args.hub_timeout,
        exclude=("*/*", ".*"), stop=STOP,
    )


def parse_args(argv) -> tuple[FinetuneArguments, TrainingArguments]:
    defaults = {}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not sharding.has_gpu():
        # Without it Trainer runs each process of a CPU launch as a run of its own,
        # all writing the same folder.
        defaults["use_cpu"] = True
        cluster.start_cpu_group(argv)  # before TrainingArguments starts the group, without the timeout
    if not sharding.has_gpu():
        defaults["dataloader_pin_memory"] = False  # pinning needs an accelerator: torch warns at every loader
    parser = finetune_parser(TrainingArguments, **defaults)
    args, training_args = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    check_args(args, training_args)
    args.model_name_or_path = model_source(args.model_name_or_path)  # a local base as an absolute path
    return args, training_args


def to_dataset(records, tokenizer, max_seq_length: int, packing: bool, path: str) -> Dataset:
    """The rows, with `.counts` for the card; what was cut or dropped is said on the console."""
    examples = build_examples(records, tokenizer, max_seq_length, packing)
    if not examples:
        raise UserInputError(
            f"No example in {path} keeps a token to learn within --max_seq_length {max_seq_length} (the "
            "prompts fill the whole row); raise --max_seq_length or shorten the prompts."
        )
    if summary := examples.counts.summary(path, max_seq_length, packing):
        print(summary)
    return examples
