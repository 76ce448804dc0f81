"""Learning: the model trains, and the training-time features (checkpointing, autocast, loss normalisation,
logits_to_keep, hidden states, tied embeddings) compute what they promise."""

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForCausalLM

from hf_tinytx_training.model.cpu_training import (
    FP32_SDPA,
    CpuTrainingRMSNorm,
    _RMSNormFunction,
    speed_up_cpu_training,
)


def random_batch(model, batch=2, seq_len=16, seed=0):
    return torch.randint(
        3, model.config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True}, {"mlp_type": "plain", "hidden_act": "gelu"}],
                         ids=["gated-silu", "qk_norm", "plain-gelu"])
def test_adamw_overfits_a_tiny_batch(tiny_model, overrides):
    model = tiny_model(attn_implementation="sdpa", **overrides).train()
    if overrides.get("qk_norm"):
        assert hasattr(model.model.layers[0].self_attn, "q_norm")
    if overrides.get("mlp_type") == "plain":
        assert not hasattr(model.model.layers[0].mlp, "gate_proj")
    input_ids = random_batch(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(40):  # crosses the 90% line after ~20 steps
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], f"loss went from {losses[0]:.3f} to {losses[-1]:.3f}"


def test_cpu_rmsnorm_gradient_is_the_formulas():
    """The CPU speed path's hand-written RMSNorm backward is the derivative of torch's rms_norm."""
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    gain = (torch.rand(8, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, gain: _RMSNormFunction.apply(x, gain, 1e-6), (x, gain))

    norm = CpuTrainingRMSNorm(8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 2, 5, 8, requires_grad=True)  # a qk_norm shape: (batch, seq, heads, head_dim)
    grad = torch.randn(4, 2, 5, 8)
    out = norm(x)
    assert type(out.grad_fn).__name__ == "_RMSNormFunctionBackward"
    reference = nn.functional.rms_norm(x, (8,), norm.weight, eps=norm.variance_epsilon)
    torch.testing.assert_close(out, reference)
    expected = torch.autograd.grad(reference, (x, norm.weight), grad)
    for ours, theirs in zip(torch.autograd.grad(out, (x, norm.weight), grad), expected):
        torch.testing.assert_close(ours, theirs)
    norm.weight.requires_grad_(False)  # a frozen gain (LoRA fine-tuning): the input's gradient only
    torch.testing.assert_close(torch.autograd.grad(norm(x), (x,), grad)[0], expected[0])
    with torch.no_grad():  # decoding keeps torch's one call
        assert norm(x).grad_fn is None


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model):
    input_ids = random_batch(tiny_model())

    def gradients(checkpointing):
        model = tiny_model(attn_implementation="eager").train()
        if checkpointing:
            # `gradient_checkpointing_enable` is the pre-5.2x name of the same
            # switch (deprecated, still works).
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        # Count runs of a module inside the layer: a checkpointed layer runs its forward again during
        # backward. (A forward hook is no counter here: in torch 2.13 it did not fire on the replay.)
        calls, mlp = [], model.model.layers[0].mlp
        mlp_forward = mlp.forward
        mlp.forward = lambda x: calls.append(1) or mlp_forward(x)
        model(input_ids, labels=input_ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}, len(calls)

    plain, plain_calls = gradients(checkpointing=False)
    checkpointed, checkpointed_calls = gradients(checkpointing=True)
    # Checkpointing really happened: the layer's forward ran again during the backward pass.
    assert (plain_calls, checkpointed_calls) == (1, 2)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_cpu_speed_path_changes_no_weight_and_no_result(tiny_model, tmp_path):
    plain = tiny_model(attn_implementation="sdpa").train()
    fast = speed_up_cpu_training(tiny_model(attn_implementation="sdpa").train())
    fast.load_state_dict(plain.state_dict())
    norms = [type(m) for m in fast.modules() if "RMSNorm" in type(m).__name__]
    assert norms and set(norms) == {CpuTrainingRMSNorm} and fast.config._attn_implementation == FP32_SDPA
    input_ids = random_batch(plain)
    losses = [model(input_ids, labels=input_ids).loss for model in (plain, fast)]
    torch.testing.assert_close(losses[1], losses[0])
    grads = [
        torch.autograd.grad(loss, list(model.parameters())) for loss, model in zip(losses, (plain, fast))
    ]
    for ours, theirs in zip(grads[1], grads[0]):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    # What it saves loads as the plain model: same keys, and no trace of the speed path in config.json.
    fast.save_pretrained(tmp_path)
    assert FP32_SDPA not in (tmp_path / "config.json").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.state_dict().keys() == plain.state_dict().keys()


def test_bf16_autocast_on_cpu_trains(tiny_model, monkeypatch):
    seen = []  # what torch's attention received: with the CPU speed path, the attention itself stays in fp32
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(query, key, value, *args, **kwargs):
        seen.append(({query.dtype, key.dtype, value.dtype}, torch.is_autocast_enabled("cpu")))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    model = speed_up_cpu_training(tiny_model(attn_implementation="sdpa").train())
    input_ids = random_batch(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = model(input_ids, labels=input_ids)
    assert outputs.logits.dtype == torch.bfloat16  # autocast really ran the matmuls in bf16
    assert seen == [({torch.float32}, False)] * model.config.num_hidden_layers
    with torch.no_grad():
        fp32_loss = model(input_ids, labels=input_ids).loss
    torch.testing.assert_close(outputs.loss.float(), fp32_loss, atol=0.05, rtol=0.01)  # bf16 rounding only
    outputs.loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_num_items_in_batch_makes_gradient_accumulation_exact(tiny_model):
    model = tiny_model()
    input_ids = random_batch(model, batch=4, seq_len=12)
    labels = input_ids.clone()
    labels[0, :9] = -100  # uneven numbers of real targets per row: a plain mean of means would be wrong
    labels[2, 5:] = -100
    # Targets are shifted by one inside the loss: position t predicts token t + 1.
    num_items = int((labels[:, 1:] != -100).sum())

    with torch.no_grad():
        logits = model(input_ids).logits
        summed = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, model.config.vocab_size), labels[:, 1:].reshape(-1), reduction="sum"
        )
        loss = model(input_ids, labels=labels, num_items_in_batch=num_items).loss
        torch.testing.assert_close(loss, summed / num_items)

        # Two micro-batches with the global item count add up to the loss of the whole batch at once.
        full = model(input_ids, labels=labels).loss
        halves = sum(
            model(input_ids[rows], labels=labels[rows], num_items_in_batch=num_items).loss
            for rows in (slice(0, 1), slice(1, 4))
        )
        torch.testing.assert_close(halves, full)
        uneven_mean = (
            model(input_ids[:1], labels=labels[:1]).loss + model(input_ids[1:], labels=labels[1:]).loss
        ) / 2
        assert not torch.allclose(uneven_mean, full)  # without num_items_in_batch accumulation is biased


def test_logits_to_keep_and_hidden_states(tiny_model):
    model = tiny_model()
    input_ids = random_batch(model)
    with torch.no_grad():
        full = model(input_ids, output_hidden_states=True)
        last = model(input_ids, logits_to_keep=1).logits
        base = model.model(input_ids)
    assert last.shape == (2, 1, model.config.vocab_size)
    torch.testing.assert_close(last, full.logits[:, -1:])

    assert len(full.hidden_states) == model.config.num_hidden_layers + 1
    assert all(h.shape == (2, 16, model.config.hidden_size) for h in full.hidden_states)
    torch.testing.assert_close(full.hidden_states[0], model.model.embed_tokens(input_ids))
    torch.testing.assert_close(full.hidden_states[-1], base.last_hidden_state)


def test_tied_embeddings_share_storage_and_survive_save_load(tiny_model, tmp_path: Path):
    model = tiny_model(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied = tiny_model(tie_word_embeddings=False)
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()

    # Training one updates the other: they are one tensor.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    input_ids = random_batch(model)
    model(input_ids, labels=input_ids).loss.backward()
    optimizer.step()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # stored once
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids).logits, model.eval()(input_ids).logits)
