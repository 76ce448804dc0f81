"""A saved folder (tiny byte-level BPE tokenizer + tiny model) works in `pipeline("text-generation")`."""

from pathlib import Path

import torch
from transformers import AutoTokenizer, pipeline

import hf_tinytx


def test_text_generation_pipeline_from_a_folder(tiny_config, byte_bpe_tokenizer, tmp_path: Path):
    tokenizer = byte_bpe_tokenizer(vocab_size=300)
    assert len(tokenizer) == 300
    config = tiny_config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    hf_tinytx.TinyTxForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token == "<pad>"

    generator = pipeline("text-generation", model=str(tmp_path), device="cpu")
    assert isinstance(generator.model, hf_tinytx.TinyTxForCausalLM)
    prompt = "The quick brown fox"
    outputs = generator(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    text = outputs[0]["generated_text"]
    assert isinstance(text, str)
    assert text.startswith(prompt)
    assert len(text) > len(prompt)  # min_new_tokens keeps </s> from ending the text at once
