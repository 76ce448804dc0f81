"""Fixtures shared by the test files."""

import pytest


@pytest.fixture
def local_hub():
    """A Hub-compatible server on 127.0.0.1 (see tests/helpers/hub_server.py), fresh for each test.

    Talk to it from a subprocess whose environment includes `local_hub.client_env(tmp_path / "hf_home")`.
    """
    from helpers.hub_server import LocalHub

    with LocalHub() as hub:
        yield hub


# ---- Tiny TinyTx models and tokenizers, for the tests/test_model_*.py files ----
import sys
from pathlib import Path

# `import hf_tinytx` must work under a bare `pytest` too, not only under `python -m pytest` from the repo root.
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

TINY_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A small model learns to write one token at a time.",
    "Attention lets every position look back at the words before it.",
    "Rotary embeddings turn queries and keys by their position.",
    "The cat sat on the mat, and the dog sat on the log.",
    "Hello world! Numbers like 12345 and symbols like #@% appear too.",
]


def build_tiny_config(**overrides):
    """A TinyTxConfig small enough that a forward pass takes milliseconds on CPU; keyword arguments override."""
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
    model = AutoModelForCausalLM.from_config(build_tiny_config(**overrides), attn_implementation=attn_implementation)
    return model.eval()


def build_byte_bpe_tokenizer(vocab_size=300, sentences=TINY_SENTENCES):
    """A byte-level BPE tokenizer trained in memory, wrapped as PreTrainedTokenizerFast.

    Ids 0, 1, 2 are <|pad|>, <|bos|>, <|eos|>, matching `build_tiny_config`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special_tokens = ["<|pad|>", "<|bos|>", "<|eos|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is a token: no input is out of vocabulary
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|eos|>"
    )


@pytest.fixture
def tiny_config():
    """`tiny_config(**overrides)` -> TinyTxConfig."""
    return build_tiny_config


@pytest.fixture
def tiny_model():
    """`tiny_model(seed=0, attn_implementation="eager", **config_overrides)` -> TinyTxForCausalLM in eval mode."""
    return build_tiny_model


@pytest.fixture
def byte_bpe_tokenizer():
    """`byte_bpe_tokenizer(vocab_size=300)` -> PreTrainedTokenizerFast with <|pad|>=0, <|bos|>=1, <|eos|>=2."""
    return build_byte_bpe_tokenizer


# ---- training/pretrain.py in a subprocess, for the tests/test_pretrain*.py files ----

# A model and corpus small enough that a few dozen steps take seconds; any of these can be overridden by a later flag.
TINY_PRETRAIN_ARGS = [
    "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2", "--num_attention_heads", "4",
    "--num_train_documents", "300", "--vocab_size", "320", "--block_size", "64",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--num_warmup_steps", "2",
    "--max_eval_batches", "4", "--num_probes_per_kind", "4", "--num_samples", "1",
    "--max_train_seconds", "0",  # no wall-clock cut: a slow machine must not change what a test trains
]


def pretrain_env(tmp_path, **extra):
    """Offline, with its own caches, so a run never touches the network or the user's ~/.cache."""
    import os

    env = dict(os.environ)
    env.update(
        HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false", PYTHONPATH=_REPO_ROOT, MPLBACKEND="Agg",
    )
    env.update(extra)
    return env


@pytest.fixture
def run_pretrain(tmp_path):
    """`run_pretrain(*flags, env=None, launcher=None, check=True)` runs training/pretrain.py with TINY_PRETRAIN_ARGS
    (then `flags`) and returns the CompletedProcess; `launcher` (e.g. torchrun's argv) goes in front."""
    import subprocess

    def run(*flags, env=None, launcher=None, check=True, timeout=300):
        script = str(Path(_REPO_ROOT) / "training" / "pretrain.py")
        command = [*(launcher or [sys.executable]), script, *TINY_PRETRAIN_ARGS, *map(str, flags)]
        result = subprocess.run(
            command, env=env or pretrain_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{command} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
        return result

    return run
