"""A cluster played on one host: two "nodes" of one CPU process each, launched by the recipes users run, every
node fault injected from outside (SIGSTOP, kill -9 of a launcher, SIGTERM, node-local folders). Each run is
compared with one process training straight through. SLURM: test_slurm.py."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from hf_tinytx_training.distributed.cluster import LAUNCHER_GRACE
from tests.helpers.cluster_runs import (
    FLAGS,
    PRETRAIN,
    STEPS,
    assert_equal_runs,
    finish,
    free_port,
    run,
    start,
    train_straight,
)
from tests.helpers.processes import (
    alive,
    command_line,
    descendants,
    freeze,
    listening_on,
    pending_signals,
    workers_under,
)
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS


pytestmark = pytest.mark.deep

CONFIGS = REPO_ROOT / "training" / "configs"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
# seconds from a fault to every process gone: --ddp_timeout (10 s) plus start-up and shutdown on a busy CI
BOUND = 90


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return train_straight(tmp_path_factory.mktemp("cluster") / "straight")


def wait_for(path, process, timeout=240):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert (
            process.poll() is None
        ), f"ended ({process.returncode}) before {path} appeared:\n{finish(process)[1]}"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


# ---- the recipes, run as written, equal one process

def kubernetes_job():
    documents = yaml.safe_load_all((CONFIGS / "kubernetes-job.yaml").read_text())
    return next(doc for doc in documents if doc["kind"] == "Job")


def pod_command(job, folder) -> list[str]:
    """The Job's container command, its $(VAR)s expanded from its env as Kubernetes does."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    values = {item["name"]: item["value"] for item in container["env"]}
    # the Service's name, here
    values.update(RDZV_ENDPOINT=f"127.0.0.1:{free_port()}", OUTPUT_DIR=str(folder))
    command = [re.sub(r"\$\((\w+)\)", lambda found: values[found.group(1)], part)
               for part in container["command"] + container["args"]]
    assert command[0] == "python" and "$(" not in " ".join(command)
    return [sys.executable, *command[1:], *FLAGS, "--ddp_timeout", "30"]


def pods(job, folder, tmp_path):
    command = pod_command(job, folder)
    return [start(command, tmp_path, JOB_COMPLETION_INDEX=str(index)) for index in range(2)]


def policy_for(job, status: int) -> str:
    """What the Job's podFailurePolicy does with a pod that exits with `status`
    ("Count": against backoffLimit)."""
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes and (status in codes["values"]) == (codes["operator"] == "In"):
            return rule["action"]
    return "Count"


def test_the_kubernetes_job_runs_as_written_and_a_deleted_pod_stops_both_with_the_status_its_policy_ignores(
        tmp_path, straight):
    """Deleting pod 0 (SIGTERM to its launcher): both pods save at one step and exit 143,
    which the podFailurePolicy ignores; the new pods resume. A crash counts against
    backoffLimit; bad input fails the Job."""
    job = kubernetes_job()
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # what a podFailurePolicy needs
    disrupted = job["spec"]["podFailurePolicy"]["rules"][0]
    assert disrupted == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert [policy_for(job, status) for status in (143, 130, 2, 1)] == [
        "Ignore", "Ignore", "FailJob", "Count",
    ]

    folder = tmp_path / "run"
    first = pods(job, folder, tmp_path)
    wait_for(folder / "checkpoints" / "step_20", first[0])
    workers = [pid for pod in first for pid in workers_under(pod.pid)]
    assert len(workers) == 2
    freeze(workers)  # the stop lands mid-run, however fast the machine
    first[0].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while signal.SIGTERM not in pending_signals(workers_under(first[0].pid)[0]):
        assert time.monotonic() < deadline, "the launcher did not pass SIGTERM on"
        time.sleep(0.1)
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    outputs = [finish(pod) for pod in first]
    assert [code for code, _ in outputs] == [143, 143], [output[-3000:] for _, output in outputs]
    assert re.search(r"^pretrain\.py: stopped at step \d+ of 120 by SIGTERM", outputs[0][1], re.M), outputs[
        0
    ][1]
    # pod 1 prints only its failures
    assert "train:" not in outputs[1][1] and "Training for" not in outputs[1][1]

    for pod in pods(job, folder, tmp_path):  # Kubernetes' new pods
        code, output = finish(pod)
        assert code == 0, output[-3000:]
    assert_equal_runs(folder, straight)


def test_accelerate_launch_on_two_machines_without_gpus_trains_on_their_cpus(tmp_path, straight):
    """accelerate-multinode.yaml (MULTI_GPU), each machine's documented command, on machines without GPUs."""
    folder, port = tmp_path / "run", str(free_port())
    machines = [
        start(
            [
                *ACCELERATE, "--config_file", str(CONFIGS / "accelerate-multinode.yaml"),
                "--num_processes", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
                "--main_process_port", port, PRETRAIN, *FLAGS, "--output_dir", str(folder),
            ],
            tmp_path,
        )
        for rank in (0, 1)
    ]
    outputs = [finish(machine) for machine in machines]
    assert all(code == 0 for code, _ in outputs), [output[-3000:] for _, output in outputs]
    assert "the processes train on its CPUs over gloo" in outputs[0][1]  # said once, by the main process
    assert "the processes train on its CPUs over gloo" not in outputs[1][1]
    assert_equal_runs(folder, straight)


# ---- faults of a node

def test_a_worker_whose_launcher_dies_stops_with_a_checkpoint_and_the_run_goes_on_over_1_then_2_processes(
        tmp_path, straight):
    """kill -9 of torchrun's agent: its workers stop with a checkpoint instead of training on alone."""
    folder = tmp_path / "run"
    agent = start(
        [*TORCHRUN, "--standalone", "--nproc_per_node", "2", PRETRAIN, *FLAGS, "--output_dir", str(folder)],
        tmp_path,
    )
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

    one = start(
        [sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder), "--resume_from_checkpoint", "latest"],
        tmp_path,
    )
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


def test_a_frozen_rendezvous_host_ends_the_other_nodes_launcher_within_ddp_timeout_and_a_grace(tmp_path):
    """The store host frozen whole: the other worker stops at --ddp_timeout; its launcher, waiting on the
    frozen store even through SIGTERM, is ended by the watcher its worker left, LAUNCHER_GRACE later."""
    folder, port, timeout = tmp_path / "run", free_port(), 10
    command = [
        *TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "frozen", PRETRAIN, *FLAGS,
        "--ddp_timeout", str(timeout), "--output_dir", str(folder),
    ]
    host = start(command, tmp_path)
    deadline = time.monotonic() + 120
    while listening_on(port) != host.pid:  # the first launcher to start hosts the store
        assert host.poll() is None and time.monotonic() < deadline, finish(host)[1][-3000:]
        time.sleep(0.1)
    other = start(command, tmp_path)
    frozen = [host.pid]
    try:
        wait_for(folder / "checkpoints" / "step_20", other)
        frozen += workers_under(host.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        code, output = finish(other, timeout=timeout + LAUNCHER_GRACE + 120)
        seconds = time.monotonic() - frozen_at
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
        host.communicate()
    print(f"frozen store host: the other node's launcher ended {seconds:.1f} s after the freeze")
    assert (
        "did not answer within --ddp_timeout 10 s (frozen, or lost with its node) during step" in output
    ), output
    assert code == -signal.SIGKILL, (code, output[-3000:])  # the watcher's doing: torchrun alone never exits
    assert timeout + LAUNCHER_GRACE <= seconds < timeout + LAUNCHER_GRACE + 45, seconds


def test_an_fsdp2_checkpoint_reshards_into_one_process(tmp_path, straight):
    folder = tmp_path / "run"
    launch = start(
        [
            *ACCELERATE, "--config_file", str(CONFIGS / "accelerate-fsdp2.yaml"), "--num_processes", "2",
            PRETRAIN, *FLAGS, "--output_dir", str(folder),
        ],
        tmp_path,
    )
    wait_for(folder / "checkpoints" / "step_40", launch)
    launch.send_signal(signal.SIGTERM)
    code, output = finish(launch)
    assert code == 143, output[-3000:]
    assert (folder / "checkpoints" / "step_40" / "sharded" / ".metadata").is_file()
    code, output = run(
        [sys.executable, PRETRAIN, *FLAGS, "--output_dir", str(folder), "--resume_from_checkpoint", "latest"],
        tmp_path,
    )
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
    code, output = run(
        [
            sys.executable, PRETRAIN, *short, "--max_train_steps", "8", "--output_dir", str(folder),
            "--resume_from_checkpoint", "latest",
        ],
        tmp_path,
    )
    assert code == 2
    assert (
        f"pretrain.py: error: {step} was written by 2 process(es) under DeepSpeed; DeepSpeed resumes its "
        "partitioned states only on as many processes and under DeepSpeed: resume with the same launch, or "
        f"continue from its weights with --init_from {step} (a fresh optimizer and schedule)."
    ) in output

    from transformers import AutoConfig, AutoModelForCausalLM

    import hf_tinytx  # noqa: F401
    from hf_tinytx_training import checkpoints

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(step))
    checkpoints.load_partitioned_weights(model, str(step))
    exported, loaded = load_file(folder / "model.safetensors"), model.state_dict()
    # step 6 is the final model
    assert all(torch.equal(loaded[name], tensor) for name, tensor in exported.items())
    sizes = {"--hidden_size", "--intermediate_size", "--num_hidden_layers", "--num_attention_heads"}
    # the sizes come from the checkpoint's config.json
    kept = [value for i, value in enumerate(TINY_PRETRAIN_ARGS)
            if not (value in sizes or (i and TINY_PRETRAIN_ARGS[i - 1] in sizes))]
    code, output = run(
        [
            sys.executable, PRETRAIN, *kept, "--num_probes_per_kind", "0", "--num_samples", "0",
            "--max_train_steps", "2", "--init_from", str(step), "--output_dir", str(tmp_path / "next"),
        ],
        tmp_path,
    )
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
    assert (
        "is not one folder shared by every process: what the main process wrote there is missing for "
        "process 1"
        in text
    )
    assert "Tokenizing" not in text and all(not any(node.iterdir()) for node in nodes)


# ---- launches that would train alone stop in one line

def test_launches_that_would_train_alone_stop_in_one_line(tmp_path):
    """srun tasks without a launcher: tests/training/distributed/test_slurm.py, on a real SLURM."""
    folder = tmp_path / "never"
    cpu = run([*ACCELERATE, "--cpu", "--num_processes", "2", PRETRAIN, *FLAGS, "--output_dir", str(folder)],
              tmp_path)
    assert (
        cpu[0] != 0
        and (
            "pretrain.py: error: `accelerate launch` was asked for several processes or machines but "
            "started this script once, alone"
        )
        in cpu[1]
    )
    if subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True).returncode == 0:
        pdsh = run(
            [
                *ACCELERATE, "--config_file", str(CONFIGS / "accelerate-deepspeed-zero3.yaml"),
                "--num_machines", "2", "--num_processes", "2", "--machine_rank", "0",
                "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), PRETRAIN, *FLAGS,
                "--output_dir", str(folder),
            ],
            tmp_path,
        )
        assert pdsh[0] != 0 and "add --deepspeed_multinode_launcher standard" in pdsh[1]
    assert not folder.exists()


# ---- finetune on two nodes: the same promises under Trainer

FINETUNE = str(REPO_ROOT / "training" / "finetune.py")


def finetune_on_two_nodes(tmp_path, folders, *flags):
    """finetune.py under torchrun as two one-process nodes (c10d), one --output_dir per node."""
    from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model
    from tests.training.sft.test_finetune import prompt_records, write_jsonl

    build_tiny_model(vocab_size=320).save_pretrained(tmp_path / "base")
    build_byte_bpe_tokenizer().save_pretrained(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", prompt_records(64))
    port = str(free_port())
    return [
        start(
            [
                *TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "sft", FINETUNE,
                "--model_name_or_path", "base", "--train_file", "train.jsonl",
                "--per_device_train_batch_size", "2", "--logging_steps", "1", "--disable_tqdm", "true",
                "--output_dir", str(folder), *flags,
            ],
            tmp_path,
            PYTHONUNBUFFERED="1",
        )
        for folder in folders
    ]


def test_finetune_refuses_node_local_folders_and_a_frozen_node_ends_it_within_ddp_timeout(tmp_path):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    outputs = [finish(launch) for launch in finetune_on_two_nodes(tmp_path, [node / "out" for node in nodes])]
    assert all(code != 0 for code, _ in outputs), outputs
    text = "".join(output for _, output in outputs)
    assert (
        "is not one folder shared by every process: what the main process wrote there is missing for "
        "process 1"
        in text
    ), text[-3000:]
    # no traceback from the script (torchrun prints its own on exit 2)
    assert 'finetune.py", line' not in text
    assert all(not any(node.iterdir()) for node in nodes)

    # One shared folder; the second node's worker is frozen after a checkpoint:
    # the first ends within the bound.
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
    assert f"checkpoint {shared / 'checkpoints'}/checkpoint-" in lines[0] and "is intact" in lines[0], lines[
        0
    ]
    assert "--resume_from_checkpoint latest." in lines[0]


@pytest.mark.parametrize(
    "text, frozen",
    [
        (
            "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv operation to "
            "complete",
            True,
        ),
        ("wait timeout after 10000ms, keys: /default_pg/0//cpu//2", True),  # a TCPStore wait (DistStoreError)
        ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:50012", False),
    ],
    ids=["gloo", "store", "closed"],
)
def test_the_lost_peer_line_tells_a_frozen_peer_from_one_that_left(text, frozen):
    """Under load a frozen peer surfaced as a store's "wait timeout", once called a process that left."""
    from hf_tinytx_training.distributed.cluster import lost_peer_message

    line = lost_peer_message(RuntimeError(text), 10, " during step 8", "out/checkpoints/step_8")
    assert ("did not answer within --ddp_timeout 10 s" in line) == frozen, line
    assert ("left (killed" in line) != frozen and "\n" not in line, line
    assert "checkpoint out/checkpoints/step_8 is intact" in line and "--resume_from_checkpoint latest" in line


# ---- the launcher's end, in small


def test_a_launcher_is_ended_only_once_its_last_worker_has_ended_and_the_grace_has_passed():
    """end_stuck_launcher leaves a launcher alone while its worker runs; another watcher among its children (a
    container's first process inherits orphans) is no worker."""
    from hf_tinytx_training.distributed.cluster import end_stuck_launcher, started

    watcher = [sys.executable, "-c", "import time; time.sleep(600)  # end_stuck_launcher"]
    stuck = (f"import subprocess, time; subprocess.Popen({watcher!r}); subprocess.run(['sleep', '2']); "
             f"time.sleep(600)")
    launcher, watchers = subprocess.Popen([sys.executable, "-c", stuck]), []
    try:
        deadline = time.monotonic() + 60
        workers = []
        while not workers or not watchers:
            below = {pid: command_line(pid) for pid in descendants(launcher.pid)}
            workers = [pid for pid, line in below.items() if line.split() == ["sleep", "2"]]
            watchers = [pid for pid, line in below.items() if "end_stuck_launcher" in line]
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.05)
        worker = workers[0]
        end_stuck_launcher(launcher.pid, started(launcher.pid), grace=1.0)
        assert not alive(worker)  # ended on its own before the launcher was
        assert launcher.wait(timeout=10) == -signal.SIGKILL
    finally:
        launcher.kill()
        for pid in watchers:
            os.kill(pid, signal.SIGKILL)
    assert started(launcher.pid) == ""


STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a worker that ignores the scheduler's stop
print("ready", flush=True)
time.sleep(300)
"""


def test_a_worker_that_ignores_the_stop_signal_is_killed_once_the_shutdown_timeout_passes(tmp_path):
    """Before (issue 69): the node launcher waited for such a worker as long as it ran, then exited 0."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hf_tinytx_training.distributed", "--standalone", "--nproc_per_node", "1",
         "--shutdown_timeout", "2", str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert launcher.stdout.readline().strip() == "ready"
        (worker,) = [pid for pid in descendants(launcher.pid) if "stubborn.py" in command_line(pid)]
        launcher.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 143, err[-3000:]
    assert time.monotonic() - stopped >= 2  # the grace was given
    assert "1 training process(es) still running 2 s after SIGTERM were killed (SIGKILL)" in err, err[-3000:]
    assert not alive(worker)


@pytest.mark.parametrize("codes, status", [
    ([143, 143], 143), ([130], 130), ([-15, 143], 143),  # -15: ended by SIGTERM before its handler was set
    ([143, 1], None), ([1, 1], None), ([-9], None), ([143, 130], None),
])
def test_the_node_launcher_calls_a_stop_only_what_every_process_stopped_at(codes, status):
    from types import SimpleNamespace

    from hf_tinytx_training.distributed.__main__ import stop_status

    failures = {rank: SimpleNamespace(exitcode=code) for rank, code in enumerate(codes)}
    assert stop_status(failures) == status
