"""Training on a cluster, played on one host: two "nodes" of one CPU process each (gloo on 127.0.0.1), launched by
the recipes users run (the SLURM batch script under a stand-in srun, the Kubernetes Job's container command,
`accelerate launch` on two machines), and every node fault injected from outside: a frozen worker (SIGSTOP), a
launcher killed alone (kill -9 of torchrun's agent), SIGTERM, node-local folders, launches that would train alone.
Each run is compared with one process training straight through with the same --total_batch_size, across epoch
boundaries.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers import fake_slurm
from tests.helpers.fake_slurm import alive, node_of, workers_under
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env


pytestmark = pytest.mark.deep

STEPS = 120  # ~21 steps an epoch: five epoch boundaries
FLAGS = [*TINY_PRETRAIN_ARGS, "--num_train_documents", "100", "--total_batch_size", "16", "--max_train_steps",
         str(STEPS), "--checkpointing_steps", "20", "--eval_steps", "1000", "--num_probes_per_kind", "0",
         "--num_samples", "0"]
PRETRAIN = str(REPO_ROOT / "training" / "pretrain.py")
CONFIGS = REPO_ROOT / "training" / "configs"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
BOUND = 90  # seconds from a fault to every process gone: --ddp_timeout (10 s) plus start-up and shutdown on a busy CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tmp_path, **extra):
    """Offline, one thread a process, with this interpreter's `python` (and the stand-ins, when given) first."""
    path = os.pathsep.join([*filter(None, [extra.pop("PATH", None)]), os.path.dirname(sys.executable),
                            os.environ["PATH"]])
    return pretrain_env(tmp_path, OMP_NUM_THREADS="1", **{**extra, "PATH": path})


def start(command, tmp_path, **env):
    return subprocess.Popen(command, cwd=tmp_path, env=env_for(tmp_path, **env), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def finish(process, timeout=300) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def run(command, tmp_path, timeout=300, **env) -> tuple[int, str]:
    return finish(start(command, tmp_path, **env), timeout)


def wait_for(path, process, timeout=240):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"ended ({process.returncode}) before {path} appeared:\n{finish(process)[1]}"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def losses(folder) -> dict[int, float]:
    """step -> training loss, the last launch's value where a resumed run logged a step twice."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def assert_equal_runs(folder, straight, tolerance=0.0):
    weights, reference = load_file(folder / "model.safetensors"), load_file(straight / "model.safetensors")
    difference = max((weights[name] - reference[name]).abs().max().item() for name in reference)
    assert difference <= tolerance, f"max |weights - straight| = {difference:.3e}"
    mine, theirs = losses(folder), losses(straight)
    assert sorted(mine) == list(range(1, STEPS + 1))
    logged = 0.0 if tolerance == 0 else 1.0001e-5  # the log keeps 5 decimals: one step of its rounding
    assert max(abs(mine[step] - theirs[step]) for step in theirs) <= logged
    final = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    reference_final = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()][-1]
    assert abs(final["eval_loss"] - reference_final["eval_loss"]) <= 1e-5


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One process, straight through: 16 blocks a step as 2 accumulated micro-batches of 8."""
    folder = tmp_path_factory.mktemp("cluster") / "straight"
    code, output = run([sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder)], folder.parent)
    assert code == 0, output[-3000:]
    return folder


# ---- the recipes, run as written, equal one process

def slurm_job(tmp_path, folder, *flags, port):
    bin_path = fake_slurm.install(tmp_path / "slurm-bin")
    return start(["bash", str(CONFIGS / "slurm.sbatch"), *FLAGS, *flags, "--output_dir", str(folder)], tmp_path,
                 PATH=bin_path, SLURM_NNODES="2",
                 SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_ID="4242", NPROC_PER_NODE="1", RDZV_PORT=str(port))


def test_the_slurm_recipe_survives_a_frozen_node_and_resumes_on_one_process_exactly(tmp_path, straight):
    """srun --kill-on-bad-exit + --ddp_timeout: a frozen worker ends the job within the bound (the survivor names the
    step and the checkpoint); the job restarted on one process continues bit for bit."""
    folder = tmp_path / "run"
    job = slurm_job(tmp_path, folder, "--ddp_timeout", "10", port=free_port())
    wait_for(folder / "checkpoints" / "step_20", job)
    workers = workers_under(job.pid)
    assert len(workers) == 2
    # The first node's worker: its survivor is then srun's second task, whose exit srun must see while the first
    # task (the frozen node's launcher, which may host the rendezvous store and so never fails by itself) runs on.
    frozen = next(pid for pid in workers if node_of(pid) == "0")
    os.kill(frozen, signal.SIGSTOP)
    frozen_at = time.monotonic()
    code, output = finish(job, timeout=BOUND + 60)
    assert time.monotonic() - frozen_at < BOUND, output[-3000:]
    assert code != 0
    assert "did not answer within --ddp_timeout 10 s (frozen, or lost with its node) during step" in output
    assert not alive(frozen)  # srun --kill-on-bad-exit ended it with the job step
    code, output = run([sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder), "--resume_from_checkpoint",
                        "latest"], tmp_path)
    assert code == 0, output[-3000:]
    assert "(written by 2 process(es), now 1)" in output
    assert_equal_runs(folder, straight)


def test_the_kubernetes_job_runs_as_written_on_two_pods(tmp_path, straight):
    """The Job's container command, its $(VAR)s expanded from its env as Kubernetes does, on two "pods"."""
    documents = yaml.safe_load_all((CONFIGS / "kubernetes-job.yaml").read_text())
    job = next(doc for doc in documents if doc["kind"] == "Job")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    container = job["spec"]["template"]["spec"]["containers"][0]
    folder = tmp_path / "run"
    values = {item["name"]: item["value"] for item in container["env"]}
    values.update(RDZV_ENDPOINT=f"127.0.0.1:{free_port()}", OUTPUT_DIR=str(folder))  # the Service's name, here
    command = [re.sub(r"\$\((\w+)\)", lambda found: values[found.group(1)], part)
               for part in container["command"] + container["args"]]
    assert command[0] == "python" and "$(" not in " ".join(command)
    pods = [start([sys.executable, *command[1:], *FLAGS], tmp_path, JOB_COMPLETION_INDEX=str(index))
            for index in range(2)]
    for pod in pods:
        code, output = finish(pod)
        assert code == 0, output[-3000:]
    assert_equal_runs(folder, straight)


def test_accelerate_launch_on_two_machines_without_gpus_trains_on_their_cpus(tmp_path, straight):
    """accelerate-multinode.yaml (MULTI_GPU), each machine's documented command, on machines without GPUs."""
    folder, port = tmp_path / "run", str(free_port())
    machines = [start([*ACCELERATE, "--config_file", str(CONFIGS / "accelerate-multinode.yaml"), "--num_processes",
                       "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port",
                       port, PRETRAIN, *FLAGS, "--output_dir", str(folder)], tmp_path) for rank in (0, 1)]
    for machine in machines:
        code, output = finish(machine)
        assert code == 0, output[-3000:]
    assert "the processes train on its CPUs over gloo" in output
    assert_equal_runs(folder, straight)


# ---- faults of a node

def test_a_worker_whose_launcher_dies_stops_with_a_checkpoint_and_the_run_goes_on_over_1_then_2_processes(
        tmp_path, straight):
    """kill -9 of torchrun's agent: its workers (in their own session) stop at the next step with a checkpoint
    instead of training on alone; resumed on 1 process, stopped again by SIGTERM, resumed on 2: bit for bit."""
    folder = tmp_path / "run"
    agent = start([*TORCHRUN, "--standalone", "--nproc_per_node", "2", PRETRAIN, *FLAGS, "--output_dir", str(folder)],
                  tmp_path)
    wait_for(folder / "checkpoints" / "step_20", agent)
    workers = workers_under(agent.pid)
    assert len(workers) == 2
    os.kill(agent.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    output = finish(agent)[1]  # its output pipe closes once the workers have gone too
    assert "the launcher that started this process" in output
    while any(alive(pid) for pid in workers):
        assert time.monotonic() - killed_at < BOUND, "a worker trained on after its launcher died"
        time.sleep(0.2)
    saved = sorted(int(p.name[5:]) for p in (folder / "checkpoints").glob("step_*"))
    assert saved[-1] > 20 and saved[-1] < STEPS, saved

    one = start([sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder), "--resume_from_checkpoint", "latest"],
                tmp_path)
    wait_for(folder / "checkpoints" / "step_60", one)
    one.send_signal(signal.SIGTERM)
    code, output = finish(one)
    assert code == 143, output[-3000:]
    assert "(written by 2 process(es), now 1)" in output
    code, output = run([*TORCHRUN, "--standalone", "--nproc_per_node", "2", PRETRAIN, *FLAGS, "--output_dir",
                        str(folder), "--resume_from_checkpoint", "latest"], tmp_path)
    assert code == 0, output[-3000:]
    assert "(written by 1 process(es), now 2)" in output
    assert_equal_runs(folder, straight)


def test_an_fsdp2_checkpoint_reshards_into_one_process(tmp_path, straight):
    folder = tmp_path / "run"
    launch = start([*ACCELERATE, "--config_file", str(CONFIGS / "accelerate-fsdp2.yaml"), "--num_processes", "2",
                    PRETRAIN, *FLAGS, "--output_dir", str(folder)], tmp_path)
    wait_for(folder / "checkpoints" / "step_40", launch)
    launch.send_signal(signal.SIGTERM)
    code, output = finish(launch)
    assert code == 143, output[-3000:]
    assert (folder / "checkpoints" / "step_40" / "sharded" / ".metadata").is_file()
    code, output = run([sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder), "--resume_from_checkpoint",
                        "latest"], tmp_path)
    assert code == 0, output[-3000:]
    assert_equal_runs(folder, straight, tolerance=1e-5)  # FSDP2's reduce-scatter rounds differently


def test_a_zero3_checkpoint_on_another_process_count_names_init_from_which_works(tmp_path):
    pytest.importorskip("deepspeed", reason="needs deepspeed (pip install -e '.[deepspeed]')")
    folder, short = tmp_path / "run", [*FLAGS, "--max_train_steps", "6"]
    code, output = run([*ACCELERATE, "--config_file", str(CONFIGS / "accelerate-deepspeed-zero3.yaml"),
                        "--num_processes", "2", PRETRAIN, *short, "--output_dir", str(folder)], tmp_path)
    assert code == 0, output[-3000:]
    assert "FutureWarning" not in output  # DeepSpeed's per-step deprecation notices are silenced
    step = folder / "checkpoints" / "step_6"
    code, output = run([sys.executable, PRETRAIN, *short, "--max_train_steps", "8", "--output_dir", str(folder),
                        "--resume_from_checkpoint", "latest"], tmp_path)
    assert code == 2
    assert (f"pretrain.py: error: {step} was written by 2 process(es) under DeepSpeed; DeepSpeed resumes its "
            f"partitioned states only on as many processes and under DeepSpeed: resume with the same launch, or "
            f"continue from its weights with --init_from {step} (a fresh optimizer and schedule).") in output

    from transformers import AutoConfig, AutoModelForCausalLM

    import hf_tinytx  # noqa: F401
    from hf_tinytx_training import checkpoints

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(step))
    checkpoints.load_partitioned_weights(model, str(step))
    exported, loaded = load_file(folder / "model.safetensors"), model.state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in exported.items())  # step 6 is the final model
    sizes = {"--hidden_size", "--intermediate_size", "--num_hidden_layers", "--num_attention_heads"}
    kept = [value for i, value in enumerate(TINY_PRETRAIN_ARGS)  # the sizes come from the checkpoint's config.json
            if not (value in sizes or (i and TINY_PRETRAIN_ARGS[i - 1] in sizes))]
    code, output = run([sys.executable, PRETRAIN, *kept, "--num_probes_per_kind", "0", "--num_samples", "0",
                        "--max_train_steps", "2", "--init_from", str(step), "--output_dir", str(tmp_path / "next")],
                       tmp_path)
    assert code == 0, output[-3000:]


def test_a_node_local_output_dir_is_refused_before_anything_is_written(tmp_path):
    port, nodes = str(free_port()), [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    launches = [start([*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "local", PRETRAIN, *FLAGS,
                       "--output_dir", str(node / "out")], tmp_path) for node in nodes]
    outputs = [finish(launch) for launch in launches]
    assert all(code != 0 for code, _ in outputs)
    text = "".join(output for _, output in outputs)
    assert "is not one folder shared by every process: what the main process wrote there is missing for process 1" \
        in text
    assert "Tokenizing" not in text and all(not any(node.iterdir()) for node in nodes)


# ---- launches that would train alone stop in one line

def test_launches_that_would_train_alone_stop_in_one_line(tmp_path):
    folder = tmp_path / "never"
    cpu = run([*ACCELERATE, "--cpu", "--num_processes", "2", PRETRAIN, *FLAGS, "--output_dir", str(folder)],
              tmp_path)
    assert cpu[0] != 0 and ("pretrain.py: error: `accelerate launch` was asked for several processes or machines "
                            "but started this script once, alone") in cpu[1]
    bin_path = fake_slurm.install(tmp_path / "slurm-bin")
    tasks = run(["srun", sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder)], tmp_path,
                PATH=bin_path, SLURM_NNODES="2")
    assert tasks[0] != 0 and "pretrain.py: error: srun started 2 tasks and each runs this script alone" in tasks[1]
    if subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True).returncode == 0:
        pdsh = run([*ACCELERATE, "--config_file", str(CONFIGS / "accelerate-deepspeed-zero3.yaml"), "--num_machines",
                    "2", "--num_processes", "2", "--machine_rank", "0", "--main_process_ip", "127.0.0.1",
                    "--main_process_port", str(free_port()), PRETRAIN, *FLAGS, "--output_dir", str(folder)], tmp_path)
        assert pdsh[0] != 0 and "add --deepspeed_multinode_launcher standard" in pdsh[1]
    assert not folder.exists()


# ---- finetune on two nodes: the same promises under Trainer

FINETUNE = str(REPO_ROOT / "training" / "finetune.py")


def finetune_on_two_nodes(tmp_path, folders, *flags):
    """finetune.py under torchrun as two one-process nodes (c10d), one --output_dir per node."""
    from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
    from tests.test_finetune import prompt_records, write_jsonl

    build_tiny_model(vocab_size=320).save_pretrained(tmp_path / "base")
    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", prompt_records(64))
    port = str(free_port())
    return [start([*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"127.0.0.1:{port}", "--rdzv-id", "sft", FINETUNE, "--model_name_or_path", "base", "--train_file",
                   "train.jsonl", "--per_device_train_batch_size", "2", "--logging_steps", "1", "--disable_tqdm",
                   "true", "--output_dir", str(folder), *flags], tmp_path, PYTHONUNBUFFERED="1")
            for folder in folders]


def test_finetune_refuses_node_local_folders_and_a_frozen_node_ends_it_within_ddp_timeout(tmp_path):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    outputs = [finish(launch) for launch in finetune_on_two_nodes(tmp_path, [node / "out" for node in nodes])]
    assert all(code != 0 for code, _ in outputs), outputs
    text = "".join(output for _, output in outputs)
    assert "is not one folder shared by every process: what the main process wrote there is missing for process 1" \
        in text, text[-3000:]
    assert 'finetune.py", line' not in text  # no traceback from the script (torchrun prints its own on exit 2)
    assert all(not any(node.iterdir()) for node in nodes)

    # One shared folder; the second node's worker is frozen after a checkpoint: the first ends within the bound.
    shared = tmp_path / "shared"
    launches = finetune_on_two_nodes(tmp_path, [shared, shared], "--max_steps", "400", "--save_steps", "5",
                                     "--ddp_timeout", "10")
    wait_for(shared / "checkpoints" / "checkpoint-5", launches[0])
    frozen = workers_under(launches[1].pid, "finetune")
    assert len(frozen) == 1
    os.kill(frozen[0], signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        code, output = finish(launches[0], timeout=BOUND + 60)
        seconds = time.monotonic() - frozen_at
    finally:
        os.killpg(launches[1].pid, signal.SIGKILL)
        os.kill(frozen[0], signal.SIGKILL)
        launches[1].communicate()
    assert code != 0 and seconds < BOUND, (code, seconds, output[-3000:])
    lines = [line for line in output.splitlines() if "did not answer within --ddp_timeout 10 s" in line]
    assert lines and lines[0].startswith("finetune.py: error: Another process of the launch"), output[-3000:]
    assert f"checkpoint {shared / 'checkpoints'}/checkpoint-" in lines[0] and "is intact" in lines[0], lines[0]
    assert "--resume_from_checkpoint latest." in lines[0]


@pytest.mark.parametrize("text, frozen", [
    ("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation to complete", True),
    ("wait timeout after 10000ms, keys: /default_pg/0//cpu//2", True),  # a TCPStore wait (DistStoreError)
    ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:50012", False),
], ids=["gloo", "store", "closed"])
def test_the_lost_peer_line_tells_a_frozen_peer_from_one_that_left(text, frozen):
    """Found under load: a peer frozen past --ddp_timeout surfaced as a store wait's "wait timeout", which the line
    called a process that left."""
    from hf_tinytx_training.distributed.cluster import lost_peer_message

    line = lost_peer_message(RuntimeError(text), 10, " during step 8", "out/checkpoints/step_8")
    assert ("did not answer within --ddp_timeout 10 s" in line) == frozen, line
    assert ("left (killed" in line) != frozen and "\n" not in line, line
    assert "checkpoint out/checkpoints/step_8 is intact" in line and "--resume_from_checkpoint latest" in line
