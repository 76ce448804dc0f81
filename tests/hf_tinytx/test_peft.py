"""PEFT treats TinyTx like a built-in model: LoRA trains, saves a safetensors adapter that reloads
and merges to the same logits; prompt and prefix tuning train and generate as Llama does;
checkpointing works with a frozen base."""

from pathlib import Path

import pytest
import torch
from peft import (
    AutoPeftModelForCausalLM,
    LoraConfig,
    PeftModel,
    PrefixTuningConfig,
    PromptTuningConfig,
    get_peft_model,
)
from transformers import AutoModelForCausalLM

import hf_tinytx
from hf_tinytx.convert import tinytx_to_llama


def token_batch(vocab_size, batch=2, seq_len=12, seed=0):
    return torch.randint(3, vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def train_steps(model, input_ids, steps=25, lr=1e-2):
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.fixture
def base_folder(tiny_model, tmp_path: Path):
    """A saved TinyTx folder, which PEFT's adapter_config.json points back to."""
    folder = tmp_path / "base"
    tiny_model(seed=0).save_pretrained(folder)
    return folder


def load_base(folder):
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")


@pytest.mark.parametrize("target_modules", [["q_proj", "v_proj", "down_proj"], "all-linear"],
                         ids=["named", "all-linear"])
def test_lora_trains_saves_reloads_and_merges(base_folder, tmp_path: Path, target_modules):
    model = get_peft_model(
        load_base(base_folder),
        LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=16, target_modules=target_modules),
    )
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable), "only the LoRA matrices may train"
    adapted = {name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    if target_modules == "all-linear":  # every projection, but never the output head
        assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    else:
        assert adapted == set(target_modules)

    input_ids = token_batch(model.config.vocab_size)
    model.train()
    losses = train_steps(model, input_ids, steps=30, lr=2e-2)
    assert losses[-1] < losses[0] - 0.3, losses  # a frozen 32-wide base learns slowly; this is ~3x the noise

    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not list(adapter.glob("*.bin")), "the adapter must be saved as safetensors only"

    model.eval()
    with torch.no_grad():
        expected = model(input_ids=input_ids).logits
        via_peft_model = PeftModel.from_pretrained(load_base(base_folder), adapter).eval()
        # AutoPeft reads the base folder from adapter_config.json and loads it
        # natively, since hf_tinytx is imported.
        via_auto = AutoPeftModelForCausalLM.from_pretrained(adapter, attn_implementation="eager").eval()
        assert type(via_auto.get_base_model()) is hf_tinytx.TinyTxForCausalLM
        for reloaded in (via_peft_model, via_auto):
            torch.testing.assert_close(reloaded(input_ids=input_ids).logits, expected, rtol=0, atol=1e-6)

        merged = via_auto.merge_and_unload()
        assert type(merged) is hf_tinytx.TinyTxForCausalLM
        assert not any("lora_" in name for name, _ in merged.named_parameters())
        torch.testing.assert_close(merged(input_ids=input_ids).logits, expected, rtol=0, atol=1e-5)
        base_logits = load_base(base_folder)(input_ids=input_ids).logits
        assert (base_logits - expected).abs().max() > 1e-2, "degenerate test: the adapter changed nothing"


@pytest.mark.parametrize(
    "make_config",
    [
        # virtual tokens: inputs_embeds
        lambda: PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
        # virtual keys/values: the cache
        lambda: PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
    ],
    ids=["prompt-tuning", "prefix-tuning"],
)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_prompt_and_prefix_tuning_train_and_generate_like_llama(tiny_model, make_config, attn_implementation):
    """TinyTx under prompt/prefix tuning gives what the same network as a LlamaForCausalLM
    gives, token for token (not a cache-free recomputation: `generate` and a forward place the
    virtual tokens differently for Llama too)."""
    tinytx = tiny_model(seed=0, attn_implementation=attn_implementation)
    llama = tinytx_to_llama(tinytx)
    input_ids = token_batch(tinytx.config.vocab_size)
    with torch.no_grad():
        base_logits = tinytx(input_ids=input_ids).logits

    runs = {}
    for name, base in (("tinytx", tinytx), ("llama", llama)):
        torch.manual_seed(3)  # the same virtual-token weights for both
        model = get_peft_model(base, make_config()).train()
        losses = train_steps(model, input_ids, steps=10, lr=3e-2)
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
            prompt = input_ids[:1, :5]
            generated = model.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                eos_token_id=None, output_scores=True, return_dict_in_generate=True,
            )
        runs[name] = (losses, logits, generated)

    losses, logits, generated = runs["tinytx"]
    assert losses[-1] < losses[0], losses
    assert (
        logits[:, -input_ids.shape[1] :] - base_logits
    ).abs().max() > 1e-3, "the virtual tokens had no effect"
    llama_losses, llama_logits, llama_generated = runs["llama"]
    assert losses == pytest.approx(llama_losses, abs=1e-5)
    torch.testing.assert_close(logits, llama_logits, rtol=0, atol=1e-5)
    assert generated.sequences.shape == (1, 5 + 8)
    assert generated.sequences.tolist() == llama_generated.sequences.tolist()
    for step, (ours, theirs) in enumerate(zip(generated.scores, llama_generated.scores)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5, msg=f"generation step {step}")


@pytest.mark.parametrize("enable", ["gradient_checkpointing_enable", "activation_checkpointing_enable"])
def test_checkpointing_with_a_frozen_base_sends_gradients_to_lora(tiny_model, enable):
    def lora_grads(checkpointing):
        base = tiny_model(seed=0, attn_implementation="eager")
        if checkpointing:
            base.enable_input_require_grads()  # the frozen embedding output must still carry a graph
            getattr(base, enable)(**{"gradient_checkpointing_kwargs" if "gradient" in enable else
                                     "activation_checkpointing_kwargs": {"use_reentrant": True}})
            assert all(layer.gradient_checkpointing for layer in base.model.layers)
        torch.manual_seed(1)
        model = get_peft_model(
            base, LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"])
        )
        # B starts at zero, which would leave A without a gradient: give B values so both get one.
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        model.train()
        input_ids = token_batch(model.config.vocab_size)
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        return {name: p.grad for name, p in model.named_parameters() if p.requires_grad}

    with_checkpointing = lora_grads(checkpointing=True)
    without = lora_grads(checkpointing=False)
    assert len(with_checkpointing) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    for name, grad in with_checkpointing.items():
        assert grad is not None and grad.abs().sum() > 0, f"no gradient reached {name}"
        torch.testing.assert_close(grad, without[name], rtol=1e-5, atol=1e-7, msg=name)
