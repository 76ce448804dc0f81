"""A launch across processes and machines: what must hold before training starts and while it runs.

Every process asked for takes part (`lone_process_problem`, `check_process_count`); every wait between
processes is bounded by --ddp_timeout (`process_group_kwargs`, `lost_peer_message`); every process sees
one --output_dir (`check_shared_folder`); a worker whose launcher died stops (`LauncherWatch`), and a
launcher stuck on a frozen node is ended once its workers failed (`end_stuck_launcher`). No torch
import at the top: the first check precedes it.
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import time


MPI_SIZES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")  # what Accelerate reads under mpirun


def lone_process_problem(env=os.environ) -> str | None:
    """Why this process trains alone though its launcher was asked for more, or
    None (from the environment)."""
    under_mpi = any(name in env for name in MPI_SIZES)
    if "ACCELERATE_USE_CPU" in env and "MASTER_ADDR" in env and "WORLD_SIZE" not in env and not under_mpi:
        # Accelerate's simple launcher sets MASTER_ADDR only when more than one
        # process or machine was asked for.
        return (
            "`accelerate launch` was asked for several processes or machines but started this script once, "
            "alone: its CPU launcher (--cpu, use_cpu: true, or a launch without a config) starts several "
            "only through mpirun. Launch with a multi-GPU, FSDP or DeepSpeed config and without --cpu (on "
            "machines without GPUs the processes train on their CPUs over gloo), or with torchrun "
            "(docs/scaling.md)."
        )
    deepspeed_runner = "LOCAL_SIZE" in env and "TORCHELASTIC_RUN_ID" not in env
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and deepspeed_runner \
            and int(env.get("WORLD_SIZE", "1")) == 1:
        # Accelerate hands several machines to DeepSpeed's own runner (pdsh by default), which, finding no
        # hostfile, starts one local process; with one machine Accelerate uses torchrun (TORCHELASTIC_RUN_ID).
        return (
            "Accelerate started DeepSpeed's multi-machine runner (pdsh), which started this process alone "
            "(it found no hostfile); add --deepspeed_multinode_launcher standard to `accelerate launch` on "
            "each machine (torchrun on every node, docs/scaling.md), or give DeepSpeed a hostfile."
        )
    if int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1 and "WORLD_SIZE" not in env and not under_mpi:
        return (
            f"srun started {env['SLURM_STEP_NUM_TASKS']} tasks and each runs this script alone; start one "
            "launcher per node instead (srun --ntasks-per-node 1 torchrun ...: "
            "training/configs/slurm.sbatch)."
        )
    return None


def refuse_lone_process() -> None:
    """`lone_process_problem` as the UserInputError the scripts stop with."""
    from hf_tinytx_training.errors import UserInputError

    problem = lone_process_problem()
    if problem:
        raise UserInputError(problem)


def launched_size(env=os.environ) -> int:
    """The process count the launcher was asked for."""
    for name in ("WORLD_SIZE", *MPI_SIZES):
        if name in env:
            return int(env[name])
    return 1


def check_process_count(num_processes: int) -> str | None:
    """Why the process group that formed is smaller or larger than the launch, or None."""
    asked = launched_size()
    if num_processes == asked:
        return None
    return (
        f"The launcher asked for {asked} processes but {num_processes} formed the process group; check the "
        "launcher's process and machine counts (--nproc_per_node, --nnodes, --num_processes, "
        "--num_machines)."
    )


def process_group_kwargs(ddp_timeout: float, backend: str | None = None):
    """Accelerate's handler that gives the process group its timeout (and a
    backend, when one must be named)."""
    from datetime import timedelta

    from accelerate.utils import InitProcessGroupKwargs

    options = {"timeout": timedelta(seconds=ddp_timeout)}
    if backend:
        options["backend"] = backend
    return InitProcessGroupKwargs(**options)


def start_cpu_group(argv: list[str]) -> None:
    """Starts a CPU launch's process group with --ddp_timeout (Trainer's default 1800 s):
    TrainingArguments starts a --use_cpu group while parsing, without the timeout, so a frozen peer
    would hang the others. Trainer keeps it."""
    import argparse
    from datetime import timedelta

    from accelerate import PartialState

    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--ddp_timeout", type=int, default=1800)
    early.add_argument("--ddp_backend", default=None)
    flags, _ = early.parse_known_args(argv)
    PartialState(cpu=True, backend=flags.ddp_backend, timeout=timedelta(seconds=flags.ddp_timeout))


# What gloo, NCCL and torch say when a peer process is gone or never answers.
PEER_FAILURES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "pair closure",
                 "Timed out", "timed out", "Timeout", "NCCL communicator was aborted", "ProcessGroupNCCL")


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that another process of the launch broke
    (left it, or never joined it)."""
    import torch.distributed

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not isinstance(error, RuntimeError):
        return False
    return isinstance(error, torch.distributed.DistError) or any(text in str(error) for text in PEER_FAILURES)


ANY_PROCESS_COUNT = " (any process count, with the same --total_batch_size)"  # pretrain's elastic resume


def lost_peer_message(error: BaseException, ddp_timeout: float, where: str, newest_checkpoint: str | None,
                      how: str = ANY_PROCESS_COUNT) -> str:
    """One line: what became of the other process, where this run stands (`where`: "
    during step 8"), how to go on."""
    text = str(error).lower()  # gloo says "Timed out", a store's wait "wait timeout after 10000ms"
    if "timed out" in text or "timeout" in text:
        what = (
            f"Another process of the launch did not answer within --ddp_timeout {ddp_timeout:g} s (frozen, "
            "or lost with its node)"
        )
    else:
        what = "Another process of the launch left (killed, or lost with its node)"
    saved = (
        f"checkpoint {newest_checkpoint} is intact" if newest_checkpoint else "no checkpoint was saved yet"
    )
    return (f"{what}{where}; {saved}: once every node is back, run the same command with "
            f"--resume_from_checkpoint latest{how}.")


def decided_by_main(accelerator, decide):
    """`decide()` on the main process, its answer (or UserInputError, or RunError: a Hub out of reach) on all:
    they might not see the same files, and must not wait for an answer that never comes."""
    import torch.distributed

    from hf_tinytx_training.errors import RunError, UserInputError

    outcome = [None]
    if accelerator.is_main_process:
        try:
            outcome = [("answer", decide())]
        except UserInputError as error:
            outcome = [("refused", str(error))]
        except RunError as error:
            outcome = [("failed", str(error))]
    if accelerator.num_processes > 1:
        torch.distributed.broadcast_object_list(outcome, src=0)
    kind, value = outcome[0]
    if kind in ("refused", "failed"):
        raise (UserInputError if kind == "refused" else RunError)(value)
    return value


def check_shared_folder(output_dir: str, num_processes: int, is_main_process: bool) -> None:
    """Every process reads back a token the main process wrote into --output_dir, or
    all raise, naming who could not."""
    import torch.distributed

    from hf_tinytx_training.errors import UserInputError

    if num_processes == 1:
        return
    created = not os.path.isdir(output_dir)
    token = [f".tinytx-shared-{secrets.token_hex(8)}"]
    if is_main_process:
        os.makedirs(output_dir, exist_ok=True)
        # O_EXCL: never through a link
        with open(os.path.join(output_dir, token[0]), "x", encoding="utf-8") as f:
            f.write(token[0])
    torch.distributed.broadcast_object_list(token, src=0)
    path = os.path.join(output_dir, token[0])
    try:
        with open(path, encoding="utf-8") as f:
            sees = f.read() == token[0]
    except OSError:
        sees = False
    views = [None] * num_processes
    torch.distributed.all_gather_object(views, (sees, socket.gethostname()))
    if is_main_process:
        os.remove(path)
        if created and not os.listdir(output_dir):
            os.rmdir(output_dir)  # a refused start leaves nothing behind
    blind = [f"process {rank} (host {host})" for rank, (seen, host) in enumerate(views) if not seen]
    if blind:
        raise UserInputError(
            f"--output_dir {output_dir} is not one folder shared by every process: what the main process "
            f"wrote there is missing for {', '.join(blind)}. Put --output_dir on storage every node mounts "
            "at the same path (NFS, Lustre, a shared volume): each process writes its part of every "
            "checkpoint there."
        )


class LauncherWatch:
    """Whether the torchrun agent that started this worker died (the worker then has another parent): torchrun
    starts workers in their own session, so nothing else would stop them."""

    def __init__(self, env=os.environ):
        self.parent = os.getppid() if "TORCHELASTIC_RUN_ID" in env else None

    def launcher_gone(self) -> bool:
        return self.parent is not None and os.getppid() != self.parent


# seconds a launcher may run on once its last worker has ended (it only has to close and exit)
LAUNCHER_GRACE = 30


def watch_launcher_exit(launcher: int | None, code: int, env=os.environ) -> None:
    """Called by a torchrun worker leaving with `code`: when it failed and no restart is left, a
    watcher process ends the launcher should it still run LAUNCHER_GRACE seconds after its last
    worker. (torchrun's agent polls the store on the first node; when that node freezes, the request
    never returns, not even to SIGTERM.)"""
    if code == 0 or launcher is None or os.getppid() != launcher:
        return  # finished, not launched by torchrun, or the launcher is already gone
    if int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) < int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")):
        return  # the launcher will start the workers again
    watcher = ("import sys; from hf_tinytx_training.distributed.cluster import end_stuck_launcher; "
               "end_stuck_launcher(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]))")
    # Its own session, no inherited pipes: whoever reads this process's output must not wait for the watcher.
    subprocess.Popen([sys.executable, "-c", watcher, str(launcher), started(launcher), str(LAUNCHER_GRACE)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def end_stuck_launcher(launcher: int, start: str, grace: float) -> None:
    """SIGKILLs `launcher` (started at `start`: never a later one with its PID)
    after `grace` s without a worker."""
    idle_since = time.monotonic()
    while started(launcher) == start:
        # Watchers are no workers: where the launcher is PID 1 (a container's first process) it inherits them.
        if [pid for pid in running_children(launcher) if "end_stuck_launcher" not in command_line(pid)]:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= grace:
            os.kill(launcher, signal.SIGKILL)
            return
        time.sleep(0.5)


def stat_fields(pid) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (state, parent,
    ...); [] once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def started(pid: int) -> str:
    """The process's start time (clock ticks since boot); "" once it has ended (a zombie too)."""
    fields = stat_fields(pid)
    return fields[19] if fields and fields[0] != "Z" else ""


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def running_children(pid: int) -> list[int]:
    """The children of `pid` that still run (not the zombies of those that ended)."""
    children = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = stat_fields(entry)
        if fields[1:2] == [str(pid)] and fields[0] != "Z":
            children.append(int(entry))
    return children
