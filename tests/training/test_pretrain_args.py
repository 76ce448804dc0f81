"""Flags of both training scripts (training/pretrain_args.py): spelled in full or refused, every mistake one
line on stderr with exit status 2, a typo named with the flag it was probably meant to be.

pretrain's bad input is one table. The cases `preflight` refuses run in process; a few also run the real
script, which must print the same line, write nothing and never import torch. The cases refused once torch has
loaded (the schedule, the model, the data's columns: pretrain_run.py's setup) run the script, side by side."""

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.pretrain_args import ALL_ARGUMENTS, build_parser, parse_args, plan_steps, preflight
from tests.helpers.reference import error_line
from tests.helpers.refusals import HEAVY, refused_in_process, snapshot
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env, run_side_by_side


BAD_TEXT = "".join(f"document {i} is about the quick brown fox, café\n" for i in range(2000)).encode()
FILES = {  # written into every case's folder
    "empty.jsonl": b"",
    # once trained the default depth
    "model.json": json.dumps({"hidden_size": 64, "num_hidden_layer": 6}).encode(),
    "a_file": b"not a folder",
    "list.json": b"[1, 2, 3]",
    "broken.json": b'{"hidden_size": 64,',
    "binary.txt": bytes(range(256)) * 64,
    "deep_text.jsonl": b'{"text": "hello there"}\n' * 3 + b"[" * 100_000 + b"\n",
    "texts/one.txt": b"The quick brown fox jumps over the lazy dog.\n" * 50,
    "nanogpt/train.bin": b"tokens of another program",
    # Before, the check read the first 64 KiB: NUL bytes after them trained, a bad
    # UTF-8 byte failed in `datasets`.
    "nul/data.txt": BAD_TEXT + b"the end of \x00\x00 it\n",
    "latin/data.txt": BAD_TEXT + b"the end of " + "café".encode("latin-1") + b" it\n",
    "data.jsonl": "".join(json.dumps({"content": f"document number {i} is about the quick brown fox"}) + "\n"
                          for i in range(50)).encode(),
}
OUT_FILES = {
    "missing_text_column": {"notes.txt": "mine"}, "output_dir_holding_an_earlier_run": {"config.json": "{}"},
}
# case: (flags after TINY_PRETRAIN_ARGS and --output_dir {tmp}/out, words of the one line); {tmp} is the
# case's folder, the run's working folder. Refused by `preflight`, before torch loads:
REFUSED_EARLY = {
    "empty_dataset_file": (["--train_file", "empty.jsonl"], ["empty", "--train_file"]),
    # Before: --plan_only on a run that plans nothing trained it in full.
    "plan_only_without_a_plan": (["--plan_only"], ["--plan_only prints the plan", "--train_file"]),
    "missing_file": (["--train_file", "nope/*.jsonl"], ["matches no file", "Check the path"]),
    # Before (issue 69): "ValueError ... (unexpected ...)" once torch had loaded, or taken as 0.
    "negative_seed": (["--seed", "-1"], ["--seed must be a whole number from 0 to 2**32 - 1, got -1"]),
    "no_eval_batches": (["--max_eval_batches", "-1"], ["--max_eval_batches must be a positive number"]),
    "negative_samples": (["--num_samples", "-1"], ["--num_samples must be 0 or more (0: none), got -1"]),
    # Before: trained on the built-in corpus, exit 0 (issue 69).
    "empty_train_file": (["--train_file", ""], ["--train_file is empty", "leave the flag out"]),
    "blank_output_dir": (["--output_dir", " "], ["--output_dir is empty", "an unset shell variable"]),
    # Root ignores permission bits: a path under a regular file cannot be created by anyone.
    "output_dir_under_a_file": (
        ["--output_dir", "a_file/model"], ["cannot be created", "not a folder", "--output_dir"],
    ),
    "output_dir_holding_an_earlier_run": ([], ["already holds an earlier run", "--overwrite_output_dir"]),
    "nul_bytes_past_64_kib": (
        ["--train_file", "nul/data.txt"], ["data.txt, line 2001: a NUL byte", "binary file"],
    ),
    "bad_utf8_past_64_kib": (
        ["--train_file", "latin/data.txt"],
        ["data.txt, line 2001: not UTF-8 text (byte 0xe9)", "save the file as UTF-8"],
    ),
    "negative learning rate": (["--learning_rate", "-1"], ["--learning_rate"]),
    "infinite learning rate": (["--learning_rate", "inf"], ["--learning_rate"]),
    "nan weight decay": (["--weight_decay", "nan"], ["--weight_decay"]),
    "nan clipping": (["--max_grad_norm", "nan"], ["--max_grad_norm"]),
    "nan stop push wait": (["--hub_stop_timeout", "nan"], ["--hub_stop_timeout must be a number of seconds"]),
    "beta2 above one": (["--adam_beta2", "2"], ["--adam_beta2"]),
    "invalid hub id": (["--push_to_hub", "--hub_model_id", "no spaces/in ids/here"], ["--hub_model_id"]),
    "a config that is a list": (["--model_config", "list.json"], ["list.json"]),
    "broken JSON": (["--model_config", "broken.json"], ["broken.json is not valid JSON/YAML"]),
    "a binary training file": (["--train_file", "binary.txt"], ["binary.txt"]),
    # Before (issue 69): a folder that was no store was taken for one, and its train.bin deleted.
    # Before (issue 69): "FileExistsError ... (unexpected ...)", after a tokenizer was trained.
    "a token store that is a file": (
        ["--train_file", "texts/one.txt", "--token_store", "a_file"],
        ["--token_store", "a_file is a file: give --token_store a new or empty folder"],
    ),
    "a token store under a file": (
        ["--train_file", "texts/one.txt", "--token_store", "a_file/store"],
        ["a_file/store cannot be created", "a_file is not a folder"],
    ),
    "a token store folder holding other files": (
        ["--train_file", "texts/one.txt", "--token_store", "nanogpt"],
        ["is not a token store (it has no store.json) and holds other files (train.bin)",
         "give --token_store a new or empty folder"],
    ),
    "an unknown optimizer": (["--optimizer", "sgd"], ["--optimizer must be auto, adamw or muon"]),
    "a negative muon rate": (["--optimizer", "muon", "--muon_learning_rate", "-1"], ["--muon_learning_rate"]),
    # Before: "matches no file", of a folder that is there (issue 57).
    "folder": (
        ["--train_file", "texts"], ["--train_file 'texts' is a folder; give its files", "texts/*.txt"],
    ),
    "no validation split": (
        ["--validation_split_percentage", "0"], ["--validation_split_percentage must lie"],
    ),
    "typo": (
        ["--learnig_rate", "1e-3"],
        ["pretrain.py: error: unknown flag --learnig_rate; did you mean --learning_rate?"],
    ),
    "abbreviation": (
        ["--max_train_step", "3"],
        ["pretrain.py: error: unknown flag --max_train_step; did you mean --max_train_steps?"],
    ),
    "not a number": (
        ["--max_train_steps", "many"],
        ["argument --max_train_steps/--max-train-steps: invalid int value: 'many'"],
    ),
    "a stray value": (["--seed", "1", "oops"], ["unexpected value 'oops'"]),
    "an unknown flag with its value": (["--zzz=1"], ["unknown flag --zzz; run with --help"]),
    "batch size twice": (
        ["--total_batch_size", "32", "--gradient_accumulation_steps", "2"],
        ["error: --total_batch_size sets --gradient_accumulation_steps itself; give one"],
    ),
    "a tracker's typo": (
        ["--report_to", "tensorbord"], ["error: --report_to 'tensorbord': use tensorboard, trackio or wandb"],
    ),
    # pretrain and finetune share the check (args.check_hub_repo_id); a default id
    # is said to come from the folder
    "a folder name that is no repo id": (
        ["--push_to_hub", "--output_dir", "out/x y"],
        [
            "error: The Hub repo id from --output_dir's name, 'x y' is not a valid Hub repo id; set "
            "--hub_model_id to"
        ],
    ),
    "a repo id of three parts": (
        ["--push_to_hub", "--hub_model_id", "a/b/c"],
        ["error: --hub_model_id 'a/b/c' is not a valid Hub repo id"],
    ),
}
# The real script too, with Python's import log (-X importtime): the same line, in a second, with no torch.
IN_A_PROCESS = ("output_dir_holding_an_earlier_run", "missing_file",
                "a token store folder holding other files")
# Refused by preflight, but after torch loads: check_report_to asks Accelerate which trackers are installed.
LOADS_TORCH = {"a tracker's typo"}
# Refused once torch has loaded (pretrain_run.py's setup); the deep ones are marked so.
REFUSED_IN_THE_RUN = {
    "missing_text_column": (
        ["--train_file", "data.jsonl"], ["no column 'text'", "['content']", "--text_column"],
    ),
    "block_size_beyond_the_context": (
        ["--block_size", "4096"], ["--block_size 4096", "max_position_embeddings (1024)"],
    ),
    "model_config_with_a_typo": (
        ["--model_config", "model.json"],
        ["model.json: unknown key 'num_hidden_layer' (did you mean 'num_hidden_layers'?)"],
    ),
}
DEEP_IN_THE_RUN = {
    "unknown schedule": (["--lr_scheduler_type", "sideways"], ["--lr_scheduler_type"]),
    "schedule needing a metric": (["--lr_scheduler_type", "reduce_lr_on_plateau"], ["--lr_scheduler_type"]),
    "unknown attention": (["--attn_implementation", "magic"], ["--attn_implementation"]),
    "a model too large": (
        ["--hidden_size", "65536", "--intermediate_size", "262144", "--num_hidden_layers", "64"], ["smaller"],
    ),
    "a typo in a local --init_from": (["--init_from", "{tmp}/modle"], ["no such folder"]),
    # The output folder ({tmp}/out) inside the folder the run starts from: it would write where it reads.
    "an --init_from folder holding --output_dir": (["--init_from", "{tmp}"], ["is inside --init_from"]),
    "a clock schedule with no form": (
        ["--max_train_seconds", "5", "--lr_scheduler_type", "polynomial"], ["has no form over the clock"],
    ),
    "int-text-parquet": (
        ["--train_file", "ints.parquet"],
        ["--train_file ints.parquet: column 'text' holds int64 values, not text", "astype(str)"],
    ),
    "deep-jsonl": (
        ["--train_file", "deep_text.jsonl"],
        ["--train_file deep_text.jsonl, line 4: JSON nested too deeply", "one JSON object"],
    ),
}


def case_folder(folder, case: str) -> list[str]:
    """FILES (and the case's OUT_FILES) written into `folder`; the case's flags, after the tiny run's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, data in FILES.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    pq.write_table(pa.table({"text": list(range(200))}), folder / "ints.parquet")
    for name, text in OUT_FILES.get(case, {}).items():
        (folder / "out").mkdir()
        (folder / "out" / name).write_text(text)
    flags = {**REFUSED_EARLY, **REFUSED_IN_THE_RUN, **DEEP_IN_THE_RUN}[case][0]
    # a case's own --output_dir comes later and wins
    return [*TINY_PRETRAIN_ARGS, "--output_dir", str(folder / "out"),
            *[flag.format(tmp=folder) for flag in flags]]


@pytest.mark.parametrize("case", REFUSED_EARLY)
def test_bad_input_is_one_line_before_torch_loads_and_nothing_is_written(tmp_path, monkeypatch, capsys, case):
    argv = case_folder(tmp_path, case)
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    line = refused_in_process(capsys, monkeypatch, "pretrain.py", preflight, argv,
                              heavy=() if case in LOADS_TORCH else HEAVY)
    words = REFUSED_EARLY[case][1]
    assert all(word in line for word in words), line
    if words[0].startswith("pretrain.py: "):  # the whole line
        assert line == words[0]
    assert snapshot(tmp_path) == before


def run_cases(cases, tmp_path_factory) -> dict:
    """{case: (its folder, its snapshot, its run)}, started together; IN_A_PROCESS ones log their imports."""
    runs = {}
    for case in cases:
        folder = tmp_path_factory.mktemp("bad_input")
        argv = case_folder(folder, case)
        log = ["-X", "importtime"] if case in IN_A_PROCESS else []
        runs[case] = [sys.executable, *log, str(REPO_ROOT / "training" / "pretrain.py"), *argv], folder, \
            pretrain_env(folder)
    befores = {case: snapshot(folder) for case, (_, folder, _) in runs.items()}
    finished = run_side_by_side(runs)
    return {case: (folder, befores[case], finished[case]) for case, (_, folder, _) in runs.items()}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """`refusals(case)`: the first case asked for runs its whole group, quick or deep."""
    done = {}

    def refusal(case):
        if case not in done:
            group = DEEP_IN_THE_RUN if case in DEEP_IN_THE_RUN else [*REFUSED_IN_THE_RUN, *IN_A_PROCESS]
            done.update(run_cases(group, tmp_path_factory))
        return done[case]

    return refusal


@pytest.mark.parametrize("case", [*IN_A_PROCESS, *REFUSED_IN_THE_RUN,
                                  *(pytest.param(case, marks=pytest.mark.deep) for case in DEEP_IN_THE_RUN)])
def test_the_script_prints_the_one_line_and_writes_nothing(refusals, case):
    folder, before, result = refusals(case)
    assert result.returncode == 2
    words = {**REFUSED_EARLY, **REFUSED_IN_THE_RUN, **DEEP_IN_THE_RUN}[case][1]
    line = error_line(result, "pretrain", *words)
    *imports, last = result.stderr.strip().splitlines()
    assert last == line
    # pretrain_env's HF_HOME is in the folder: the caches a run made there are no output
    after = {name: entry for name, entry in snapshot(folder).items() if not name.startswith("hf_home")}
    assert after == before
    if case in IN_A_PROCESS:  # refused in about a second, not after ~8 s of imports
        imported = {entry.split("|")[-1].strip() for entry in imports}
        assert "json" in imported, "the import log was read"
        assert "torch" not in imported and "transformers.training_args" not in imported


def test_pretrains_help_lists_the_flags_before_torch_loads(tmp_path):
    command = [sys.executable, "-X", "importtime", str(REPO_ROOT / "training" / "pretrain.py"), "--help"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "json" in imported and "torch" not in imported
    assert "--max_train_steps" in result.stdout and "usage: pretrain.py" in result.stdout


def test_finetunes_help_lists_its_flags_then_every_flag_of_trainingarguments(tmp_path):
    """Trainer's flags as transformers declares them (TrainingArguments loads torch: a few seconds)."""
    from transformers import TrainingArguments

    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "training" / "finetune.py"), "--help"], cwd=tmp_path,
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0 and "usage: finetune.py" in result.stdout, result.stderr[-3000:]
    listed = re.findall(r"^  (--\w+)", result.stdout, re.MULTILINE)
    trainer = [f"--{field.name}" for field in dataclasses.fields(TrainingArguments) if field.init]
    assert listed.index("--model_name_or_path") < listed.index("--use_peft") < listed.index("--output_dir")
    assert set(trainer) <= set(listed), sorted(set(trainer) - set(listed))
    assert not list(tmp_path.iterdir()), "nothing may be written"


def test_flags_in_full_and_defaults_still_parse():
    parser = build_parser(ALL_ARGUMENTS, max_train_steps=7)
    _, data_args, train_args = parser.parse_args_into_dataclasses(
        ["--block-size", "32"], look_for_args_file=False
    )
    assert (data_args.block_size, train_args.max_train_steps) == (32, 7)


def test_what_parses_beside_the_refusals(monkeypatch):
    parse_args(["--total_batch_size", "32"])  # alone it parses; the process count is checked at launch
    assert parse_args(["--push_to_hub", "--output_dir", "out/tiny-run"])[2].hub_model_id == "tiny-run"
    assert parse_args(["--output_dir", "out/tiny-run"])[2].hub_model_id is None  # no push: no repo
    monkeypatch.setattr("accelerate.utils.is_wandb_available", lambda: False)  # as on a machine without wandb
    with pytest.raises(
        UserInputError,
        match="^--report_to wandb needs the wandb package, which is not installed: pip install wandb, or "
        "leave --report_to out.$",
    ):
        parse_args(["--report_to", "tensorboard,wandb"])
    parse_args(["--report_to", "tensorboard"])  # installed with the test extra
    parse_args(["--report_to", "all"])


def test_an_arguments_file_then_flags_that_override_it():
    """`pretrain.py training/configs/tiny.yaml --max_train_steps 100`: the file's
    values, then the flags after it."""
    model_args, data_args, train_args = parse_args([str(REPO_ROOT / "training/configs/tiny.yaml"),
                                                    "--max_train_steps", "100", "--block_size", "64"])
    assert (train_args.max_train_steps, data_args.block_size) == (100, 64)  # the flags win
    # the file
    assert (model_args.model_preset, model_args.vocab_size, train_args.eval_steps) == ("micro", 1024, 200)


def test_total_batch_size_sets_the_accumulation_the_processes_need():
    """--total_batch_size 64 with 8 sequences per device: 4 micro-batches on 2 processes, 8 on one."""
    from hf_tinytx_training.pretrain_args import apply_total_batch_size

    for processes, accumulation in ((1, 8), (2, 4), (8, 1)):
        *_, train_args = parse_args(["--total_batch_size", "64", "--per_device_train_batch_size", "8"])
        apply_total_batch_size(train_args, processes)
        assert train_args.gradient_accumulation_steps == accumulation


def test_the_default_runs_arguments_file_equals_no_arguments():
    """training/configs/tiny.yaml says it holds the default run's values (the step count spelled out)."""
    from_file, bare = parse_args([str(REPO_ROOT / "training/configs/tiny.yaml")]), parse_args([])
    bare[2].max_train_steps = plan_steps(bare[1], bare[2], 1)[0]
    assert from_file == bare


@pytest.mark.parametrize("preset, vocab_size, parameters, qk_norm", [
    ("micro", 1024, 0.17e6, False), ("tiny", 2048, 1.3e6, False), ("small", 8192, 10e6, True),
    ("base", 50304, 124e6, True),
])
def test_each_model_preset_is_the_size_its_file_says(preset, vocab_size, parameters, qk_norm):
    """Built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    from hf_tinytx_training.model.config import load_model_config

    model_args, _, _ = parse_args(["--model_preset", preset])
    config = load_model_config(model_args)
    config.vocab_size = vocab_size  # pretrain.py sets it from the tokenizer
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert abs(sum(p.numel() for p in model.parameters()) / parameters - 1) < 0.1
    assert config.qk_norm == qk_norm  # the README: small and base use qk_norm, which GGUF export refuses


def test_a_model_config_file_in_yaml_reads_like_json(tmp_path):
    """--model_config takes .yaml as well as .json: the same fields give the same config."""
    import json

    import yaml

    from hf_tinytx_training.model.config import load_model_config

    fields = {"hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4,
              "qk_norm": True, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(fields))
    (tmp_path / "model.json").write_text(json.dumps(fields))
    configs = [load_model_config(parse_args(["--model_config", str(tmp_path / name)])[0])
               for name in ("model.yaml", "model.json")]
    assert configs[0].to_dict() == configs[1].to_dict()
    assert (configs[0].hidden_size, configs[0].num_hidden_layers, configs[0].qk_norm) == (96, 3, True)
    assert configs[0].rope_parameters["rope_theta"] == 500.0


def test_optimizer_auto_is_muon_unless_fsdp_or_deepspeed_shard_the_matrices():
    from hf_tinytx_training.optim.optimizers import chosen_optimizer

    assert parse_args([])[2].optimizer == "auto"
    assert [chosen_optimizer("auto", sharded_by) for sharded_by in (None, "fsdp2", "deepspeed")] == [
        "muon", "adamw", "adamw"]
    assert chosen_optimizer("adamw", None) == "adamw"
    assert chosen_optimizer("muon", "fsdp2") == "muon"  # named: kept, and refused in one line by pretrain.py
