"""Push checkpoints and the final model to the Hugging Face Hub without ever stopping training.

`HubPusher.push_async` snapshots a folder by hard links (so the checkpoint may be rotated meanwhile)
and returns; one daemon thread uploads the queue in order, retries a bounded number of times, and keeps
what failed in `failures`. Every wait is bounded (`huggingface_hub`'s `run_as_future` would join its
thread at exit, hanging on a dead Hub). The token (None: HF_TOKEN or the `hf auth login` cache) is
never logged and is scrubbed from every message.
"""

from __future__ import annotations

import glob
import logging
import os
import queue
import re
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field

from hf_tinytx.folders.safe import link_or_copy, regular_files, remove_tree
from hf_tinytx_training.distributed.preemption import Stopped, StopRequests


logger = logging.getLogger(__name__)

POLL_S = 0.2  # how long a stop signal may wait for a wait to notice it
SNAPSHOT_PREFIX = ".hub-final-"  # the final push's hard-linked snapshot, inside the folder it pushes
# Anything shaped like a Hub token or an Authorization header value, in case a
# message carries one we don't know.
_TOKEN_PATTERNS = (re.compile(r"\bhf_[A-Za-z0-9]{8,}"), re.compile(r"(?i)(bearer\s+)[^\s'\")]+"))


@dataclass
class _Job:
    folder: str
    commit_message: str
    path_in_repo: str | None
    snapshot: str | None = None  # our private copy, removed once uploaded
    replacing: tuple[str, ...] = ()  # folders of the repo this upload replaces whole, in one commit
    newest_of: str | None = None  # a job queued later under this name supersedes this one
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


class HubPusher:
    """Uploads folders to one Hub repo from a background thread; see the module docstring."""

    def __init__(self, repo_id: str, token: str | None = None, private: bool = False, max_attempts: int = 3,
                 retry_wait_s: float = 5.0):
        # `upload_folder` already retries 5xx answers (about 23 s); these attempts, 5 s then 10 s apart,
        # cover longer outages and network errors.
        self.repo_id = repo_id
        self.private = private
        self.max_attempts = max(1, max_attempts)
        self.retry_wait_s = retry_wait_s
        self._token = token
        self._repo_ready = False
        self._failures: list[str] = []
        self._lock = threading.Lock()
        # its unfinished_tasks counts the uploads not yet ended
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._newest: dict[str, _Job] = {}  # the newest job queued under each `newest_of` name

    def __repr__(self) -> str:  # the default one would show the token
        return f"HubPusher(repo_id={self.repo_id!r}, private={self.private})"

    def push_async(self, folder: str, commit_message: str, path_in_repo: str | None = None,
                   replacing: tuple[str, ...] = (), newest_of: str | None = None) -> None:
        """Queue an upload of `folder` (a snapshot of it, taken now) and return immediately. Never raises.
        `replacing`: the repo's folders this one replaces, in one commit (`commit_folder`). A job named
        `newest_of` is skipped when a newer one of that name waits behind it: a slow Hub never gets a
        queue of stale checkpoints."""
        try:
            job = _Job(str(folder), commit_message, path_in_repo, snapshot=_snapshot(str(folder)),
                       replacing=tuple(replacing), newest_of=newest_of)
            self._enqueue(job)
        except Exception as e:  # e.g. the folder vanished: report, don't stop training
            self._record_failure(commit_message, e)

    def push(self, folder: str, commit_message: str, path_in_repo: str | None = None, timeout=None) -> bool:
        """Upload `folder` after the queued uploads, wait for it (at most `timeout`
        s), return whether it got there."""
        started = time.monotonic()
        job = self.submit(folder, commit_message, path_in_repo)
        if not wait_until(job.done.is_set, job.done.wait, None if timeout is None else started + timeout):
            self.note_unfinished(commit_message, time.monotonic() - started, timeout)
            return False
        return job.ok

    def submit(self, folder: str, commit_message: str, path_in_repo: str | None = None) -> _Job:
        """Queue an upload of `folder` as it is (no snapshot) and return its job:
        `job.done` is set once it ended."""
        job = _Job(str(folder), commit_message, path_in_repo)
        self._enqueue(job)
        return job

    def wait(self, timeout: float | None = None, stop=None) -> bool:
        """Wait until every queued upload has ended; False if `timeout` ran out
        first, or `stop()` turned true."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return wait_until(lambda: not self._queue.unfinished_tasks, self._wait_idle, deadline, stop)

    def _wait_idle(self, seconds: float | None) -> None:
        with self._queue.all_tasks_done:
            if self._queue.unfinished_tasks:
                self._queue.all_tasks_done.wait(seconds)

    def note_unfinished(self, commit_message: str, waited: float, timeout: float | None) -> None:
        """Records an upload not waited for to its end, with the true time waited
        (the flag may have allowed more)."""
        limit = f" (--hub_timeout {timeout:g} s)" if timeout is not None else ""
        with self._lock:
            self._failures.append(f"Hub push {commit_message!r} to {self.repo_id} did not finish within "
                                  f"{waited:.0f} s{limit}: the Hub is slow or not answering")

    @property
    def failures(self) -> list[str]:
        """Messages of the uploads that finally failed (tokens scrubbed)."""
        with self._lock:
            return list(self._failures)

    def _enqueue(self, job: _Job) -> None:
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                # A daemon thread: an interpreter exiting without `wait()` must not hang on a dead Hub.
                self._worker = threading.Thread(target=self._run, name="hub-pusher", daemon=True)
                self._worker.start()
        with self._lock:
            if job.newest_of:
                self._newest[job.newest_of] = job
        self._queue.put(job)

    def _superseded(self, job: _Job) -> bool:
        with self._lock:
            return job.newest_of is not None and self._newest.get(job.newest_of) is not job

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if self._superseded(job):
                    logger.info("Skipped %r: a newer upload of it is queued.", job.commit_message)
                else:
                    job.ok = self._upload_with_retries(job)
            except BaseException as e:  # never let the worker die with jobs still queued
                self._record_failure(job.commit_message, e)
            finally:
                if job.snapshot:
                    shutil.rmtree(job.snapshot, ignore_errors=True)
                job.done.set()
                self._queue.task_done()

    def _upload_with_retries(self, job: _Job) -> bool:
        for attempt in range(1, self.max_attempts + 1):
            try:
                self._upload(job)
                logger.info("Pushed %r to the Hub repo %s.", job.commit_message, self.repo_id)
                return True
            except Exception as e:
                if attempt == self.max_attempts or _is_permanent(e):
                    self._record_failure(job.commit_message, e)
                    return False
                wait_s = self.retry_wait_s * 2 ** (attempt - 1)
                logger.warning(
                    "Hub push %r failed (attempt %d of %d), retrying in %.0f s: %s", job.commit_message,
                    attempt, self.max_attempts, wait_s, self._scrub(_describe(e)),
                )
                time.sleep(wait_s)
        return False

    def _upload(self, job: _Job) -> None:
        from huggingface_hub import create_repo, upload_folder  # only a run that pushes needs it

        if not self._repo_ready:
            create_repo(self.repo_id, token=self._token, private=self.private, exist_ok=True)
            self._repo_ready = True
        if job.replacing:
            commit_folder(self.repo_id, job.snapshot or job.folder, job.commit_message, self._token,
                          job.replacing)
            return
        upload_folder(
            repo_id=self.repo_id, folder_path=job.snapshot or job.folder, path_in_repo=job.path_in_repo,
            commit_message=job.commit_message, token=self._token,
        )

    def _record_failure(self, commit_message: str, error: BaseException) -> None:
        message = self._scrub(f"Hub push {commit_message!r} to {self.repo_id} failed: {_describe(error)}")
        logger.error("%s", message)
        with self._lock:
            self._failures.append(message)

    def _scrub(self, text: str) -> str:
        return scrub(text, self._token)


def commit_folder(repo_id: str, folder: str, message: str, token: str | None, replacing: tuple[str, ...]):
    """Every file of `folder` at the repo's root in ONE commit, which also removes what the repo holds under
    the `replacing` folders and `folder` does not bring: a reader sees the old folder or the new one, never a
    mix (upload_folder may split a large folder into several commits)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    api = HfApi(token=token)
    names = regular_files(folder)
    under = tuple(f"{name.rstrip('/')}/" for name in replacing)
    stale = [path for path in api.list_repo_files(repo_id) if path.startswith(under) and path not in names]
    added = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=os.path.join(folder, name))
             for name in names]
    removed = [CommitOperationDelete(path_in_repo=path) for path in stale]
    api.create_commit(repo_id, operations=[*removed, *added], commit_message=message)


def scrub(text: str, token: str | None) -> str:
    """`text` without `token`, the client's own token, or anything shaped like a token."""
    for known in {token, _token_from_client()} - {None, ""}:
        text = text.replace(known, "***")
    text = _TOKEN_PATTERNS[0].sub("***", text)
    return _TOKEN_PATTERNS[1].sub(r"\1***", text)


def wait_until(done, sleep, deadline: float | None, stop=None) -> bool:
    """Whether `done()` came true before the monotonic `deadline` (None: no limit) and before `stop()` did;
    `sleep(s)` waits for a change. With a `stop`, waits are slices of POLL_S: a signal handler only records
    the signal, so one long wait would sit out the whole --hub_timeout after a Ctrl-C."""
    while not done():
        if stop is not None and stop():
            return False
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        if stop is not None:
            left = POLL_S if left is None else min(left, POLL_S)
        sleep(left)
    return True


def _snapshot(folder: str) -> str:
    """Hard-link (or copy) `folder` into a new hidden sibling folder, which lives on the same file system."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"No folder to push at {folder}")
    parent, name = os.path.split(os.path.abspath(folder))
    target = tempfile.mkdtemp(prefix=f".hub-push-{name}-", dir=parent)
    try:
        link_or_copy(folder, target)  # refuses a link that leaves the folder
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def _is_permanent(error: BaseException) -> bool:
    """Errors another attempt cannot fix: 4xx answers (auth, not found, bad
    request), a missing folder, bad values."""
    status = _http_status(error)
    if status is not None:
        return 400 <= status < 500 and status not in (408, 429)  # timeout, rate limit: worth another try
    return isinstance(error, (FileNotFoundError, NotADirectoryError, ValueError))


def _http_status(error: BaseException) -> int | None:
    return getattr(getattr(error, "response", None), "status_code", None)


def _describe(error: BaseException) -> str:
    """One line (a training log stays one event per line), with a hint for a bad token."""
    status = _http_status(error)
    head = f"{type(error).__name__}" + (f" (HTTP {status})" if status else "")
    hint = " (check the token: it is missing, wrong, or lacks write access)" if status in (401, 403) else ""
    text = " | ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return f"{head}{hint}: {text}"


def _token_from_client() -> str | None:
    """The token `huggingface_hub` would use when none was given, so it can be scrubbed too."""
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:
        return None


def push_final(
    pusher: HubPusher, folder: str, names: list[str], commit_message: str, what: str, timeout: float,
    exclude: tuple[str, ...], stop: StopRequests, say=print,
) -> str | None:
    """Uploads `names` of `folder` (hard-linked into a hidden folder first) to the repo's root after the
    queued uploads, within `timeout` s in all, then says how every upload went. Returns None once the model is
    on the Hub, else the line to end the run with, naming the `hf upload` command (with `exclude`) that
    retries. A stop signal ends the wait as `Stopped`: the model is complete on disk."""
    started = time.monotonic()
    patterns = "".join(f" --exclude '{pattern}'" for pattern in exclude)
    retry = f"`hf upload {pusher.repo_id} {folder}{patterns}`"

    def asked():
        return bool(stop.received)

    for leftover in glob.glob(os.path.join(glob.escape(folder), f"{SNAPSHOT_PREFIX}*")):
        remove_tree(leftover)  # a killed push's snapshot: a second copy of the model otherwise, kept for good
    snapshot = tempfile.mkdtemp(prefix=SNAPSHOT_PREFIX, dir=folder)
    try:
        link_or_copy(folder, snapshot, names)
        if not pusher.wait(timeout=min(300, timeout), stop=asked) and not asked():
            say(f"Checkpoint uploads are still running; the {what}'s upload follows them...")
        job = pusher.submit(snapshot, commit_message)
        finished = wait_until(job.done.is_set, job.done.wait, started + timeout, stop=asked)
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
    waited = time.monotonic() - started
    if not finished and asked():
        signum = stop.received[0]
        raise Stopped(
            f"{stop.program}: stopped by {signal.Signals(signum).name} after {waited:.0f} s of the Hub "
            f"push, which did not finish; the local folder {folder} is complete: push it with {retry}.",
            signum,
        )
    if not finished:
        pusher.note_unfinished(commit_message, waited, timeout)
    pushed = finished and job.ok
    report_final_push(pusher, pushed, what, folder, say)
    if pushed:
        return None
    return (
        f"The {what} was NOT pushed to {pusher.repo_id}; the local folder {folder} is complete: push it with "
        f"{retry}."
    )


def report_final_push(pusher: HubPusher, pushed: bool, what: str, folder: str, say=print) -> None:
    """A summary at the very end, so a failed upload is not lost in the
    training log (never with the token)."""
    failures = pusher.failures
    if pushed and not failures:
        say(f"Pushed the {what} to the Hub as {pusher.repo_id}.")
        return
    say(f"Hub push to {pusher.repo_id}: {len(failures)} upload(s) failed:")
    for message in failures:
        say(f"  - {message}")
    if pushed:
        say(f"The {what} did reach the Hub; the local folder {folder} is complete.")
