# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Converts between Llama and TinyTx, in memory or folder to folder.

A TinyTx model with `qk_norm=False` and `mlp_type="gated"` is the same network as a Llama model, with the same
module names, so converting is config translation; the weights are copied as they are.

Safetensors only, checked against the config before anything is written; `--overwrite` replaces only the
files an earlier conversion recorded writing.
"""

import copy
import os
import shutil
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from hf_tinytx.configuration_tinytx import SIZE_FIELDS, TinyTxConfig
from hf_tinytx.convert.saved_folder import check_stored_weights, convertible_files, load_config, why_not_llama
from hf_tinytx.folders import safe as folders
from hf_tinytx.folders.config import check_vocabulary_fits
from hf_tinytx.folders.location import TOKENIZER_FILES, local_folder_or_hub_id
from hf_tinytx.modeling_tinytx import TinyTxForCausalLM


# Fields with the same name and the same meaning in both configs: these describe the whole network.
SHARED_FIELDS = (
    *SIZE_FIELDS, "hidden_act", "rope_parameters", "rms_norm_eps", "initializer_range", "tie_word_embeddings",
    "attention_bias", "mlp_bias", "attention_dropout", "use_cache", "pad_token_id", "bos_token_id",
    "eos_token_id", "dtype",
)

# Files that travel with a checkpoint but not with the model object: copied from the source.
# besides these: the config, the weights, the model's code
COPIED = (*TOKENIZER_FILES, "generation_config.json")
WRITER = "hf_tinytx.convert"  # the name in the record of what a conversion wrote
SHOWN = 3  # file names quoted in a refusal


def llama_config_to_tinytx(config: LlamaConfig) -> TinyTxConfig:
    """The TinyTx config that describes the same network as a Llama config."""
    _check_model_type(config, "llama", "llama_config_to_tinytx")
    if getattr(config, "quantization_config", None) is not None:
        raise ValueError(
            "llama_config_to_tinytx: the Llama model is quantized (`quantization_config` is set); TinyTx "
            "converts plain weights only. Load it without quantization (or dequantize it) first."
        )
    values = {name: copy.deepcopy(getattr(config, name)) for name in SHARED_FIELDS}
    # Some Llama checkpoints store `pad_token_id=-1` to mean "no padding token"; TinyTx spells that None.
    if isinstance(values["pad_token_id"], int) and not 0 <= values["pad_token_id"] < config.vocab_size:
        values["pad_token_id"] = None
    return TinyTxConfig(qk_norm=False, mlp_type="gated", **values)


def tinytx_config_to_llama(config: TinyTxConfig) -> LlamaConfig:
    """The Llama config that describes the same network as a TinyTx config;
    refuses the TinyTx-only features."""
    _check_model_type(config, "tinytx", "tinytx_config_to_llama")
    if (reason := why_not_llama(config)) is not None:
        raise ValueError(f"tinytx_config_to_llama: {reason}")
    values = {name: copy.deepcopy(getattr(config, name)) for name in SHARED_FIELDS}
    return LlamaConfig(**values)


def llama_to_tinytx(model: LlamaForCausalLM) -> TinyTxForCausalLM:
    """A TinyTx model that computes exactly what `model` computes (same weights, dtype and device)."""
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"llama_to_tinytx: expected a LlamaForCausalLM, got {type(model).__name__}.")
    return _rebuild(model, TinyTxForCausalLM, llama_config_to_tinytx(model.config))


def tinytx_to_llama(model: TinyTxForCausalLM) -> LlamaForCausalLM:
    """A Llama model that computes exactly what `model` computes (same weights, dtype and device)."""
    # By model type, not class: a model loaded as remote code has its own copy of the class.
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
    # skipped above along with the initialisation; shares lm_head with the embedding if tied
    converted.tie_weights()
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
    local_folder_or_hub_id(str(source))  # a link loop or a missing path, before any path is resolved
    folders.refuse_overlap(source, destination, ("source", "destination"), who="convert")
    source_class, config_class, translate = (
        (TinyTxForCausalLM, TinyTxConfig, tinytx_config_to_llama) if to == "llama"
        else (LlamaForCausalLM, LlamaConfig, llama_config_to_tinytx)
    )
    source_files = convertible_files(source, config_class.model_type)
    ours = _check_destination(destination, overwrite)
    # Refusals first, before gigabytes of weights are read.
    config = load_config(source, config_class, "convert")
    translate(config)
    check_stored_weights(source, source_class, config, "convert")
    check_vocabulary_fits(source, config.to_dict(), "convert")  # the tokenizer is copied beside the weights

    model = source_class.from_pretrained(source, dtype="auto", use_safetensors=True)
    converted = tinytx_to_llama(model) if to == "llama" else llama_to_tinytx(model)
    del model
    _save(converted, source, source_files, destination, ours)
    return destination


def _save(
    converted: PreTrainedModel, source: Path, source_files: list[str], destination: Path, ours: set[str]
):
    """Stages the converted folder inside `destination` and publishes it; the files of an earlier conversion
    that this one does not write are removed only once the new model is complete (a kill never loses both)."""
    created = folders.folders_to_create(destination)  # removed again on failure
    staged = destination / folders.STAGING_NAME
    publishing = False
    try:
        folders.staging_folder(destination)
        converted.save_pretrained(staged)
        for name in COPIED:
            if name in source_files:
                shutil.copyfile(source / name, staged / name)
        written = folders.regular_files(staged)
        _refuse_others_files(destination, lambda name: folders.would_replace(name, written))
        # Recorded before any file moves: a killed publish leaves a record of every file of ours.
        folders.record_written(destination, WRITER, ours | set(written))
        publishing = True
        folders.publish(staged, destination)
    except BaseException as error:  # a failure, or a stop signal (hf_tinytx.commands.exits.StopSignal)
        full = isinstance(error, Exception) and folders.is_disk_full(error, staged)
        needed = sum((source / name).stat().st_size for name in source_files)
        if not publishing:  # once files move in, all stays as a kill leaves it: the same command finishes it
            shutil.rmtree(staged, ignore_errors=True)
            if created:
                (destination / folders.MANIFEST_NAME).unlink(missing_ok=True)
                folders.remove_created(created)
        if full:
            raise folders.DiskFullError(_disk_full_message(destination, needed, publishing)) from None
        raise
    folders.remove_written(destination, ours - set(written))
    folders.record_written(destination, WRITER, written)


def _disk_full_message(destination: Path, needed: int, publishing: bool) -> str:
    free = shutil.disk_usage(next(path for path in (destination, *destination.parents) if path.exists())).free
    outcome = (
        "some of its files were already replaced" if publishing
        else "nothing in it was changed and the partial output was removed"
    )
    return (f"convert: the disk is full while writing {destination} (about {folders.mib(needed)} needed, "
            f"{folders.mib(free)} free); {outcome}: free some space and run the same command again.")


def _check_destination(destination: Path, overwrite: bool) -> set[str]:
    """Refuses a file, a non-empty folder without `overwrite`, and files of others that a conversion would
    replace; returns the files an earlier conversion recorded writing there (what `overwrite` may replace)."""
    if destination.exists() and not destination.is_dir():
        raise FileExistsError(f"convert: destination {str(destination)!r} is a file, not a folder.")
    if not destination.is_dir():
        return set()
    # A staging folder or a record alone is what a killed conversion leaves: the next one may use the folder.
    old = [
        path
        for path in destination.iterdir()
        if path.name not in (folders.STAGING_NAME, folders.MANIFEST_NAME)
    ]
    interrupted = (destination / folders.STAGING_NAME).is_dir() and not folders.others_files(
        destination, WRITER
    )
    if old and not overwrite and not interrupted:
        raise FileExistsError(
            f"convert: destination {str(destination)!r} is not empty; pass --overwrite to replace what an "
            "earlier conversion wrote there, or choose another folder."
        )
    # Every name a conversion can write (the exact list is checked again once staged).
    _refuse_others_files(
        destination,
        lambda name: folders.would_replace(name, COPIED) or (name.endswith(".py") and "/" not in name),
    )
    return folders.written_before(destination, WRITER)


def _refuse_others_files(destination: Path, replaced) -> None:
    # The model's own files first: they say best what the folder holds.
    others = sorted((name for name in folders.others_files(destination, WRITER) if replaced(name)),
                    key=lambda name: (name not in ("config.json", "model.safetensors"), name))
    if others:
        shown = ", ".join(others[:SHOWN]) + (
            f" and {len(others) - SHOWN} more" if len(others) > SHOWN else ""
        )
        raise FileExistsError(
            f"convert: destination {str(destination)!r} holds files that convert did not write ({shown}) and "
            "this conversion would replace them; --overwrite only replaces an earlier conversion's files: "
            "choose another folder, or move those files away first."
        )
