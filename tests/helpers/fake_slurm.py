"""Stand-ins for SLURM's `srun` and `scontrol` on one host, put first on PATH by `install(folder)`: a batch script runs
as on a cluster, each "node" a group of processes on 127.0.0.1.

- `srun [options] COMMAND...` starts COMMAND once per node (SLURM_NNODES, 1 task per node) with the variables SLURM
  gives a task (SLURM_NODEID, SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS), each in its own process group, and
  waits for all. With --kill-on-bad-exit=1, the first task to exit non-zero gets every process of the others
  SIGKILLed, those in sessions of their own and stopped ones included, as SLURM ends a job step (its cgroup). Exits
  with the first non-zero status (or 0).
- `scontrol show hostnames LIST` prints 127.0.0.1 once per node.
"""

import os
import signal
import stat
import subprocess
import sys
import time


def install(folder) -> str:
    """Writes the two commands into `folder`; returns it, to put first on PATH."""
    os.makedirs(folder, exist_ok=True)
    for name in ("srun", "scontrol"):
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                    f"import fake_slurm\nsys.exit(fake_slurm.{name}(sys.argv[1:]))\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return str(folder)


def scontrol(argv) -> int:
    if argv[:2] != ["show", "hostnames"]:
        print(f"scontrol stand-in: only 'show hostnames' is played, not {argv}", file=sys.stderr)
        return 2
    print("\n".join(["127.0.0.1"] * int(os.environ.get("SLURM_NNODES", "1"))))
    return 0


def srun(argv) -> int:
    kill_on_bad_exit = False
    while argv and argv[0].startswith("-"):
        option = argv.pop(0)
        kill_on_bad_exit |= option in ("--kill-on-bad-exit=1", "--kill-on-bad-exit", "-K")
    nodes = int(os.environ.get("SLURM_NNODES", "1"))
    tasks = []
    for node in range(nodes):
        env = {**os.environ, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
               "SLURM_STEP_NUM_TASKS": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes)}
        tasks.append(subprocess.Popen(argv, env=env, start_new_session=True))
    status = 0
    while [task.poll() for task in tasks].count(None):  # every task polled each round: `any` would stop at the first
        failed = [task.returncode for task in tasks if task.returncode not in (None, 0)]
        if failed and not status:
            status = failed[0] if failed[0] > 0 else 128 - failed[0]
            if kill_on_bad_exit:
                for task in tasks:
                    if task.poll() is None:
                        for pid in [task.pid, *descendants(task.pid)]:
                            try:
                                os.kill(pid, signal.SIGKILL)
                            except ProcessLookupError:
                                pass
        time.sleep(0.2)
    codes = [task.returncode for task in tasks]
    return status or next((code if code > 0 else 128 - code for code in codes if code), 0)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), read from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    found, queue = [], [pid]
    while queue:
        children = [child for child, parent in parents.items() if parent == queue[-1]]
        queue.pop()
        found += children
        queue += children
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def command_line(pid: int) -> str:
    """The process's command line as one string ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def workers_under(pid: int, script: str = "pretrain") -> list[int]:
    """The training processes (not the launchers: torchrun, accelerate) started below `pid`."""
    return [p for p in descendants(pid) if script in (line := command_line(p)) and "torch.distributed.run" not in line
            and "accelerate" not in line]


def node_of(pid: int) -> str:
    """The SLURM_NODEID that srun gave the process (its launcher's, inherited)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        variables = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return variables[b"SLURM_NODEID"].decode()
