"""Scaling out on 2 CPU ranks (gloo): FSDP2 and DeepSpeed ZeRO-2/3 pre-training against 1 process, sharded
checkpoints and resuming, the export, tensor-parallel inference, and setups that must stop before the data.
The model's embeddings are tied, so that sharding or the export would show a broken tie."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.remote_code import BLOCK_HF_TINYTX
from tests.helpers.tiny import LAUNCH, REPO_ROOT, TINY_PRETRAIN_ARGS, assert_same_weights, pretrain_env
from tests.training.publish.test_hub import run_python


pytestmark = pytest.mark.deep

STEPS = 8
TOLERANCE = 1e-5  # sharded ranks reduce-scatter, one process sums the same 16 blocks: float32 rounding apart
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
FSDP2_CONFIG = str(REPO_ROOT / "training" / "configs" / "accelerate-fsdp2.yaml")
# What `accelerate launch` with that config puts in the environment, for runs
# started by torchrun (the kill wrapper).
FSDP2_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


def pretrain(folder, *flags, launcher, env=None, check=True):
    config = folder.parent / "tied.json"
    if not config.exists():
        config.write_text(json.dumps({"tie_word_embeddings": True, "num_key_value_heads": 2}))
    command = [
        *launcher, str(REPO_ROOT / "training" / "pretrain.py"), *TINY_PRETRAIN_ARGS,
        "--model_config", str(config), "--max_train_steps", str(STEPS), "--num_probes_per_kind", "0",
        "--num_samples", "0", "--output_dir", str(folder), *map(str, flags),
    ]
    run_env = pretrain_env(folder.parent, OMP_NUM_THREADS="1", **(env or {}))
    result = subprocess.run(
        command, env=run_env, cwd=folder.parent, capture_output=True, text=True, timeout=300
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{command} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}")
    return result


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, global batch 16."""
    folder = tmp_path_factory.mktemp("scale") / "single"
    pretrain(folder, "--per_device_train_batch_size", 16, launcher=[sys.executable])
    return folder


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    """The documented command: accelerate launch with the FSDP2 config, 2 processes x
    8 blocks, checkpoints every 2."""
    folder = tmp_path_factory.mktemp("scale") / "fsdp2"
    result = pretrain(folder, "--per_device_train_batch_size", 8, "--checkpointing_steps", 2,
                      launcher=[*ACCELERATE, "--config_file", FSDP2_CONFIG, "--num_processes", "2"])
    return folder, result


def assert_matches_one_process(folder, single, what: str):
    weights, reference = load_file(folder / "model.safetensors"), load_file(single / "model.safetensors")
    assert "lm_head.weight" not in weights and weights.keys() == reference.keys()  # tied: saved once
    difference = max((weights[name] - reference[name]).abs().max().item() for name in weights)
    print(f"max |{what} - single| after {STEPS} steps: {difference:.3e}")
    assert difference < TOLERANCE


def test_fsdp2_shards_half_per_rank_and_matches_one_process(fsdp2, single):
    folder, result = fsdp2
    assert "FSDP2 by torch's fully_shard" in result.stdout
    for rank in (0, 1):  # each rank holds half of the parameters and half of AdamW's two moments
        line = next(line for line in result.stdout.splitlines() if line.startswith(f"rank {rank} of 2 holds"))
        assert line.count("(50.0%") == 2, line
    assert_matches_one_process(folder, single, "fsdp2")
    losses = [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    assert len(losses) == STEPS and losses[-1] < losses[0]


def test_fsdp2_checkpoints_are_sharded_and_checksummed(fsdp2):
    folder, _ = fsdp2
    step = folder / "checkpoints" / f"step_{STEPS}"
    listed = json.loads((step / "checksums.json").read_text())
    assert {
        "sharded/__0_0.distcp", "sharded/__1_0.distcp", "sharded/.metadata", "scheduler.bin",
    } <= listed.keys()
    # nothing gathered on rank 0
    assert not any(name.endswith((".safetensors", "optimizer.bin")) for name in listed)


def test_fsdp2_export_loads_without_the_package(fsdp2, tmp_path):
    folder, _ = fsdp2
    assert not list(folder.glob("_fsdp*.py"))
    assert_loads_without_the_package(folder, tmp_path)


def assert_loads_without_the_package(folder, tmp_path):
    """The exported folder is an ordinary TinyTx model: it loads with
    transformers alone, its embeddings tied."""
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["TinyTxForCausalLM"] and config["tie_word_embeddings"]
    assert (folder / "modeling_tinytx.py").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = run_python(
        BLOCK_HF_TINYTX,
        f"""
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
        tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        print("LOADED", type(model).__module__.split(".")[0], tied)
        """,
        env={**env, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"},
        cwd=tmp_path,
        timeout=120,
    )
    assert "LOADED transformers_modules True" in result.stdout


def test_fsdp2_killed_resumes_bit_for_bit_and_skips_a_damaged_shard(fsdp2, tmp_path):
    straight, _ = fsdp2
    resumed = tmp_path / "resumed"
    # SIGKILL right after the third save_state returns: step 6 is still under its temporary name.
    killer = [*TORCHRUN, LAUNCH, "--kill-at", "after:accelerate.Accelerator.save_state:3"]
    crashed = pretrain(
        resumed, "--per_device_train_batch_size", 8, "--checkpointing_steps", 2, launcher=killer,
        env=FSDP2_ENV, check=False,
    )
    assert crashed.returncode != 0
    checkpoints = resumed / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == [".tmp_step_6", "step_2", "step_4", "tokenizer"]
    # Rank 1's shard of step 4 damaged after it was written: `latest` must skip
    # step 4 and continue from step 2.
    shard = checkpoints / "step_4" / "sharded" / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))

    result = pretrain(resumed, "--per_device_train_batch_size", 8, "--checkpointing_steps", 2,
                      "--resume_from_checkpoint", "latest", launcher=TORCHRUN, env=FSDP2_ENV)
    assert "sharded/__1_0.distcp does not match its checksum" in result.stdout
    assert "Resumed from" in result.stdout and "at step 2" in result.stdout
    assert_same_weights(straight, resumed)


def test_fsdp2_resumes_from_the_hub_on_an_empty_folder_bit_for_bit(fsdp2, local_hub, tmp_path):
    """FSDP2's sharded checkpoint (each rank's .distcp) goes up whole with --hub_strategy checkpoint; killed
    right after that upload, its folder gone with the machine, the same command on an empty folder resumes
    from the Hub and ends with the straight run's weights."""
    straight, _ = fsdp2
    repo, lost, resumed = f"{local_hub.user}/fsdp2", tmp_path / "lost", tmp_path / "resumed"
    env = {**FSDP2_ENV, **local_hub.client_env(tmp_path / "hf_home")}
    flags = ["--per_device_train_batch_size", 8, "--checkpointing_steps", 2, "--push_to_hub",
             "--hub_model_id", repo, "--hub_strategy", "checkpoint"]
    killer = [*TORCHRUN, LAUNCH, "--kill-at", "after:huggingface_hub.HfApi.create_commit:1"]
    crashed = pretrain(lost, *flags, launcher=killer, env=env, check=False)
    assert crashed.returncode != 0, crashed.stdout[-2000:]
    listed = json.loads(local_hub.repo_files(repo)["last-checkpoint/checksums.json"])
    assert {"sharded/__0_0.distcp", "sharded/__1_0.distcp", "sharded/.metadata"} <= listed.keys()
    shutil.rmtree(lost)  # the machine is gone

    result = pretrain(resumed, *flags, "--resume_from_checkpoint", "hub", launcher=TORCHRUN, env=env)
    assert f"Resuming from the Hub's checkpoint {repo}@" in result.stdout, result.stdout[-3000:]
    assert "at step 2" in result.stdout
    assert_same_weights(straight, resumed)


# ---- tensor-parallel inference: transformers' tp_plan="auto" with the config's base_model_tp_plan

TP_RUN = str(REPO_ROOT / "tests" / "helpers" / "tp_run.py")
# colwise = S(0): output features (whole heads) split; rowwise = S(1): input split, outputs all-reduced.
EXPECTED_PLAN = {
    "model.layers.0.self_attn.q_proj": "S(0)", "model.layers.0.self_attn.k_proj": "S(0)",
    "model.layers.0.self_attn.v_proj": "S(0)", "model.layers.0.self_attn.o_proj": "S(1)",
    "model.layers.0.mlp.gate_proj": "S(0)", "model.layers.0.mlp.up_proj": "S(0)",
    # colwise_gather_output: vocab split, logits gathered
    "model.layers.0.mlp.down_proj": "S(1)", "lm_head": "S(0)",
}


def tp_run(folder, prefix, ranks: int, plan="auto"):
    launcher = [*TORCHRUN[:-1], str(ranks)] if ranks > 1 else [sys.executable]
    env = pretrain_env(prefix.parent, OMP_NUM_THREADS="1")
    return subprocess.run([*launcher, TP_RUN, str(folder), str(prefix), json.dumps(plan)], env=env,
                          capture_output=True, text=True, timeout=180)


def tp_matches_one_process(folder, tmp_path, plan="auto") -> tuple[dict, list[dict]]:
    """One process, then 2 ranks with `plan`: each rank's logits within 1e-5 of
    one process's, the same tokens."""
    for ranks in (1, 2):
        result = tp_run(folder, tmp_path / f"tp{ranks}", ranks, plan if ranks == 2 else "auto")
        assert result.returncode == 0, result.stderr[-3000:]
    one, ranks = torch.load(tmp_path / "tp1.rank0.pt"), [
        torch.load(tmp_path / f"tp2.rank{rank}.pt") for rank in (0, 1)
    ]
    for rank, sharded in enumerate(ranks):
        difference = (sharded["logits"] - one["logits"]).abs().max().item()
        print(f"{folder.name} rank {rank}: max |tp - one process| logits {difference:.2e}")
        assert difference < 1e-5
        assert torch.equal(sharded["tokens"], one["tokens"])
    return one, ranks


@pytest.mark.parametrize("tied", [False, True])
def test_tensor_parallel_matches_one_process(tiny_model, tmp_path, tied):
    folder = tmp_path / f"tied={tied}"
    tiny_model(tie_word_embeddings=tied, intermediate_size=96).save_pretrained(folder)
    one, ranks = tp_matches_one_process(folder, tmp_path)
    for sharded in ranks:
        assert {name: layer["placement"] for name, layer in sharded["layers"].items()} == EXPECTED_PLAN
        for name, layer in sharded["layers"].items():  # each rank holds half of every linear layer
            full = torch.Size(one["layers"][name]["local_shape"]).numel()
            assert 2 * torch.Size(layer["local_shape"]).numel() == full


def test_tensor_parallel_refuses_key_value_heads_the_ranks_cannot_split(tiny_model, tmp_path):
    folder = tmp_path / "model"
    tiny_model(hidden_size=48, num_attention_heads=6, num_key_value_heads=3).save_pretrained(folder)
    result = tp_run(folder, tmp_path / "tp", 2)
    assert result.returncode != 0
    assert (
        "ValueError: Tensor parallelism over 2 processes with the 'colwise' plan for k_proj needs "
        "num_key_value_heads (3) to be divisible by 2; run on a process count that divides it (or 1 "
        "process), or shard the attention with 'unit_colwise'/'unit_rowwise', which share heads."
    ) in result.stderr
    # refused while loading, not in the first forward
    assert "is invalid for input of size" not in result.stderr


def test_tensor_parallel_with_unit_styles_shares_the_heads_the_ranks_cannot_split(tiny_model, tmp_path):
    """unit_colwise/unit_rowwise share heads that do not divide: 3 heads over 2 ranks
    compute what one process does."""
    folder = tmp_path / "model"
    tiny_model(hidden_size=48, num_attention_heads=3, num_key_value_heads=3).save_pretrained(folder)
    plan = {f"model.layers.*.self_attn.{name}": "unit_colwise" for name in ("q_proj", "k_proj", "v_proj")}
    plan["model.layers.*.self_attn.o_proj"] = "unit_rowwise"
    tp_matches_one_process(folder, tmp_path, plan)


# ---- setups this machine cannot run stop in one line, before any data is read

def refusal(result, folder) -> str:
    """The first `pretrain.py: error:` line of a run that stopped before reading
    data or creating its folder."""
    assert result.returncode != 0
    assert "Tokenizing" not in result.stderr + result.stdout and not folder.exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("pretrain.py: error:")]
    assert errors, result.stderr[-3000:]
    return errors[0]


def test_a_gpu_config_on_a_cpu_only_machine_trains_on_its_cpus(tmp_path, single):
    """accelerate-ddp.yaml (MULTI_GPU) with no GPU trains on the CPUs over gloo (it was refused before)."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU: it checks a GPU config on a CPU-only box")
    folder = tmp_path / "run"
    config = str(REPO_ROOT / "training" / "configs" / "accelerate-ddp.yaml")
    result = pretrain(folder, "--per_device_train_batch_size", 8,
                      launcher=[*ACCELERATE, "--config_file", config, "--num_processes", "2"])
    assert (
        "asks for GPUs, but this machine has none: the processes train on its CPUs over gloo" in result.stdout
    )
    assert "2 process(es) on cpu" in result.stdout
    assert_matches_one_process(folder, single, "ddp config")


# ---- a global batch the processes cannot share stops in one line, before any data is read

def test_a_total_batch_the_processes_cannot_share_stops_before_the_data(tmp_path):
    folder = tmp_path / "run"
    result = pretrain(folder, "--per_device_train_batch_size", 4, "--total_batch_size", 12, launcher=TORCHRUN,
                      check=False)
    assert refusal(result, folder) == (
        "pretrain.py: error: --total_batch_size 12 cannot be split over 2 process(es) x "
        "--per_device_train_batch_size 4: it must be a multiple of 8; change the total, the per-device "
        "batch or the process count."
    )


def test_muon_under_a_sharded_config_stops_before_the_data(tmp_path):
    folder = tmp_path / "run"
    config = str(REPO_ROOT / "training" / "configs" / "accelerate-fsdp2.yaml")
    result = pretrain(folder, "--optimizer", "muon", check=False,
                      launcher=[*ACCELERATE, "--config_file", config, "--num_processes", "2"])
    assert refusal(result, folder) == (
        "pretrain.py: error: --optimizer muon needs whole weight matrices on every process, which fsdp2 "
        "does not keep; use --optimizer adamw, or Muon with one process or DDP."
    )


# ---- DeepSpeed ZeRO-2 and ZeRO-3 through Accelerate, on DeepSpeed's CPU
# accelerator over gloo (nothing compiled)

def deepspeed_run(folder, stage: int, *flags, check=True):
    """The documented command with the ZeRO config of that stage, 2 processes x 8 blocks."""
    assert importlib.util.find_spec(
        "deepspeed"
    ), "deepspeed is part of the test extra: pip install -e '.[test]'"
    config = str(REPO_ROOT / "training" / "configs" / f"accelerate-deepspeed-zero{stage}.yaml")
    return pretrain(folder, "--per_device_train_batch_size", 8, *flags,
                    launcher=[*ACCELERATE, "--config_file", config, "--num_processes", "2"], check=check)


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    """ZeRO-3 with checkpoints every 4 steps (step 4 is where the resume test starts)."""
    folder = tmp_path_factory.mktemp("scale") / "zero3"
    return folder, deepspeed_run(folder, 3, "--checkpointing_steps", 4)


def assert_holds(result, parameters: str, optimizer_state: str):
    """Each rank's own line: the share of the parameters and of AdamW's moments it holds."""
    for rank in (0, 1):
        line = next(line for line in result.stdout.splitlines() if line.startswith(f"rank {rank} of 2 holds"))
        assert (
            f"parameters ({parameters}," in line and f"optimizer-state values ({optimizer_state}," in line
        ), line


def test_deepspeed_zero2_matches_one_process(single, tmp_path):
    folder = tmp_path / "zero2"
    result = deepspeed_run(folder, 2, "--checkpointing_steps", 4)
    assert "2 process(es) on cpu (DistributedType.DEEPSPEED)" in result.stdout
    # ZeRO-2 shards the optimizer state only
    assert_holds(result, parameters="100.0%", optimizer_state="50.0%")
    listed = json.loads((folder / "checkpoints" / f"step_{STEPS}" / "checksums.json").read_text())
    assert {
        f"pytorch_model/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)
    } <= listed.keys()
    assert_matches_one_process(folder, single, "zero2")


def test_deepspeed_zero3_matches_one_process_and_exports_a_full_model(zero3, single, tmp_path):
    folder, result = zero3
    assert "2 process(es) on cpu (DistributedType.DEEPSPEED)" in result.stdout
    assert_holds(result, parameters="50.0%", optimizer_state="50.0%")
    listed = json.loads((folder / "checkpoints" / f"step_{STEPS}" / "checksums.json").read_text())
    for rank in (0, 1):  # ZeRO-3: parameters and optimizer state each in one file per process
        assert {
            f"pytorch_model/zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt" for kind in ("model", "optim")
        } <= listed.keys()
    assert_matches_one_process(folder, single, "zero3")
    assert_loads_without_the_package(folder, tmp_path)


def test_a_deepspeed_config_that_disagrees_with_the_flags_stops_before_the_data(tmp_path):
    config = tmp_path / "zero3-accumulating.yaml"
    original = (REPO_ROOT / "training" / "configs" / "accelerate-deepspeed-zero3.yaml").read_text()
    config.write_text(
        original.replace("  zero_stage: 3\n", "  zero_stage: 3\n  gradient_accumulation_steps: 2\n")
    )
    folder = tmp_path / "run"
    result = pretrain(folder, launcher=[*ACCELERATE, "--config_file", str(config), "--num_processes", "1"],
                      check=False)
    assert refusal(result, folder) == (
        "pretrain.py: error: The DeepSpeed config sets gradient_accumulation_steps: 2 but this run has "
        "--gradient_accumulation_steps 1; remove it from the Accelerate config (the flag decides) or pass "
        "--gradient_accumulation_steps 2.")


def test_a_deepspeed_clipping_that_disagrees_with_max_grad_norm_is_refused_and_auto_takes_the_flag():
    """The same rule for gradient_clipping, in process on the config Accelerate hands over."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from hf_tinytx_training.distributed.sharding import apply_flags_to_deepspeed_config
    from hf_tinytx_training.errors import UserInputError

    def accelerator(settings: dict):
        state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=2, deepspeed_config=settings))
        return SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, state=state)

    flags = SimpleNamespace(gradient_accumulation_steps=2, max_grad_norm=1.0)
    with pytest.raises(UserInputError) as refusal:
        apply_flags_to_deepspeed_config(accelerator({"gradient_clipping": 0.5}), flags)
    assert str(refusal.value) == (
        "The DeepSpeed config sets gradient_clipping: 0.5 but this run has --max_grad_norm 1.0; remove it "
        "from the Accelerate config (the flag decides) or pass --max_grad_norm 0.5."
    )
    settings = {"gradient_clipping": "auto"}  # and gradient_accumulation_steps left out
    apply_flags_to_deepspeed_config(accelerator(settings), flags)
    assert settings == {"gradient_clipping": 1.0, "gradient_accumulation_steps": 2}
    # the same value as an int: accepted
    apply_flags_to_deepspeed_config(accelerator({"gradient_clipping": 1}), flags)


def test_deepspeed_zero3_resumes_bit_for_bit(zero3, tmp_path):
    straight, _ = zero3
    resumed = tmp_path / "resumed"
    # The straight run as it stood after step 4: its tokenizer and its step_4 checkpoint, nothing after.
    for name in ("tokenizer", "step_4"):
        shutil.copytree(straight / "checkpoints" / name, resumed / "checkpoints" / name)
    result = deepspeed_run(resumed, 3, "--checkpointing_steps", 4, "--resume_from_checkpoint", "latest")
    assert "at step 4" in result.stdout
    assert_same_weights(straight, resumed)


class RunsACommand:
    """What an attacker plants: unpickling it calls os.system."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_planted_pickle_in_a_deepspeed_checkpoint_is_refused_and_never_runs(zero3, tmp_path):
    """DeepSpeed unpickles with weights_only=False; the resume reads with weights_only=True."""
    import hashlib

    straight, _ = zero3
    planted = tmp_path / "planted"
    for name in ("tokenizer", "step_4"):
        shutil.copytree(straight / "checkpoints" / name, planted / "checkpoints" / name)
    step, marker = planted / "checkpoints" / "step_4", tmp_path / "the_pickle_ran"
    states = step / "pytorch_model" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    torch.save({"module": RunsACommand(f"touch {marker}")}, states)
    listed = json.loads((step / "checksums.json").read_text())
    listed[str(states.relative_to(step))] = hashlib.sha256(states.read_bytes()).hexdigest()
    (step / "checksums.json").write_text(json.dumps(listed))

    result = deepspeed_run(
        planted, 3, "--checkpointing_steps", 4, "--resume_from_checkpoint", "latest", check=False
    )
    assert result.returncode != 0 and not marker.exists(), "the planted pickle ran"
    errors = [line for line in result.stderr.splitlines() if line.startswith("pretrain.py: error:")]
    refusal = [line for line in errors if f"Refused to load {states}: it holds posix.system" in line]
    # The other process, waiting in a collective for the one that refused, says that it left: one line too.
    assert refusal and all(
        line == refusal[0] or "Another process of the launch left" in line for line in errors
    ), result.stderr[-3000:]
    assert not (planted / "model.safetensors").exists()
