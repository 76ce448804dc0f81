"""Tiny models, tokenizers and training runs for the tests: small enough that each takes seconds on a CPU."""

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]

TINY_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A small model learns to write one token at a time.",
    "Attention lets every position look back at the words before it.",
    "Rotary embeddings turn queries and keys by their position.",
    "The cat sat on the mat, and the dog sat on the log.",
    "Hello world! Numbers like 12345 and symbols like #@% appear too.",
]


def build_tiny_config(**overrides):
    """A TinyTxConfig whose forward pass takes milliseconds on CPU."""
    from hf_tinytx import TinyTxConfig

    values = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, so repeat_kv is exercised too
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    values.update(overrides)
    return TinyTxConfig(**values)


def build_tiny_model(seed=0, attn_implementation="eager", **overrides):
    """A seeded TinyTxForCausalLM in eval mode, fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    import hf_tinytx  # noqa: F401  (registers "tinytx" with the Auto classes)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        build_tiny_config(**overrides), attn_implementation=attn_implementation
    )
    return model.eval()


def greedy(model, input_ids, new_tokens: int = 16):
    """Exactly `new_tokens` greedy tokens after `input_ids` (no early end)."""
    import torch

    return model.generate(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
    )


def build_byte_bpe_tokenizer(vocab_size=300, sentences=TINY_SENTENCES):
    """A byte-level BPE trained in memory: <pad>=0, <s>=1, </s>=2, as in `build_tiny_config`."""
    from hf_tinytx.tokenization import train_bpe_tokenizer

    return train_bpe_tokenizer(sentences, vocab_size)



def save_tiny_model_folder(folder, model=None):
    """A saved model folder, as save_pretrained writes one: `model` (default: a tiny TinyTx of 320 rows)
    and the byte-level BPE tokenizer of 300 tokens. Returns `folder`."""
    (model if model is not None else build_tiny_model(vocab_size=320)).save_pretrained(folder)
    build_byte_bpe_tokenizer().save_pretrained(folder)
    return folder

# A model and corpus small enough that a few dozen steps take seconds; a later flag overrides any of these.
TINY_PRETRAIN_ARGS = [
    "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2",
    "--num_attention_heads", "4", "--num_train_documents", "300", "--vocab_size", "320", "--block_size", "64",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--num_warmup_steps", "2",
    "--max_eval_batches", "4", "--num_probes_per_kind", "4", "--num_samples", "1",
    "--max_train_seconds", "0",  # no wall-clock cut: a slow machine must not change what a test trains
    # One optimizer on every launch: `auto` takes Muon on one process and AdamW under FSDP or DeepSpeed, and
    # the tests compare those launches (and resume across them) weight for weight.
    "--optimizer", "adamw",
]


# the words of write_text's paragraphs (test_token_store.py trains its tokenizers on them)
ASCII_WORDS = (
    "the miller kept his grain in the old mill by the river and sold bread to every village while the "
    "children of the valley played on the bridge until the evening bell rang"
).split()
WORDS = [*ASCII_WORDS, "café"]  # one word beyond ASCII


def write_text(path, megabytes: float, blank_lines: bool = True, seed: int = 0) -> str:
    """Paragraphs of 1-3 lines of words (separated by blank lines, or not at all), about `megabytes` MB."""
    rng, size, lines = random.Random(seed), 0, []
    while size < megabytes * 1e6:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "."
        lines.append(line + ("\n\n" if blank_lines and rng.random() < 0.4 else "\n"))
        size += len(lines[-1])
    text = "".join(lines)
    path.write_text(text, encoding="utf-8")
    return text


def pretrain_env(tmp_path, **extra):
    """Offline, with its own caches, so a run never touches the network or the user's ~/.cache."""
    env = dict(os.environ)
    env.update(
        HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg",
    )
    env.update(extra)
    return env


# runs at once: short runs spend most of their time importing torch, which overlaps; dozens at
SIDE_BY_SIDE = 8
# once on two cores only crowd each other


def run_side_by_side(runs: dict, timeout: float = 300) -> dict:
    """{key: (command, cwd, env)} -> {key: CompletedProcess}, SIDE_BY_SIDE at a time, each
    timeout counted from its run's own start."""
    def run(command, cwd, env):
        return subprocess.run(command, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)

    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        started = {key: pool.submit(run, *how) for key, how in runs.items()}
        return {key: future.result() for key, future in started.items()}


LAUNCH = str(Path(__file__).with_name("launch.py"))


def kill_after_call(target: str, nth: int) -> list[str]:
    """A `run_pretrain` launcher that SIGKILLs the run right after the Nth call
    of `target` (see launch.py)."""
    return [sys.executable, LAUNCH, "--kill-at", f"after:{target}:{nth}"]


def assert_same_weights(expected, actual) -> None:
    """Two model folders hold bit-for-bit the same weights."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(Path(expected) / "model.safetensors"), load_file(Path(actual) / "model.safetensors")
    assert a.keys() == b.keys(), f"different tensors: {sorted(a.keys() ^ b.keys())}"
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ from the reference run's: {different}"
