"""Bad input fails early with a ValueError that names the problem, never deep inside a forward pass."""

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
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def test_rope_errors_name_rope_parameters(tiny_config):
    for rope_parameters in ({"rope_type": "spiral", "rope_theta": 1e4}, {"rope_type": "linear", "rope_theta": 1e4}):
        with pytest.raises(ValueError, match="rope_parameters"):
            tiny_config(rope_parameters=rope_parameters)


@pytest.mark.parametrize("bad_id", [128, 1000, -1])
def test_token_ids_outside_the_vocabulary(tiny_model, bad_id):
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, bad_id, 7]])
    with pytest.raises(ValueError, match="vocab_size=128"):
        model(input_ids)
    model(input_ids.clamp(0, 127))  # the same call with valid ids runs


def test_token_ids_off_the_cpu_are_not_read_back(tiny_model):
    """Reading the ids' bounds back from an accelerator would stall every step; there the embedding's own device-side
    assert catches a bad id. "meta" stands in for an accelerator: any read of its values raises."""
    model = tiny_model()
    model.model._check_token_ids(torch.tensor([[5, 1000]], device="meta"))
    with pytest.raises(ValueError, match="vocab_size=128"):
        model.model._check_token_ids(torch.tensor([[5, 1000]]))  # the same ids on the CPU are refused


def test_empty_input_ids_name_the_fix(tiny_model):
    model = tiny_model()
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    with pytest.raises(ValueError, match=r"`input_ids` is empty \(shape \(1, 0\)\).*torch.tensor\(\[\[1\]\]\)"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), **kwargs)
    with pytest.raises(ValueError, match="is empty"):
        model(torch.zeros(1, 0, dtype=torch.long))
    assert model.generate(torch.tensor([[model.config.bos_token_id]]), **kwargs).shape == (1, 4)  # the fix runs


@pytest.mark.parametrize(
    "mask_shape",
    [(3, 8), (2, 5), (2, 11), (8,), (2, 8, 8)],
    ids=["wrong-batch", "too-short", "too-long", "1d", "3d"],
)
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
