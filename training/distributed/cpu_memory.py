"""Training on a CPU: keep freed memory in the process instead of handing it back to the kernel after
every step (glibc would page-fault the same activations in again each step; docs/performance.md). Two
`mallopt` settings keep up to 1 GiB, as PyTorch's caching allocator does on a GPU; a user's own
allocator or glibc settings are left alone.
"""

import ctypes
import os
import platform

from hf_tinytx_training.distributed import sharding


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
KEEP_BYTES = 1 << 30
ANNOUNCEMENT = ("Freed memory stays in the process for the next step (glibc malloc settings: "
               "training/distributed/cpu_memory.py)")


def user_chose_allocator() -> bool:
    """MALLOC_*_ variables are glibc's own tunables (read at start-up); LD_PRELOAD
    usually brings another malloc."""
    glibc_settings = any(name.startswith("MALLOC_") or name == "GLIBC_TUNABLES" for name in os.environ)
    return glibc_settings or bool(os.environ.get("LD_PRELOAD"))


def keep_freed_memory() -> bool:
    """Sets the two thresholds on glibc; returns whether it did (False elsewhere, or where the user chose)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or user_chose_allocator():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # The mmap threshold first: a fixed trim threshold alone would also freeze the adaptive
    # mmap threshold at 128 KiB, which makes things much worse (every block over 128 KiB mapped
    # and unmapped: 7x the faults at 10M).
    if not mallopt(M_MMAP_THRESHOLD, KEEP_BYTES):
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))


def train_on_cpu(bf16_flag: str | None, say=print) -> None:
    """Keeps freed memory in the process, and says when `bf16_flag` (as spelled)
    would be faster off on this CPU."""
    if keep_freed_memory():
        say(ANNOUNCEMENT)  # no page faults for the same activations every step
    if bf16_flag and not sharding.cpu_runs_bf16_fast():
        say(sharding.slow_bf16(bf16_flag))
