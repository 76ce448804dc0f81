"""Bad input stops training/pretrain.py before any training, in one line that names the fix, and writes nothing.

Each case runs in a folder of its own; the quick cases start together, the deep ones too (each spends most of its
time importing)."""

import json
import sys

import pytest

from tests.helpers.reference import error_line
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env, run_side_by_side


BAD_TEXT = "".join(f"document {i} is about the quick brown fox, café\n" for i in range(2000)).encode()
FILES = {  # written into every case's folder
    "empty.jsonl": b"",
    "model.json": json.dumps({"hidden_size": 64, "num_hidden_layer": 6}).encode(),  # once trained the default depth
    "a_file": b"not a folder",
    "list.json": b"[1, 2, 3]",
    "broken.json": b'{"hidden_size": 64,',
    "binary.txt": bytes(range(256)) * 64,
    "deep_text.jsonl": b'{"text": "hello there"}\n' * 3 + b"[" * 100_000 + b"\n",
    "texts/one.txt": b"The quick brown fox jumps over the lazy dog.\n" * 50,
    # Before, the check read the first 64 KiB: NUL bytes after them trained, a bad UTF-8 byte failed in `datasets`.
    "nul/data.txt": BAD_TEXT + b"the end of \x00\x00 it\n",
    "latin/data.txt": BAD_TEXT + b"the end of " + "café".encode("latin-1") + b" it\n",
    "data.jsonl": "".join(json.dumps({"content": f"document number {i} is about the quick brown fox"}) + "\n"
                          for i in range(50)).encode(),
}
OUT_FILES = {"missing_text_column": {"notes.txt": "mine"}, "output_dir_holding_an_earlier_run": {"config.json": "{}"}}
# case: (flags, words of the one line); {tmp} is the case's folder, the run's working folder.
QUICK = {
    "empty_dataset_file": (["--train_file", "empty.jsonl"], ["empty", "--train_file"]),
    "missing_file": (["--train_file", "nope/*.jsonl"], ["matches no file", "Check the path"]),
    "missing_text_column": (["--train_file", "data.jsonl"], ["no column 'text'", "['content']", "--text_column"]),
    "block_size_beyond_the_context": (["--block_size", "4096"],
                                      ["--block_size 4096", "max_position_embeddings (1024)"]),
    # Root ignores permission bits: a path under a regular file cannot be created by anyone.
    "output_dir_under_a_file": (["--output_dir", "a_file/model"], ["cannot be created", "not a folder",
                                                                   "--output_dir"]),
    "output_dir_holding_an_earlier_run": ([], ["already holds an earlier run", "--overwrite_output_dir"]),
    "nul_bytes_past_64_kib": (["--train_file", "nul/data.txt"], ["data.txt, line 2001: a NUL byte", "binary file"]),
    "bad_utf8_past_64_kib": (["--train_file", "latin/data.txt"],
                             ["data.txt, line 2001: not UTF-8 text (byte 0xe9)", "save the file as UTF-8"]),
    "model_config_with_a_typo": (["--model_config", "model.json"],
                                 ["model.json: unknown key 'num_hidden_layer' (did you mean 'num_hidden_layers'?)"]),
}
DEEP = {
    "negative learning rate": (["--learning_rate", "-1"], ["--learning_rate"]),
    "infinite learning rate": (["--learning_rate", "inf"], ["--learning_rate"]),
    "nan weight decay": (["--weight_decay", "nan"], ["--weight_decay"]),
    "nan clipping": (["--max_grad_norm", "nan"], ["--max_grad_norm"]),
    "beta2 above one": (["--adam_beta2", "2"], ["--adam_beta2"]),
    "unknown schedule": (["--lr_scheduler_type", "sideways"], ["--lr_scheduler_type"]),
    "schedule needing a metric": (["--lr_scheduler_type", "reduce_lr_on_plateau"], ["--lr_scheduler_type"]),
    "unknown attention": (["--attn_implementation", "magic"], ["--attn_implementation"]),
    "invalid hub id": (["--push_to_hub", "--hub_model_id", "no spaces/in ids/here"], ["--hub_model_id"]),
    "a model too large": (["--hidden_size", "65536", "--intermediate_size", "262144", "--num_hidden_layers", "64"],
                          ["smaller"]),
    "a config that is a list": (["--model_config", "list.json"], ["list.json"]),
    "broken JSON": (["--model_config", "broken.json"], ["broken.json"]),
    "a binary training file": (["--train_file", "binary.txt"], ["binary.txt"]),
    "a typo in a local --init_from": (["--init_from", "{tmp}/modle"], ["no such folder"]),
    # The output folder ({tmp}/out) inside the folder the run starts from: it would write where it reads.
    "an --init_from folder holding --output_dir": (["--init_from", "{tmp}"], ["is inside --init_from"]),
    "an unknown optimizer": (["--optimizer", "sgd"], ["--optimizer must be auto, adamw or muon"]),
    "a negative muon rate": (["--optimizer", "muon", "--muon_learning_rate", "-1"], ["--muon_learning_rate"]),
    "a clock schedule with no form": (["--max_train_seconds", "5", "--lr_scheduler_type", "polynomial"],
                                      ["has no form over the clock"]),
    "int-text-parquet": (["--train_file", "ints.parquet"],
                         ["--train_file ints.parquet: column 'text' holds int64 values, not text", "astype(str)"]),
    "deep-jsonl": (["--train_file", "deep_text.jsonl"],
                   ["--train_file deep_text.jsonl, line 4: JSON nested too deeply", "one JSON object"]),
    # Before: "matches no file", of a folder that is there (issue 57).
    "folder": (["--train_file", "texts"], ["--train_file 'texts' is a folder; give its files", "texts/*.txt"]),
}


def run_cases(cases: dict, tmp_path_factory) -> dict:
    """{case: (its folder, its run)}, the runs started together."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    runs = {}
    for case, (flags, _) in cases.items():
        folder = tmp_path_factory.mktemp("bad_input")
        for name, data in FILES.items():
            (folder / name).parent.mkdir(exist_ok=True)
            (folder / name).write_bytes(data)
        pq.write_table(pa.table({"text": list(range(200))}), folder / "ints.parquet")
        for name, text in OUT_FILES.get(case, {}).items():
            (folder / "out").mkdir()
            (folder / "out" / name).write_text(text)
        flags = [flag.format(tmp=folder) for flag in flags]  # a case's own --output_dir comes later and wins
        command = [sys.executable, str(REPO_ROOT / "training" / "pretrain.py"), *TINY_PRETRAIN_ARGS, "--output_dir",
                   str(folder / "out"), *flags]
        runs[case] = command, folder, pretrain_env(folder)
    finished = run_side_by_side(runs)
    return {case: (folder, finished[case]) for case, (_, folder, _) in runs.items()}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """`refusals(case)`: the first case asked for runs its whole table, quick or deep."""
    done = {}

    def refusal(case):
        if case not in done:
            done.update(run_cases(QUICK if case in QUICK else DEEP, tmp_path_factory))
        return done[case]

    return refusal


@pytest.mark.parametrize("case", [*QUICK, *(pytest.param(case, marks=pytest.mark.deep) for case in DEEP)])
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(refusals, case):
    folder, result = refusals(case)
    assert result.returncode == 2
    line = error_line(result, "pretrain", *{**QUICK, **DEEP}[case][1])
    assert result.stderr.strip().splitlines()[-1] == line
    if case in OUT_FILES:  # the user's files stay, alone
        assert {path.name: path.read_text() for path in (folder / "out").iterdir()} == OUT_FILES[case]
    else:
        assert not (folder / "out").exists()
    assert (folder / "a_file").read_text() == "not a folder"
