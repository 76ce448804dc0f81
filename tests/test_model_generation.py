"""Generation: the key/value cache, padding, static cache, compilation, sampling, attention weights and continuous
batching all give the tokens that plain full-recompute decoding gives."""

import pytest
import torch
from transformers import ContinuousBatchingConfig, GenerationConfig


def greedy(model, input_ids, max_new_tokens, **kwargs):
    """`generate` without an end-of-sequence token, so every call yields exactly `max_new_tokens` tokens."""
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=model.config.pad_token_id
    )
    return model.generate(input_ids, generation_config=config, **kwargs)


def prompts(vocab_size, lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (length,), generator=generator).tolist() for length in lengths]


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_cached_greedy_equals_full_recompute(tiny_model, attn_implementation):
    model = tiny_model(attn_implementation=attn_implementation)
    input_ids = torch.tensor(prompts(model.config.vocab_size, [5]))
    with torch.no_grad():
        cached = greedy(model, input_ids, max_new_tokens=32)
        recomputed = input_ids
        for _ in range(32):
            next_token = model(recomputed, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            recomputed = torch.cat([recomputed, next_token], dim=-1)
    assert cached.shape == (1, 5 + 32)
    assert torch.equal(cached, recomputed)
    assert len(set(cached[0, 5:].tolist())) > 1, "degenerate test: the model repeats a single token"


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_left_padded_batch_equals_each_prompt_alone(tiny_model, attn_implementation):
    model = tiny_model(attn_implementation=attn_implementation)
    pad = model.config.pad_token_id
    batch_prompts = prompts(model.config.vocab_size, [3, 8, 5])
    width = max(map(len, batch_prompts))
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch_prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch_prompts])
    batched = greedy(model, input_ids, max_new_tokens=12, attention_mask=attention_mask)
    for row, prompt in enumerate(batch_prompts):
        alone = greedy(model, torch.tensor([prompt]), max_new_tokens=12)
        assert batched[row, width:].tolist() == alone[0, len(prompt) :].tolist(), f"prompt {row} changed by padding"


def test_static_cache_equals_dynamic(tiny_model):
    model = tiny_model(attn_implementation="sdpa")
    input_ids = torch.tensor(prompts(model.config.vocab_size, [6, 6]))
    dynamic = greedy(model, input_ids, max_new_tokens=16)
    static = greedy(model, input_ids, max_new_tokens=16, cache_implementation="static")
    assert torch.equal(static, dynamic)


def test_seeded_sampling_is_reproducible(tiny_model):
    model = tiny_model(attn_implementation="sdpa")
    input_ids = torch.tensor(prompts(model.config.vocab_size, [4]))
    config = GenerationConfig(
        max_new_tokens=20, do_sample=True, temperature=1.5, top_k=0, eos_token_id=None, pad_token_id=0
    )

    def sample(seed):
        torch.manual_seed(seed)
        return model.generate(input_ids, generation_config=config)

    first = sample(1234)
    assert torch.equal(first, sample(1234))
    assert any(not torch.equal(first, sample(seed)) for seed in (1, 2, 3)), "sampling ignores the seed"


def test_eager_attention_weights_are_causal_and_normalised(tiny_model):
    model = tiny_model(attn_implementation="eager")
    input_ids = torch.tensor(prompts(model.config.vocab_size, [9, 9]))
    with torch.no_grad():
        outputs = model(input_ids, output_attentions=True)
    assert len(outputs.attentions) == model.config.num_hidden_layers
    upper = torch.triu(torch.ones(9, 9, dtype=torch.bool), diagonal=1)
    for weights in outputs.attentions:
        assert weights.shape == (2, model.config.num_attention_heads, 9, 9)
        assert torch.all(weights[..., upper] == 0), "a position attends to its future"
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, model.config.num_attention_heads, 9))
        assert (weights[..., ~upper] > 0).all()


@pytest.mark.parametrize("attn_implementation", [
    "sdpa", "eager",  # generate_batch switches an eager model to paged|eager
    pytest.param("paged|sdpa", marks=pytest.mark.filterwarnings("ignore::FutureWarning")),  # before 5.19; warns now
])
def test_continuous_batching_equals_generate(tiny_model, attn_implementation):
    model = tiny_model(attn_implementation=attn_implementation)
    batch_prompts = prompts(model.config.vocab_size, [4, 3, 7])
    config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # Sized for this toy workload: left to itself the manager sizes its page pool from free GPU memory, which on CPU
    # makes it allocate (and scan) far more than three short requests need.
    cb_config = ContinuousBatchingConfig(num_blocks=16, page_size=16, max_batch_tokens=64)
    results = model.generate_batch(
        batch_prompts, generation_config=config, continuous_batching_config=cb_config, warmup=False
    )
    assert len(results) == len(batch_prompts)

    model.set_attn_implementation("sdpa")
    for prompt, result in zip(batch_prompts, results.values()):  # results come back in the order of the inputs
        assert result.prompt_ids == prompt
        expected = greedy(model, torch.tensor([prompt]), max_new_tokens=10)[0, len(prompt) :].tolist()
        assert result.generated_tokens == expected
