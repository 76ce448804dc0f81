"""TinyTx in the tools people deploy with: `pipeline("text-generation")` from a folder and
from a Hub id, chat messages, streaming and batched left-padded generation all give exactly
the text plain greedy `generate` gives."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from threading import Thread

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer, TextStreamer, pipeline

import hf_tinytx
from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model


GREEDY = {"max_new_tokens": 16, "do_sample": False}
# A minimal ChatML-like template: role markers as plain text, EOS closes each turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A saved TinyTx + tokenizer folder; wide initial weights, so greedy
    decoding does not repeat one token."""
    tokenizer = build_byte_bpe_tokenizer()
    model = build_tiny_model(seed=0, vocab_size=len(tokenizer), initializer_range=0.3)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    folder = tmp_path_factory.mktemp("pipelines") / "tinytx"
    model.save_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def generate_text(model, tokenizer, prompt: str) -> str:
    """What greedy `generate` writes after `prompt`, decoded the way the pipeline decodes it."""
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, **GREEDY)
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_pipeline_from_a_saved_folder(model_folder):
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    assert (
        len(tokenizer) == 300
        and tokenizer.pad_token == "<pad>"
        and (model_folder / "tokenizer.json").is_file()
    )
    generator = pipeline("text-generation", model=str(model_folder), device="cpu")
    assert isinstance(generator.model, hf_tinytx.TinyTxForCausalLM)
    prompt = "The quick brown fox"
    text = generator(prompt, return_full_text=False, **GREEDY)[0]["generated_text"]
    expected = generate_text(AutoModelForCausalLM.from_pretrained(model_folder), tokenizer, prompt)
    assert text == expected
    assert len(set(text)) > 3, f"degenerate test: the model wrote {text!r}"
    full = generator(prompt, **GREEDY)[0]["generated_text"]
    assert full == prompt + expected


def test_pipeline_from_a_hub_id(model_folder, local_hub, tmp_path: Path):
    """Upload the folder to the local Hub server, then build the pipeline from
    the repo id in a fresh process."""
    repo_id = f"{local_hub.user}/tinytx-pipeline"
    prompt = "A small model learns"
    code = textwrap.dedent(
        f"""
        import json
        from huggingface_hub import HfApi
        from transformers import pipeline
        import hf_tinytx

        api = HfApi()
        api.create_repo({repo_id!r})
        api.upload_folder(repo_id={repo_id!r}, folder_path={str(model_folder)!r})
        generator = pipeline("text-generation", model={repo_id!r})
        output = generator({prompt!r}, return_full_text=False, max_new_tokens=16, do_sample=False)
        print(json.dumps({{"text": output[0]["generated_text"], "class": type(generator.model).__name__}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_"))}
    env.update(local_hub.client_env(tmp_path / "hf_home"))
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"STDOUT:\n{result.stdout}\nSTDERR:\n{result.stderr}"
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["class"] == "TinyTxForCausalLM"
    assert "model.safetensors" in local_hub.repo_files(repo_id)
    local = generate_text(AutoModelForCausalLM.from_pretrained(model_folder),
                          AutoTokenizer.from_pretrained(model_folder), prompt)
    assert answer["text"] == local


def test_chat_messages_through_the_pipeline(model_folder):
    generator = pipeline("text-generation", model=str(model_folder))
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something about the dog."},
    ]
    conversation = generator(messages, **GREEDY)[0]["generated_text"]
    assert conversation[:2] == messages
    assert conversation[-1]["role"] == "assistant"

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert tokenizer.decode(inputs["input_ids"][0]).endswith("<|assistant|>\n")
    model = AutoModelForCausalLM.from_pretrained(model_folder)
    with torch.no_grad():
        output = model.generate(**inputs, **GREEDY)
    reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert reply and conversation[-1]["content"] == reply


class CollectingStreamer(TextStreamer):
    """TextStreamer that keeps the pieces instead of printing them (its documented extension point)."""

    def __init__(self, tokenizer, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.pieces = []

    def on_finalized_text(self, text: str, stream_end: bool = False):
        self.pieces.append(text)


def test_streaming_yields_the_same_text(model_folder):
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder)
    prompt = "Rotary embeddings turn"
    expected = generate_text(model, tokenizer, prompt)
    inputs = tokenizer(prompt, return_tensors="pt")

    streamer = CollectingStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    model.generate(**inputs, streamer=streamer, **GREEDY)
    assert len([piece for piece in streamer.pieces if piece]) > 1, "nothing was streamed piece by piece"
    assert "".join(streamer.pieces) == expected

    iterator = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=60)
    thread = Thread(target=model.generate, kwargs={**inputs, "streamer": iterator, **GREEDY})
    thread.start()
    streamed = "".join(iterator)
    thread.join()
    assert streamed == expected

    # The pipeline takes a streamer as well.
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    streamer = CollectingStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    generator(prompt, streamer=streamer, **GREEDY)
    assert "".join(streamer.pieces) == expected


def test_batched_left_padded_generation_equals_each_prompt_alone(model_folder):
    generator = pipeline("text-generation", model=str(model_folder))
    prompts = ["Hi", "The cat sat on the mat, and the dog", "Numbers like 12345"]
    tokenizer = generator.tokenizer
    assert len({len(tokenizer(p)["input_ids"]) for p in prompts}) == 3, "prompts must differ in length"

    batch_sizes = []
    hook = generator.model.model.embed_tokens.register_forward_hook(
        lambda module, args, output: batch_sizes.append(args[0].shape[0])
    )
    batched = generator(prompts, batch_size=3, return_full_text=False, **GREEDY)
    hook.remove()
    assert 3 in batch_sizes, "the prompts were not generated as one padded batch"
    assert tokenizer.padding_side == "left"

    for prompt, output in zip(prompts, batched):
        alone = generator(prompt, return_full_text=False, **GREEDY)[0]["generated_text"]
        assert (
            alone and output[0]["generated_text"] == alone
        ), f"padding changed the continuation of {prompt!r}"
