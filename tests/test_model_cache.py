"""The key/value cache (transformers' `DynamicCache`): assisted decoding crops it, beam search reorders it, a loss
forward builds none, and gradients flow through it; each gives what decoding without a cache gives."""

import torch
from transformers import GenerationConfig


def generate(model, input_ids, **kwargs):
    config = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=model.config.pad_token_id, **kwargs)
    return model.generate(input_ids, generation_config=config, return_dict_in_generate=True)


def test_assisted_decoding_with_cropping_equals_greedy(tiny_model):
    model = tiny_model(attn_implementation="sdpa")
    assistant = tiny_model(seed=1, attn_implementation="sdpa")  # a different model: most drafts get rejected
    input_ids = torch.tensor([[5, 9, 11, 4]])
    with torch.no_grad():
        plain = generate(model, input_ids, max_new_tokens=24).sequences
        assisted = model.generate(input_ids, assistant_model=assistant, max_new_tokens=24, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
    assert torch.equal(assisted, plain)


def test_beam_search_with_the_cache_equals_beam_search_without_it(tiny_model):
    model = tiny_model(attn_implementation="sdpa")
    input_ids = torch.tensor([[5, 9, 11, 4], [7, 3, 8, 8]])
    kwargs = dict(num_beams=3, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(input_ids, **kwargs)
        recomputed = model.generate(input_ids, use_cache=False, **kwargs)
    assert cached.shape == (2, 4 + 12)
    assert torch.equal(cached, recomputed)


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
    """Two forwards through one cache, then backward through both (fine-tuning with a prefix, for instance)."""
    model = tiny_model()
    model.train()
    first = model(torch.tensor([[5, 6, 7]]), use_cache=True)
    cache = getattr(first, "cache", None) or getattr(first, "past_key_values", None)
    second = model(torch.tensor([[8, 9]]), cache=cache, use_cache=True)
    (first.logits.sum() + second.logits.sum()).backward()
    assert model.model.layers[0].self_attn.k_proj.weight.grad is not None


def test_the_old_cache_name_still_works_and_warns_where_cache_is_current(tiny_model):
    """`past_key_values=` (older code, PEFT's prefix tuning) gives what `cache=` gives, for the base model and the
    LM; it warns as Llama's forward does where transformers names the argument `cache` (5.24 on), not before."""
    import dataclasses
    import warnings

    from transformers.modeling_outputs import BaseModelOutputWithPast

    model = tiny_model()
    prompt, step = torch.tensor([[5, 6, 7]]), torch.tensor([[8]])
    current = "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)}
    for module in (model, model.model):
        results = []
        for name in ("cache", "past_key_values"):
            first = module(prompt, use_cache=True)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = module(step, use_cache=True, **{name: getattr(first, "cache", None) or first.past_key_values})
            deprecations = [w for w in caught if "`past_key_values` is deprecated" in str(w.message)]
            assert len(deprecations) == (1 if current and name == "past_key_values" else 0), caught
            results.append(out.logits if module is model else out.last_hidden_state)
        assert torch.equal(*results)
