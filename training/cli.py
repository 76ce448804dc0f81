"""`tinytx`: the project's tools under one command, installed with the package.

    tinytx pretrain [flags]                  pre-train a TinyTx model         (python -m hf_tinytx_training.pretrain)
    tinytx finetune [flags]                  fine-tune a causal LM (Trainer)  (python -m hf_tinytx_training.finetune)
    tinytx convert --to llama SRC DST        TinyTx <-> Llama, or GGUF        (python -m hf_tinytx.convert)
    tinytx serve MODEL [flags]               OpenAI-compatible server         (python -m hf_tinytx.serve)
    tinytx interpret MODEL TEXT [flags]      attention maps and head roles    (python -m hf_tinytx.interpret)
    tinytx generate FOLDER PROMPT [flags]    continue a prompt, streamed      (python -m hf_tinytx_training.generate)
    tinytx chat FOLDER [flags]               chat in the terminal             (python -m hf_tinytx_training.chat)

A subcommand runs its module exactly as `python -m` does (its `__main__` block, which calls `main()`), so it takes
the same flags and keeps what the scripts do before `main()`: bad input refused before torch loads, SIGTERM/SIGINT
handled from the first line, one-line errors and their exit status. Nothing heavy is imported here: `tinytx --help`
and every `tinytx <command> --help` are answered without torch. The library's modules (convert, interpret) load torch
as soon as they are imported (hf_tinytx/__init__.py), so their flags are parsed here first, with their parsers read
from hf_tinytx/command_flags.py alone; `serve --help` runs hf_tinytx/serve.py read alone, which imports the
package only to serve.
"""

import difflib
import runpy
import sys
from importlib.util import find_spec


COMMANDS = {  # subcommand -> (module run as __main__, what it does)
    "pretrain": ("hf_tinytx_training.pretrain", "pre-train a TinyTx model from scratch, export a model folder"),
    "finetune": ("hf_tinytx_training.finetune", "fine-tune a causal LM folder or Hub id (full or LoRA)"),
    "convert": ("hf_tinytx.convert", "convert a saved folder: TinyTx <-> Llama, or TinyTx -> one GGUF file"),
    "serve": ("hf_tinytx.serve", "serve a model with transformers' OpenAI-compatible server"),
    "interpret": ("hf_tinytx.interpret", "draw attention maps and rank heads by role"),
    "generate": ("hf_tinytx_training.generate", "continue a prompt with a model folder, streaming the tokens"),
    "chat": ("hf_tinytx_training.chat", "chat with a model folder over its chat template, in the terminal"),
}
# The library's commands whose flags are parsed before their module runs: command -> its parser in command_flags.
EARLY_PARSERS = {"convert": "convert_parser", "interpret": "interpret_parser"}


# What the training scripts import from the `train` extra (a plain `pip install hf_tinytx` brings the model alone).
TRAIN_EXTRA = ("accelerate", "datasets", "matplotlib", "jinja2", "yaml", "tqdm")


def missing_extra(command: str) -> str | None:
    """The one-line error of a training command whose `train` extra is not installed, or None. Only looked up
    (`find_spec`), never imported, so that nothing heavy loads."""
    if command not in ("pretrain", "finetune"):
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
    error = None if {"-h", "--help"} & set(flags) else missing_extra(command)  # the flags need no extra
    if error:
        sys.stderr.write(error + "\n")
        return 2
    if command in EARLY_PARSERS:  # --help, or a bad flag, ends here (exit 0, 2) before the module loads torch
        from hf_tinytx import command_flags

        getattr(command_flags, EARLY_PARSERS[command])().parse_args(flags)
    if command == "serve" and {"-h", "--help"} & set(flags):  # its help is typer's, over transformers' Serve
        from hf_tinytx import serve

        serve.main(flags)  # it prints the help and exits
    run_as_main(COMMANDS[command][0], flags)
    return 0


def run_as_main(module: str, flags: list[str]) -> None:
    """Runs `module` as `python -m module flags...` would; its sys.exit() ends the process with its status."""
    sys.argv = [module, *flags]  # alter_sys puts the module's file first, as `python -m` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    sys.exit(main())
