"""Rotary position embeddings: only relative positions matter, and every scaling type builds and runs."""

import pytest
import torch


@pytest.mark.parametrize("shift", [1, 37, 500])
def test_shifting_all_positions_leaves_logits_unchanged(tiny_model, shift):
    # RoPE makes q_m . k_n depend on m - n only, so adding a constant to every position changes nothing.
    model = tiny_model(attn_implementation="sdpa", max_position_embeddings=1024)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(16).unsqueeze(0).expand(2, -1)
    with torch.no_grad():
        reference = model(input_ids, position_ids=positions, use_cache=False).logits
        shifted = model(input_ids, position_ids=positions + shift, use_cache=False).logits
    torch.testing.assert_close(shifted, reference, atol=1e-4, rtol=1e-4)
    # Teeth: a position change that is not a constant shift does change the logits.
    with torch.no_grad():
        spread = model(input_ids, position_ids=positions * 2, use_cache=False).logits
    assert not torch.allclose(spread, reference, atol=1e-4, rtol=1e-4)


ROPE_SCALINGS = {
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 2.0, "original_max_position_embeddings": 16},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("rope_type", sorted(ROPE_SCALINGS))
def test_rope_scaling_types_build_and_change_positions(tiny_model, rope_type):
    rope_parameters = {"rope_type": rope_type, "rope_theta": 10000.0, **ROPE_SCALINGS[rope_type]}
    # max_position_embeddings=16 and 24 tokens: "dynamic" only rescales once the input outgrows the trained length.
    scaled = tiny_model(max_position_embeddings=16, rope_parameters=rope_parameters)
    plain = tiny_model(max_position_embeddings=16)
    assert scaled.config.rope_parameters["rope_type"] == rope_type
    assert scaled.model.rotary_emb.rope_type == rope_type
    input_ids = torch.randint(3, scaled.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        scaled_logits = scaled(input_ids, use_cache=False).logits
        plain_logits = plain(input_ids, use_cache=False).logits
    assert scaled_logits.shape == (1, 24, scaled.config.vocab_size)
    assert torch.isfinite(scaled_logits).all()
    assert not torch.allclose(scaled_logits, plain_logits), f"{rope_type} scaling changed nothing"


@pytest.mark.parametrize("rope_type", ["default", "llama3"])
def test_rotation_is_bit_for_bit_llamas(rope_type):
    """TinyTx folds the rotation's signs into its sin table and rolls instead of rotate_half: the same numbers."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply

    from hf_tinytx.modeling_tinytx import TinyTxRotaryEmbedding, apply_rotary_pos_emb
    from tests.helpers.tiny import build_tiny_config

    rope = {"rope_type": rope_type, "rope_theta": 10000.0}
    if rope_type == "llama3":
        rope.update(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32)
    config = build_tiny_config(rope_parameters=rope)
    llama_config = LlamaConfig(**{k: getattr(config, k) for k in ("hidden_size", "num_attention_heads",
                               "num_key_value_heads", "max_position_embeddings")}, rope_parameters=rope)
    positions = torch.arange(40)[None] * 3
    q, k = torch.randn(2, 1, 4, 40, config.head_dim).unbind(0)
    ours = apply_rotary_pos_emb(q, k, *TinyTxRotaryEmbedding(config)(q, positions))
    theirs = llama_apply(q, k, *LlamaRotaryEmbedding(llama_config)(q, positions))
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
