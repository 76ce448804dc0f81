"""Preemption: SIGTERM (SLURM, Kubernetes) and SIGINT (Ctrl-C) stop a run at the next optimizer step boundary,
with a checkpoint, and exit status 128 + the signal's number; before training starts, at once, in one line.

Once `training()` is called a signal only marks the request; every process asks `asked()` at each step
boundary, so all stop at the same step. A rank that finds a collective broken after a signal
(`peer_left`) exits 1: its peer may have crashed (srun sends SIGTERM to a step whose other node
failed), and a crash must not be requeued.

The handler is hf_tinytx/commands/signals.py's Recorder; this module says what a stop means for training.
"""

import atexit
import ctypes
import functools
import os
import signal
import sys

from hf_tinytx.commands import signals
from hf_tinytx.commands.signals import STOP_SIGNALS
from hf_tinytx_training.distributed.cluster import LauncherWatch


RESUME_ADVICE = "resume with the same command and --resume_from_checkpoint latest"


class Stopped(Exception):
    """A run stopped by a signal at a step boundary, its checkpoint saved; the
    message is the one line to print."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopRequests(signals.Recorder):
    """The stop signals this process received (`received`); install() once, at the start of the script."""

    def __init__(self, program: str):
        super().__init__()
        self.program = program
        self.deferred = False  # False until training starts: a signal then ends the process at once
        self.pid = None
        self.launcher = None

    def install(self) -> "StopRequests":
        # forked workers (tokenization) inherit the handler but must not speak for the run
        self.pid = os.getpid()
        self.launcher = LauncherWatch()
        super().install()
        # Registered first, so run last of the exit handlers: a late signal leaves
        # the chosen exit status alone.
        atexit.register(ignore_stop_signals, self.pid)
        children_die_with_parent()
        return self

    def training(self) -> None:
        """From now on a signal is honoured at the next step boundary."""
        self.deferred = True

    def stopping(self, signum: int) -> None:
        if self.deferred and os.getpid() == self.pid:
            return
        # Nothing trained yet, so nothing to save: one line, and the status the signal would give.
        if os.environ.get("RANK", "0") == "0" and os.getpid() == self.pid:
            sys.stderr.write(
                f"{self.program}: stopped by {signal.Signals(signum).name} before training started; "
                f"{RESUME_ADVICE}.\n"
            )
            sys.stderr.flush()
        sys.stdout.flush()
        os._exit(128 + signum)

    def peer_left(self, error: BaseException) -> bool:
        """Whether `error` is a collective another process broke after this one got a
        signal (it left, or failed)."""
        return (
            bool(self.received)
            and int(os.environ.get("WORLD_SIZE", "1")) > 1
            and isinstance(error, RuntimeError)
        )

    def peer_left_message(self, error: BaseException) -> str:
        signum = self.received[0]
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        return (f"stopping at {signal.Signals(signum).name}, but another process of the launch left first "
                f"({reason}); the checkpoints saved so far are intact: {RESUME_ADVICE}.")

    def counts(self) -> list[float]:
        """1 or 0 for each of STOP_SIGNALS (an all-reduce sums them); a worker whose
        launcher died counts a SIGTERM."""
        if (
            self.launcher is not None
            and self.launcher.launcher_gone()
            and signal.SIGTERM not in self.received
        ):
            self.received.append(signal.SIGTERM)
            sys.stderr.write(
                f"{self.program}: the launcher that started this process (PID {self.launcher.parent}) is "
                "gone; stopping at this step with a checkpoint, as on SIGTERM.\n"
            )
        return [float(signum in self.received) for signum in STOP_SIGNALS]

    def asked(self, accelerator) -> int | None:
        """The signal any process of the launch got, or None; every process calls it at the same point."""
        import torch  # not at the top: the script installs the handlers before torch loads (~7 s)

        counts = torch.tensor(self.counts(), device=accelerator.device)
        if accelerator.num_processes > 1:
            torch.distributed.all_reduce(counts)
        return signal_of(counts.tolist())


@functools.cache
def stop_requests(program: str) -> StopRequests:
    """The one StopRequests of `program` in this process (training/cli.py
    installs it, the script reads it)."""
    return StopRequests(program)


def ignore_stop_signals(pid: int | None) -> None:
    if os.getpid() == pid:
        signals.ignore()


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_forking_pid = [None]


def children_die_with_parent() -> None:
    """Every process forked from now on gets SIGKILL when the thread that forked it ends: datasets'
    tokenization workers would otherwise live on after a SIGTERM to this process alone. Linux only."""
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return

    def in_child():
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != _forking_pid[0]:  # the parent was gone before the request took effect
            os._exit(128 + signal.SIGKILL)

    os.register_at_fork(before=lambda: _forking_pid.__setitem__(0, os.getpid()), after_in_child=in_child)


def signal_of(counts: list[float]) -> int | None:
    """The signal that summed `counts` stand for (SIGTERM first: a shutdown outranks a Ctrl-C), or None."""
    return next((int(signum) for signum, count in zip(STOP_SIGNALS, counts) if count), None)


def stop_message(program: str, signum: int, step: int, planned: int | None, saved: str) -> str:
    of = f" of {planned}" if planned is not None else ""
    return (
        f"{program}: stopped at step {step}{of} by {signal.Signals(signum).name}; checkpoint {saved} is "
        f"saved, nothing was exported: {RESUME_ADVICE}."
    )
