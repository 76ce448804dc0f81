"""Auto-class round trip: build through AutoConfig, save, and load back through every registered Auto class."""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

import hf_tinytx
from hf_tinytx import TinyTxForSequenceClassification


PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl"}


def test_auto_round_trip(tmp_path: Path):
    config = AutoConfig.for_model(
        "tinytx",
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )
    assert isinstance(config, hf_tinytx.TinyTxConfig)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    assert isinstance(model, hf_tinytx.TinyTxForCausalLM)
    model.save_pretrained(tmp_path)

    names = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "config.json", "configuration_tinytx.py", "modeling_tinytx.py"} <= names
    assert not [p for p in tmp_path.rglob("*") if p.suffix in PICKLE_SUFFIXES], "weights must be safetensors only"
    saved_config = AutoConfig.from_pretrained(tmp_path)
    assert saved_config.auto_map["AutoModelForCausalLM"] == "modeling_tinytx.TinyTxForCausalLM"
    assert saved_config.auto_map["AutoConfig"] == "configuration_tinytx.TinyTxConfig"

    input_ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, loaded(input_ids).logits)

    # The same folder serves the bare model and the classifier (its head is new, so it is initialised).
    base = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        hidden = base(input_ids).last_hidden_state
    assert hidden.shape == (2, 12, 32)
    assert torch.equal(base.embed_tokens.weight, model.model.embed_tokens.weight)

    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3).eval()
    assert isinstance(classifier, TinyTxForSequenceClassification)
    with torch.no_grad():
        assert classifier(input_ids).logits.shape == (2, 3)


def test_sequence_classification_reads_last_real_token(tiny_config):
    torch.manual_seed(0)
    model = TinyTxForSequenceClassification(tiny_config(num_labels=3)).eval()
    pad = model.config.pad_token_id
    short = torch.tensor([[5, 6, 7]])
    # Right padding: the pooled position is the last non-pad token, so padding must not change the logits.
    padded = torch.tensor([[5, 6, 7, pad, pad], [8, 9, 10, 11, 12]])
    mask = (padded != pad).long()
    with torch.no_grad():
        alone = model(short).logits
        batch = model(padded, attention_mask=mask).logits
    assert batch.shape == (2, 3)
    torch.testing.assert_close(batch[:1], alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(batch[0], batch[1])
