# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Converts between Llama and TinyTx, in memory or folder to folder.

A TinyTx model with `qk_norm=False` and `mlp_type="gated"` is the same network as a Llama model: the same layers
under the same module names, so the state dicts have identical keys and shapes. Converting is therefore mostly
config translation; the weights are copied as they are, in their dtype, onto the same device.

    python -m hf_tinytx.convert --to tinytx path/to/llama path/to/tinytx
    python -m hf_tinytx.convert --to llama path/to/tinytx path/to/llama [--overwrite]
    python -m hf_tinytx.convert --to gguf path/to/tinytx model.gguf [--outtype f32|f16|q8_0] [--overwrite]

The command reads and writes safetensors only, copies the tokenizer files and `generation_config.json`, refuses a
source folder with a link that leads out of it, and writes the output into a staging folder inside the destination
whose files are then moved in one by one (`hf_tinytx.folders.publish`): at every moment the destination holds a
complete model or none, and a mount point works as the destination. `--to gguf` (hf_tinytx/gguf_export.py, needs the
`gguf` extra) writes one file for llama.cpp, with the tokenizer inside.
"""

import argparse
import copy
import json
import os
import shutil
import sys
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from .configuration_tinytx import TinyTxConfig
from .folders import STAGING_NAME, local_folder_or_hub_id, publish, regular_files, staging_folder
from .modeling_tinytx import TinyTxForCausalLM


# Fields with the same name and the same meaning in both configs: these describe the whole network.
SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rope_parameters",
    "rms_norm_eps",
    "initializer_range",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "attention_dropout",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "dtype",
)

# Files that travel with a checkpoint but not with the model object.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
GENERATION_CONFIG_FILE = "generation_config.json"


def llama_config_to_tinytx(config: LlamaConfig) -> TinyTxConfig:
    """The TinyTx config that describes the same network as a Llama config."""
    _check_model_type(config, "llama", "llama_config_to_tinytx")
    if getattr(config, "quantization_config", None) is not None:
        raise ValueError(
            "llama_config_to_tinytx: the Llama model is quantized (`quantization_config` is set); TinyTx converts "
            "plain weights only. Load it without quantization (or dequantize it) first."
        )
    # `pretraining_tp` needs no check: it only split Llama's matmuls in old releases and no longer changes the output.
    values = {name: copy.deepcopy(getattr(config, name)) for name in SHARED_FIELDS}
    # Some Llama checkpoints store `pad_token_id=-1` to mean "no padding token"; TinyTx spells that None.
    if isinstance(values["pad_token_id"], int) and not 0 <= values["pad_token_id"] < config.vocab_size:
        values["pad_token_id"] = None
    return TinyTxConfig(qk_norm=False, mlp_type="gated", **values)


def tinytx_config_to_llama(config: TinyTxConfig) -> LlamaConfig:
    """The Llama config that describes the same network as a TinyTx config; refuses the TinyTx-only features."""
    _check_model_type(config, "tinytx", "tinytx_config_to_llama")
    if (reason := why_not_llama(config)) is not None:
        raise ValueError(f"tinytx_config_to_llama: {reason}")
    values = {name: copy.deepcopy(getattr(config, name)) for name in SHARED_FIELDS}
    return LlamaConfig(**values)


def why_not_llama(config: TinyTxConfig) -> str | None:
    """Why this TinyTx config has no Llama twin (a TinyTx-only feature), or None when it has one."""
    if config.qk_norm:
        return (
            "`qk_norm=True` has no Llama equivalent: the model normalises each head's queries and keys with learned "
            "weights (`q_norm`/`k_norm`) that Llama does not have, so a Llama model would compute something else. "
            "Only TinyTx models built with qk_norm=False convert to Llama."
        )
    if config.mlp_type != "gated":
        return (
            f"`mlp_type={config.mlp_type!r}` has no Llama equivalent: Llama's MLP is always the gated "
            "down(act(gate(x)) * up(x)), and this model has no `gate_proj`. Only TinyTx models built with "
            "mlp_type='gated' convert to Llama."
        )
    return None


def llama_to_tinytx(model: LlamaForCausalLM) -> TinyTxForCausalLM:
    """A TinyTx model that computes exactly what `model` computes (same weights, dtype and device)."""
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"llama_to_tinytx: expected a LlamaForCausalLM, got {type(model).__name__}.")
    return _rebuild(model, TinyTxForCausalLM, llama_config_to_tinytx(model.config))


def tinytx_to_llama(model: TinyTxForCausalLM) -> LlamaForCausalLM:
    """A Llama model that computes exactly what `model` computes (same weights, dtype and device)."""
    # Checked by model type, not class: a model loaded as remote code has its own copy of the class.
    if getattr(model.config, "model_type", None) != "tinytx" or not isinstance(model, PreTrainedModel):
        raise TypeError(f"tinytx_to_llama: expected a TinyTxForCausalLM, got {type(model).__name__}.")
    return _rebuild(model, LlamaForCausalLM, tinytx_config_to_llama(model.config))


def _rebuild(model: PreTrainedModel, target_class: type[PreTrainedModel], config: PreTrainedConfig):
    # No random initialisation: every weight is overwritten by the source's right after.
    with no_init_weights():
        converted = target_class._from_config(
            config, dtype=model.dtype, attn_implementation=model.config._attn_implementation
        )
    converted.load_state_dict(model.state_dict(), strict=True)
    converted.tie_weights()  # skipped above along with the initialisation; shares lm_head with the embedding if tied
    converted.to(model.device)
    if model.generation_config is not None:
        converted.generation_config = copy.deepcopy(model.generation_config)
    converted.train(model.training)
    return converted


def _check_model_type(config: PreTrainedConfig, expected: str, caller: str) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type != expected:
        raise ValueError(f"{caller}: expected a {expected!r} config, got model_type={model_type!r}.")


def convert_folder(
    source: str | os.PathLike, destination: str | os.PathLike, to: str, overwrite: bool = False
) -> Path:
    """Converts the checkpoint folder `source` to `to` ("llama" or "tinytx") and saves it as `destination`."""
    source, destination = Path(source), Path(destination)
    if to not in ("llama", "tinytx"):
        raise ValueError(f"convert: `to` must be 'llama' or 'tinytx', got {to!r}.")
    expected_type = "tinytx" if to == "llama" else "llama"
    source_files = check_source_folder(source, expected_type)
    replaced = _check_destination(destination, overwrite)
    # Translate the config alone first, so a refusal comes before gigabytes of weights are read.
    if to == "tinytx":
        llama_config_to_tinytx(LlamaConfig.from_pretrained(source))
    else:
        tinytx_config_to_llama(TinyTxConfig.from_pretrained(source))

    if to == "tinytx":
        model = LlamaForCausalLM.from_pretrained(source, dtype="auto", use_safetensors=True)
        converted = llama_to_tinytx(model)
    else:
        model = TinyTxForCausalLM.from_pretrained(source, dtype="auto", use_safetensors=True)
        converted = tinytx_to_llama(model)
    del model

    created = not destination.exists()
    staged = staging_folder(destination)
    try:
        converted.save_pretrained(staged)
        for name in (*TOKENIZER_FILES, GENERATION_CONFIG_FILE):
            if name in source_files:
                shutil.copyfile(source / name, staged / name)
        written = regular_files(staged)
        publish(staged, destination)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        if created and not any(destination.iterdir()):
            destination.rmdir()
        raise
    if replaced:
        _remove_all_but(destination, written)  # only once the new model is complete: a kill never loses both
    return destination


def check_source_folder(source: Path, expected_type: str) -> list[str]:
    """Refuses what cannot be converted; returns the folder's files (raises if a link leads out of it)."""
    local_folder_or_hub_id(str(source))  # a mistyped path: "no such folder", the same words as every command
    if not source.is_dir():
        raise FileNotFoundError(f"convert: source folder {str(source)!r} does not exist.")
    files = regular_files(source)
    config_file = source / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"convert: {str(source)!r} has no config.json, so it is not a saved model folder; pass the folder that "
            "`save_pretrained` wrote."
        )
    has_safetensors = (source / "model.safetensors").is_file() or (source / "model.safetensors.index.json").is_file()
    if not has_safetensors:
        pickled = [name for name in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (source / name).exists()]
        hint = (
            f" It only has pickled weights ({pickled[0]}), which this tool does not load because unpickling can run "
            "code; re-save it with `save_pretrained` (safetensors) in a trusted environment first."
            if pickled
            else ""
        )
        raise FileNotFoundError(f"convert: {str(source)!r} has no model.safetensors weights.{hint}")
    model_type = json.loads(config_file.read_text()).get("model_type")
    if model_type != expected_type:
        raise ValueError(
            f"convert: {str(source)!r} holds a {model_type!r} model, but this conversion needs a {expected_type!r} "
            f"one; use `--to {'tinytx' if model_type == 'llama' else 'llama'}` for the other direction."
        )
    return files


def _check_destination(destination: Path, overwrite: bool) -> bool:
    """Refuses a file, or a non-empty folder without `overwrite`; returns whether old contents are to be replaced."""
    if destination.exists() and not destination.is_dir():
        raise FileExistsError(f"convert: destination {str(destination)!r} is a file, not a folder.")
    # A staging folder alone is what a killed conversion leaves: the next one may use the folder.
    old = [path for path in destination.iterdir() if path.name != STAGING_NAME] if destination.is_dir() else []
    if old and not overwrite:
        raise FileExistsError(
            f"convert: destination {str(destination)!r} is not empty; pass --overwrite to replace it, or choose "
            "another folder."
        )
    return bool(old)


def _remove_all_but(folder: Path, keep: list[str]) -> None:
    """Deletes what `folder` held before (--overwrite), keeping the files named in `keep` and the folders above
    them."""
    kept = {Path(name).parts[0] for name in keep}
    for path in folder.iterdir():
        if path.name in kept:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hf_tinytx.convert",
        description="Convert a saved Llama model folder to TinyTx, a TinyTx folder to Llama (safetensors only), or a "
        "TinyTx folder to one GGUF file for llama.cpp / Ollama / LM Studio.",
    )
    parser.add_argument("--to", required=True, choices=("llama", "tinytx", "gguf"), help="the format to convert to")
    parser.add_argument("source", help="folder written by save_pretrained (config.json + model.safetensors)")
    parser.add_argument(
        "destination", help="folder to write (a file ending in .gguf for --to gguf); must be absent or empty unless "
        "--overwrite"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty destination folder or file")
    parser.add_argument(
        "--outtype", choices=("f32", "f16", "q8_0"), default=None,
        help="--to gguf only: how the weight matrices are stored (default f32; norms and biases are always f32)",
    )
    args = parser.parse_args(argv)
    if args.outtype is not None and args.to != "gguf":
        parser.error("--outtype applies to --to gguf only")
    try:
        if args.to == "gguf":
            from .gguf_export import write_gguf  # needs the optional `gguf` package

            destination = write_gguf(args.source, args.destination, args.outtype or "f32", overwrite=args.overwrite)
        else:
            destination = convert_folder(args.source, args.destination, to=args.to, overwrite=args.overwrite)
    except (ValueError, TypeError, OSError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.to} model to {destination}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
