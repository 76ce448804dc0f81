"""The SLURM recipe (training/configs/slurm.sbatch) submitted with sbatch, as a user submits it, to a real
SLURM: two nodes of one training process each on this host (tests/helpers/slurm_cluster.py), with tiny
flags. Every stop and fault is made from outside, with scancel, scontrol and signals; each run that ends is
compared with one process training straight through.

SLURM holds a requeued job ~120 s before it may start again; the tests tell it to start 3 s after the requeue
(`wait_job`). A stop is pinned to the middle of the run by freezing the training processes
(SIGSTOP) until the stop signal waits for them, so a slow machine cannot let the run finish first.
"""

import math
import os
import re
import signal
import sys
import time

import pytest

from hf_tinytx_training.distributed.cluster import LAUNCHER_GRACE
from tests.helpers import slurm_cluster
from tests.helpers.cluster_runs import FLAGS, PRETRAIN, assert_equal_runs, train_straight
from tests.helpers.processes import (
    alive,
    command_line,
    environment,
    freeze,
    is_worker,
    listening_on,
    pending_signals,
    pids,
    stat_fields,
)
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env


pytestmark = pytest.mark.slurm

RECIPE = REPO_ROOT / "training" / "configs" / "slurm.sbatch"
# The recipe's 8 CPUs a node and 4 hours do not fit the test's nodes (4 CPUs); one
# CPU each lets four jobs share them.
FIT = ["--cpus-per-task=1", "--time=10"]
# what each case measured, printed at the end of the module (pytest -s, or --durations for the totals)
TIMED = {}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with slurm_cluster.running(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return train_straight(tmp_path_factory.mktemp("cluster") / "straight")


def job_env(tmp_path, slurm):
    """What sbatch exports to the job: offline, one thread a process, this
    interpreter's `python` first on PATH."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    return pretrain_env(tmp_path, OMP_NUM_THREADS="1", PATH=path, SLURM_CONF=str(slurm.conf))


def submit(slurm, tmp_path, folder, *flags, options=()) -> str:
    return slurm.sbatch(
        RECIPE, *FLAGS, *flags, "--output_dir", folder, options=[*FIT, *options], cwd=tmp_path,
        env=job_env(tmp_path, slurm),
    )


def log_of(slurm, tmp_path, job: str) -> str:
    """The job's log (%x-%j.out in the folder it was submitted from), every run of it."""
    return (tmp_path / f"tinytx-{slurm.job(job)['JobId']}.out").read_text(errors="replace")


def job_processes(job: str) -> dict[str, list[int]]:
    """{"launchers": [...], "workers": [...]} of the running job (its processes carry SLURM_JOB_ID)."""
    found = {"launchers": [], "workers": []}
    for pid in pids():
        if environment(pid).get("SLURM_JOB_ID") != job:
            continue
        if is_worker(pid):
            found["workers"].append(pid)
        elif "-m hf_tinytx_training.distributed " in command_line(pid):
            found["launchers"].append(pid)
    return found


def freeze_at_checkpoint(slurm, runs: dict, step: int = 20, timeout: float = 240) -> dict[str, list[int]]:
    """{job: folder} -> {job: its two training processes}, each job's frozen (SIGSTOP) as soon as its
    checkpoint step_N is written: whatever comes next lands mid-run, however fast or slow the machine."""
    deadline, frozen = time.monotonic() + timeout, {}
    while len(frozen) < len(runs):
        for job, folder in runs.items():
            if job not in frozen and (folder / "checkpoints" / f"step_{step}").is_dir():
                workers = job_processes(slurm.job(job)["JobId"])["workers"]
                assert len(workers) == 2, workers
                freeze(workers)  # stopped before any stop signal is sent: it stays pending
                frozen[job] = workers
            elif job not in frozen:
                state = slurm.job(job)["JobState"]
                assert state in (
                    "PENDING", "RUNNING", "CONFIGURING",
                ), f"job {job} is {state} before step {step}"
        assert time.monotonic() < deadline, f"no checkpoint step_{step} after {timeout} s"
        time.sleep(0.05)
    return frozen


def signal_all(pids_, signum):
    for pid in pids_:
        os.kill(pid, signum)


def wait_pending(workers, signum, timeout: float = 120) -> float:
    """Waits until every frozen worker holds `signum`, or was woken by SLURM (a cancel sends SIGCONT, then
    the signal); returns the seconds waited."""
    started = time.monotonic()
    while not all(signum in pending_signals(pid) or stat_fields(pid)[:1] != ["T"] for pid in workers):
        assert time.monotonic() - started < timeout, f"{signal.Signals(signum).name} never reached {workers}"
        time.sleep(0.1)
    return time.monotonic() - started


def stopped_at(log: str) -> int:
    found = re.findall(
        r"pretrain\.py: stopped at step (\d+) of \d+ by SIGTERM; checkpoint step_\1 is saved", log
    )
    assert len(found) == 1, log[-4000:]
    return int(found[0])


def assert_one_voice(log: str):
    """One line per event for the whole job: each run's main process (rank 0, on whichever node
    joined the rendezvous first) prints, the other says nothing; a line every few steps, no
    progress bar; every line labelled."""
    runs = log.count("slurm.sbatch: job ")
    assert "\r" not in log and "it/s]" not in log, log[-2000:]
    for event in ("TinyTx with ", "Training for 120 steps", "Freed memory stays in the process"):
        assert log.count(event) == runs, (event, log[-4000:])
    assert len(re.findall(r"^\d: train: 100% \| 120/120 steps, loss \d", log, re.M)) == 1, log[-3000:]
    unlabelled = [
        line for line in log.splitlines() if not re.match(r"(\d: |slurm\.sbatch: |srun: |slurmstepd-)", line)
    ]
    assert not unlabelled, unlabelled


# ---- runs that finish, and jobs that share nodes


def test_two_jobs_share_the_nodes_one_ends_equal_to_one_process_and_a_cancel_ends_only_the_other(
        slurm, tmp_path, straight):
    """Two jobs at once on both nodes, each with its own rendezvous port. `scancel` of one: its processes save
    a checkpoint within SLURM's KillWait and it stays cancelled (no requeue); the other runs on undisturbed
    and ends bit for bit equal to one process."""
    kept, cancelled = tmp_path / "kept", tmp_path / "cancelled"
    job, other = submit(slurm, tmp_path, kept), submit(slurm, tmp_path, cancelled)
    frozen = freeze_at_checkpoint(slurm, {job: kept, other: cancelled})  # both mid-run at the cancel
    running, workers = frozen[job], frozen[other]
    cancelled_at = time.monotonic()
    slurm.command("scancel", other)
    wait_pending(workers, signal.SIGTERM)
    signal_all([*workers, *running], signal.SIGCONT)
    info = slurm.wait_job(other, {"CANCELLED", "COMPLETED", "FAILED"}, release=False)
    TIMED["scancel: cancel to job ended"] = time.monotonic() - cancelled_at
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info
    log = log_of(slurm, tmp_path, other)
    step = stopped_at(log)
    assert (cancelled / "checkpoints" / f"step_{step}").is_dir()
    assert "not requeued" in log and "requeued: the job starts again" not in log, log[-3000:]

    info = slurm.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"})
    log = log_of(slurm, tmp_path, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, log[-4000:])
    ports = {re.search(r"rendezvous at \S+:(\d+)", log_of(slurm, tmp_path, j)).group(1) for j in (job, other)}
    assert len(ports) == 2, ports
    assert_one_voice(log)
    assert_equal_runs(kept, straight)


# ---- stops: each saves, the job requeues itself and resumes


@pytest.mark.parametrize("how", [["--signal=TERM"], ["--full", "--signal=TERM"]], ids=["steps", "full"])
def test_a_stop_signal_saves_requeues_and_the_job_ends_equal_to_one_process(slurm, tmp_path, straight, how):
    """scancel --signal=TERM reaches the training processes; with --full it also reaches the batch shell (as
    --batch and --signal=B:... do), which passes it on: srun, out of its reach, would otherwise end the step
    at once, without the checkpoint. Either way: a checkpoint at the next step, exit 143, a requeue, a resume
    from that checkpoint, and the run ends equal to one process."""
    folder = tmp_path / "run"
    job = submit(slurm, tmp_path, folder)
    workers = freeze_at_checkpoint(slurm, {job: folder})[job]
    slurm.command("scancel", *how, job)
    TIMED[f"scancel {' '.join(how)}: signal to the processes"] = wait_pending(workers, signal.SIGTERM)
    signal_all(workers, signal.SIGCONT)
    assert_stopped_requeued_and_resumed(slurm, tmp_path, folder, job, straight, " ".join(how))


def test_the_time_limit_signal_saves_requeues_and_the_job_ends_equal_to_one_process(
    slurm, tmp_path, straight
):
    """The recipe's --signal=TERM@120: once the job has a checkpoint, its time limit is cut to 2-3
    minutes past its run time (however long a busy machine took to get there), SLURM sends SIGTERM at its
    next look at the time left, and the job stops, requeues and resumes (with its time limit raised
    again, or it would be stopped once more)."""
    folder = tmp_path / "run"
    job = submit(slurm, tmp_path, folder)
    workers = freeze_at_checkpoint(slurm, {job: folder})[job]
    run_seconds = sum(
        int(part) * 60**i for i, part in enumerate(reversed(slurm.job(job)["RunTime"].split(":")))
    )
    slurm.command("scontrol", "update", f"JobId={job}", f"TimeLimit={math.ceil((run_seconds + 120) / 60)}")
    TIMED["--signal=TERM@120: time limit cut to the signal"] = wait_pending(
        workers, signal.SIGTERM, timeout=240
    )
    signal_all(workers, signal.SIGCONT)
    thawed = time.monotonic()
    slurm.wait_job(job, {"PENDING"}, release=False)
    TIMED["time limit: processes thawed to job requeued"] = time.monotonic() - thawed
    slurm.command("scontrol", "update", f"JobId={job}", "TimeLimit=10")  # the requeued run counts from 0
    assert_stopped_requeued_and_resumed(slurm, tmp_path, folder, job, straight, "time limit")


def assert_stopped_requeued_and_resumed(slurm, tmp_path, folder, job, straight, what):
    thawed = time.monotonic()
    slurm.wait_job(job, {"PENDING", "COMPLETED", "FAILED", "CANCELLED"}, release=False)
    TIMED.setdefault(f"{what}: processes thawed to job requeued", time.monotonic() - thawed)
    info = slurm.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"})
    log = log_of(slurm, tmp_path, job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, log[-4000:])
    step = stopped_at(log)
    assert "slurm.sbatch: stopped with a checkpoint; requeued" in log
    assert "run 1, on" in log and "run 2, on" in log  # --open-mode=append: the first run's lines are kept
    assert f"Resumed from {folder / 'checkpoints' / f'step_{step}'} at step {step}" in log, log[-4000:]
    assert_one_voice(log)
    assert_equal_runs(folder, straight)


# ---- arrays


def test_each_task_of_an_array_trains_in_its_own_folder_and_a_missing_output_dir_is_refused(
        slurm, tmp_path, straight):
    array = submit(slurm, tmp_path, tmp_path / "sweep", options=["--array=0-1"])
    infos = [slurm.wait_job(f"{array}_{task}", {"COMPLETED", "FAILED", "CANCELLED"}) for task in (0, 1)]
    logs = [log_of(slurm, tmp_path, f"{array}_{task}") for task in (0, 1)]
    assert all(info["JobState"] == "COMPLETED" for info in infos), (infos, logs[0][-3000:], logs[1][-3000:])
    ports = {re.search(r"rendezvous at \S+:(\d+)", log).group(1) for log in logs}
    assert len(ports) == 2, ports
    for task in (0, 1):
        assert_equal_runs(tmp_path / "sweep" / f"task_{task}", straight)

    refused = slurm.sbatch(
        RECIPE, *FLAGS, options=[*FIT, "--array=0-1"], cwd=tmp_path, env=job_env(tmp_path, slurm)
    )
    info = slurm.wait_job(f"{refused}_0", {"COMPLETED", "FAILED", "CANCELLED"})
    assert info["ExitCode"] == "2:0", info
    assert log_of(slurm, tmp_path, f"{refused}_0").strip() == (
        "slurm.sbatch: error: an array job needs --output_dir DIR after the script's name (each task trains "
        "in DIR/task_N); add it, or submit without --array."
    )


# ---- frozen: the job ends within --ddp_timeout, without a requeue


@pytest.mark.parametrize("frozen", ["worker", "store host"])
def test_a_frozen_node_ends_the_job_within_ddp_timeout_and_a_resubmission_resumes_exactly(
        slurm, tmp_path, straight, frozen):
    """"worker": the training process of the node that does not host the rendezvous store, frozen (SIGSTOP):
    the other stops at --ddp_timeout, its launcher exits 1 and srun ends the step. "store host": the whole
    node that hosts it, launcher included: the survivor's launcher hangs on the frozen store (torchrun's
    agent asks it for news every 0.1 s and never gets an answer) until the watcher its failed worker left
    ends it, LAUNCHER_GRACE seconds later. Either way the job fails without a requeue; submitted again, it
    resumes from the intact checkpoint exactly."""
    folder, timeout = tmp_path / "run", 10
    job = submit(slurm, tmp_path, folder, "--ddp_timeout", timeout)
    workers = freeze_at_checkpoint(slurm, {job: folder})[job]
    port = int(re.search(r"rendezvous at \S+:(\d+)", log_of(slurm, tmp_path, job)).group(1))
    host = listening_on(port)
    launchers = job_processes(job)["launchers"]
    assert host in launchers, (host, launchers)
    node = environment(host)["SLURM_NODEID"]
    if frozen == "store host":
        targets = [host, *(pid for pid in workers if environment(pid)["SLURM_NODEID"] == node)]
    else:
        targets = [pid for pid in workers if environment(pid)["SLURM_NODEID"] != node]
    signal_all([pid for pid in targets if pid not in workers], signal.SIGSTOP)  # the store host's launcher
    signal_all([pid for pid in workers if pid not in targets], signal.SIGCONT)  # the other node trains on
    frozen_at = time.monotonic()
    info = slurm.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED", "PENDING"}, release=False)
    seconds = time.monotonic() - frozen_at
    TIMED[f"frozen {frozen}: freeze to job ended"] = seconds
    log = log_of(slurm, tmp_path, job)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", (info, log[-4000:])
    # start-up of the stop, srun, a busy CI
    bound = timeout + (LAUNCHER_GRACE if frozen == "store host" else 0) + 45
    assert seconds < bound, (seconds, log[-4000:])
    assert re.search(
        rf"^\d: pretrain\.py: error: Another process of the launch did not answer within --ddp_timeout "
        rf"{timeout} s \(frozen, or lost with its node\) during step \d+; checkpoint step_\d+ is intact",
        log,
        re.M,
    ), log[-4000:]
    assert "slurm.sbatch: the job step failed (status" in log and "not requeued" in log
    assert not any(alive(pid) for pid in targets)  # srun ended the frozen processes with the step

    if frozen == "store host":
        again = submit(slurm, tmp_path, folder)
        info = slurm.wait_job(again, {"COMPLETED", "FAILED", "CANCELLED"})
        assert info["JobState"] == "COMPLETED", log_of(slurm, tmp_path, again)[-4000:]
        assert "Resumed from" in log_of(slurm, tmp_path, again)
        assert_equal_runs(folder, straight)


# ---- launches that would train alone


def test_srun_tasks_without_a_launcher_stop_in_one_line(slurm, tmp_path):
    folder = tmp_path / "never"
    command = " ".join(["srun", sys.executable, PRETRAIN, *TINY_PRETRAIN_ARGS, "--output_dir", str(folder)])
    job = slurm.sbatch(
        "--wrap", command,
        options=["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", "--output=alone.out"], cwd=tmp_path,
        env=job_env(tmp_path, slurm),
    )
    info = slurm.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"})
    output = (tmp_path / "alone.out").read_text()
    assert info["JobState"] == "FAILED", output
    assert "pretrain.py: error: srun started 2 tasks and each runs this script alone" in output, output
    assert not folder.exists()


@pytest.fixture(scope="module", autouse=True)
def report_times():
    yield
    for what, seconds in TIMED.items():
        print(f"{what}: {seconds:.1f} s")
