"""The model's config file (--model_config, JSON or YAML, or a preset's), read
and checked before torch loads."""

import importlib.resources
import json
import os
import re

from hf_tinytx_training.errors import UserInputError


# The presets and Accelerate configs: package data, beside this module in a wheel and in the checkout alike.
CONFIGS_DIR = str(importlib.resources.files("hf_tinytx_training") / "configs")


def config_file_path(model_args) -> str:
    """--model_config, else the preset's file."""
    return model_args.model_config or os.path.join(CONFIGS_DIR, f"model-{model_args.model_preset}.json")


def read_config_file(path: str) -> dict:
    if not os.path.isfile(path):
        presets = sorted(name[6:-5] for name in os.listdir(CONFIGS_DIR) if re.match(r"model-.*\.json$", name))
        raise UserInputError(
            f"No model config at {path}; use --model_preset with one of {presets} or --model_config " "FILE."
        )
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith((".yaml", ".yml")):
                import yaml

                values = yaml.safe_load(f)
            else:
                values = json.load(f)
    # JSON, YAML and decoding errors all derive from ValueError
    except (ValueError, UnicodeDecodeError) as error:
        reason = str(error).splitlines()[0]
        raise UserInputError(
            f"--model_config {path} is not valid JSON/YAML ({reason}); fix the file."
        ) from None
    if not isinstance(values, dict):
        raise UserInputError(
            f"--model_config {path} holds a {type(values).__name__}, not a mapping of TinyTxConfig fields; "
            f'write it as {{"hidden_size": 128, ...}} (see training/configs/model-tiny.json).'
        )
    return values
