"""Supervised fine-tuning of a causal LM checkpoint (TinyTx or any other) with transformers' Trainer, optionally LoRA.

    # full fine-tuning on prompt/response records
    python training/finetune.py --model_name_or_path out/tinytx --train_file data/sft.jsonl --output_dir out/sft

    # LoRA through PEFT, then also export a merged, adapter-free model folder to out/sft-lora/merged
    python training/finetune.py --model_name_or_path out/tinytx --train_file data/chat.jsonl \
        --output_dir out/sft-lora --use_peft --merge --learning_rate 1e-3

Every `TrainingArguments` flag works too (--num_train_epochs, --max_steps, --per_device_train_batch_size, ...).
--push_to_hub uploads once, at the end: the merged folder with --merge, else output_dir without its sub-folders.

What ends up where:
    output_dir/              the fine-tuned model (full) or the LoRA adapter, plus the tokenizer: load it from here;
                             README.md is its model card (training/cards.py), finetune_*.json the arguments and metrics
    output_dir/checkpoints/  Trainer's resumable checkpoints (--save_strategy, --resume_from_checkpoint)
    output_dir/merged/       with --merge: base model + adapter folded into plain weights (safetensors), with a card

An adapter records its base as an absolute folder (or the Hub id), so it loads from any working directory.

Reads top to bottom: arguments -> data (checked before anything loads) -> tokenizer and model -> LoRA -> Trainer
-> save -> merge -> Hub.
"""

import contextlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass


if __package__ in (None, ""):  # run as `python training/finetune.py`: import `training` from the checkout
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from training.args import UserInputError, build_parser
from training.finetune_args import FinetuneArguments, check_args, hub_repo_id, model_source, preflight
from training.sft_records import has_chat, read_records


if __name__ == "__main__":
    # Flags, model folder and data first, before torch and transformers load (~8 s on a small CPU): bad input is
    # refused at once. main() checks them again with Trainer's flags parsed too, and reads the data files again
    # (a second's work for a file of ~100k records, small next to fine-tuning on them).
    try:
        preflight()
    except UserInputError as early_error:
        sys.stderr.write(f"finetune.py: error: {early_error}\n")
        sys.exit(2)

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, set_seed

import hf_tinytx  # noqa: F401  (registers the "tinytx" model type with the Auto classes)
from hf_tinytx.folders import UnsafeLinkError, link_or_copy, regular_files, writing_into
from training import cards, cpu_memory, distributed
from training.hub import HubPusher
from training.sft_data import build_examples, ensure_chat_template, pad_collator


RECORD_KINDS = {"text": "text", "prompt": "prompt/response", "chat": "chat"}  # sft_records' kinds, as the card says


def main(argv=None):
    # ---------------------------------------------------------------- arguments
    args, training_args = parse_args(argv)
    where = destinations(args, training_args)
    set_seed(training_args.seed)  # before the LoRA weights are drawn
    if training_args.device.type == "cpu" and training_args.process_index == 0:
        if cpu_memory.keep_freed_memory():
            print(cpu_memory.ANNOUNCEMENT)  # no page faults for the same activations every step
        if training_args.bf16 and not distributed.cpu_runs_bf16_fast():
            print(distributed.slow_bf16("--bf16"))

    # ---------------------------------------------------------------- data (read and checked before any model loads)
    train_records = read_records(args.train_file)
    validation_records = read_records(args.validation_file) if args.validation_file else []

    # ---------------------------------------------------------------- tokenizer and model
    tokenizer = load_tokenizer(args, chat=has_chat(train_records + validation_records))
    model = load_model(args)
    train_dataset, eval_dataset, max_seq_length = build_datasets(args, tokenizer, model, train_records,
                                                                 validation_records)
    facts = {  # for the model cards
        "num_train_records": len(train_records), "num_train_rows": len(train_dataset),
        "num_validation_records": len(validation_records), "num_validation_rows": len(eval_dataset or []),
        "record_kinds": ", ".join(sorted({RECORD_KINDS[record["kind"]] for record in train_records})),
        "max_seq_length": max_seq_length, "chat": bool(tokenizer.chat_template),
    }

    # ---------------------------------------------------------------- LoRA
    if args.use_peft:
        model = add_lora(model, args, training_args)

    # ---------------------------------------------------------------- training
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=pad_collator(tokenizer),
        processing_class=tokenizer,
    )
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    metrics = dict(result.metrics)
    if eval_dataset is not None:
        metrics.update(trainer.evaluate())
    if not trainer.is_world_process_zero():
        return  # under torchrun every process holds the same weights: one writes them, and pushes
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    facts.update(training_facts(args, training_args, trainer, metrics))

    # ---------------------------------------------------------------- save, merge, Hub
    save_folders(trainer.model, tokenizer, args, where, metrics, facts)
    if where.pushed_dir and not push_result(args, training_args, where, trainer.state.global_step):
        raise PushFailed


@dataclass
class Destinations:
    output_dir: str  # the fine-tuned model or the adapter; Trainer's checkpoints in its checkpoints/
    merged_dir: str  # with --merge
    pushed_dir: str | None  # the folder --push_to_hub uploads (None: no push)
    hub_model_id: str


def destinations(args: FinetuneArguments, training_args: TrainingArguments) -> Destinations:
    """Where the run writes, checked for links out; Trainer is pointed at checkpoints/ and kept from the Hub."""
    output_dir = os.path.abspath(training_args.output_dir)
    merged_dir = os.path.abspath(args.merged_output_dir or os.path.join(output_dir, "merged"))
    for folder in (output_dir, merged_dir):
        if os.path.isdir(folder):
            refuse_links_out(folder)  # saving would write through such a link, and the push would read it
    # The Hub push is ours (HubPusher, after saving), so Trainer must not create or push a repo of its own.
    hub_model_id = hub_repo_id(training_args)
    training_args.output_dir = os.path.join(output_dir, "checkpoints")
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    pushed_dir = (merged_dir if args.merge else output_dir) if push_to_hub else None
    return Destinations(output_dir, merged_dir, pushed_dir, hub_model_id)


def save_folders(model, tokenizer, args: FinetuneArguments, where: Destinations, metrics: dict, facts: dict) -> None:
    """The model (or adapter) folder, then with --merge the merged one (safetensors). Each is written into a staging
    folder inside it and then moved in (hf_tinytx.folders.writing_into): a run killed while saving leaves the folder's
    previous model whole, never a new config beside half-written weights."""
    with writing_into(where.output_dir) as staged:
        model.save_pretrained(staged)  # PEFT writes a placeholder README.md, which write_card replaces
        tokenizer.save_pretrained(staged)
        write_json(staged / "finetune_args.json", {**vars(args), "max_seq_length": facts["max_seq_length"]})
        write_json(staged / "finetune_metrics.json", metrics)
        write_card(where.output_dir, staged, "adapter" if args.use_peft else "full", facts, where)
    print(f"{'LoRA adapter' if args.use_peft else 'Model'} saved to {where.output_dir}")

    if args.merge:
        merged = model.merge_and_unload()  # W + (alpha/r) * B @ A, in place: a plain transformers model again
        with writing_into(where.merged_dir) as staged:
            merged.save_pretrained(staged)  # a TinyTx also gets its code files and auto_map here
            tokenizer.save_pretrained(staged)
            write_card(where.merged_dir, staged, "merged", facts, where)
        print(f"Merged model saved to {where.merged_dir}")


def build_datasets(args, tokenizer, model, train_records, validation_records):
    """(training rows, validation rows or None, row length), the length checked against the model's context."""
    context = getattr(model.config, "max_position_embeddings", None) or 1024
    max_seq_length = args.max_seq_length or min(1024, context)
    if max_seq_length > context:
        raise UserInputError(f"--max_seq_length {max_seq_length} exceeds the model's context ({context} tokens).")
    train_dataset = to_dataset(train_records, tokenizer, max_seq_length, args.packing, args.train_file)
    eval_dataset = to_dataset(validation_records, tokenizer, max_seq_length, args.packing, args.validation_file) \
        if validation_records else None
    rows = f"{len(train_dataset)} training rows" + (f", {len(eval_dataset)} validation rows" if eval_dataset else "")
    print(f"{rows} of at most {max_seq_length} tokens ({'packed' if args.packing else 'padded'})")
    return train_dataset, eval_dataset, max_seq_length


def push_result(args, training_args, where: Destinations, steps: int) -> bool:
    """One upload at the end: the merged model with --merge, else output_dir without its sub-folders."""
    hub_model_id = where.hub_model_id
    pusher = HubPusher(hub_model_id, token=training_args.hub_token, private=bool(training_args.hub_private_repo))
    what = "merged model" if args.merge else ("LoRA adapter" if args.use_peft else "model")
    with final_files_only(where.pushed_dir) as folder:
        pushed = pusher.push(folder, f"Fine-tuned {what} ({steps} steps)", timeout=args.hub_timeout)
    for failure in pusher.failures:
        print(failure, file=sys.stderr)
    print(f"Pushed the {what} to the Hub as {hub_model_id}" if pushed
          else f"The {what} was not pushed to the Hub (see above); the local folders are complete.")
    return pushed


def parse_args(argv) -> tuple[FinetuneArguments, TrainingArguments]:
    defaults = {"logging_steps": 10, "report_to": "none", "save_total_limit": 2}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not distributed.has_gpu():
        # Without it Trainer runs each process of a CPU launch as a run of its own, all writing the same folder.
        defaults["use_cpu"] = True
    parser = build_parser((FinetuneArguments, TrainingArguments), **defaults)
    args, training_args = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    check_args(args, training_args)
    args.model_name_or_path = model_source(args.model_name_or_path)  # a local base as an absolute path
    return args, training_args


def to_dataset(records, tokenizer, max_seq_length: int, packing: bool, path: str) -> Dataset:
    examples = build_examples(records, tokenizer, max_seq_length, packing)
    if not examples:
        raise UserInputError(
            f"No example in {path} keeps a token to learn within --max_seq_length {max_seq_length} (the prompts "
            f"fill the whole row); raise --max_seq_length or shorten the prompts."
        )
    return Dataset.from_list(examples)


def load_tokenizer(args: FinetuneArguments, chat: bool):
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserInputError("The tokenizer has neither a pad nor an EOS token; give it a pad token first.")
        tokenizer.pad_token = tokenizer.eos_token  # padding positions carry label -100, so its id never matters
    if chat and ensure_chat_template(tokenizer):
        print("The tokenizer had no chat template: added the default one (saved with the model).")
    return tokenizer


def load_model(args: FinetuneArguments):
    model_options = {"trust_remote_code": args.trust_remote_code}
    if args.attn_implementation:
        model_options["attn_implementation"] = args.attn_implementation
    return AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **model_options)


def add_lora(model, args: FinetuneArguments, training_args: TrainingArguments):
    from peft import LoraConfig, get_peft_model

    if training_args.gradient_checkpointing or training_args.activation_checkpointing:
        model.enable_input_require_grads()  # a frozen embedding gives checkpointed layers no grad to pass on
    lora_config = LoraConfig(
        task_type="CAUSAL_LM",
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=lora_targets(model, args.lora_target_modules),
    )
    # PEFT records the base as the model's name_or_path: the Hub id, or the absolute folder from model_source, so
    # the adapter loads from any working directory.
    model = get_peft_model(model, lora_config)
    model.print_trainable_parameters()
    return model


def lora_targets(model, requested: str):
    """The requested module names the model has (a plain-MLP TinyTx has no gate_proj), or "all-linear"."""
    if requested.strip() == "all-linear":
        return "all-linear"
    names = [name.strip() for name in requested.split(",") if name.strip()]
    linear = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    present = [name for name in names if name in linear]
    if not present:
        raise UserInputError(
            f"None of --lora_target_modules {names} is a linear layer of this model; its linear layers are "
            f"{sorted(linear)} (or pass all-linear)."
        )
    skipped = sorted(set(names) - set(present))
    if skipped:
        print(f"LoRA: the model has no {skipped}; adapting {present}.")
    return present


@contextlib.contextmanager
def final_files_only(folder: str):
    """The folder's files without its sub-folders (checkpoints, merged), hard-linked into a temporary sibling."""
    top_level = [name for name in refuse_links_out(folder) if os.sep not in name]
    parent, name = os.path.split(os.path.abspath(folder))
    staged = tempfile.mkdtemp(prefix=f".{name}-push-", dir=parent)
    try:
        link_or_copy(folder, staged, top_level)
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def training_facts(args: FinetuneArguments, training_args: TrainingArguments, trainer: Trainer, metrics) -> dict:
    """What the model cards report about the run, read before a merge changes the model."""
    model = trainer.model
    logged = [row for row in trainer.state.log_history if "loss" in row]  # every --logging_steps steps
    lora = None
    if args.use_peft:
        config = model.peft_config["default"]
        targets = config.target_modules  # a set of names, or "all-linear"
        lora = {"r": config.r, "alpha": config.lora_alpha, "dropout": config.lora_dropout,
                "target_modules": targets if isinstance(targets, str) else ", ".join(sorted(targets))}
    return {
        "base_model": args.model_name_or_path, "base_is_hub": not os.path.isdir(args.model_name_or_path),
        "model_type": model.config.model_type, "tinytx": model.config.model_type == "tinytx",
        "trust_remote_code": args.trust_remote_code,
        "train_file": args.train_file, "validation_file": args.validation_file, "packing": args.packing,
        "steps": trainer.state.global_step, "epochs": trainer.state.epoch or 0.0,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "num_devices": training_args.world_size, "learning_rate": training_args.learning_rate,
        "lr_scheduler_type": getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type),
        "warmup_steps": training_args.warmup_steps, "seed": training_args.seed,
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "train_loss": metrics["train_loss"], "eval_loss": metrics.get("eval_loss"),
        "last_logged_step": logged[-1]["step"] if logged else None,
        "last_logged_loss": logged[-1]["loss"] if logged else None,
        "lora": lora,
    }


def write_card(folder: str, staged, kind: str, facts: dict, where: Destinations) -> None:
    """README.md of a saved folder, written into its staging folder; the folder that goes to the Hub is named (and
    loaded) by its repo id."""
    pushed = folder == where.pushed_dir
    context = {**facts, "kind": kind, "load_from": where.hub_model_id if pushed else folder,
               "model_name": where.hub_model_id if pushed else os.path.basename(folder)}
    cards.finetuned_card(context).save(os.path.join(staged, "README.md"))


def refuse_links_out(folder: str) -> list[str]:
    """The folder's files (`regular_files`); a link in it that leads out of it is a one-line error."""
    try:
        return regular_files(folder)
    except UnsafeLinkError as error:
        raise UserInputError(str(error)) from None


def write_json(path: str | os.PathLike, values: dict) -> None:
    values = {k: v for k, v in values.items() if k != "hub_token"}  # a Hub token must never reach a file
    with open(path, "w", encoding="utf-8") as f:
        json.dump(values, f, indent=2, sort_keys=True, default=str)


class PushFailed(Exception):
    """The upload failed after everything was saved locally (push_result said why)."""


if __name__ == "__main__":
    try:
        main()
    except UserInputError as error:
        print(f"finetune.py: error: {error}", file=sys.stderr)
        sys.exit(2)
    except PushFailed:
        distributed.exit_launched_process(code=1)
        sys.exit(1)
    distributed.exit_launched_process()
