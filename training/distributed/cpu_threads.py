"""Training on a CPU: torch's thread count, chosen from the cores free at the start.

torch's threads wait for each other at each kernel's end, so one thread on a core another process keeps
busy stalls them all: beside one busy loop, 2 threads train 10-35x slower than 1. So a run takes only the
cores its CPUs left idle over a short look at the start (/proc/stat), shared among the processes of this
machine. The user's OMP_NUM_THREADS wins. Another count trains other weights, so a resume keeps the count
its checkpoint records, and says so in one line when OMP_NUM_THREADS forces another. When other work
takes the cores after the start, `BusyCores` says so once.
"""

import math
import os
import statistics
import time


LOOK_SECONDS = 0.5  # long enough to see a busy process, short beside any run
FREE_ENOUGH = 0.75  # a core counts as free when idle this much of the look: a thread there rarely waits
LOCAL_SIZES = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
               "MV2_COMM_WORLD_LOCAL_SIZE")  # torchrun, DeepSpeed's runner, the MPIs


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]] | None:
    """{cpu: (idle ticks, all ticks)} of `cpus` from /proc/stat, or None (not Linux)."""
    times = {}
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *ticks = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                    values = [int(tick) for tick in ticks[:8]]  # user .. steal
                    times[int(name[3:])] = (values[3] + values[4], sum(values))  # idle + iowait
    except (OSError, ValueError):
        return None
    return times or None


def idle_cores(seconds: float = LOOK_SECONDS) -> float | None:
    """How many of this process's CPUs sat idle over the next `seconds` (None where unknown). The run itself
    sleeps meanwhile: only other work is seen."""
    cpus = usable_cpus()
    before = cpu_times(cpus)
    time.sleep(seconds)
    after = cpu_times(cpus)
    if before is None or after is None:
        return None
    idle = 0.0
    for cpu, (idle_then, all_then) in before.items():
        idle_now, all_now = after.get(cpu, (idle_then, all_then))
        idle += (idle_now - idle_then) / (all_now - all_then) if all_now > all_then else 1.0
    return idle


def user_threads(env) -> int | None:
    """OMP_NUM_THREADS as a count, or None where it is unset (or not one)."""
    value = env.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def local_processes(env) -> int:
    """The processes of this run on this machine (1 without a launcher)."""
    for name in LOCAL_SIZES:
        if env.get(name, "").isdigit() and int(env[name]) > 0:
            return int(env[name])
    return 1


def choose(idle: float | None, cores: int, processes: int = 1) -> int:
    """Threads per process: the free cores (idle at least FREE_ENOUGH each, all of them where unknown)
    shared among this machine's processes, at least one."""
    free = cores if idle is None else min(cores, math.floor(idle + 1 - FREE_ENOUGH))
    return max(1, free // processes)


def decide(recorded: int | None, user: int | None, idle: float | None, cores: int,
           processes: int = 1) -> tuple[int, str]:
    """(threads, the line that says why): the checkpoint's count on a resume, else OMP_NUM_THREADS, else the
    free cores. `recorded`: the count the checkpoint to resume from trained with (None: a new run)."""
    if recorded is not None and user not in (None, recorded):
        return user, (f"CPU threads: {user} (OMP_NUM_THREADS), but the checkpoint trained with {recorded}: "
                      "the run goes on, no longer bit for bit as one without the stop.")
    if recorded is not None:
        return recorded, (f"CPU threads: {recorded}, as the checkpoint trained with (another count trains "
                          "other weights; OMP_NUM_THREADS forces one).")
    if user is not None:
        return user, f"CPU threads: {user} (OMP_NUM_THREADS); a resume keeps them."
    threads = choose(idle, cores, processes)
    seen = "load unknown" if idle is None else f"{idle:.1f} idle"
    shared = f", shared by {processes} processes" if processes > 1 else ""
    return threads, (f"CPU threads: {threads} ({cores} cores, {seen} at the start{shared}; OMP_NUM_THREADS "
                     "sets them); a resume keeps them.")


def set_threads(recorded: int | None, is_main_process: bool, say=print) -> int:
    """Decides on the main process (every process takes part), sets torch's threads, says why once."""
    import torch

    decided = None
    if is_main_process:
        looked = user_threads(os.environ) is None and recorded is None
        idle = idle_cores() if looked else None
        decided = decide(recorded, user_threads(os.environ), idle, len(usable_cpus()),
                         local_processes(os.environ))
    threads, line = agreed(decided)
    torch.set_num_threads(threads)
    if is_main_process:
        say(line)
    return threads


def agreed(value):
    """The main process's `value` on every process of a launch: they train with one count."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return value


def running_tasks() -> int | None:
    """How many threads the kernel could run right now, this run's own included (Linux's /proc/loadavg)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None  # not Linux: no notice


SAMPLES = 10  # steps watched before deciding: one reading is a moment, ten are a pattern


class BusyCores:
    """Other work that took the cores after the start: one line after SAMPLES steps (`notice`), or None."""

    def __init__(self, threads: int, cores: int | None = None):
        self.threads, self.cores = threads, cores or len(usable_cpus())
        self.readings: list[int] = []
        self.decided = threads <= 1  # one thread waits on nobody

    def notice(self, program: str) -> str | None:
        if self.decided:
            return None
        reading = running_tasks()
        if reading is None:
            self.decided = True
            return None
        self.readings.append(reading)
        if len(self.readings) < SAMPLES:
            return None
        self.decided = True
        running = statistics.median(self.readings)
        if running <= self.cores + 0.5:  # this run's threads alone fill the cores at most
            return None
        return (
            f"{program}: the {self.cores} CPU cores are busy ({running:g} threads running, this run's "
            f"{self.threads} included): torch's threads wait on each other and "
            "may train ~10x slower. Stop it (Ctrl-C keeps a checkpoint) and resume with OMP_NUM_THREADS=1 "
            "to go faster, no longer bit for bit as a run without the stop."
        )
