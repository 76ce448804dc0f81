"""How both training scripts start and end: `launch` is the `__main__` of pretrain.py and finetune.py.

    python -m hf_tinytx_training.pretrain, tinytx pretrain, python training/pretrain.py, torchrun training/pretrain.py
      -> launch: the stop signals handled (preemption.py) -> the torch-free checks (`check_early`: bad input is one
         line and exit 2, before torch loads) -> the script's module imported (torch, transformers: seconds)
         -> its main() -> the exit status (`run_main`)

Run as a script, the file's first statement calls `launch`: that copy of the file (`__main__`) goes no further, and
`launch` imports the file again as the package's module, heavy imports and all, once the signals are handled and the
input checked. Nothing heavy is imported here.

The exit status, the same for both scripts:
    0            the run finished
    2            bad input (UserInputError), before or after torch loaded
    1            a fault while running (RunError: a non-finite loss, a lost peer, a push that did not happen), or a
                 full disk
    128 + signal stopped by SIGTERM or SIGINT with a checkpoint (Stopped), or a peer that left at the signal first
"""

import importlib
import logging
import os
import sys
from collections.abc import Callable
from importlib.util import find_spec
from typing import NoReturn

from .cli import missing_extra, run_as_main
from .errors import RunError, UserInputError
from .preemption import Stopped, StopRequests, stop_requests


# Each script's torch-free module, holding the `preflight()` that checks its input before the heavy imports.
EARLY_CHECKS = {"pretrain": "args", "finetune": "finetune_args"}


def launch(script_file: str, package: str | None) -> NoReturn:
    """Runs the script `script_file` (its `__file__`; `package` its `__package__`, empty for a checkout's file) and
    exits with its status."""
    script = os.path.splitext(os.path.basename(script_file))[0]
    if not package:  # `python training/pretrain.py` in a checkout (also under torchrun or accelerate launch)
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(script_file)))  # this checkout's hf_tinytx first
        run_checkout_script(script_file, f"{__package__}.{script}")
    program = f"{script}.py"
    stop = stop_requests(program)
    stop.install()  # first: a signal while the libraries load ends the run with a line, not a traceback or a bare -15
    check_early(program, importlib.import_module(f"{__package__}.{EARLY_CHECKS[script]}").preflight)
    run_main(program, importlib.import_module(f"{__package__}.{script}").main, stop)


def run_checkout_script(script_file: str, module: str) -> NoReturn:
    """`python training/pretrain.py` in a checkout: runs the installed package's module, once it is that very file
    (an editable install of this checkout), so that the package's relative imports hold; then exits."""
    spec = find_spec(module)
    name = os.path.basename(script_file)
    if spec is None or os.path.realpath(spec.origin) != os.path.realpath(script_file):
        installed = f"it is installed from {os.path.dirname(spec.origin)}" if spec else "it is not installed"
        sys.exit(f"{name}: error: hf_tinytx_training must be this checkout's training/ ({installed}); run "
                 f"`pip install -e .` in this checkout, or use the installed `tinytx {name[:-3]}`.")
    error = missing_extra(name[:-3])
    if error:
        sys.exit(error.replace(f"tinytx {name[:-3]}:", f"{name}:", 1))
    run_as_main(module, sys.argv[1:])
    sys.exit(0)


def check_early(program: str, check: Callable[[], None]) -> None:
    """The flags, folders and files checked before torch and transformers load (~7 s on a small CPU): a typo, --help,
    a folder holding an earlier run or a wrong path is answered at once. `main` checks them again, which costs
    nothing."""
    try:
        check()
    except UserInputError as error:
        sys.stderr.write(f"{program}: error: {error}\n")
        sys.exit(2)


def run_main(program: str, main: Callable[[], None], stop: StopRequests) -> NoReturn:
    """`main()`, and the process's end: every way a run ends becomes its exit status and at most one line."""
    try:
        main()
    except Stopped as stopped:
        leave_stopped(stopped)
    except (UserInputError, RunError) as error:
        # One write, newline included: every process of a launch may say it at once, and print() writes the newline
        # separately, so two processes' lines could run together.
        sys.stderr.write(f"{program}: error: {error}\n")
        leave(2 if isinstance(error, UserInputError) else 1)
    except Exception as error:
        if stop.peer_left(error):  # a collective broken by a process that left at the signal: a stop, not a crash
            leave_stopped(stop.stopped_with_a_peer(error))
        from hf_tinytx.folders import is_disk_full  # loaded with the script's module by now

        if not is_disk_full(error):
            raise
        where = getattr(error, "filename", None) or "the output folder"
        sys.stderr.write(f"{program}: error: No space left on the device while writing {where}; the checkpoints "
                         f"saved so far are intact: free some space and rerun with --resume_from_checkpoint latest.\n")
        leave(1)
    leave(0)


def leave_stopped(stopped: Stopped) -> NoReturn:
    if os.environ.get("RANK", "0") == "0":  # one line for the launch, not one per process
        sys.stderr.write(f"{stopped}\n")
    sys.stderr.flush()
    leave(stopped.exit_code)


def leave(code: int) -> NoReturn:
    exit_launched_process(code)
    sys.exit(code)


def exit_launched_process(code: int = 0) -> None:
    """Ends a process of a multi-process launch at once, once its run has ended: every file is written and closed,
    the trackers are finished and the process groups destroyed, but a gloo group's worker threads live on while
    anything still references the group (DeepSpeed and FSDP2 keep references past `destroy_process_group`). The
    interpreter's own shutdown would then run beside them, and a worker that needs the GIL at that moment (to free
    a tensor) aborts the process ("terminate called without an active exception", exit code -6): a finished run
    reported as failed. Leaving with os._exit skips that shutdown; the kernel releases the output folder's lock."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
