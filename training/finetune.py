"""Supervised fine-tuning of a causal LM checkpoint (TinyTx or any other) with transformers' Trainer, optionally LoRA.

    # full fine-tuning on prompt/response records
    python training/finetune.py --model_name_or_path out/tinytx --train_file data/sft.jsonl --output_dir out/sft

    # LoRA through PEFT, then also export a merged, adapter-free model folder to out/sft-lora/merged
    python training/finetune.py --model_name_or_path out/tinytx --train_file data/chat.jsonl \
        --output_dir out/sft-lora --use_peft --merge --learning_rate 1e-3

Every `TrainingArguments` flag works too (--num_train_epochs, --max_steps, --per_device_train_batch_size, ...).
--push_to_hub uploads once, at the end: the merged folder with --merge, else output_dir without its sub-folders.

What ends up where:
    output_dir/              the fine-tuned model (full) or the LoRA adapter, plus the tokenizer: load it from here
    output_dir/checkpoints/  Trainer's resumable checkpoints (--save_strategy, --resume_from_checkpoint)
    output_dir/merged/       with --merge: base model + adapter folded into plain weights (safetensors)

Reads top to bottom: arguments -> data (checked before anything loads) -> tokenizer and model -> LoRA -> Trainer
-> save -> merge -> Hub.
"""

import contextlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field


if __package__ in (None, ""):  # run as `python training/finetune.py`: import `training` from the checkout
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, set_seed

import hf_tinytx  # noqa: F401  (registers the "tinytx" model type with the Auto classes)
from hf_tinytx.folders import link_or_copy, regular_files
from training.args import UserInputError, build_parser
from training.hub import HubPusher
from training.sft_data import build_examples, ensure_chat_template, has_chat, pad_collator, read_records


LLAMA_LINEAR_NAMES = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@dataclass
class FinetuneArguments:
    model_name_or_path: str = field(metadata={"help": "The model to fine-tune: a saved model folder or a Hub id."})
    train_file: str = field(
        metadata={"help": ".jsonl of {prompt, response} or {messages} records, or .txt with one document per line."}
    )
    validation_file: str | None = field(default=None, metadata={"help": "Held-out data in the same format."})
    max_seq_length: int | None = field(
        default=None, metadata={"help": "Longest training row in tokens. Default: min(1024, the model's context)."}
    )
    packing: bool = field(
        default=False, metadata={"help": "Pack examples end to end into full rows instead of padding each one."}
    )
    use_peft: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of every weight."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator (the update is scaled by alpha/r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: str = field(
        default=LLAMA_LINEAR_NAMES,
        metadata={"help": "Comma-separated module names to adapt (those the model lacks are skipped), or all-linear."},
    )
    merge: bool = field(
        default=False, metadata={"help": "With --use_peft: also save base + adapter merged into one model folder."}
    )
    merged_output_dir: str | None = field(
        default=None, metadata={"help": "Where --merge writes; default output_dir/merged."}
    )
    attn_implementation: str | None = field(default=None, metadata={"help": "eager, sdpa, ...; default: the model's."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow a checkpoint's own code (models transformers does not know)."}
    )


def main(argv=None):
    # ---------------------------------------------------------------- arguments
    defaults = {"logging_steps": 10, "report_to": "none", "save_total_limit": 2}
    parser = build_parser((FinetuneArguments, TrainingArguments), **defaults)
    args, training_args = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    check_args(args, training_args)
    output_dir = os.path.abspath(training_args.output_dir)
    # The final model goes to output_dir, Trainer's checkpoints below it. The Hub push is ours (HubPusher, after
    # saving), so Trainer must not create or push a repo of its own.
    training_args.output_dir = os.path.join(output_dir, "checkpoints")
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    hub_model_id = training_args.hub_model_id or os.path.basename(output_dir)
    set_seed(training_args.seed)  # before the LoRA weights are drawn

    # ---------------------------------------------------------------- data (read and checked before any model loads)
    train_records = read_records(args.train_file)
    validation_records = read_records(args.validation_file) if args.validation_file else None

    # ---------------------------------------------------------------- tokenizer and model
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserInputError("The tokenizer has neither a pad nor an EOS token; give it a pad token first.")
        tokenizer.pad_token = tokenizer.eos_token  # padding positions carry label -100, so its id never matters
    if has_chat(train_records + (validation_records or [])) and ensure_chat_template(tokenizer):
        print("The tokenizer had no chat template: added the default one (saved with the model).")

    model_options = {"trust_remote_code": args.trust_remote_code}
    if args.attn_implementation:
        model_options["attn_implementation"] = args.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, **model_options)
    context = getattr(model.config, "max_position_embeddings", None) or 1024
    max_seq_length = args.max_seq_length or min(1024, context)
    if max_seq_length > context:
        raise UserInputError(f"--max_seq_length {max_seq_length} exceeds the model's context ({context} tokens).")

    train_dataset = to_dataset(train_records, tokenizer, max_seq_length, args.packing, args.train_file)
    eval_dataset = to_dataset(validation_records, tokenizer, max_seq_length, args.packing, args.validation_file) \
        if validation_records else None
    rows = f"{len(train_dataset)} training rows" + (f", {len(eval_dataset)} validation rows" if eval_dataset else "")
    print(f"{rows} of at most {max_seq_length} tokens ({'packed' if args.packing else 'padded'})")

    # ---------------------------------------------------------------- LoRA
    if args.use_peft:
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
        model = get_peft_model(model, lora_config)
        model.print_trainable_parameters()

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
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))

    # ---------------------------------------------------------------- save (safetensors; an adapter with --use_peft)
    model = trainer.model
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    write_json(os.path.join(output_dir, "finetune_args.json"), {**vars(args), "max_seq_length": max_seq_length})
    write_json(os.path.join(output_dir, "finetune_metrics.json"), metrics)
    print(f"{'LoRA adapter' if args.use_peft else 'Model'} saved to {output_dir}")

    push_folder = None
    if args.merge:
        merged_dir = os.path.abspath(args.merged_output_dir or os.path.join(output_dir, "merged"))
        merged = model.merge_and_unload()  # W + (alpha/r) * B @ A, in place: a plain transformers model again
        merged.save_pretrained(merged_dir)  # a TinyTx also gets its code files and auto_map here
        tokenizer.save_pretrained(merged_dir)
        print(f"Merged model saved to {merged_dir}")
        push_folder = merged_dir

    # ---------------------------------------------------------------- Hub
    if push_to_hub:
        pusher = HubPusher(hub_model_id, token=training_args.hub_token, private=bool(training_args.hub_private_repo))
        what = "merged model" if push_folder else ("LoRA adapter" if args.use_peft else "model")
        with final_files_only(push_folder or output_dir) as folder:
            pushed = pusher.push(folder, f"Fine-tuned {what} ({trainer.state.global_step} steps)")
        print(f"Pushed the {what} to the Hub as {hub_model_id}" if pushed
              else "Hub push failed (see above); the local folders are complete.")
        if not pushed:
            sys.exit(1)


def check_args(args: FinetuneArguments, training_args: TrainingArguments) -> None:
    if args.merge and not args.use_peft:
        raise UserInputError("--merge folds a LoRA adapter into the model, so it needs --use_peft.")
    if args.max_seq_length is not None and args.max_seq_length < 2:
        raise UserInputError(f"--max_seq_length must be at least 2 tokens, got {args.max_seq_length}.")
    if args.lora_r <= 0:
        raise UserInputError(f"--lora_r must be a positive rank, got {args.lora_r}.")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise UserInputError(f"--lora_dropout must lie in [0, 1), got {args.lora_dropout}.")


def to_dataset(records, tokenizer, max_seq_length: int, packing: bool, path: str) -> Dataset:
    examples = build_examples(records, tokenizer, max_seq_length, packing)
    if not examples:
        raise UserInputError(
            f"No example in {path} keeps a token to learn within --max_seq_length {max_seq_length} (the prompts "
            f"fill the whole row); raise --max_seq_length or shorten the prompts."
        )
    return Dataset.from_list(examples)


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
    top_level = [name for name in regular_files(folder) if os.sep not in name]  # refuses links out of the folder
    parent, name = os.path.split(os.path.abspath(folder))
    staged = tempfile.mkdtemp(prefix=f".{name}-push-", dir=parent)
    try:
        link_or_copy(folder, staged, top_level)
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def write_json(path: str, values: dict) -> None:
    values = {k: v for k, v in values.items() if k != "hub_token"}  # a Hub token must never reach a file
    with open(path, "w", encoding="utf-8") as f:
        json.dump(values, f, indent=2, sort_keys=True, default=str)


if __name__ == "__main__":
    try:
        main()
    except UserInputError as error:
        print(f"finetune.py: error: {error}", file=sys.stderr)
        sys.exit(2)
