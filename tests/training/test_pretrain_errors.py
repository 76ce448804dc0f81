"""Bad input stops training/pretrain.py before any training, with a message that names the fix, and writes nothing."""

import json
import os
import sys

import pytest

from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env, run_side_by_side


def empty_dataset_file(folder):
    (folder / "empty.jsonl").write_text("")
    return ["--train_file", folder / "empty.jsonl"]


def missing_file(folder):
    return ["--train_file", folder / "nope" / "*.jsonl"]


def missing_text_column(folder):
    rows = [{"content": f"document number {i} is about the quick brown fox"} for i in range(50)]
    (folder / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "out").mkdir()
    (folder / "out" / "notes.txt").write_text("mine")
    return ["--train_file", folder / "data.jsonl"]


def block_size_beyond_the_context(folder):
    return ["--block_size", 4096]


def output_dir_under_a_file(folder):
    # CI runs as root, which ignores permission bits: a path under a regular file cannot be created by anyone.
    (folder / "a_file").write_text("not a folder")
    return ["--output_dir", folder / "a_file" / "model"]


def output_dir_holding_an_earlier_run(folder):
    (folder / "out").mkdir()
    (folder / "out" / "config.json").write_text("{}")
    return []


def text_with_a_bad_byte_past_64_kib(folder, bad: bytes):
    """Before, the check read the first 64 KiB: NUL bytes after them trained (exit 0), a bad UTF-8 byte failed
    inside `datasets` with no line named."""
    lines = "".join(f"document {i} is about the quick brown fox, café\n" for i in range(2000)).encode()
    assert len(lines) > 1 << 16 and lines.count(b"\n") == 2000
    (folder / "data.txt").write_bytes(lines + b"the end of " + bad + b" it\n")
    return ["--train_file", folder / "data.txt"]


def nul_bytes_past_64_kib(folder):
    return text_with_a_bad_byte_past_64_kib(folder, b"\x00\x00")


def bad_utf8_past_64_kib(folder):
    return text_with_a_bad_byte_past_64_kib(folder, "café".encode("latin-1"))


def model_config_with_a_typo(folder):
    """Before: "num_hidden_layer": 6 trained the default depth and was copied into config.json."""
    (folder / "model.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layer": 6}))
    return ["--model_config", folder / "model.json"]


CASES = [empty_dataset_file, missing_file, missing_text_column, block_size_beyond_the_context,
         output_dir_under_a_file, output_dir_holding_an_earlier_run, nul_bytes_past_64_kib, bad_utf8_past_64_kib,
         model_config_with_a_typo]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict:
    """{case name: (its folder, its run)}: each case's files in a folder of its own, the runs started together
    (each spends most of its time importing, on one core)."""
    runs = {}
    for case in CASES:
        folder = tmp_path_factory.mktemp(case.__name__)
        flags = ["--output_dir", folder / "out", *case(folder)]  # a case's own --output_dir comes later and wins
        command = [sys.executable, str(REPO_ROOT / "training" / "pretrain.py"), *TINY_PRETRAIN_ARGS, *map(str, flags)]
        runs[case.__name__] = command, folder, pretrain_env(folder)
    finished = run_side_by_side(runs)
    return {name: (folder, finished[name]) for name, (_, folder, _) in runs.items()}


def assert_clean_failure(result, *phrases):
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("pretrain.py: error:")
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize("case, phrases", [
    ("empty_dataset_file", ["empty", "--train_file"]),
    ("missing_file", ["matches no file", "Check the path"]),
    ("block_size_beyond_the_context", ["--block_size 4096", "max_position_embeddings (1024)"]),
    ("nul_bytes_past_64_kib", ["data.txt, line 2001: a NUL byte", "binary file"]),
    ("bad_utf8_past_64_kib", ["data.txt, line 2001: not UTF-8 text (byte 0xe9)", "save the file as UTF-8"]),
    ("model_config_with_a_typo", ["model.json: unknown key 'num_hidden_layer' (did you mean 'num_hidden_layers'?)"]),
])
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(refusals, case, phrases):
    folder, result = refusals[case]
    assert_clean_failure(result, *phrases)
    assert not (folder / "out").exists()


def test_missing_text_column_keeps_the_users_files(refusals):
    folder, result = refusals["missing_text_column"]
    assert_clean_failure(result, "no column 'text'", "['content']", "--text_column")
    assert os.listdir(folder / "out") == ["notes.txt"] and (folder / "out" / "notes.txt").read_text() == "mine"


def test_output_dir_that_cannot_be_created(refusals):
    folder, result = refusals["output_dir_under_a_file"]
    assert_clean_failure(result, "cannot be created", "not a folder", "--output_dir")
    assert (folder / "a_file").read_text() == "not a folder"


def test_output_dir_holding_an_earlier_run(refusals):
    folder, result = refusals["output_dir_holding_an_earlier_run"]
    assert_clean_failure(result, "already holds an earlier run", "--overwrite_output_dir")
    assert os.listdir(folder / "out") == ["config.json"]
