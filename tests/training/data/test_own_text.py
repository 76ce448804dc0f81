"""Pre-training on one's own text (one paragraph, one page, many files) at pretrain's default
sizes: what the run picks for a small text (training/data/sizing.py) and says, that it trains, and
that its samples continue the user's text.
"""

import json
import random
import re
import signal
import subprocess
import sys

import pytest

from hf_tinytx_training.data.sizing import MIN_BLOCK, Asked, Text, fit_sizes
from tests.helpers.tiny import ASCII_WORDS as WORDS
from tests.helpers.tiny import REPO_ROOT, kill_after_call, pretrain_env


# A tiny model, a short run, the sizes left to their defaults.
FLAGS = [
    "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2",
    "--num_attention_heads", "4", "--vocab_size", "320", "--max_train_steps", "20", "--num_warmup_steps", "2",
    "--num_samples", "2", "--max_train_seconds", "0",
]


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
    assert (
        "probe accuracy" not in result.stdout
        and "No probes: they test what the built-in corpus" in result.stdout
    )
    prompts = samples(result.stdout)
    assert prompts and all(prompt.strip() and prompt.strip() in text for prompt in prompts), prompts
    # nothing a user cannot act on
    assert "Token indices sequence length" not in result.stderr + result.stdout
    assert "didn't cross the street" not in result.stdout


def test_one_paragraph_trains_on_its_own_end_as_validation(tmp_path):
    text = paragraphs(1, 60)[0]
    (tmp_path / "one.txt").write_text(text + "\n")
    result = pretrain(tmp_path, "--train_file", "one.txt", "--output_dir", "out")
    assert_trained_on_the_text(result, tmp_path / "out", text)
    said = result.stdout
    assert re.search(
        r"^Validation: the last \d+ of the text's \d+ tokens \(a single document: none to hold out", said,
        re.M,
    )
    assert re.search(r"^--block_size (16|32|64) instead of 128: the text holds \d+ tokens", said, re.M)
    assert re.search(r"^--per_device_train_batch_size \d+ instead of 16", said, re.M)
    # the passes as a fact; whether they are too many, the validation loss says (memorising.py)
    assert re.search(r"^Training for 20 steps of [\d,]+ tokens \([\d,]+ tokens, [\d.]+ passes over the "
                     r"training text\)", said, re.M)
    assert "by heart" not in said and "Warning: 20 steps" not in said
    recorded = json.loads((tmp_path / "out" / "training_args.json").read_text())
    # what it trained with
    assert recorded["block_size"] < 128 and recorded["per_device_train_batch_size"] < 16


@pytest.mark.deep
def test_a_page_gets_a_shorter_block_and_batch_and_keeps_its_held_out_paragraph(tmp_path):
    texts = paragraphs(12, 45)
    (tmp_path / "page").mkdir()
    for number, text in enumerate(texts):
        (tmp_path / "page" / f"p{number:02d}.txt").write_text(text + "\n")
    result = pretrain(tmp_path, "--train_file", "page/*.txt", "--output_dir", "out")
    assert_trained_on_the_text(result, tmp_path / "out", "\n".join(texts))
    assert "Validation: the last" not in result.stdout  # a paragraph was held out, and one block fits in it
    assert re.search(
        r"^--block_size (32|64) instead of 128: the validation text holds \d+ tokens", result.stdout, re.M
    )


@pytest.mark.deep
def test_many_files_keep_the_sizes_asked_and_say_nothing_of_them(tmp_path):
    texts = paragraphs(300, 60, seed=1)
    (tmp_path / "books").mkdir()
    for number in range(30):
        (tmp_path / "books" / f"b{number:02d}.txt").write_text(
            "\n\n".join(texts[number * 10 : number * 10 + 10])
        )
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
    assert line.startswith(
        "pretrain.py: error: Too little text for these sizes: the validation text holds 0 tokens"
    )
    assert re.search(
        r"run with --block_size \d+ --per_device_train_batch_size \d+ \(or leave the sizes out", line
    )
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


# ---- training/data/sizing.py in process

DEFAULTS = dict(
    block_size=128, per_device_train_batch_size=16, gradient_accumulation_steps=1, num_processes=1
)


def asked(**changes) -> Asked:
    explicit = frozenset(changes.pop("explicit", ()))
    return Asked(**{**DEFAULTS, **changes}, explicit=explicit)


def test_a_corpus_keeps_the_sizes_asked_and_says_nothing():
    text = Text(train_chunks=(300_000, 120_000), validation_tokens=20_000, held_out=True)
    plan = fit_sizes(text, asked(), share=0.05)
    assert (plan.block_size, plan.per_device_train_batch_size, plan.validation_from_end) == (128, 16, 0)
    assert plan.notes == [] and plan.problem is None


def test_a_page_gets_a_shorter_block_and_a_smaller_batch_each_said_in_a_line():
    # 12 paragraphs: 1,000 training tokens, one held-out paragraph of 89 (the case)
    plan = fit_sizes(Text(train_chunks=(1000,), validation_tokens=89, held_out=True), asked(), share=0.05)
    assert (plan.block_size, plan.per_device_train_batch_size, plan.validation_from_end) == (64, 8, 0)
    assert 1000 // 64 >= 8  # one optimizer step fits
    assert len(plan.notes) == 2
    assert plan.notes[0].startswith("--block_size 64 instead of 128: the validation text holds 89 tokens")
    assert plan.notes[1].startswith(
        "--per_device_train_batch_size 8 instead of 16: the text makes 15 training block(s)"
    )


def test_one_paragraph_validates_on_the_end_of_its_own_text():
    plan = fit_sizes(Text(train_chunks=(100,), validation_tokens=0, held_out=True), asked(), share=0.05)
    assert plan.problem is None
    # The largest block that leaves a validation block and one step: 32 (68
    # tokens left: 2 blocks, a batch of 2)
    assert plan.validation_from_end == plan.block_size == 2 * MIN_BLOCK
    assert plan.per_device_train_batch_size == 2
    assert plan.notes[0].startswith("Validation: the last 32 of the text's 100 tokens")


def test_sizes_given_on_the_command_line_are_kept_or_refused_with_the_flags_that_fit():
    text = Text(train_chunks=(1000,), validation_tokens=89, held_out=True)
    # 128 kept: validation from the end instead
    plan = fit_sizes(text, asked(explicit={"block_size"}), share=0.05)
    assert plan.block_size == 128 and plan.validation_from_end == 128 and plan.problem is None

    plan = fit_sizes(
        text, asked(explicit={"block_size", "per_device_train_batch_size", "validation_split_percentage"}),
        share=0.05,
    )
    assert plan.problem == (
        "Too little text for these sizes: the validation text holds 89 tokens, less than one block of 128; "
        "the training text makes 7 blocks of 128 tokens, fewer than one optimizer step takes (16); run with "
        "--block_size 64 --per_device_train_batch_size 8 (or leave the sizes out: they are then fitted to "
        "the text)."
    )


def test_a_given_total_batch_size_is_named_again_in_the_fix():
    text = Text(train_chunks=(1000,), validation_tokens=500, held_out=False)
    plan = fit_sizes(text, asked(per_device_train_batch_size=4, gradient_accumulation_steps=4,
                           explicit={"total_batch_size", "block_size"}), share=0.05)
    assert plan.problem.endswith(
        "run with --block_size 128 --per_device_train_batch_size 1 --total_batch_size 4 (or leave the sizes "
        "out: they are then fitted to the text)."
    )


def test_too_little_text_for_any_size_says_how_much_is_needed():
    plan = fit_sizes(
        Text(train_chunks=(20,), validation_tokens=0, held_out=True), asked(num_processes=2), share=0.05
    )
    assert plan.problem.endswith(
        "give more text: at least 48 tokens for 2 process(es) (one block of 16 each, and one to validate "
        "on)."
    )


def test_samples_start_where_the_validation_documents_do():
    from hf_tinytx_training.data.packing import document_starts

    eos = 0
    blocks = [[5, 6, 7, 0, 8, 9], [10, 0, 11, 0, 12, 13], [14, 15, 0, 16, 17, 18]]
    # block 1 starts mid-document (10 is not a start); 11 alone is too short; 16 17 18 runs to the block's end
    assert document_starts(blocks, eos, count=5, length=3) == [[5, 6, 7], [8, 9], [12, 13], [16, 17, 18]]
    assert document_starts(blocks, eos, count=2, length=8) == [[5, 6, 7], [8, 9]]
    assert document_starts(blocks, eos, count=0) == []


def test_the_sizes_a_command_sets_are_read_from_its_flags_and_its_file(tmp_path):
    from hf_tinytx_training.pretrain_args import explicit_flags

    (tmp_path / "run.yaml").write_text("block_size: 64\nmax_train_steps: 10\n")
    assert explicit_flags(["--per_device_train_batch_size", "4", "--seed=3"]) == {
        "per_device_train_batch_size", "seed",
    }
    assert explicit_flags([str(tmp_path / "run.yaml"), "--seed", "1"]) == {
        "block_size", "max_train_steps", "seed",
    }
