"""Faults injected from outside the product: a process killed at a chosen moment, a full disk, a silent Hub.

Nothing here reaches into training/: every fault is something a real machine can do to a running script.

- `run_killed_at`: the script runs under tests/helpers/launch.py, which wraps one or more library functions
  (`os.replace`, `safetensors.torch.save_file`, `accelerate.Accelerator.save_state`, ...) so that the child SIGKILLs
  itself right before or right after the Nth call whose arguments contain a given text. Exact moments: "after the
  second file moved out of the staging folder".
- `run_killed_after_line`: SIGKILL once the output shows a line matching a pattern (then `delay` seconds later).
- `run_killed_after`: SIGKILL `seconds` after the start.
- `run_signalled`: any signal, once a line of the output matches a pattern (what a scheduler or a user sends).
- `relabel_dtype(path, old, new)`: a safetensors file whose header names another dtype of the same size (I32 for
  F32): a valid file whose data no longer means what the header says.
- `tmpfs(size)`: a small RAM file system mounted on a folder (root only), always unmounted again.
- `silent_server()`: a TCP server on 127.0.0.1 that accepts connections, reads what comes and never answers.

A killed run's result is a `subprocess.CompletedProcess` with `returncode == -signal.SIGKILL` (-9). The child Python
runs unbuffered, so the output printed before the kill is in the result.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .launch import KILL_MARK  # noqa: F401  (re-exported: callers read it here)


REPO_ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = REPO_ROOT / "training" / "pretrain.py"
KILLED = -signal.SIGKILL
LAUNCH = Path(__file__).with_name("launch.py")


def _unbuffered(env: dict | None) -> dict:
    return {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}


def run_killed_at(
    args,
    env: dict | None = None,
    cwd=None,
    function: str | tuple[str, ...] = "os.replace",
    match: str = "",
    nth: int = 1,
    when: str = "before",
    script=PRETRAIN,
    timeout: float = 300,
    signum: int = signal.SIGKILL,
) -> subprocess.CompletedProcess:
    """Runs `script args` in a child Python that SIGKILLs itself (or sends itself `signum`) right `when` ("before" or
    "after") the `nth` call of `function` (a dotted name, or several sharing one count) whose str/bytes/path arguments
    contain `match`.

    Returns the CompletedProcess: returncode -9 if the call came, else whatever the script returned. The stderr of a
    killed run ends with a line starting with KILL_MARK that names the call. With "after", a call that raises counts
    but kills nothing (the exception goes on as usual). A method is named through its class
    ("accelerate.Accelerator.save_state"); static and class methods are not supported.
    """
    if when not in ("before", "after"):
        raise ValueError(f"when must be 'before' or 'after', got {when!r}")
    functions = ",".join([function] if isinstance(function, str) else function)
    command = [sys.executable, str(LAUNCH), "--kill-at", f"{when}:{functions}:{nth}:{match}",
               "--signal", signal.Signals(signum).name, str(script), *map(str, args)]
    return subprocess.run(command, env=_unbuffered(env), cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_killed_after_line(
    args,
    pattern: str,
    delay: float = 0.0,
    env: dict | None = None,
    cwd=None,
    script=PRETRAIN,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Runs `python script args` and SIGKILLs it `delay` seconds after a line of its stdout or stderr matches the
    regular expression `pattern` (progress bars count: a line ends at "\\n" or "\\r"). Not killed if no line matches
    or the process ends first; then the returncode is the script's own."""
    return _run_and_kill([sys.executable, str(script), *map(str, args)], re.compile(pattern), delay, env, cwd, timeout)


def run_killed_after(
    args, seconds: float, env: dict | None = None, cwd=None, script=PRETRAIN, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Runs `python script args` and SIGKILLs it `seconds` after it started (unless it ended before)."""
    return _run_and_kill([sys.executable, str(script), *map(str, args)], None, seconds, env, cwd, timeout)


def _run_and_kill(command, pattern, delay, env, cwd, timeout) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        command, env=_unbuffered(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    outputs = {"stdout": [], "stderr": []}
    matched = threading.Event()
    start = time.monotonic()

    def kill_later():
        deadline = start + delay if pattern is None else time.monotonic() + delay
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)

    def read(stream, name):
        pending = b""
        for chunk in iter(lambda: stream.read1(65536), b""):
            outputs[name].append(chunk)
            if pattern is None or matched.is_set():
                continue
            pending += chunk
            *lines, pending = re.split(rb"[\r\n]", pending)
            if any(pattern.search(line.decode(errors="replace")) for line in lines) and not matched.is_set():
                matched.set()
                threading.Thread(target=kill_later, daemon=True).start()

    readers = [threading.Thread(target=read, args=(process.stdout, "stdout"), daemon=True),
               threading.Thread(target=read, args=(process.stderr, "stderr"), daemon=True)]
    for reader in readers:
        reader.start()
    if pattern is None:
        threading.Thread(target=kill_later, daemon=True).start()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    finally:
        for reader in readers:
            reader.join()
    return subprocess.CompletedProcess(
        command, process.returncode,
        b"".join(outputs["stdout"]).decode(errors="replace"), b"".join(outputs["stderr"]).decode(errors="replace"),
    )


def run_signalled(command, signum, pattern: str, env, cwd, timeout=300) -> subprocess.CompletedProcess:
    """Runs `command`, sends it `signum` once a line of its output (a line ends at \\n or \\r) matches `pattern`, and
    waits for it to end. The output is stdout and stderr together."""
    process = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    chunks, regex = [], re.compile(pattern)

    def read():
        pending, sent = b"", False
        for chunk in iter(lambda: process.stdout.read1(65536), b""):
            chunks.append(chunk)
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)
            if not sent and any(regex.search(line.decode(errors="replace")) for line in lines):
                process.send_signal(signum)
                sent = True

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
        reader.join(timeout=10)
    return subprocess.CompletedProcess(command, process.returncode, b"".join(chunks).decode(errors="replace"), "")


class TmpfsUnavailable(RuntimeError):
    """Mounting needs root (or CAP_SYS_ADMIN); tests that need a tmpfs skip with this message."""


@contextlib.contextmanager
def tmpfs(path, size: str | int):
    """Mounts a tmpfs of `size` ("4m", "1500k" or bytes) on the folder `path` (created if missing), yields the path,
    and unmounts it on the way out, whatever happened inside (lazily if something still holds it open)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        raise TmpfsUnavailable("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        raise TmpfsUnavailable(f"cannot mount a tmpfs on {path}: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and reads what they send, but never answers and never closes them."""

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._received = 0
        self._thread = threading.Thread(target=self._serve, name="silent-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return self._received

    def _serve(self):
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                if key.fileobj is self._listener:
                    with contextlib.suppress(BlockingIOError):
                        connection, _ = self._listener.accept()
                        connection.setblocking(False)
                        self._selector.register(connection, selectors.EVENT_READ)
                        with self._lock:
                            self._held.append(connection)
                    continue
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionError:
                    data = b""
                if data:
                    with self._lock:
                        self._received += len(data)
                else:  # the client gave up: stop watching, but keep our end open (never answer)
                    self._selector.unregister(key.fileobj)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._selector.close()
        for connection in [self._listener, *self._held]:
            connection.close()


def silent_server() -> SilentServer:
    """`with silent_server() as server:` point a client at `server.url`; it connects, sends, and waits forever."""
    return SilentServer()


def relabel_dtype(path, old: str = "F32", new: str = "I32") -> None:
    """Rewrites the safetensors file `path` so that its header calls every `old` tensor `new` (the same size): the
    bytes stay, the header's length stays (both names have the same length)."""
    data = bytearray(Path(path).read_bytes())
    length = int.from_bytes(data[:8], "little")
    header = data[8:8 + length].replace(f'"{old}"'.encode(), f'"{new}"'.encode())
    assert len(header) == length and header != data[8:8 + length], f"no {old} tensor in {path}"
    Path(path).write_bytes(bytes(data[:8] + header + data[8 + length:]))
