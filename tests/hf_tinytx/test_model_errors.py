"""Bad input fails early with a ValueError that names the problem, never deep inside a forward pass."""

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM


BAD_CONFIGS = [
    # (overrides, a word the message must contain)
    ({"hidden_size": 30}, "hidden_size"),  # 4 heads do not divide 30
    ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 3 kv heads cannot serve 4 query heads
    ({"vocab_size": 0}, "vocab_size"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"intermediate_size": -8}, "intermediate_size"),
    ({"num_hidden_layers": -1}, "num_hidden_layers"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"hidden_act": "swishy"}, "hidden_act"),
    ({"mlp_type": "mixture"}, "mlp_type"),
    ({"attention_dropout": 1.0}, "attention_dropout"),
    ({"rope_parameters": {"rope_type": "spiral", "rope_theta": 10000.0}}, "spiral"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}}, "low_freq_factor"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0}}, "short_factor"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 0.5}}, "factor"),
]


@pytest.mark.parametrize("overrides, field", BAD_CONFIGS, ids=[str(field) for _, field in BAD_CONFIGS])
def test_invalid_config_names_the_field(tiny_config, overrides, field):
    with pytest.raises(ValueError, match=field) as raised:
        tiny_config(**overrides)
    assert "rope_parameters" not in overrides or "rope_parameters" in str(raised.value)


@pytest.mark.parametrize("width, heads, nearest", [(48, 7, [3, 4, 6, 8]), (30, 4, [2, 3, 5, 6])])
def test_heads_that_do_not_divide_the_width_name_the_nearest_that_do(tiny_config, width, heads, nearest):
    with pytest.raises(ValueError, match=re.escape(f"pick a head count such as {nearest}.")):
        tiny_config(hidden_size=width, num_attention_heads=heads, num_key_value_heads=1)


@pytest.mark.parametrize("bad_id", [128, 1000, -1])
def test_token_ids_outside_the_vocabulary(tiny_model, bad_id):
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, bad_id, 7]])
    with pytest.raises(ValueError, match="vocab_size=128"):
        model(input_ids)
    model(input_ids.clamp(0, 127))  # the same call with valid ids runs


def test_token_ids_off_the_cpu_are_not_read_back(tiny_model):
    """Reading the ids' bounds back from an accelerator would stall every step; there the
    embedding's own device-side assert catches a bad id. "meta" stands in for an
    accelerator: any read of its values raises."""
    model = tiny_model()
    model.model._check_token_ids(torch.tensor([[5, 1000]], device="meta"))
    with pytest.raises(ValueError, match="vocab_size=128"):
        model.model._check_token_ids(torch.tensor([[5, 1000]]))  # the same ids on the CPU are refused


def test_empty_input_ids_name_the_fix(tiny_model):
    model = tiny_model()
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    with pytest.raises(
        ValueError, match=r"`input_ids` is empty \(shape \(1, 0\)\).*torch.tensor\(\[\[1\]\]\)"
    ):
        model.generate(torch.zeros(1, 0, dtype=torch.long), **kwargs)
    with pytest.raises(ValueError, match="is empty"):
        model(torch.zeros(1, 0, dtype=torch.long))
    # the fix runs
    assert model.generate(torch.tensor([[model.config.bos_token_id]]), **kwargs).shape == (1, 4)


@pytest.mark.parametrize("mask_shape", [(3, 8), (2, 5), (2, 11), (8,), (2, 8, 8)],
                         ids=["wrong-batch", "too-short", "too-long", "1d", "3d"])
def test_attention_mask_of_the_wrong_shape(tiny_model, mask_shape):
    model = tiny_model()
    input_ids = torch.randint(3, 128, (2, 8))
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids, attention_mask=torch.ones(mask_shape, dtype=torch.long))
    model(input_ids, attention_mask=torch.ones(2, 8, dtype=torch.long))  # the right shape runs


def test_mask_must_cover_the_cached_tokens(tiny_model):
    model = tiny_model()
    input_ids = torch.randint(3, 128, (1, 6))
    with torch.no_grad():
        cache = model(input_ids[:, :4], use_cache=True).cache
        with pytest.raises(ValueError, match=r"\(1, 6\)"):
            model(input_ids[:, 4:], cache=cache, attention_mask=torch.ones(1, 2, dtype=torch.long))


def test_truncated_safetensors_raises_a_clear_error(tiny_model, tmp_path: Path):
    tiny_model().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    # transformers lets safetensors' own error through; it names the corruption, though not the file's path.
    with pytest.raises(SafetensorError, match="(?i)incomplete|deserializ|header"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


# RoPE values transformers lets through (it checks which keys a type needs, and only warns about a factor
# below 1): (rope_parameters, the message's field, its allowed range, the value as written back).
BAD_ROPE_VALUES = [
    ({"rope_type": "default", "rope_theta": float("inf")}, "['rope_theta']", "finite number > 1", "inf"),
    ({"rope_type": "default", "rope_theta": 1e-30}, "['rope_theta']", "finite number > 1", "1e-30"),
    ({"rope_type": "default", "rope_theta": 0.0}, "['rope_theta']", "finite number > 1", "0.0"),
    ({"rope_type": "default", "rope_theta": -1e4}, "['rope_theta']", "finite number > 1", "-10000.0"),
    ({"rope_type": "default", "rope_theta": float("nan")}, "['rope_theta']", "finite number > 1", "nan"),
    ({"rope_type": "linear", "rope_theta": 1e4, "factor": 1e30}, "['factor']", "in [1, 1024]", "1e+30"),
    ({"rope_type": "linear", "rope_theta": 1e4, "factor": float("inf")}, "['factor']", "in [1, 1024]", "inf"),
    ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 0.0}, "['factor']", "in [1, 1024]", "0.0"),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": -2.0}, "['factor']", "in [1, 1024]", "-2.0"),
    (
        {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.0}, "partial_rotary_factor",
        "be 1.0", "0.0",
    ),
    (
        {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 3}, "partial_rotary_factor",
        "be 1.0", "3",
    ),
    (
        {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}, "partial_rotary_factor",
        "be 1.0", "0.5",
    ),
]


@pytest.mark.parametrize("rope, field, allowed, value", BAD_ROPE_VALUES,
                         ids=[f"{field}={value}" for _, field, _, value in BAD_ROPE_VALUES])
def test_rope_values_outside_their_range_are_refused(
    tiny_config, tmp_path: Path, rope, field, allowed, value
):
    """Built in code or loaded from a config.json, the message names the field,
    the allowed range and the value."""
    from transformers import AutoConfig

    with pytest.raises(ValueError) as built:
        tiny_config(rope_parameters=dict(rope))
    message = str(built.value)
    assert (
        field in message and allowed in message and re.search(rf"got {re.escape(value)}[.;]", message)
    ), message
    good = tiny_config()
    good.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "rope_parameters": rope}))
    with pytest.raises(ValueError, match=re.escape(field)):
        AutoConfig.from_pretrained(tmp_path)


def test_rope_values_at_the_edges_of_their_range_are_kept(tiny_config):
    kept = tiny_config(rope_parameters={"rope_type": "linear", "rope_theta": 1.5, "factor": 1024},
                       partial_rotary_factor=1.0)
    assert kept.rope_parameters == {"rope_type": "linear", "rope_theta": 1.5, "factor": 1024,
                                    "partial_rotary_factor": 1.0}
    assert (
        tiny_config(
            rope_parameters={"rope_type": "linear", "rope_theta": 5e5, "factor": 1.0}
        ).rope_parameters["factor"]
        == 1.0
    )


def test_legacy_top_level_rope_keys_are_checked_too(tiny_config):
    """`rope_theta` and `partial_rotary_factor` beside the other fields (as older configs store them)."""
    with pytest.raises(
        ValueError, match=r"`rope_parameters\['rope_theta'\]` must be a finite number > 1.*got inf\."
    ):
        tiny_config(rope_theta=float("inf"))
    with pytest.raises(ValueError, match=r"`partial_rotary_factor` must be 1\.0 .*got 0\.25;"):
        tiny_config(partial_rotary_factor=0.25)
    assert tiny_config(rope_theta=5e5).rope_parameters == {"rope_type": "default", "rope_theta": 5e5}


def test_one_dimensional_input_ids_say_to_add_a_batch_dimension(tiny_model):
    model = tiny_model()
    ids = torch.tensor([5, 6, 7])
    expected = (
        r"`input_ids` must be 2-D \(batch, sequence\), got shape \(3,\); add a batch dimension.*ids\[None\]"
    )
    with pytest.raises(ValueError, match=expected):
        model(ids)
    with pytest.raises(ValueError, match=r"`inputs_embeds` must be 3-D .*got shape \(3, 32\)"):
        model(inputs_embeds=torch.zeros(3, 32))
    assert model(ids[None]).logits.shape == (1, 3, 128)  # the fix runs
    assert model(ids.unsqueeze(0)).logits.shape == (1, 3, 128)


def test_a_forward_past_max_position_embeddings_warns_once_and_changes_nothing(tiny_model, caplog):
    short = tiny_model(max_position_embeddings=16)
    # the same weights (same seed); RoPE does not read the limit
    long = tiny_model(max_position_embeddings=64)
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING), torch.no_grad():
        within = short(ids[:, :16]).logits
        assert not caplog.records  # 16 tokens of 16: no warning
        logits = short(ids).logits
        short(ids)
        # A generation that crosses the limit token by token: one warning in all, not one per new length.
        short.generate(ids[:, :14], max_new_tokens=6, do_sample=False, pad_token_id=0)
        reference = long(ids).logits
    ours = [record for record in caplog.records if record.name.endswith("modeling_tinytx")]
    assert [record.getMessage() for record in ours] == [
        "TinyTxModel: a sequence of 40 tokens is longer than max_position_embeddings=16, the longest this "
        "model is configured for; positions past 16 extrapolate RoPE and the outputs there may degrade (a "
        "RoPE scaling type in `rope_parameters` extends the context)."
    ]
    assert torch.equal(logits, reference)
    assert torch.equal(within, logits[:, :16])


def test_generation_crossing_the_limit_warns_once_with_the_length_it_reached(tiny_model, caplog):
    model = tiny_model(max_position_embeddings=16)
    ids = torch.randint(3, 128, (1, 14), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING):
        model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    ours = [record.getMessage() for record in caplog.records if record.name.endswith("modeling_tinytx")]
    assert len(ours) == 1 and ours[0].startswith("TinyTxModel: a sequence of 17 tokens is longer than "
                                                "max_position_embeddings=16"), ours


UNIT_PLAN = {
    "model.layers.*.self_attn.q_proj": "unit_colwise", "model.layers.*.self_attn.k_proj": "unit_colwise",
    "model.layers.*.self_attn.v_proj": "unit_colwise", "model.layers.*.self_attn.o_proj": "unit_rowwise",
}


@pytest.mark.parametrize("plan, refused", [("auto", True), ({}, False), (UNIT_PLAN, False),
                                           ({"model.layers.*.self_attn.v_proj": "colwise_rep"}, True)],
                         ids=["auto", "no-tp", "unit", "v-even"])
def test_the_tensor_parallel_heads_check_follows_the_plan_in_use(tiny_config, plan, refused):
    """3 key/value heads over 2 ranks: refused where the plan splits them evenly by columns, kept
    where transformers' unit_colwise/unit_rowwise share a head across ranks (transformers 5.25's
    common TP test) or no TP rule applies."""
    from transformers import DistributedConfig

    from hf_tinytx import TinyTxForCausalLM

    config = tiny_config(hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    config.distributed_config = DistributedConfig(tp_size=2, tp_plan=plan)
    if refused:
        with pytest.raises(ValueError, match=r"needs num_key_value_heads \(3\) to be divisible by 2"):
            TinyTxForCausalLM(config)
    else:
        TinyTxForCausalLM(config)
