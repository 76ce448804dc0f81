"""How the library's commands (generate, chat, convert) end: every way is one line on stderr and a documented status.

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
    """Bad input (a flag, a folder, a file), found before anything is written. The message says how to fix it."""


TRACEBACK_VARIABLE = "TINYTX_TRACEBACK"  # set to 1: an unexpected error shows its traceback instead of one line


def exit_status(prefix: str, command, refused: tuple = (UserInputError,), failed: tuple = (),
                stopped: str = "", streams: bool = False) -> int:
    """Runs `command()` and returns its exit status; every way it ends is at most one line `prefix ...` on stderr.
    `refused` errors exit 2, `failed` ones (no fault of the input) 1, both with their message as the line.
    `stopped` follows "stopped by SIGINT"; `streams`: a stop first ends the streamed text's line."""
    start = f"{prefix} " if prefix else ""
    try:
        with stop_signals():
            command()
    except BrokenPipeError:
        return closed_pipe()
    except (StopSignal, KeyboardInterrupt) as stop:  # KeyboardInterrupt: before our handlers, or a library's own
        signum = getattr(stop, "signum", signal.SIGINT)
        say(f"{start}stopped by {signal.Signals(signum).name}{stopped}", newline_first=streams)
        return 128 + signum
    except (*failed, *refused) as error:
        say(f"{start}error: {error}")
        return 1 if isinstance(error, failed) else 2
    except Exception as error:  # noqa: BLE001  (the one line, not a traceback: the hint says how to see one)
        if os.environ.get(TRACEBACK_VARIABLE):
            raise
        reason = " ".join(str(error).split())[:300]
        say(f"{start}error: {type(error).__name__}{f': {reason}' if reason else ''} (unexpected: run again with "
            f"{TRACEBACK_VARIABLE}=1 to see where, and report it)")
        return 1
    return 0


def say(line: str, newline_first: bool = False) -> None:
    """The line on stderr, after what stdout holds (a streamed text ends first, on its own line)."""
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
        if newline_first:
            sys.stdout.write("\n")
            sys.stdout.flush()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def closed_pipe() -> int:
    """Standard output's reader left: what is still buffered goes nowhere (else Python reports the flush at exit)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE
