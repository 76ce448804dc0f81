# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Two claims about position, checked numerically on TinyTx's own attention code.

1. Without positions (cos = 1, sin = 0, no mask), shuffling the input tokens
   shuffles the outputs the same way.
2. With rotary positions, a score depends only on the distance: the rotated
   q_m . k_n equals q_{m+s} . k_{n+s}.

Each check also measures a contrast where the property must fail, so it cannot pass by computing a constant.
"""

from dataclasses import dataclass

import torch

from hf_tinytx.configuration_tinytx import TinyTxConfig
from hf_tinytx.modeling_tinytx import TinyTxAttention, TinyTxRotaryEmbedding, apply_rotary_pos_emb


@dataclass(frozen=True)
class PositionCheck:
    max_error: float  # should be ~0 (float32 rounding)
    contrast: float  # the same comparison where the property should not hold: clearly > 0


def _attention_layer(hidden_size: int, num_heads: int, seed: int) -> tuple[TinyTxAttention, TinyTxConfig]:
    config = TinyTxConfig(
        hidden_size=hidden_size, num_attention_heads=num_heads, intermediate_size=2 * hidden_size,
        num_hidden_layers=1, vocab_size=16,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    layer = TinyTxAttention(config, layer_idx=0).eval()
    for parameter in layer.parameters():  # N(0, 1/width): scores of order one, so the softmax is not flat
        torch.nn.init.normal_(parameter, std=hidden_size**-0.5)
    return layer, config


@torch.no_grad()
def permutation_check(n: int = 12, hidden_size: int = 64, num_heads: int = 4, seed: int = 0) -> PositionCheck:
    """max |attn(x[perm]) - attn(x)[perm]| with rotary off and no mask; contrast: the same with rotary on."""
    layer, config = _attention_layer(hidden_size, num_heads, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, n, hidden_size, generator=generator)
    perm = torch.randperm(n, generator=generator)
    while torch.equal(perm, torch.arange(n)):  # the identity would prove nothing
        perm = torch.randperm(n, generator=generator)
    head_dim = config.head_dim
    no_rotation = (torch.ones(1, n, head_dim), torch.zeros(1, n, head_dim))
    rotation = TinyTxRotaryEmbedding(config)(x, torch.arange(n)[None])

    def error(position_embeddings):
        out = layer(x, position_embeddings=position_embeddings, attention_mask=None)[0]
        out_of_shuffled = layer(x[:, perm], position_embeddings=position_embeddings, attention_mask=None)[0]
        return (out_of_shuffled - out[:, perm]).abs().max().item()

    return PositionCheck(max_error=error(no_rotation), contrast=error(rotation))


@torch.no_grad()
def rotary_separation_check(head_dim: int = 32, trials: int = 50, max_position: int = 1000,
                            seed: int = 0) -> PositionCheck:
    """max |q_m.k_n - q_{m+s}.k_{n+s}| over random q, k, m, n, s; contrast: |q_m.k_n - q_m.k_{n+s}|."""
    config = TinyTxConfig(hidden_size=head_dim, num_attention_heads=1, num_hidden_layers=1, vocab_size=16,
                          intermediate_size=head_dim, max_position_embeddings=2 * max_position)
    rotary = TinyTxRotaryEmbedding(config)
    generator = torch.Generator().manual_seed(seed)

    def score(q, k, m, n):
        cos, sin = rotary(q, torch.tensor([[m, n]]))
        pair = torch.stack([q, k])[None, None]  # (1, 1, 2, head_dim): position m for q, n for k
        q_rot, _ = apply_rotary_pos_emb(pair, pair, cos, sin)
        return (q_rot[0, 0, 0] @ q_rot[0, 0, 1]).item()

    errors, contrasts = [], []
    for _ in range(trials):
        q, k = torch.randn(2, head_dim, generator=generator)
        m, n, s = torch.randint(0, max_position, (3,), generator=generator).tolist()
        s = s or 1
        errors.append(abs(score(q, k, m, n) - score(q, k, m + s, n + s)))
        contrasts.append(abs(score(q, k, m, n) - score(q, k, m, n + s)))
    return PositionCheck(max_error=max(errors), contrast=sum(contrasts) / len(contrasts))


__all__ = ["PositionCheck", "permutation_check", "rotary_separation_check"]
