"""The model a pre-training run trains: built from its config and tokenizer (or --init_from's weights),
and sharded here when FSDP2 runs on CPUs."""

from accelerate import Accelerator
from transformers import AutoModelForCausalLM

from hf_tinytx_training import checkpoints
from hf_tinytx_training.distributed import sharding
from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.model.cpu_training import speed_up_cpu_training
from hf_tinytx_training.publish import cards


def build_model(model_args, model_config, tokenizer):
    """The model on the current device: its vocabulary and special tokens from the tokenizer."""
    if not model_args.init_from:
        model_config.vocab_size = len(tokenizer)
    elif len(tokenizer) > model_config.vocab_size:
        raise UserInputError(f"The tokenizer has {len(tokenizer)} tokens but the --init_from model only "
                             f"{model_config.vocab_size}; use the tokenizer saved with that model (leave "
                             "--tokenizer_name out).")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model_config, name, getattr(tokenizer, name))
    options = {"config": model_config, "attn_implementation": model_args.attn_implementation}
    if model_args.init_from and checkpoints.holds_whole_weights(model_args.init_from):
        model = AutoModelForCausalLM.from_pretrained(model_args.init_from, **options)
    else:
        model = AutoModelForCausalLM.from_config(**options)
        if model_args.init_from:  # a checkpoint that FSDP2 or DeepSpeed wrote partitioned
            checkpoints.load_partitioned_weights(model, model_args.init_from)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.generation_config, name, getattr(tokenizer, name))
    if model_args.gradient_checkpointing:  # each layer's activations recomputed in the backward pass
        # The switch's name since transformers 5.2x (the old one warns there); 5.10.4 has only the old one.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if model_args.torch_compile:
        model.compile()  # in place: a torch.compile wrapper would save every weight under "_orig_mod."
    return model


def make_model(model_args, model_config, tokenizer, accelerator: Accelerator, own_fsdp2: bool):
    """(model, its parameter count): built where the launch wants it, sharded here under FSDP2 on CPUs."""
    with sharding.building_model(accelerator):
        model = build_model(model_args, model_config, tokenizer)
    if accelerator.device.type == "cpu":
        # training/model/cpu_training.py: two speed paths the model file does not carry
        speed_up_cpu_training(model)
    num_parameters = sum(sharding.full_shape(p).numel() for p in model.parameters())
    accelerator.print(f"TinyTx with {num_parameters:,} parameters ({cards.human_count(num_parameters)})")
    if own_fsdp2:
        model = sharding.shard_model(model)
        accelerator.print(
            "FSDP2 by torch's fully_shard (each decoder layer, then the root) over gloo: Accelerate shards "
            "on GPUs only"
        )
    return model, num_parameters
