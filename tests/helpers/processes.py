"""The processes of a test's launches, read from /proc: who runs under whom, what each
listens on, which signals wait for it."""

import os
import signal
import time


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: [state, parent, ...]; [] once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), read from /proc."""
    parents = {other: int(fields[1]) for other in pids() if (fields := stat_fields(other))}
    found, queue = [], [pid]
    while queue:
        children = [child for child, parent in parents.items() if parent == queue[-1]]
        queue.pop()
        found += children
        queue += children
    return found


def in_group(group: int) -> list[int]:
    """The live processes of the process group `group` (a zombie, exited but not yet reaped, is none)."""
    return [pid for pid in pids() if (fields := stat_fields(pid))[2:3] == [str(group)] and fields[0] != "Z"]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def command_line(pid: int) -> str:
    """The process's command line as one string, arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def environment(pid: int) -> dict[str, str]:
    """The environment the process started with ({} once it is gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)


LAUNCHERS = ("torch.distributed.run", "accelerate", "hf_tinytx_training.distributed ")


def is_worker(pid: int, script: str = "pretrain") -> bool:
    """A training process, not a launcher."""
    line = command_line(pid)
    return script in line and not any(launcher in line for launcher in LAUNCHERS)


def workers_under(pid: int, script: str = "pretrain") -> list[int]:
    """The training processes started below `pid`."""
    return [p for p in descendants(pid) if is_worker(p, script)]


def listening_on(port: int) -> int | None:
    """The process that listens on TCP `port` (IPv4 or IPv6), or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="utf-8") as f:
                rows = [line.split() for line in f.read().splitlines()[1:]]
        except OSError:
            continue
        inodes |= {row[9] for row in rows if row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port}
    for pid in pids():
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            return pid
    return None


def freeze(pids, timeout: float = 60) -> None:
    """SIGSTOP each process and wait until it has stopped (a signal sent before may still be taken first)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while any(stat_fields(pid)[:1] not in (["T"], []) for pid in pids):
        assert time.monotonic() < deadline, f"not stopped {timeout} s after SIGSTOP: {list(pids)}"
        time.sleep(0.01)


def pending_signals(pid: int) -> set[int]:
    """The signals sent to the process that it has not handled yet (a stopped
    process holds them until SIGCONT)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            fields = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    except OSError:
        return set()
    mask = int(fields.get("SigPnd", "0"), 16) | int(fields.get("ShdPnd", "0"), 16)
    return {bit + 1 for bit in range(64) if mask >> bit & 1}
