"""The appending key/value cache (`TinyTxDynamicLayer`): what `generate` uses by default, and it must give exactly
what transformers' concatenating `DynamicLayer` gives, through growth, cropping, beam search and batch selection."""

import pytest
import torch
from transformers import DynamicCache, GenerationConfig
from transformers.cache_utils import DynamicLayer

from hf_tinytx.modeling_tinytx import TinyTxDynamicLayer


def plain_cache(model):
    """transformers' own DynamicCache, exactly as `generate` would build it for any other model."""
    cache = DynamicCache(config=model.config)
    assert all(type(layer) is DynamicLayer for layer in cache.layers)
    return cache


def generate(model, input_ids, **kwargs):
    config = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=model.config.pad_token_id, **kwargs)
    return model.generate(input_ids, generation_config=config, return_dict_in_generate=True)


def test_generate_uses_appending_layers_and_matches_concatenating_cache(tiny_model):
    # max_position_embeddings 600 so that decoding runs through two buffer reallocations (256 spare, then +25%).
    model = tiny_model(attn_implementation="sdpa", max_position_embeddings=600)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = generate(model, input_ids, max_new_tokens=560)
        config = GenerationConfig(do_sample=False, eos_token_id=None, max_new_tokens=560, pad_token_id=0)
        theirs = model.generate(input_ids, generation_config=config, cache=plain_cache(model))
    cache = ours.cache if hasattr(ours, "cache") else ours.past_key_values
    assert all(type(layer) is TinyTxDynamicLayer for layer in cache.layers)
    assert cache.get_seq_length() == 7 + 560 - 1  # the last token is sampled, never fed back
    assert cache.layers[0]._key_buffer.shape[-2] > cache.get_seq_length()  # grew, with room to spare
    assert torch.equal(ours.sequences, theirs)


def test_users_own_cache_is_left_alone(tiny_model):
    model = tiny_model()
    cache = plain_cache(model)
    input_ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        model.generate(input_ids, cache=cache, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert all(type(layer) is DynamicLayer for layer in cache.layers)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_layer_operations_equal_dynamic_layer(attn_implementation, tiny_model):
    """Crop (assisted decoding), reorder (beam search), select and repeat (contrastive search) keep both layers equal."""
    model = tiny_model(attn_implementation=attn_implementation)
    generator = torch.Generator().manual_seed(1)
    ours, theirs = TinyTxDynamicLayer(), DynamicLayer()

    def step(tokens):
        batch = ours.keys.shape[0] if ours.is_initialized else 3
        keys = torch.randn(batch, 2, tokens, 8, generator=generator)
        values = torch.randn(batch, 2, tokens, 8, generator=generator)
        got, expected = ours.update(keys, values), theirs.update(keys, values)
        for a, b in zip(got, expected):
            assert torch.equal(a, b)
        assert ours.get_seq_length() == theirs.get_seq_length()

    step(5)
    for _ in range(4):
        step(1)
    for layer in (ours, theirs):
        layer.crop(-3)
    step(2)  # overwrites the cropped tokens in place
    beams = torch.tensor([2, 0, 0])
    for layer in (ours, theirs):
        layer.reorder_cache(beams)
    step(1)  # adopted into a fresh buffer
    for layer in (ours, theirs):
        layer.batch_select_indices(torch.tensor([0, 2]))
    step(300)  # outgrows the buffer
    for layer in (ours, theirs):
        layer.batch_repeat_interleave(2)
    step(1)
    assert ours.keys.shape == (4, 2, 5 + 4 - 3 + 2 + 1 + 300 + 1, 8)


def test_assisted_decoding_with_cropping_equals_greedy(tiny_model):
    model = tiny_model(attn_implementation="sdpa")
    assistant = tiny_model(seed=1, attn_implementation="sdpa")  # a different model: most drafts get rejected
    input_ids = torch.tensor([[5, 9, 11, 4]])
    with torch.no_grad():
        plain = generate(model, input_ids, max_new_tokens=24).sequences
        assisted = model.generate(input_ids, assistant_model=assistant, max_new_tokens=24, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)  # fmt: skip
    assert torch.equal(assisted, plain)


def test_beam_search_equals_concatenating_cache(tiny_model):
    model = tiny_model(attn_implementation="sdpa")
    input_ids = torch.tensor([[5, 9, 11, 4], [7, 3, 8, 8]])
    kwargs = dict(num_beams=3, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        ours = model.generate(input_ids, **kwargs)
        theirs = model.generate(input_ids, cache=DynamicCache(), **kwargs)
    assert torch.equal(ours, theirs)


def test_loss_forward_builds_no_cache_unless_asked(tiny_model):
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, 7, 8]])
    output = model(input_ids, labels=input_ids)
    assert getattr(output, "cache", None) is None and getattr(output, "past_key_values", None) is None
    asked = model(input_ids, labels=input_ids, use_cache=True)
    cache = getattr(asked, "cache", None) or getattr(asked, "past_key_values", None)
    assert cache.get_seq_length() == 4
    assert torch.equal(asked.logits, output.logits)


def test_cache_built_with_gradients_still_backpropagates(tiny_model):
    """Two forwards through one cache, then backward through both: in-place appends would break autograd here."""
    model = tiny_model()
    model.train()
    first = model(torch.tensor([[5, 6, 7]]), use_cache=True)
    cache = getattr(first, "cache", None) or getattr(first, "past_key_values", None)
    second = model(torch.tensor([[8, 9]]), cache=cache, use_cache=True)
    (first.logits.sum() + second.logits.sum()).backward()
    assert model.model.layers[0].self_attn.k_proj.weight.grad is not None
