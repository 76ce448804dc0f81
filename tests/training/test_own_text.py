"""Pre-training on one's own text, as a new user brings it: one paragraph, one page, many files.

Each run uses pretrain's default sizes (blocks of 128, 16 a step, 5% held out) unless a test sets them: what the run
chooses for a small text, what it says, that it trains and exports, and that its samples continue the user's text
(not the built-in corpus's prompts, nor its probes).
"""

import json
import random
import re
import signal
import subprocess
import sys

import pytest

from tests.helpers.tiny import REPO_ROOT, kill_after_call, pretrain_env


WORDS = ("the miller kept his grain in the old mill by the river and sold bread to every village while the children "
         "of the valley played on the bridge until the evening bell rang").split()
# A tiny model, a short run, the sizes left to their defaults.
FLAGS = ["--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2", "--num_attention_heads", "4",
         "--vocab_size", "320", "--max_train_steps", "20", "--num_warmup_steps", "2", "--num_samples", "2",
         "--max_train_seconds", "0"]


def paragraphs(count: int, words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(count)]


def pretrain(tmp_path, *flags, launcher=None):
    command = [*(launcher or [sys.executable]), str(REPO_ROOT / "training" / "pretrain.py"), *FLAGS, *flags]
    return subprocess.run(command, cwd=tmp_path, env=pretrain_env(tmp_path), capture_output=True, text=True,
                          timeout=600)


def samples(stdout: str) -> list[str]:
    return re.findall(r"^sample: \.\.\.(.*)\[", stdout, flags=re.M)


def assert_trained_on_the_text(result, out, text: str):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert "probe accuracy" not in result.stdout and "No probes: they test what the built-in corpus" in result.stdout
    prompts = samples(result.stdout)
    assert prompts and all(prompt.strip() and prompt.strip() in text for prompt in prompts), prompts
    assert "Token indices sequence length" not in result.stderr + result.stdout  # nothing a user cannot act on
    assert "didn't cross the street" not in result.stdout


def test_one_paragraph_trains_on_its_own_end_as_validation(tmp_path):
    text = paragraphs(1, 60)[0]
    (tmp_path / "one.txt").write_text(text + "\n")
    result = pretrain(tmp_path, "--train_file", "one.txt", "--output_dir", "out")
    assert_trained_on_the_text(result, tmp_path / "out", text)
    said = result.stdout
    assert re.search(r"^Validation: the last \d+ of the text's \d+ tokens \(a single document: none to hold out",
                     said, re.M)
    assert re.search(r"^--block_size (16|32|64) instead of 128: the text holds \d+ tokens", said, re.M)
    assert re.search(r"^--per_device_train_batch_size \d+ instead of 16", said, re.M)
    assert re.search(r"^Warning: 20 steps of \d+ blocks read the \d+ training blocks \d+ times: the model will learn "
                     r"them by heart", said, re.M)
    recorded = json.loads((tmp_path / "out" / "training_args.json").read_text())
    assert recorded["block_size"] < 128 and recorded["per_device_train_batch_size"] < 16  # what it trained with


@pytest.mark.deep
def test_a_page_gets_a_shorter_block_and_batch_and_keeps_its_held_out_paragraph(tmp_path):
    texts = paragraphs(12, 45)
    (tmp_path / "page").mkdir()
    for number, text in enumerate(texts):
        (tmp_path / "page" / f"p{number:02d}.txt").write_text(text + "\n")
    result = pretrain(tmp_path, "--train_file", "page/*.txt", "--output_dir", "out")
    assert_trained_on_the_text(result, tmp_path / "out", "\n".join(texts))
    assert "Validation: the last" not in result.stdout  # a paragraph was held out, and one block fits in it
    assert re.search(r"^--block_size (32|64) instead of 128: the validation text holds \d+ tokens", result.stdout,
                     re.M)


@pytest.mark.deep
def test_many_files_keep_the_sizes_asked_and_say_nothing_of_them(tmp_path):
    texts = paragraphs(300, 60, seed=1)
    (tmp_path / "books").mkdir()
    for number in range(30):
        (tmp_path / "books" / f"b{number:02d}.txt").write_text("\n\n".join(texts[number * 10 : number * 10 + 10]))
    result = pretrain(tmp_path, "--train_file", "books/*.txt", "--output_dir", "out")
    assert_trained_on_the_text(result, tmp_path / "out", "\n".join(texts))
    assert "instead of" not in result.stdout and "Validation: the last" not in result.stdout
    assert "blocks of 128 tokens" in result.stdout


def test_sizes_given_that_cannot_fit_are_refused_in_one_line_before_anything_is_written(tmp_path):
    (tmp_path / "one.txt").write_text(paragraphs(1, 60)[0] + "\n")
    result = pretrain(tmp_path, "--train_file", "one.txt", "--output_dir", "out", "--block_size", "128",
                      "--per_device_train_batch_size", "16", "--validation_split_percentage", "5")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("pretrain.py: error: Too little text for these sizes: the validation text holds 0 tokens")
    assert re.search(r"run with --block_size \d+ --per_device_train_batch_size \d+ \(or leave the sizes out", line)
    assert not (tmp_path / "out").exists()


@pytest.mark.deep
def test_a_start_killed_before_its_first_checkpoint_does_not_block_the_next(tmp_path):
    texts = paragraphs(12, 45)
    (tmp_path / "page.txt").write_text("\n\n".join(texts))
    flags = ["--train_file", "page.txt", "--output_dir", "out"]
    killed = pretrain(tmp_path, *flags, "--vocab_size", "300",
                      launcher=kill_after_call("hf_tinytx_training.checkpoints.save_tokenizer", nth=1))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (tmp_path / "out" / "checkpoints" / "tokenizer").is_dir()
    # The same command again (another vocabulary, even): no earlier run to refuse, and a tokenizer of its own
    result = pretrain(tmp_path, *flags)
    assert_trained_on_the_text(result, tmp_path / "out", "\n".join(texts))
    assert "Training a byte-level BPE tokenizer (320 tokens asked)" in result.stdout  # not the killed start's
