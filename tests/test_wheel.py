"""The package as built for users: the wheel's contents, the `tinytx` command's help and errors without torch,
and the smaller parts of the CI install stage (.ci/wheel_check.py)."""

import importlib.util
import subprocess
import sys
import zipfile

import pytest

from tests.helpers.tiny import REPO_ROOT


def load_wheel_check():
    spec = importlib.util.spec_from_file_location("wheel_check", REPO_ROOT / ".ci" / "wheel_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheel_check = load_wheel_check()


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
    """The file list of a wheel built from this checkout."""
    dist = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO_ROOT)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_wheel_holds_configs_cards_and_the_command_and_no_top_level_training(wheel_names):
    assert wheel_check.wheel_problems(wheel_names) == []
    assert not any(name.startswith("training/") for name in wheel_names)
    configs = {name for name in wheel_names if name.startswith("hf_tinytx_training/configs/")}
    assert {"hf_tinytx_training/configs/model-tiny.json",
            "hf_tinytx_training/configs/accelerate-fsdp2.yaml"} <= configs
    assert len(configs) == len(list((REPO_ROOT / "training" / "configs").iterdir()))
    entry_points = next(name for name in wheel_names if name.endswith("entry_points.txt"))
    assert entry_points.endswith(".dist-info/entry_points.txt")


def test_wheel_problems_names_each_fault():
    good = [*wheel_check.REQUIRED, "hf_tinytx/__init__.py", "hf_tinytx-0.1.0.dist-info/entry_points.txt"]
    assert wheel_check.wheel_problems(good) == []
    bad = [name for name in good if "model_cards" not in name and "entry_points" not in name]
    bad.append("training/pretrain_args.py")
    problems = wheel_check.wheel_problems(bad)
    assert "missing hf_tinytx_training/model_cards/tinytx_model_card.md" in problems
    assert (
        "installs a top-level 'training'; only hf_tinytx, hf_tinytx_training belong to this project"
        in problems
    )
    assert problems[-1].startswith("no entry_points.txt")


def test_the_finetune_records_are_valid_and_include_chats(tmp_path):
    """finetune reads them (its own reader), and the chats give the model the
    template `tinytx serve` chat needs."""
    from hf_tinytx_training.sft.records import read_records

    (tmp_path / "sft.jsonl").write_text(wheel_check.finetune_records(6))
    records = read_records(str(tmp_path / "sft.jsonl"))
    assert len(records) == 6 and {record["kind"] for record in records} == {"prompt", "chat"}


def test_the_ci_pretrain_flags_parse_and_stay_tiny():
    """The stage's pretrain flags are real flags (a renamed one would only fail in CI, minutes in)."""
    from hf_tinytx_training.pretrain_args import parse_args

    model_args, data_args, train_args = parse_args(wheel_check.TINY_PRETRAIN)
    assert (model_args.hidden_size, data_args.block_size, train_args.max_train_steps) == (64, 64, 6)


HELP_SAYS = {  # the command's flags -> a line of their help
    "": "finetune   fine-tune",
    "pretrain": "--max_train_steps",
    # one of Trainer's flags: TrainingArguments, and so torch, loads for them
    "finetune": "--num_train_epochs",
    "convert": "--outtype",
    "interpret": "--coref_probes",
    "serve": "--max_tokens_cap",
    "generate": "--max_new_tokens",
    "chat": "Each line read from standard input is a user turn",
}


@pytest.mark.parametrize("command", HELP_SAYS, ids=[name or "tinytx" for name in HELP_SAYS])
def test_tinytx_help_answers_before_torch_loads(command, tmp_path):
    """`tinytx [command] --help`, run outside the checkout, answers without importing torch; but
    finetune's, which lists Trainer's flags."""
    argv = [command, "--help"] if command else ["--help"]
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "hf_tinytx_training", *argv],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "hf_tinytx_training.cli" in imported and ("torch" in imported) == (command == "finetune")
    assert HELP_SAYS[command] in result.stdout
    if command == "serve":  # the endpoints it lists are those it serves
        assert "POST /v1/chat/completions" in result.stdout and "POST /v1/systemone" not in result.stdout


def test_a_bad_convert_flag_is_refused_before_torch_loads():
    command = [
        sys.executable, "-X", "importtime", "-m", "hf_tinytx_training", "convert", "--to", "onnx", "a", "b",
    ]
    result = subprocess.run(command, cwd=REPO_ROOT.parent, capture_output=True, text=True, timeout=120)
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert result.returncode == 2 and "torch" not in imported
    assert "argument --to: invalid choice: 'onnx'" in result.stderr


def test_an_unknown_tinytx_command_is_one_line_naming_the_closest():
    result = subprocess.run(
        [sys.executable, "-m", "hf_tinytx_training", "pretrian"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip() == ("tinytx: error: unknown command 'pretrian'; did you mean pretrain? "
                                     "(tinytx --help lists them)")


# Makes the named top-level modules look uninstalled, as after `pip install
# hf_tinytx` without the `train` extra.
HIDE_MODULES = """
import sys
from importlib.machinery import PathFinder

class WithoutSome(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] in {hidden} else super().find_spec(name, path, target)

sys.meta_path[sys.meta_path.index(PathFinder)] = WithoutSome
"""


def test_a_training_command_without_the_train_extra_is_one_line_naming_it(tmp_path):
    """Before: `ModuleNotFoundError: No module named 'accelerate'`, a traceback."""
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(
        HIDE_MODULES.format(hidden={"accelerate", "datasets"})
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "hide"), "HOME": str(tmp_path)}
    for command in ("pretrain", "finetune"):
        result = subprocess.run(
            [sys.executable, "-m", "hf_tinytx_training", command, "--output_dir", str(tmp_path / "out")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 2, result.stderr[-3000:]
        assert result.stderr.strip() == (
            f"tinytx {command}: error: the training scripts need the `train` extra (accelerate, datasets not "
            "installed): pip install 'hf_tinytx[train]'"
        )
    assert not (tmp_path / "out").exists()
    # the flags are still listed
    result = subprocess.run([sys.executable, "-m", "hf_tinytx_training", "pretrain", "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--max_train_steps" in result.stdout, result.stderr[-3000:]


@pytest.mark.deep
def test_launchers_run_the_module_as_the_readme_says(tmp_path):
    """README: `torchrun ... -m hf_tinytx_training.pretrain` and `accelerate launch --config_file CONFIG -m
    ...`, CONFIG from the installed package's configs folder."""
    from hf_tinytx_training.model.config_file import CONFIGS_DIR
    from tests.helpers.tiny import TINY_PRETRAIN_ARGS, pretrain_env, run_side_by_side

    flags = [
        *TINY_PRETRAIN_ARGS, "--max_train_steps", "2", "--num_probes_per_kind", "0", "--num_samples", "0",
    ]
    launchers = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"],
        "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                       f"{CONFIGS_DIR}/accelerate-cpu.yaml"],
    }
    env = pretrain_env(tmp_path, OMP_NUM_THREADS="1")
    runs = {
        name: (
            [*launcher, "-m", "hf_tinytx_training.pretrain", *flags, "--output_dir", str(tmp_path / name)],
            tmp_path, env,
        )
        for name, launcher in launchers.items()
    }
    for name, result in run_side_by_side(runs).items():
        assert result.returncode == 0, f"{name}:\n{result.stderr[-3000:]}"
        assert (tmp_path / name / "model.safetensors").is_file(), name
