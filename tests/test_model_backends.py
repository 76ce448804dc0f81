"""The eager and sdpa attention backends compute the same function (fp32, within 1e-5)."""

import pytest
import torch


@pytest.mark.parametrize("with_padding", [False, True])
@pytest.mark.parametrize("num_key_value_heads", [4, 2, 1])  # multi-head, grouped-query, multi-query
def test_eager_matches_sdpa(tiny_model, with_padding, num_key_value_heads):
    eager = tiny_model(attn_implementation="eager", num_key_value_heads=num_key_value_heads)
    sdpa = tiny_model(attn_implementation="sdpa", num_key_value_heads=num_key_value_heads)
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    assert all(torch.equal(a, b) for a, b in zip(eager.state_dict().values(), sdpa.state_dict().values()))

    input_ids = torch.randint(3, eager.config.vocab_size, (3, 10), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    if with_padding:
        attention_mask[0, :4] = 0  # left padding
        attention_mask[1, -3:] = 0  # right padding
        input_ids = input_ids.masked_fill(attention_mask == 0, eager.config.pad_token_id)
    with torch.no_grad():
        eager_logits = eager(input_ids, attention_mask=attention_mask).logits
        sdpa_logits = sdpa(input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    assert torch.isfinite(eager_logits[real]).all()
    torch.testing.assert_close(sdpa_logits[real], eager_logits[real], atol=1e-5, rtol=1e-5)
