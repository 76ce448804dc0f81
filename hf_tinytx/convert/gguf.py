# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Writes a TinyTx model folder as one GGUF file, model and tokenizer together, for llama.cpp and the tools
built on it (Ollama, LM Studio, llama-cpp-python).

    python -m hf_tinytx.convert --to gguf path/to/tinytx model.gguf [--outtype f32|f16|q8_0] [--overwrite]

Design choices:
- llama.cpp's "llama" architecture (convert.py: the gated MLP without qk_norm is a Llama network); what it
  cannot compute (another activation, another RoPE type) is refused before anything is written.
- q_proj/k_proj rows are permuted within each head from Hugging Face's "rotate
  half" RoPE to llama.cpp's neighbours.
- The tokenizer must be a byte-level BPE with GPT-2's regex split (what `hf_tinytx.tokenization` trains).
- f32, f16 or q8_0 matrices; norms and biases stay f32.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hf_tinytx.configuration_tinytx import TinyTxConfig
from hf_tinytx.convert.saved_folder import check_stored_weights, convertible_files, load_config, why_not_llama
from hf_tinytx.folders import safe as folders
from hf_tinytx.folders.location import local_folder_or_hub_id
from hf_tinytx.modeling_tinytx import TinyTxForCausalLM, TinyTxRotaryEmbedding
from hf_tinytx.tokenization import adds_bos


try:
    import gguf
except ImportError as error:  # an optional extra: the rest of hf_tinytx works without it
    raise ImportError(
        "convert --to gguf needs the `gguf` package (llama.cpp's own GGUF library): pip install "
        "'hf_tinytx[gguf]'"
    ) from error


OUTTYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
ARCHITECTURE = gguf.MODEL_ARCH.LLAMA
# llama.cpp's name for GPT-2's regex split, which is what a ByteLevel
# pre-tokenizer without a prefix space does.
PRE_TOKENIZER = "gpt-2"
# RoPE keys that llama.cpp's YaRN has no setting for (it derives the attention factor from `factor` itself).
UNSUPPORTED_YARN_KEYS = ("attention_factor", "mscale", "mscale_all_dim")


def write_gguf(source: str | os.PathLike, destination: str | os.PathLike, outtype: str = "f32",
               overwrite: bool = False) -> Path:
    """Writes the TinyTx folder `source` (weights and tokenizer) as the GGUF file `destination`."""
    source, destination = Path(source), Path(destination)
    if outtype not in OUTTYPES:
        raise ValueError(f"gguf: `outtype` must be one of {list(OUTTYPES)}, got {outtype!r}.")
    local_folder_or_hub_id(str(source))  # a link loop or a missing path, before any path is resolved
    folders.refuse_overlap(source, destination, ("source", "destination"), who="gguf")
    _check_destination_file(destination, overwrite)
    files = convertible_files(source, "tinytx")
    # Every refusal before the weights are read.
    config = load_config(source, TinyTxConfig, "gguf")
    check_gguf_config(config)
    check_stored_weights(source, TinyTxForCausalLM, config, "gguf")
    vocabulary = gguf_vocabulary(_load_tokenizer(source, files), config)

    model = TinyTxForCausalLM.from_pretrained(source, dtype=torch.float32, use_safetensors=True)
    writer = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[ARCHITECTURE])
    _add_hyperparameters(writer, config, name=source.resolve().name, outtype=outtype)
    for key, value in vocabulary.items():  # GGUFWriter's add_<key>
        getattr(writer, f"add_{key}")(value)
    for name, data, qtype in gguf_tensors(model, outtype):
        writer.add_tensor(name, data, raw_dtype=qtype)
    _write_atomically(writer, destination)
    return destination


# ---- what llama.cpp can run ----


def check_gguf_config(config: TinyTxConfig) -> None:
    """Refuses a model that llama.cpp's Llama graph would compute otherwise."""
    if (reason := why_not_llama(config)) is not None:
        raise ValueError(f"gguf: {reason} (The GGUF file runs as llama.cpp's Llama architecture.)")
    if config.hidden_act not in ("silu", "swish"):
        raise ValueError(
            f"gguf: `hidden_act={config.hidden_act!r}` has no llama.cpp equivalent: its Llama graph always "
            "uses SiLU in the MLP. Only models built with hidden_act='silu' convert to GGUF."
        )
    rope = config.rope_parameters
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ("default", "linear", "llama3", "yarn"):
        raise ValueError(
            f"gguf: RoPE type {rope_type!r} has no llama.cpp equivalent for Llama models; 'default', "
            "'linear', 'llama3' and 'yarn' convert."
        )
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            f"gguf: `partial_rotary_factor={rope['partial_rotary_factor']}` has no llama.cpp equivalent: its "
            "Llama graph rotates every dimension of a head."
        )
    if rope_type == "yarn":
        extra = [key for key in UNSUPPORTED_YARN_KEYS if rope.get(key) is not None]
        if extra or rope.get("truncate", True) is not True:
            keys = extra or ["truncate"]
            raise ValueError(
                f"gguf: YaRN with {keys} has no llama.cpp setting (it derives the attention factor from "
                "`factor` and always truncates the correction range); drop those keys from "
                "`rope_parameters` to convert."
            )
        if rope.get("factor") is None:
            raise ValueError(
                "gguf: YaRN needs an explicit `rope_parameters['factor']` for llama.cpp; set it."
            )


def _add_hyperparameters(writer: gguf.GGUFWriter, config: TinyTxConfig, name: str, outtype: str) -> None:
    rope = config.rope_parameters
    keys = {  # GGUF key (the writer's add_<key>) -> its value
        "type": gguf.GGUFType.MODEL,
        "name": name,
        "file_type": OUTTYPES[outtype],
        "quantization_version": gguf.GGML_QUANT_VERSION,
        "vocab_size": config.vocab_size,
        "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size,
        "block_count": config.num_hidden_layers,
        "feed_forward_length": config.intermediate_size,
        "head_count": config.num_attention_heads,
        "head_count_kv": config.num_key_value_heads,
        "key_length": config.head_dim,
        "value_length": config.head_dim,
        "rope_dimension_count": config.head_dim,
        "layer_norm_rms_eps": config.rms_norm_eps,
        "rope_freq_base": rope["rope_theta"],
    }
    for key, value in keys.items():
        getattr(writer, f"add_{key}")(value)
    rope_type = rope.get("rope_type", "default")
    if rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope_type == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if rope.get("beta_fast"):
            writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if rope.get("beta_slow"):
            writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    # "llama3" has no key: its per-frequency factors travel as the `rope_freqs` tensor (see gguf_tensors).


# ---- the weights ----


def gguf_tensors(model: TinyTxForCausalLM, outtype: str):
    """Yields (GGUF name, numpy data, quantization type or None) for every tensor llama.cpp needs."""
    config = model.config
    names = gguf.get_tensor_name_map(ARCHITECTURE, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp reads `token_embd` as the output head when `output` is absent
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"gguf: no llama.cpp name for the tensor {hf_name!r}.")
        data = tensor.detach().to(device="cpu", dtype=torch.float32)
        if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = rotate_half_to_interleaved(data, config.num_attention_heads)
        elif hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = rotate_half_to_interleaved(data, config.num_key_value_heads)
        yield (name, *_encode(data.numpy(), outtype))
    if (factors := llama3_rope_factors(config)) is not None:
        yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors, None


def rotate_half_to_interleaved(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorders each head's rows from rotate-half RoPE pairs (i, i + d/2) to llama.cpp's interleaved (2i, 2i +
    1); for weights (rows, in) and biases (rows,). The attention scores stay the same."""
    head_dim = weight.shape[0] // num_heads
    halves = weight.reshape(num_heads, 2, head_dim // 2, *weight.shape[1:])
    return halves.transpose(1, 2).reshape(weight.shape)


def llama3_rope_factors(config: TinyTxConfig) -> np.ndarray | None:
    """For RoPE type "llama3": how much slower each frequency turns than unscaled
    RoPE (llama.cpp divides by these)."""
    if config.rope_parameters.get("rope_type") != "llama3":
        return None
    plain, _ = TinyTxRotaryEmbedding.compute_default_rope_parameters(config)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")  # transformers' own llama3 computation
    return (plain / scaled).to(torch.float32).numpy()


def _encode(data: np.ndarray, outtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    if data.ndim < 2 or outtype == "f32":
        return data, None
    if outtype == "q8_0":
        try:
            return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
        except gguf.QuantError:
            pass  # rows not a multiple of q8_0's block size: f16, as llama.cpp's own converter does
    return data.astype(np.float16), None


# ---- the tokenizer ----


def gguf_vocabulary(tokenizer: PreTrainedTokenizerFast, config: TinyTxConfig) -> dict:
    """The tokenizer as llama.cpp's BPE ("gpt2") tokenizer model reads it: {GGUF key: value}, in the file's
    order. Refuses one llama.cpp would split differently."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    _check_byte_level_bpe(spec)
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    if max(vocab.values()) >= config.vocab_size:
        raise ValueError(
            f"gguf: the tokenizer has token ids up to {max(vocab.values())}, but the model's embedding has "
            f"only vocab_size={config.vocab_size} rows; the tokenizer does not belong to this model."
        )
    added = tokenizer.added_tokens_decoder
    by_id = {token_id: token for token, token_id in vocab.items()}
    tokens, token_types = [], []
    for token_id in range(config.vocab_size):
        # embedding rows past the tokenizer (a vocabulary rounded up): never produced
        if token_id not in by_id:
            tokens.append(f"[PAD{token_id}]")
            token_types.append(gguf.TokenType.UNUSED)
        elif token_id in added:
            tokens.append(by_id[token_id])
            token_types.append(
                gguf.TokenType.CONTROL if added[token_id].special else gguf.TokenType.USER_DEFINED
            )
        else:
            tokens.append(by_id[token_id])
            token_types.append(gguf.TokenType.NORMAL)

    keys = {
        "tokenizer_model": "gpt2", "tokenizer_pre": PRE_TOKENIZER, "token_list": tokens,
        "token_types": [int(kind) for kind in token_types], "token_merges": _merges(spec["model"]["merges"]),
    }
    for kind in ("bos", "eos", "pad", "unk"):
        token_id = getattr(tokenizer, f"{kind}_token_id")
        if token_id is None and kind in ("bos", "eos", "pad"):
            token_id = _first(getattr(config, f"{kind}_token_id"))
        if token_id is not None:
            keys[f"{kind}_token_id"] = token_id
    sample = list(tokenizer("x")["input_ids"])
    keys["add_bos_token"] = adds_bos(tokenizer)
    keys["add_eos_token"] = tokenizer.eos_token_id is not None and sample[-1:] == [tokenizer.eos_token_id]
    chat_template = tokenizer.chat_template
    if isinstance(chat_template, dict):  # several named templates: GGUF stores them as a list
        chat_template = [{"name": name, "template": text} for name, text in chat_template.items()]
    if chat_template:
        keys["chat_template"] = chat_template
    return keys


def _check_byte_level_bpe(spec: dict) -> None:
    """llama.cpp's "gpt2" tokenizer with the "gpt-2" pre-tokenizer reproduces
    exactly this kind of tokenizer."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"its model is {model.get('type')!r}, not BPE")
    for flag in ("byte_fallback", "ignore_merges"):
        if model.get(flag):
            problems.append(f"it sets {flag}")
    for option in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(option):
            problems.append(f"it sets {option}={model[option]!r}")
    if spec.get("normalizer") is not None:
        problems.append(f"it has a {spec['normalizer'].get('type')} normalizer")
    if pre.get("type") != "ByteLevel":
        problems.append(f"its pre-tokenizer is {pre.get('type')!r}, not ByteLevel")
    elif pre.get("add_prefix_space") or not pre.get("use_regex", True):
        problems.append("its ByteLevel pre-tokenizer adds a prefix space or skips GPT-2's regex split")
    if problems:
        raise ValueError(
            "gguf: the tokenizer is not a byte-level BPE that llama.cpp's GPT-2 pre-tokenizer reproduces "
            f"({'; '.join(problems)}); only tokenizers like those hf_tinytx.tokenization trains convert."
        )


def _merges(merges: list) -> list[str]:
    """GGUF stores a merge as "left right"; tokenizers writes ["left", "right"]
    (or that string in older files)."""
    pairs = [merge.split(" ") if isinstance(merge, str) else list(merge) for merge in merges]
    for pair in pairs:
        if len(pair) != 2 or any(" " in part for part in pair):
            raise ValueError(
                f"gguf: the merge {pair!r} has a space, which GGUF's 'left right' merges cannot hold."
            )
    return [f"{left} {right}" for left, right in pairs]


def _load_tokenizer(source: Path, files: list[str]) -> PreTrainedTokenizerFast:
    if "tokenizer.json" not in files:
        raise FileNotFoundError(
            f"gguf: {str(source)!r} has no tokenizer.json; a GGUF file holds the tokenizer too, so save it "
            "into the folder first (tokenizer.save_pretrained(folder))."
        )
    tokenizer = AutoTokenizer.from_pretrained(source)
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(
            f"gguf: {str(source)!r} holds a slow tokenizer; only fast (tokenizer.json) ones convert."
        )
    return tokenizer


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) and value else value


# ---- the file ----


def _check_destination_file(destination: Path, overwrite: bool) -> None:
    if destination.suffix != ".gguf":
        raise ValueError(
            f"gguf: the destination must be a file name ending in .gguf, got {str(destination)!r}."
        )
    if destination.is_dir():
        raise IsADirectoryError(
            f"gguf: destination {str(destination)!r} is a folder; name a file ending in .gguf."
        )
    if destination.exists() and not destination.is_file():
        raise FileExistsError(
            f"gguf: destination {str(destination)!r} is not a regular file; name a file instead."
        )
    if destination.exists() and not overwrite:
        raise FileExistsError(
            f"gguf: destination {str(destination)!r} exists; pass --overwrite to replace it."
        )


def _write_atomically(writer: gguf.GGUFWriter, destination: Path) -> None:
    """Writes under a temporary name beside `destination`, then renames it
    over: never a half-written .gguf."""
    created = folders.folders_to_create(destination.parent)  # removed again if the write fails
    destination.parent.mkdir(parents=True, exist_ok=True)
    staged = destination.with_name(f".{destination.name}{folders.STAGING_NAME}")
    try:
        folders.open_new(staged, "wb").close()  # never through a link planted at the name
        writer.write_header_to_file(path=staged)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        os.replace(staged, destination)
        folders.fsync_dir(destination.parent)
    except BaseException as error:
        # Asked before the partial file gives its space back: numpy reports a full disk without an errno.
        full = isinstance(error, Exception) and folders.is_disk_full(error, staged.parent)
        writer.close()
        staged.unlink(missing_ok=True)
        folders.remove_created(created)
        if full:
            existing = next(folder for folder in destination.parents if folder.exists())
            free = folders.mib(shutil.disk_usage(existing).free)
            raise folders.DiskFullError(
                f"gguf: the disk is full while writing {destination} ({free} free once the partial file was "
                "removed); nothing was changed: free some space and run the same command again."
            ) from None
        raise
