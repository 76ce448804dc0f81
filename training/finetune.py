"""Supervised fine-tuning of a causal LM checkpoint (TinyTx or any other) with
transformers' Trainer, optionally LoRA.

    python training/finetune.py --model_name_or_path out/tinytx --train_file data/sft.jsonl --output_dir
    out/sft python training/finetune.py --model_name_or_path out/tinytx --train_file data/chat.jsonl \
        --output_dir out/sft-lora --use_peft --merge --learning_rate 1e-3

Every `TrainingArguments` flag works too. output_dir/ gets the model (or LoRA adapter), tokenizer, card and
arguments; output_dir/checkpoints/ Trainer's checkpoint-N, each renamed into place whole;
output_dir/merged/ with --merge, base and adapter folded into plain weights. --push_to_hub uploads once, at
the end: the merged folder, else output_dir.

The flags, the model folder and the data files are checked first, in about a second; then torch loads
and sft/finetune_run.py trains. As with pretrain.py, SIGTERM or Ctrl-C ends the step with a
checkpoint and exit 128 + the signal's number.
"""

from hf_tinytx_training.cli import run_script


def main(argv: list[str] | None = None) -> None:
    """The input checked, then the run. Both imports wait for the stop signals' handlers (`run_script`)."""
    from hf_tinytx_training.sft.finetune_args import preflight

    preflight(argv)
    from hf_tinytx_training.sft.finetune_run import finetune  # torch, datasets, Trainer

    finetune(argv)


if __name__ == "__main__":
    run_script("finetune", main)
