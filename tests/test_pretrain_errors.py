"""Bad input stops training/pretrain.py before any training, with a message that names the fix, and writes nothing."""

import json
import os

import pytest


pytestmark = pytest.mark.slow


def assert_clean_failure(result, *phrases):
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("pretrain.py: error:")
    for phrase in phrases:
        assert phrase in message, message


def test_empty_dataset_file(run_pretrain, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    result = run_pretrain("--train_file", tmp_path / "empty.jsonl", "--output_dir", tmp_path / "out", check=False)
    assert_clean_failure(result, "empty", "--train_file")
    assert not (tmp_path / "out").exists()


def test_missing_file(run_pretrain, tmp_path):
    result = run_pretrain("--train_file", tmp_path / "nope" / "*.jsonl", "--output_dir", tmp_path / "out", check=False)
    assert_clean_failure(result, "matches no file", "Check the path")
    assert not (tmp_path / "out").exists()


def test_missing_text_column_keeps_the_users_files(run_pretrain, tmp_path):
    rows = [{"content": f"document number {i} is about the quick brown fox"} for i in range(50)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text("mine")
    result = run_pretrain("--train_file", tmp_path / "data.jsonl", "--output_dir", output_dir, check=False)
    assert_clean_failure(result, "no column 'text'", "['content']", "--text_column")
    assert os.listdir(output_dir) == ["notes.txt"] and (output_dir / "notes.txt").read_text() == "mine"


def test_block_size_longer_than_the_model_context(run_pretrain, tmp_path):
    result = run_pretrain("--block_size", 4096, "--output_dir", tmp_path / "out", check=False)
    assert_clean_failure(result, "--block_size 4096", "max_position_embeddings (512)")
    assert not (tmp_path / "out").exists()


def test_output_dir_that_cannot_be_created(run_pretrain, tmp_path):
    # CI runs as root, which ignores permission bits: a path under a regular file cannot be created by anyone.
    (tmp_path / "a_file").write_text("not a folder")
    result = run_pretrain("--output_dir", tmp_path / "a_file" / "model", check=False)
    assert_clean_failure(result, "cannot be created", "not a folder", "--output_dir")
    assert (tmp_path / "a_file").read_text() == "not a folder"


def test_output_dir_holding_an_earlier_run(run_pretrain, tmp_path):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "config.json").write_text("{}")
    result = run_pretrain("--output_dir", output_dir, check=False)
    assert_clean_failure(result, "already holds an earlier run", "--overwrite_output_dir")
    assert os.listdir(output_dir) == ["config.json"]
