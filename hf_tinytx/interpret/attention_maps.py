# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Attention you can see: the weight every token gives every earlier token, per
layer and head, as labelled heatmaps.

Only the eager attention path writes its weights out (fused kernels such as SDPA never build the n x n table),
so the forward here always runs eagerly and the model's own setting is put back afterwards.
"""

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_tinytx.folders.safe import open_new
from hf_tinytx.probes import model_device


@dataclass
class AttentionMaps:
    """Attention weights of one text: `weights[layer, head, query, key]`, rows summing to one."""

    tokens: list[str]  # one readable label per position, e.g. "The", "␣animal"
    input_ids: list[int]
    weights: torch.Tensor  # (num_layers, num_heads, n, n), float32, on CPU


@contextlib.contextmanager
def eager_attention(model):
    """Runs the block with `attn_implementation="eager"` (the only path that
    returns weights), then restores it."""
    previous = getattr(model.config, "_attn_implementation", None)
    if previous == "eager":
        yield model
        return
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"{type(model).__name__} cannot switch to eager attention; load it with "
                         "`attn_implementation=\"eager\"` to read its attention weights.")
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        if previous is not None:
            model.set_attn_implementation(previous)


def token_labels(tokenizer, input_ids: list[int]) -> list[str]:
    """Each token decoded on its own, with a leading space shown as '␣' so that word starts stay visible."""
    labels = []
    for token_id in input_ids:
        text = tokenizer.decode([token_id])
        if text.startswith(" "):
            text = "␣" + text[1:]
        labels.append(text.replace("\n", "⏎") or repr(token_id))
    return labels


@torch.no_grad()
def attention_weights(model, input_ids: torch.Tensor) -> torch.Tensor:
    """(num_layers, batch, heads, n, n) attention weights of a causal LM for a batch of `input_ids`."""
    if input_ids.dim() != 2:
        raise ValueError(f"`input_ids` must be 2D (batch, tokens), got shape {tuple(input_ids.shape)}.")
    was_training = model.training
    model.eval()
    try:
        with eager_attention(model):
            output = model(
                input_ids=input_ids.to(model_device(model)), output_attentions=True, use_cache=False
            )
    finally:
        model.train(was_training)
    attentions = getattr(output, "attentions", None)
    if not attentions or any(a is None for a in attentions):
        raise ValueError(f"{type(model).__name__} returned no attention weights; it must support "
                         "`output_attentions=True` with eager attention (TinyTx and Llama-style models do).")
    return torch.stack([a.detach().float().cpu() for a in attentions])


def attention_maps(model, tokenizer, text: str) -> AttentionMaps:
    """The attention maps of `text`, tokenized as the model sees it (with the
    tokenizer's BOS if it adds one)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"`text` must be a non-empty string, got {text!r}.")
    input_ids = list(tokenizer(text)["input_ids"])
    if not input_ids:
        raise ValueError(f"The tokenizer turned {text!r} into no tokens at all.")
    weights = attention_weights(model, torch.tensor([input_ids]))[:, 0]
    return AttentionMaps(tokens=token_labels(tokenizer, input_ids), input_ids=input_ids, weights=weights)


def _new_figure(size_inches, dpi: int):
    """A bare matplotlib Figure: it draws without a display and leaves pyplot
    (and the user's session) alone."""
    try:
        import matplotlib  # noqa: F401  (the package first: its submodule may be cached while it is missing)
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "Drawing attention maps needs matplotlib, which hf_tinytx does not install by itself: `pip "
            "install matplotlib`."
        ) from error
    return Figure(figsize=size_inches, dpi=dpi)


def default_size_inches(num_tokens: int) -> tuple[float, float]:
    """Room for every label: about a fifth of an inch per token, never smaller than 4 inches."""
    side = max(4.0, 1.5 + 0.22 * num_tokens)
    return (side + 1.0, side)  # the extra inch on the right is for the colour bar


def render_attention_map(weights, tokens: list[str], title: str = "", size_inches=None, dpi: int = 100):
    """A heatmap of one head: queries (the token looking) down the side, keys (the token looked at) along the
    bottom, every token labelled. Returns the matplotlib Figure; save it with `fig.savefig(path, dpi=dpi)`."""
    weights = torch.as_tensor(weights, dtype=torch.float32).cpu()
    n = len(tokens)
    if weights.shape != (n, n):
        raise ValueError(f"`weights` must be ({n}, {n}) for {n} tokens, got {tuple(weights.shape)}.")
    fig = _new_figure(size_inches or default_size_inches(n), dpi)
    ax = fig.subplots()
    image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks(range(n), labels=tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(n), labels=tokens, fontsize=8)
    ax.set_xlabel("looked at (key)")
    ax.set_ylabel("looking (query)")
    if title:
        ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    fig.tight_layout()
    return fig


def save_attention_maps(maps: AttentionMaps, out_dir, layers=None, heads=None, dpi: int = 100) -> list[Path]:
    """One PNG per layer and head, `layer{L}_head{H}.png`, in `out_dir`, each `default_size_inches(n) * dpi`
    pixels; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_layers, num_heads = maps.weights.shape[:2]
    paths = []
    for layer in range(num_layers) if layers is None else layers:
        for head in range(num_heads) if heads is None else heads:
            if not (0 <= layer < num_layers and 0 <= head < num_heads):
                raise ValueError(
                    f"No layer {layer} head {head}: the model has {num_layers} layers of {num_heads} heads."
                )
            fig = render_attention_map(
                maps.weights[layer, head], maps.tokens, f"layer {layer}, head {head}", dpi=dpi
            )
            path = out_dir / f"layer{layer}_head{head}.png"
            with open_new(path, "wb") as f:  # a link at the name is replaced, never written through
                fig.savefig(f, format="png", dpi=dpi)
            paths.append(path)
    return paths


__all__ = ["AttentionMaps", "attention_maps", "attention_weights", "default_size_inches", "eager_attention",
           "render_attention_map", "save_attention_maps", "token_labels"]
