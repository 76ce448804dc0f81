"""The model to train: a preset, a --model_config file or an --init_from folder, with command-line overrides,
checked by building it on PyTorch's "meta" device (no memory) before anything is written."""

import copy
import difflib
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hf_tinytx.folders.location import local_folder_or_hub_id
from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.model.config_file import config_file_path, read_config_file


OVERRIDES = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "max_position_embeddings",
)
# fp32 weights + gradients + AdamW's two moments: what training needs per parameter before activations.
TRAINING_BYTES_PER_PARAMETER = 16


def load_model_config(model_args):
    """The preset (or --model_config file, or --init_from model), with command-line overrides applied."""
    for flag in ("init_from", "tokenizer_name"):
        if getattr(model_args, flag):
            try:  # a typo in a local path must not wait ~50 s on the network as a Hub id
                local_folder_or_hub_id(getattr(model_args, flag))
            except FileNotFoundError as error:
                raise UserInputError(f"--{flag}: {error}") from None
    if model_args.init_from:
        try:
            config = AutoConfig.from_pretrained(model_args.init_from)
        except (OSError, ValueError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserInputError(
                f"--init_from {model_args.init_from!r} is not a model folder: {reason}"
            ) from None
    else:
        path = config_file_path(model_args)
        values = {key: value for key, value in read_config_file(path).items() if not key.startswith("_")}
        config = _build("tinytx", values, path)
        refuse_unknown_keys(config, values, path)
    changes = {name: getattr(model_args, name) for name in OVERRIDES if getattr(model_args, name) is not None}
    if not changes:
        return config
    if model_args.init_from:
        raise UserInputError(f"--init_from keeps the saved architecture; drop {sorted(changes)}.")
    if "hidden_size" in changes or "num_attention_heads" in changes:
        config.head_dim = None  # let the config derive it again from the new width / head count
    if "num_attention_heads" in changes and "num_key_value_heads" not in changes:
        config.num_key_value_heads = None
    values = {k: v for k, v in {**config.to_dict(), **changes}.items() if k != "model_type"}
    return _build("tinytx", values, "the command-line overrides")


def _build(model_type: str, values: dict, source: str):
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError) as error:
        raise UserInputError(f"{source}: {error}") from None


def refuse_unknown_keys(config, values: dict, path: str) -> None:
    """A key the config keeps only as a stray attribute is a typo: refused with the nearest field. Legacy
    names the config takes in (`rope_theta`) pass."""
    known = type(config)().to_dict()
    stored = config.to_dict()
    unknown = [key for key in values if key not in known and key in stored]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserInputError(
            f"--model_config {path}: unknown key {key!r}{hint}; {type(config).__name__} has no such field, "
            "so fix or remove it (the fields: training/configs/model-tiny.json)."
        )


def check_model_builds(config, attn_implementation: str, num_processes: int) -> None:
    """Builds the model without memory: an unknown attention backend or a size too
    big for this machine fails now."""
    config = copy.deepcopy(config)
    config._attn_implementation = attn_implementation  # validated by the model's constructor
    model_class = AutoModelForCausalLM._model_mapping[type(config)]
    try:
        # The class itself, not from_config: under DeepSpeed ZeRO-3 from_config
        # would partition the model at once.
        with torch.device("meta"):
            model = model_class(config)
    except (ValueError, ImportError) as error:
        reason = str(error).strip().splitlines()[0]
        raise UserInputError(f"--attn_implementation {attn_implementation!r}: {reason}") from None
    num_parameters = sum(p.numel() for p in model.parameters())
    needed = num_parameters * TRAINING_BYTES_PER_PARAMETER
    available = _memory_bytes() * num_processes
    if needed > available:
        raise UserInputError(
            f"The model has {num_parameters:,} parameters: training needs about {needed / 2**30:,.0f} GiB "
            f"for weights, gradients and optimizer state, more than the {available / 2**30:,.0f} GiB here; "
            "choose a smaller --model_preset / --model_config."
        )


def _memory_bytes() -> int:
    """Accelerator memory when there is one, else the machine's RAM."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
