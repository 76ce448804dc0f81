"""The model finetune trains: the base model and its tokenizer, checked against
each other, and its LoRA adapter."""

import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.sft.data import ensure_chat_template
from hf_tinytx_training.sft.finetune_args import FinetuneArguments


def load_base_model_tokenizer(args: FinetuneArguments, chat: bool):
    """The tokenizer saved with --model_name_or_path, with a pad token, and with
    chat records a chat template."""
    tokenizer = AutoTokenizer.from_pretrained(
        args.model_name_or_path, trust_remote_code=args.trust_remote_code
    )
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserInputError(
                "The tokenizer has neither a pad nor an EOS token; give it a pad token first."
            )
        # padding positions carry label -100, so its id never matters
        tokenizer.pad_token = tokenizer.eos_token
    if chat and ensure_chat_template(tokenizer):
        print("The tokenizer had no chat template: added the default one (saved with the model).")
    return tokenizer


def load_model(args: FinetuneArguments):
    options = {"attn_implementation": args.attn_implementation} if args.attn_implementation else {}
    return AutoModelForCausalLM.from_pretrained(
        args.model_name_or_path, trust_remote_code=args.trust_remote_code, **options
    )


def check_vocabulary(model, tokenizer, name: str) -> None:
    """A tokenizer with ids past the model's embedding would fail inside the first step: refused now."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise UserInputError(
            f"--model_name_or_path {name!r}: the tokenizer has {len(tokenizer)} tokens but the model's "
            f"embedding only {rows} rows; save the tokenizer the model was trained with into the folder, or "
            "grow the model first (model.resize_token_embeddings(len(tokenizer)); "
            "model.save_pretrained(folder))."
        )


def add_lora(model, tokenizer, args: FinetuneArguments, training_args: TrainingArguments):
    from peft import LoraConfig, get_peft_model

    if training_args.gradient_checkpointing or training_args.activation_checkpointing:
        model.enable_input_require_grads()  # a frozen embedding gives checkpointed layers no grad to pass on
    targets = lora_targets(model, args.lora_target_modules)
    tokens = trainable_tokens(tokenizer, args.lora_trainable_tokens)
    lora_config = LoraConfig(task_type="CAUSAL_LM", r=args.lora_r, lora_alpha=args.lora_alpha,
                             lora_dropout=args.lora_dropout, target_modules=targets,
                             trainable_token_indices=tokens)
    # PEFT records the model's name_or_path as the base: a Hub id, or an absolute
    # folder that loads from anywhere.
    with warnings.catch_warnings():
        # PEFT reads `is_gradient_checkpointing`, which transformers 5.2x deprecates:
        # a warning for PEFT, not for us.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(model, lora_config)
    model.print_trainable_parameters()
    return model


def trainable_tokens(tokenizer, text: str | None) -> list[int] | None:
    """The ids of the tokens --lora_trainable_tokens encodes to, whose embedding rows train beside the
    adapter: a base that barely saw a token (digits, in a model pre-trained on words) gives it a row that an
    adapter of its linear layers cannot tell from the others. With tied embeddings PEFT trains the output
    rows with them."""
    if not text:
        return None
    ids = sorted(set(tokenizer(text, add_special_tokens=False)["input_ids"]))
    pieces = " ".join(repr(tokenizer.decode([i])) for i in ids)
    print(f"LoRA: also training the embedding rows of {len(ids)} tokens: {pieces}.")
    return ids


def lora_targets(model, requested: str):
    """The requested module names the model has (a plain-MLP TinyTx has no gate_proj), or "all-linear"."""
    if requested.strip() == "all-linear":
        return "all-linear"
    names = [name.strip() for name in requested.split(",") if name.strip()]
    linear = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
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
