"""Flags of both training scripts (training/pretrain_args.py): spelled in full or refused, every mistake one line on
stderr with exit status 2, a typo named with the flag it was probably meant to be."""

import dataclasses
import re
import subprocess
import sys

import pytest

from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.pretrain_args import ALL_ARGUMENTS, build_parser, parse_args, plan_steps
from tests.helpers.tiny import REPO_ROOT, pretrain_env, run_side_by_side


RECORD = '{"prompt": "Q:", "response": " A"}\n'
FLAG_MISTAKES = {  # (script, flags) -> the one line the script must print
    ("finetune", "typo"): (["--learnig_rate", "1e-3"], "unknown flag --learnig_rate; did you mean --learning_rate?"),
    ("finetune", "abbreviation"): (["--max_step", "3"], "unknown flag --max_step; did you mean --max_steps?"),
    ("pretrain", "typo"): (["--learnig_rate", "1e-3"], "unknown flag --learnig_rate; did you mean --learning_rate?"),
    ("pretrain", "abbreviation"): (
        ["--max_train_step", "3"], "unknown flag --max_train_step; did you mean --max_train_steps?"
    ),
}


def write_finetune_inputs(folder, records: str):
    """base/ (a config and a tokenizer file, the names finetune.py checks for) and data.jsonl holding `records`."""
    (folder / "base").mkdir()
    for name in ("config.json", "tokenizer.json"):
        (folder / "base" / name).write_text("{}")
    (folder / "data.jsonl").write_text(records)
    return folder


@pytest.fixture(scope="module")
def flag_runs(tmp_path_factory):
    """Each mistake in its own process, all started together (each spends seconds importing torch)."""
    inputs = write_finetune_inputs(tmp_path_factory.mktemp("inputs"), RECORD)  # all finetune.py checks early
    runs = {}
    for (script, case), (flags, _) in FLAG_MISTAKES.items():
        cwd = tmp_path_factory.mktemp(f"{script}-{case}")
        required = ["--model_name_or_path", str(inputs / "base"), "--train_file", str(inputs / "data.jsonl")] \
            if script == "finetune" else []
        command = [sys.executable, str(REPO_ROOT / "training" / f"{script}.py"), *required, *flags]
        env = pretrain_env(tmp_path_factory.mktemp("home"))  # caches outside cwd, which must stay empty
        runs[script, case] = command, cwd, env
    finished = run_side_by_side(runs)
    return {key: (cwd, finished[key]) for key, (_, cwd, _) in runs.items()}


@pytest.mark.parametrize("script, case", list(FLAG_MISTAKES))
def test_a_mistyped_or_shortened_flag_is_one_line_naming_the_closest_flag(flag_runs, script, case):
    cwd, result = flag_runs[script, case]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"{script}.py: error: {FLAG_MISTAKES[script, case][1]}"]
    assert not list(cwd.iterdir()), "nothing may be written"


@pytest.mark.parametrize("script, flags, message", [
    ("pretrain", ["--validation_split_percentage", "0"], "--validation_split_percentage must lie"),
    ("pretrain", ["--output_dir", "base"], "already holds an earlier run"),  # the commonest refusal of all
    ("pretrain", ["--train_file", "data.txt"], "'data.txt' matches no file"),
    ("pretrain", ["--model_config", "broken.json"], "broken.json is not valid JSON/YAML"),
    ("finetune", ["--model_name_or_path", "base", "--train_file", "data.jsonl"], "data.jsonl, line 2: not valid JSON"),
])
def test_bad_input_is_refused_before_torch_loads(tmp_path, script, flags, message):
    """Refused in about a second, not after ~8 s of imports: Python's import log (-X importtime) names no torch."""
    write_finetune_inputs(tmp_path, RECORD + '{"prompt": "Q:"\n')
    (tmp_path / "broken.json").write_text('{"hidden_size": 64,')
    command = [sys.executable, "-X", "importtime", str(REPO_ROOT / "training" / f"{script}.py"), *flags]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    *imports, error = result.stderr.strip().splitlines()
    assert result.returncode == 2 and error.startswith(f"{script}.py: error: ") and message in error, error
    imported = {line.split("|")[-1].strip() for line in imports}
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

    result = subprocess.run([sys.executable, str(REPO_ROOT / "training" / "finetune.py"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0 and "usage: finetune.py" in result.stdout, result.stderr[-3000:]
    listed = re.findall(r"^  (--\w+)", result.stdout, re.MULTILINE)
    trainer = [f"--{field.name}" for field in dataclasses.fields(TrainingArguments) if field.init]
    assert listed.index("--model_name_or_path") < listed.index("--use_peft") < listed.index("--output_dir")
    assert set(trainer) <= set(listed), sorted(set(trainer) - set(listed))
    assert not list(tmp_path.iterdir()), "nothing may be written"


def parse_failure(capsys, flags) -> str:
    with pytest.raises(SystemExit) as exit_info:
        build_parser(ALL_ARGUMENTS).parse_args_into_dataclasses(flags, look_for_args_file=False)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_argparse_errors_and_stray_values_are_one_line_too(capsys):
    assert "argument --max_train_steps/--max-train-steps: invalid int value: 'many'" in parse_failure(
        capsys, ["--max_train_steps", "many"]
    )
    assert "unexpected value 'oops'" in parse_failure(capsys, ["--seed", "1", "oops"])
    assert "unknown flag --zzz; run with --help" in parse_failure(capsys, ["--zzz=1"])


def test_flags_in_full_and_defaults_still_parse():
    parser = build_parser(ALL_ARGUMENTS, max_train_steps=7)
    _, data_args, train_args = parser.parse_args_into_dataclasses(["--block-size", "32"], look_for_args_file=False)
    assert (data_args.block_size, train_args.max_train_steps) == (32, 7)


@pytest.mark.parametrize("flags, refusal", [
    (["--total_batch_size", "32", "--gradient_accumulation_steps", "2"],
     "^--total_batch_size sets --gradient_accumulation_steps itself; give one"),
    (["--report_to", "tensorbord"], "^--report_to 'tensorbord': use tensorboard, trackio or wandb"),
    # pretrain and finetune share the check (args.check_hub_repo_id); a default id is said to come from the folder
    (["--push_to_hub", "--output_dir", "out/x y"],
     "^The Hub repo id from --output_dir's name, 'x y' is not a valid Hub repo id; set --hub_model_id to"),
    (["--push_to_hub", "--hub_model_id", "a/b/c"], "^--hub_model_id 'a/b/c' is not a valid Hub repo id"),
])
def test_flags_that_cannot_go_together_or_name_nothing_are_refused(flags, refusal):
    with pytest.raises(UserInputError, match=refusal):
        parse_args(flags)


def test_what_parses_beside_the_refusals(monkeypatch):
    parse_args(["--total_batch_size", "32"])  # alone it parses; the process count is checked at launch
    assert parse_args(["--push_to_hub", "--output_dir", "out/tiny-run"])[2].hub_model_id == "tiny-run"
    assert parse_args(["--output_dir", "out/tiny-run"])[2].hub_model_id is None  # no push: no repo
    monkeypatch.setattr("accelerate.utils.is_wandb_available", lambda: False)  # as on a machine without wandb
    with pytest.raises(UserInputError, match="^--report_to wandb needs the wandb package, which is not installed: "
                                             "pip install wandb, or leave --report_to out.$"):
        parse_args(["--report_to", "tensorboard,wandb"])
    parse_args(["--report_to", "tensorboard"])  # installed with the test extra
    parse_args(["--report_to", "all"])


def test_an_arguments_file_then_flags_that_override_it():
    """`pretrain.py training/configs/tiny.yaml --max_train_steps 100`: the file's values, then the flags after it."""
    model_args, data_args, train_args = parse_args([str(REPO_ROOT / "training/configs/tiny.yaml"),
                                                    "--max_train_steps", "100", "--block_size", "64"])
    assert (train_args.max_train_steps, data_args.block_size) == (100, 64)  # the flags win
    assert (model_args.model_preset, model_args.vocab_size, train_args.eval_steps) == ("micro", 1024, 200)  # the file


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
