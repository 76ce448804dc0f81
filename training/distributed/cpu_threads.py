"""Training on a busy CPU: one line when other work keeps the cores this run's threads need. torch's threads
wait for each other at each kernel's end, so one busy core stalls them all; the run cannot change its thread
count itself (another count trains other weights), so it says what to do, once.
"""

import os
import statistics


SAMPLES = 10  # steps watched before deciding: one reading is a moment, ten are a pattern


def running_tasks() -> int | None:
    """How many threads the kernel could run right now, this run's own included (Linux's /proc/loadavg)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None  # not Linux: no notice


class BusyCores:
    """Reads the running tasks at each step; after SAMPLES steps, `notice` returns the one line, or None."""

    def __init__(self, threads: int, cores: int | None = None):
        self.threads, self.cores = threads, cores or os.cpu_count() or 1
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
            f"{self.threads} included): torch's threads wait on each other and may train ~10x slower. On a "
            "busy machine run with OMP_NUM_THREADS=1 (another thread count trains other weights, so a "
            "resume keeps the count it started with)."
        )
