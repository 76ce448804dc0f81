"""`tinytx`: the project's tools under one command (COMMANDS), and how the two training scripts run.

A subcommand runs its module as `python -m` does; nothing heavy is imported here, so every `--help` but
finetune's (Trainer's flags load torch) is answered without torch. pretrain.py and finetune.py end with
`run_script`: the stop signals handled before the libraries load, then their `main`, which checks the input
before it imports torch. Every way a run ends is one exit status (`RunEnding`, on top of the library's
hf_tinytx/commands/exits.py): 0 the run finished; 2 bad input (UserInputError); 1 a fault (RunError, a full
disk, anything unexpected: one line, the traceback with TINYTX_TRACEBACK=1); 128 + signal stopped by
SIGTERM or SIGINT with a checkpoint (Stopped).
"""

import contextlib
import difflib
import logging
import os
import runpy
import sys
from collections.abc import Callable
from importlib.util import find_spec
from typing import NoReturn

from hf_tinytx.commands.exits import Ending
from hf_tinytx.folders.safe import is_disk_full
from hf_tinytx_training.distributed.cluster import watch_launcher_exit
from hf_tinytx_training.distributed.preemption import Stopped, StopRequests, stop_requests
from hf_tinytx_training.errors import RunError


COMMANDS = {  # subcommand -> (module run as __main__, what it does)
    "pretrain": (
        "hf_tinytx_training.pretrain", "pre-train a TinyTx model from scratch, export a model folder",
    ),
    "finetune": ("hf_tinytx_training.finetune", "fine-tune a causal LM folder or Hub id (full or LoRA)"),
    "convert": ("hf_tinytx.convert", "convert a saved folder: TinyTx <-> Llama, or TinyTx -> one GGUF file"),
    "serve": ("hf_tinytx.serve", "serve a model with transformers' OpenAI-compatible server"),
    "interpret": ("hf_tinytx.interpret", "draw attention maps and rank heads by role"),
    "generate": (
        "hf_tinytx.commands.generate", "continue a prompt with a model folder, streaming the tokens",
    ),
    "chat": ("hf_tinytx.commands.chat", "chat with a model folder over its chat template, in the terminal"),
}
# The library's commands whose flags are parsed before their module runs: command ->
# its parser in commands/flags.py.
EARLY_PARSERS = {"convert": "convert_parser", "interpret": "interpret_parser"}


# What the training scripts import from the `train` extra (a plain `pip install
# hf_tinytx` brings the model alone).
TRAIN_EXTRA = ("accelerate", "datasets", "matplotlib", "jinja2", "yaml", "tqdm")


def missing_extra(command: str, flags: list[str]) -> str | None:
    """The one-line error of a training command whose `train` extra is not installed, or None (nothing
    imported). Its --help needs no extra."""
    if command not in ("pretrain", "finetune") or {"-h", "--help"} & set(flags):
        return None
    missing = []
    for module in TRAIN_EXTRA:
        try:
            if find_spec(module) is None:
                missing.append(module)
        except (ImportError, ValueError):  # a broken install of it counts as none
            missing.append(module)
    if not missing:
        return None
    return (f"tinytx {command}: error: the training scripts need the `train` extra ({', '.join(missing)} not "
            "installed): pip install 'hf_tinytx[train]'")


def usage() -> str:
    rows = "\n".join(f"  {name:<10} {what}" for name, (_, what) in COMMANDS.items())
    return (f"usage: tinytx {{{','.join(COMMANDS)}}} [flags]\n\n{rows}\n\n"
            "`tinytx <command> --help` lists a command's flags (the same as `python -m <its module>`).")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, flags = argv[0], argv[1:]
    if command not in COMMANDS:
        closest = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"did you mean {closest[0]}?" if closest else f"use one of {', '.join(COMMANDS)}"
        sys.stderr.write(f"tinytx: error: unknown command {command!r}; {hint} (tinytx --help lists them)\n")
        return 2
    if error := missing_extra(command, flags):
        sys.stderr.write(error + "\n")
        return 2
    if command in EARLY_PARSERS:  # --help, or a bad flag, ends here (exit 0, 2) before the module loads torch
        from hf_tinytx.commands import flags as command_flags

        getattr(command_flags, EARLY_PARSERS[command])().parse_args(flags)
    _STARTED_AS[:] = [f"tinytx {command}"]
    module = COMMANDS[command][0]
    sys.argv = [module, *flags]  # alter_sys puts the module's file first, as `python -m` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)  # its sys.exit() ends the process
    return 0


_STARTED_AS = []  # "tinytx pretrain" when the `tinytx` command runs the script in this process


def program_name(script: str) -> str:
    """The script's name in its messages, as the user started it: `tinytx pretrain` or `pretrain.py`."""
    return _STARTED_AS[0] if _STARTED_AS == [f"tinytx {script}"] else f"{script}.py"


# ---- the training scripts: the stop signals handled before the libraries load, one exit status at the end

def run_script(script: str, main: Callable[[], None]) -> NoReturn:
    """How pretrain.py and finetune.py run their `main`: the stop signals first (a signal
    while the libraries load ends the run with a line, not a traceback or a bare -15), then
    `main()`, every way it ends an exit status."""
    program = program_name(script)
    if error := missing_extra(script, sys.argv[1:]):
        sys.exit(error.replace(f"tinytx {script}:", f"{program}:", 1))  # (the same words under `tinytx`)
    stop = stop_requests(program)
    stop.install()
    sys.stdout = OutputWithoutReader(sys.stdout)
    speak_only_as_main()
    try:
        code = RunEnding(stop).status(main)
    except Exception:  # TINYTX_TRACEBACK=1: the traceback, and its exit status 1
        watch_launcher_exit(stop.launcher and stop.launcher.parent, 1)
        raise
    leave(code, stop)


class OutputWithoutReader:
    """sys.stdout that outlives its reader: Ctrl-C on `finetune.py ... | tee log` ends tee too, and the run
    must still save its checkpoint. Once a write finds the pipe closed, the output goes to /dev/null."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


_OWN_OUTPUT = []  # this process's stdout, kept by speak_only_as_main for `print_own`


def speak_only_as_main(env=os.environ) -> None:
    """One voice for a launch: only the global main process (RANK 0) prints to stdout
    (Accelerate prints once per node), errors still go to stderr. The libraries' progress bars
    are drawn by it alone, and only on a terminal."""
    _OWN_OUTPUT[:] = [sys.stdout]
    main = env.get("RANK", "0") == "0"
    if not main:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # for the life of the process
    if not main or not sys.stderr.isatty():
        for name in ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS"):
            env.setdefault(name, "1")  # read by datasets, huggingface_hub and transformers as they load


def print_own(line: str) -> None:
    """A line that is each process's own, printed by every process in one write, so
    that the lines do not interleave."""
    stream = _OWN_OUTPUT[0] if _OWN_OUTPUT else sys.stdout
    stream.write(line + "\n")
    stream.flush()


class RunEnding(Ending):
    """How a training run ends, on top of the library's commands: a stop at a step boundary
    with its checkpoint (Stopped), a peer that left, a full disk with the way to resume.
    The stop signals are StopRequests'."""

    def __init__(self, stop: StopRequests):
        super().__init__(
            f"{stop.program}:", failed=(RunError,), intact="the checkpoints saved so far are intact; "
        )
        self.stop = stop

    def signals(self):
        return contextlib.nullcontext()  # StopRequests' handlers, installed before the libraries loaded

    def ending(self, error: Exception) -> tuple[int, str | None] | None:
        """The run's own endings, then the refusals and faults; a BrokenPipeError is unexpected here, as the
        script's stdout never raises one (OutputWithoutReader)."""
        if isinstance(error, Stopped):  # one line for the launch, not one per process
            return error.exit_code, str(error) if os.environ.get("RANK", "0") == "0" else None
        if said := self.said(error):
            return said
        if self.stop.peer_left(error):  # left at the signal, or failed: not a stop a scheduler may requeue
            return 1, f"{self.start}error: {self.stop.peer_left_message(error)}"
        if is_disk_full(error):
            where = getattr(error, "filename", None) or "the output folder"
            return 1, (
                f"{self.start}error: No space left on the device while writing {where}; the checkpoints "
                "saved so far are intact: free some space and rerun with --resume_from_checkpoint latest."
            )
        return None


def leave(code: int, stop: StopRequests) -> NoReturn:
    watch_launcher_exit(stop.launcher and stop.launcher.parent, code)
    exit_launched_process(code)
    sys.exit(code)


def exit_launched_process(code: int = 0) -> None:
    """Ends a process of a multi-process launch at once: a gloo worker thread that needs the GIL during the
    interpreter's shutdown would abort it (exit -6), a finished run reported as failed."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
