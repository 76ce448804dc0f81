"""The stop signals, SIGTERM and SIGINT: the one place that sets and restores their handlers, in the few
shapes the commands and launchers need. Each caller keeps its own policy: what a stop means for it, what it
prints, its exit status.

    raising()          a signal raises StopSignal where the main thread was; a second one is ignored
                       (generate, chat, convert: hf_tinytx/commands/exits.py)
    record()           a signal is recorded, and the main thread stops at a safe point (serve polls `first`);
                       exit_on_second=True: a second signal ends the process at once, 128 + its number
    Recorder           the same, as a class to build on: `stopping(signum)` runs at every signal
                       (training's stop at the next step boundary: training/distributed/preemption.py)
    Forwarder          a recorder that passes the first signal on to child processes, also those started later
                       (the node launcher: training/distributed/__main__.py)

Python runs a handler in the main thread only, and refuses to set one from another thread: there the shapes do
nothing, and the signal keeps the handler it had.
"""

import contextlib
import os
import signal
from collections.abc import Callable, Iterable


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # in this order: a shutdown outranks a Ctrl-C where both came


def install(handler, signums: Iterable[int] = STOP_SIGNALS) -> dict:
    """Sets `handler` for the stop signals; returns the handlers it replaced, for restore(). Off the main
    thread it sets nothing and returns {}."""
    earlier = {}
    try:
        for signum in signums:
            earlier[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread: nothing was set
        return {}
    return earlier


def restore(earlier: dict) -> None:
    for signum, handler in earlier.items():
        signal.signal(signum, handler)


def ignore() -> None:
    """From now on the stop signals do nothing (a second Ctrl-C while a stop is under way, or after the exit
    status is chosen)."""
    install(signal.SIG_IGN)


class StopSignal(BaseException):
    """SIGINT or SIGTERM, raised where the command was: `except Exception` lets it pass, `finally` cleans
    up."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stop(signum, frame):
    ignore()  # the cleanup the first one started runs to its end
    raise StopSignal(signum)


@contextlib.contextmanager
def raising():
    """SIGINT and SIGTERM raise StopSignal while the block runs (in the main thread); a second one is
    ignored. The earlier handlers come back after the block."""
    earlier = install(raise_stop)
    try:
        yield
    finally:
        restore(earlier)


class Recorder:
    """The stop signals received, in order, for the caller to act on at a safe point. A subclass's
    `stopping(signum)` runs at each one, in the handler; with exit_on_second a second signal ends the process
    at once."""

    def __init__(self, exit_on_second: bool = False):
        self.received: list[int] = []
        self.exit_on_second = exit_on_second
        self.earlier: dict = {}

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    def __call__(self, signum, frame) -> None:
        if self.received and self.exit_on_second:
            os._exit(128 + signum)  # no cleanup: the user asked twice
        self.received.append(signum)
        self.stopping(signum)

    def stopping(self, signum: int) -> None:
        """Runs at each signal, after it is recorded; nothing here."""

    def install(self) -> "Recorder":
        self.earlier = install(self)
        return self

    def restore(self) -> None:
        restore(self.earlier)
        self.earlier = {}

    def __enter__(self) -> "Recorder":
        return self.install()

    def __exit__(self, *exc_info) -> None:
        self.restore()


def record(exit_on_second: bool = False) -> Recorder:
    """A Recorder set for the stop signals until its restore(); `.first` is the signal got, or None."""
    return Recorder(exit_on_second).install()


class Forwarder(Recorder):
    """Records the stop signals and sends the first one on to each of `targets()` (process ids; a negative
    one is a process group), once each: at the signal, and at every forward() after it, so that a child
    started later (a restarted worker) gets it too."""

    def __init__(self, targets: Callable[[], Iterable[int]]):
        super().__init__()
        self.targets = targets
        self.told: set[int] = set()

    def stopping(self, signum: int) -> None:
        self.forward()

    def forward(self) -> None:
        if self.first is None:
            return
        for pid in set(self.targets()) - self.told:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(pid, self.first)
            self.told.add(pid)
