"""How every command ends: one line on stderr at most, and a documented status. `Ending.status` runs a
command; generate, chat, convert and interpret use it through `exit_status`, and a subclass adds a
command's own endings (the training scripts': a stop with its checkpoint, a peer that left, a full disk).

    0      done
    2      bad input (UserInputError; for convert, each of its refusals)
    1      anything else (a full disk; else the error's name, and TINYTX_TRACEBACK=1 shows where)
    130    Ctrl-C (SIGINT), 143 SIGTERM: what the command had half written is removed
    141    the reader of standard output went away (`... | head -c 10`), as for `cat`
"""

import contextlib
import os
import signal
import sys

from hf_tinytx.commands.signals import StopSignal
from hf_tinytx.commands.signals import raising as stop_signals  # the names other modules import from here


class UserInputError(ValueError):
    """Bad input (a flag, a folder, a file), found before anything is written.
    The message says how to fix it."""


# set to 1: an unexpected error shows its traceback instead of one line
TRACEBACK_VARIABLE = "TINYTX_TRACEBACK"


class Ending:
    """How a command ends: `status(command)` runs it, and every way it ends is a status and at most one
    line `prefix error: ...` on stderr. `refused` errors exit 2, `failed` ones (no fault of the input)
    1, both with their message as the line. `stopped` follows "stopped by SIGINT"; `streams`: a stop
    first ends the streamed text's line; `intact` says, in an unexpected error's line, what it left
    whole. A subclass adds its own endings."""

    def __init__(self, prefix: str, refused: tuple = (UserInputError,), failed: tuple = (), stopped: str = "",
                 streams: bool = False, intact: str = ""):
        self.start = f"{prefix} " if prefix else ""
        self.refused, self.failed = refused, failed
        self.stopped, self.streams, self.intact = stopped, streams, intact

    def status(self, command) -> int:
        try:
            with self.signals():
                command()
        # KeyboardInterrupt: before our handlers, or a library's own
        except (StopSignal, KeyboardInterrupt) as stop:
            signum = getattr(stop, "signum", signal.SIGINT)
            say(
                f"{self.start}stopped by {signal.Signals(signum).name}{self.stopped}",
                newline_first=self.streams,
            )
            return 128 + signum
        # The one line, not a traceback: the hint says how to see one.
        except Exception as error:  # noqa: BLE001
            known = self.ending(error)
            if known is None and os.environ.get(TRACEBACK_VARIABLE):
                raise
            status, line = known or (1, self.unexpected(error))
            if line:
                say(line)
            return status
        return 0

    def signals(self):
        """What the stop signals do while the command runs: raise StopSignal."""
        return stop_signals()

    def ending(self, error: Exception) -> tuple[int, str | None] | None:
        """(status, line or None) of an error the command expects; None for an unexpected one."""
        if isinstance(error, BrokenPipeError):
            return closed_pipe(), None
        return self.said(error)

    def said(self, error: Exception) -> tuple[int, str] | None:
        """A refusal (2) or a failure (1), with its message as the line; None for any other error."""
        if isinstance(error, (*self.failed, *self.refused)):
            return 1 if isinstance(error, self.failed) else 2, f"{self.start}error: {error}"
        return None

    def unexpected(self, error: Exception) -> str:
        reason = " ".join(str(error).split())[:300]
        return (f"{self.start}error: {type(error).__name__}{f': {reason}' if reason else ''} (unexpected: "
                f"{self.intact}run again with {TRACEBACK_VARIABLE}=1 to see where, and report it)")


def exit_status(prefix: str, command, refused: tuple = (UserInputError,), failed: tuple = (),
                stopped: str = "", streams: bool = False) -> int:
    """Runs `command()` and returns its exit status, as `Ending` says
    (generate, chat and convert end here)."""
    return Ending(prefix, refused, failed, stopped, streams).status(command)


def say(line: str, newline_first: bool = False) -> None:
    """The line on stderr, after what stdout holds (a streamed text ends first, on its own line). One write,
    newline included: the processes of a launch may say it at once."""
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
        if newline_first:
            sys.stdout.write("\n")
            sys.stdout.flush()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def closed_pipe() -> int:
    """Standard output's reader left: what is still buffered goes nowhere (else
    Python reports the flush at exit)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE
