"""Faults injected from outside the product, as a real machine can do them to a running script: a process
killed at an exact call (`run_killed_at`), or signalled at a time or once its output shows a line
(`run_process`, `run_signalled`), a safetensors header that lies about its dtype, a full disk (`tmpfs`), a
server that never answers (`silent_server`)."""

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
from .processes import in_group
from .tiny import pretrain_env


REPO_ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = REPO_ROOT / "training" / "pretrain.py"
KILLED = -signal.SIGKILL
LAUNCH = Path(__file__).with_name("launch.py")


def _unbuffered(env: dict | None) -> dict:
    return {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}


def run_killed_at(args, env: dict | None = None, cwd=None, function: str | tuple[str, ...] = "os.replace",
                  match: str = "", nth: int = 1, when: str = "before", script=PRETRAIN, timeout: float = 300,
                  signum: int = signal.SIGKILL) -> subprocess.CompletedProcess:
    """Runs `script args` in a child Python (tests/helpers/launch.py) that SIGKILLs itself (or sends itself
    `signum`) right `when` ("before" or "after") the `nth` call of `function` (a dotted name, or several
    sharing one count) whose str/bytes/path arguments contain `match`: returncode -9 if the call came, and
    stderr's last line starts with KILL_MARK. With "after", a call that raises counts but kills nothing."""
    if when not in ("before", "after"):
        raise ValueError(f"when must be 'before' or 'after', got {when!r}")
    functions = ",".join([function] if isinstance(function, str) else function)
    command = [sys.executable, str(LAUNCH), "--kill-at", f"{when}:{functions}:{nth}:{match}",
               "--signal", signal.Signals(signum).name, str(script), *map(str, args)]
    return subprocess.run(
        command, env=_unbuffered(env), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def run_process(command, env, cwd, timeout=300, at=None, signum=signal.SIGKILL, after=None, marks=None,
                merged=False, target=None, grace=0.0):
    """Runs `command` (its own process group) and sends `signum` to it (the launcher, under torchrun) `at`
    seconds after it started, or `at` seconds after a line of its output matches the pattern `after`
    (lines end at \\n or \\r); `target(pid)`, if given, names the process to signal instead (None: none).
    `marks`: {name: pattern}, the seconds at which a line first matched each. `grace`: seconds the group's
    other processes may take to follow the command out before they are killed. On a timeout the whole
    group is killed and the result's returncode is "timeout". Returns a CompletedProcess with .seconds,
    .sent (whether the signal went out to a live process), .sent_at (its second, or None), .left_running
    (the processes of the group still there `grace` seconds after the command ended), .marks and
    .timed_out; with `merged`, stdout holds stderr too."""
    process = subprocess.Popen(
        command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE, start_new_session=True,
    )
    start, outputs, seen = time.monotonic(), {"stdout": [], "stderr": []}, {}
    patterns = {name: re.compile(pattern) for name, pattern in (marks or {}).items()}
    trigger = re.compile(after) if after else None
    triggered, sent = threading.Event(), [None]

    def send_later(deadline):
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        if process.poll() is not None:
            return
        if target is None:
            process.send_signal(signum)
        elif (pid := target(process.pid)) is None:
            return
        else:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # it left between the choice and the signal
                return
        sent[0] = time.monotonic() - start

    def read(stream, name):
        pending = b""
        for chunk in iter(lambda: stream.read1(65536), b""):
            outputs[name].append(chunk)
            if not patterns and (trigger is None or triggered.is_set()):
                continue
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)
            for line in (text.decode(errors="replace") for text in lines):
                for mark, pattern in patterns.items():
                    if mark not in seen and pattern.search(line):
                        seen[mark] = time.monotonic() - start
                if trigger is not None and not triggered.is_set() and trigger.search(line):
                    triggered.set()
                    threading.Thread(target=send_later, args=(time.monotonic() + at,), daemon=True).start()

    streams = {"stdout": process.stdout, "stderr": process.stderr}
    readers = [
        threading.Thread(target=read, args=(stream, name), daemon=True)
        for name, stream in streams.items()
        if stream is not None
    ]
    for reader in readers:
        reader.start()
    if at is not None and trigger is None:
        threading.Thread(target=send_later, args=(start + at,), daemon=True).start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    ended = time.monotonic() - start  # before the grace and the readers' last output
    left_running = still_running(process.pid, grace)
    if left_running:  # they hold the output's pipes, whose end the readers wait for
        with_leftovers_killed(process.pid)
    for reader in readers:
        reader.join(timeout=30)
    with_leftovers_killed(process.pid)
    stderr = b"".join(outputs["stderr"]).decode(errors="replace")
    if timed_out:
        stderr += f"\nkill_campaign: no end after {timeout} s: the run was killed\n"
    # a run that hung must not pass for one the trial killed: its status says so instead of -9
    result = subprocess.CompletedProcess(command, "timeout" if timed_out else process.returncode,
                                         b"".join(outputs["stdout"]).decode(errors="replace"), stderr)
    result.seconds, result.sent, result.sent_at, result.marks, result.timed_out = (
        ended, sent[0] is not None, sent[0], seen, timed_out,
    )
    result.left_running = left_running
    return result


def still_running(group: int, grace: float) -> list[int]:
    """The processes of `group` still there `grace` seconds after its leader ended ([] without a grace)."""
    if not grace:
        return []
    deadline = time.monotonic() + grace
    while (left := in_group(group)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def with_leftovers_killed(group: int) -> None:
    """A launcher killed outright leaves its workers behind; they are in its
    process group, which only we made."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_signalled(command, signum, pattern: str, env, cwd, timeout=300) -> subprocess.CompletedProcess:
    """Runs `command`, sends it `signum` once a line of its output matches `pattern`, and waits for it to end.
    The output is stdout and stderr together."""
    result = run_process(command, env, cwd, timeout, at=0, signum=signum, after=pattern, merged=True)
    if result.timed_out:
        raise subprocess.TimeoutExpired(command, timeout, result.stdout)
    return result


class TmpfsUnavailable(RuntimeError):
    """Mounting needs root (or CAP_SYS_ADMIN); tests that need a tmpfs skip with this message."""


@contextlib.contextmanager
def tmpfs(path, size: str | int):
    """Mounts a tmpfs of `size` ("4m", "1500k" or bytes) on the folder `path` (created if
    missing), yields the path, and unmounts it on the way out, whatever happened inside (lazily
    if something still holds it open)."""
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
    """Accepts TCP connections on 127.0.0.1 and reads what they send, but never
    answers and never closes them."""

    def __init__(self):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="silent-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._held)

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
                if not data:  # the client gave up: stop watching, but keep our end open (never answer)
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
    """`with silent_server() as server:` point a client at `server.url`; it
    connects, sends, and waits forever."""
    return SilentServer()


def silent_hub_env(server: SilentServer, tmp_path) -> dict:
    """A run's environment with `server` as its Hub and a fresh token (none of the host's)."""
    env = {
        k: v for k, v in pretrain_env(tmp_path).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))
    }
    env.update(HF_ENDPOINT=server.url, HF_TOKEN="hf_silent" + os.urandom(16).hex(), HF_HUB_OFFLINE="0",
               TRANSFORMERS_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    return env


def relabel_dtype(path, old: str = "F32", new: str = "I32") -> None:
    """Rewrites the safetensors file `path` so that its header calls every `old` tensor `new` (the same size):
    the bytes stay, the header's length stays (both names have the same length)."""
    data = bytearray(Path(path).read_bytes())
    length = int.from_bytes(data[:8], "little")
    header = data[8:8 + length].replace(f'"{old}"'.encode(), f'"{new}"'.encode())
    assert len(header) == length and header != data[8:8 + length], f"no {old} tensor in {path}"
    Path(path).write_bytes(bytes(data[:8] + header + data[8 + length:]))
