"""Reads a saved model folder the way a converter must before it writes anything: its config, and its stored
tensors' names and shapes (safetensors headers only) against what the config's model expects, since
`from_pretrained` would fill a missing tensor with random values. Each problem is one ValueError line.
"""

import os
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PreTrainedConfig, PreTrainedModel

from hf_tinytx.folders.config import read_config_json
from hf_tinytx.folders.location import local_folder_or_hub_id
from hf_tinytx.folders.safe import STAGING_NAME, interrupted_save, regular_files
from hf_tinytx.folders.weights import PICKLED, has_safetensors, stored_shapes


# Buffers that older Llama checkpoints stored and that transformers now recomputes instead of loading.
RECOMPUTED = (".rotary_emb.inv_freq",)
SHOWN = 3  # tensor names quoted in a message, per kind of problem


def load_config(
    folder: str | os.PathLike, config_class: type[PreTrainedConfig], who: str
) -> PreTrainedConfig:
    """`config_class.from_pretrained(folder)`, with a field of the wrong kind reported in one line."""
    path = Path(folder) / "config.json"
    read_config_json(folder, who, config_class.model_type)
    try:
        return config_class.from_pretrained(folder)
    except (TypeError, ValueError, AttributeError, KeyError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{who}: {path} is not a valid {config_class.model_type} config ({reason}); fix that " "field."
        ) from None


def check_stored_weights(
    folder: str | os.PathLike, model_class: type[PreTrainedModel], config: PreTrainedConfig, who: str
) -> None:
    """Refuses stored tensors that are missing, unexpected or misshapen for `config`."""
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        expected = {name: tuple(t.shape) for name, t in model_class._from_config(config).state_dict().items()}
    files = stored_shapes(folder, who)
    stored = {name: shape for name, (_, shape) in files.items()}
    tied = _tied(model_class, config)
    missing = [name for name in expected if name not in stored and name not in tied]
    unexpected = [name for name in stored if name not in expected and not name.endswith(RECOMPUTED)]
    misshapen = [f"{name} {list(stored[name])} (expected {list(shape)})"
                 for name, shape in expected.items() if name in stored and stored[name] != shape]
    # A tied tensor stored anyway must equal its source: tying would silently replace it otherwise.
    untied = [
        f"{name} (differs from {source}; set tie_word_embeddings false)"
        for name, source in tied.items()
        if name in stored and source in stored and not misshapen and not _equal(files, name, source)
    ]
    kinds = (("missing", missing), ("unexpected", unexpected), ("misshapen", misshapen), ("not tied", untied))
    problems = [
        f"{kind}: {', '.join(names[:SHOWN])}{f' and {len(names) - SHOWN} more' if len(names) > SHOWN else ''}"
        for kind, names in kinds
        if names
    ]
    if problems:
        raise ValueError(
            f"{who}: the weights in {folder} do not match its config.json "
            f"(num_hidden_layers={config.num_hidden_layers}, hidden_size={config.hidden_size}) — "
            f"{'; '.join(problems)}; fix config.json to describe these weights, or use the weights saved "
            "with it."
        )


def _tied(model_class: type[PreTrainedModel], config: PreTrainedConfig) -> dict[str, str]:
    """{tied tensor: the tensor it shares} when the config ties them."""
    keys = model_class._tied_weights_keys or {}
    if not config.tie_word_embeddings:
        return {}
    return dict(keys) if isinstance(keys, dict) else {key: "model.embed_tokens.weight" for key in keys}


def _equal(files: dict, first: str, second: str) -> bool:
    tensors = []
    for name in (first, second):
        with safe_open(files[name][0], framework="pt") as f:
            tensors.append(f.get_tensor(name))
    return torch.equal(*tensors)


def convertible_files(source: Path, expected_type: str) -> list[str]:
    """The files of a saved model folder that can be converted; refuses one that
    cannot (and a link leading out)."""
    local_folder_or_hub_id(str(source))  # the same words as every command for a mistyped path
    if not source.is_dir():
        raise FileNotFoundError(
            f"convert: source folder {str(source)!r} does not exist; pass the folder that `save_pretrained` "
            "wrote (a Hub model: download it first, e.g. with `hf download`)."
        )
    files = regular_files(source)
    config_file = source / "config.json"
    if not config_file.is_file() and interrupted_save(source):
        raise FileNotFoundError(
            f"convert: {str(source)!r} has no config.json: a save into it was killed before it finished (its "
            f"{STAGING_NAME} folder is left); run the command that wrote it again to finish the model."
        )
    if not config_file.is_file():
        raise FileNotFoundError(
            f"convert: {str(source)!r} has no config.json, so it is not a saved model folder; pass the "
            "folder that `save_pretrained` wrote."
        )
    if not has_safetensors(source):
        pickled = [
            name for name in PICKLED if (source / name).exists()
        ]
        hint = (
            ""
            if not pickled
            else (
                f" It only has pickled weights ({pickled[0]}), which this tool does not load because "
                "unpickling can run code; re-save it with `save_pretrained` (safetensors) in a trusted "
                "environment first."
            )
        )
        raise FileNotFoundError(f"convert: {str(source)!r} has no model.safetensors weights.{hint}")
    model_type = read_config_json(source, "convert", expected_type)["model_type"]
    if model_type != expected_type:
        raise ValueError(
            f"convert: {str(source)!r} holds a {model_type!r} model, but this conversion needs a "
            f"{expected_type!r} one; use `--to {'tinytx' if model_type == 'llama' else 'llama'}` for the "
            "other direction."
        )
    return files


def why_not_llama(config: PreTrainedConfig) -> str | None:
    """Why this TinyTx config has no Llama twin (a TinyTx-only feature), or None when it has one."""
    if config.qk_norm:
        return (
            "`qk_norm=True` has no Llama equivalent: the model normalises each head's queries and keys with "
            "learned weights (`q_norm`/`k_norm`) that Llama does not have, so a Llama model would compute "
            "something else. Only TinyTx models built with qk_norm=False convert to Llama."
        )
    if config.mlp_type != "gated":
        return (
            f"`mlp_type={config.mlp_type!r}` has no Llama equivalent: Llama's MLP is always the gated "
            "down(act(gate(x)) * up(x)), and this model has no `gate_proj`. Only TinyTx models built with "
            "mlp_type='gated' convert to Llama."
        )
    return None
