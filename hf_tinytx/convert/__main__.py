"""`python -m hf_tinytx.convert` (`tinytx convert`): a saved folder converted,
one line and a status at the end.

    python -m hf_tinytx.convert --to tinytx path/to/llama path/to/tinytx
    python -m hf_tinytx.convert --to llama path/to/tinytx path/to/llama [--overwrite]
    python -m hf_tinytx.convert --to gguf path/to/tinytx model.gguf [--outtype f32|f16|q8_0] [--overwrite]

The flags: hf_tinytx/commands/flags.py; the exit statuses: hf_tinytx/commands/exits.py.
"""

import sys

from hf_tinytx.commands.exits import exit_status
from hf_tinytx.commands.flags import convert_parser
from hf_tinytx.commands.quiet import quiet_notices
from hf_tinytx.convert.llama import convert_folder
from hf_tinytx.folders.safe import DiskFullError


def main(argv: list[str] | None = None) -> int:
    parser = convert_parser()
    args = parser.parse_args(argv)
    quiet_notices()
    if args.outtype is not None and args.to != "gguf":
        parser.error("--outtype applies to --to gguf only")

    def command():
        if args.to == "gguf":
            from hf_tinytx.convert.gguf import write_gguf  # needs the optional `gguf` package

            destination = write_gguf(
                args.source, args.destination, args.outtype or "f32", overwrite=args.overwrite
            )
        else:
            destination = convert_folder(args.source, args.destination, to=args.to, overwrite=args.overwrite)
        print(f"wrote {args.to} model to {destination}")

    refused = (ValueError, TypeError, OSError, ImportError)
    stopped = "; run the same command again (what it had half written is removed, or finished by the rerun)"
    # Its lines begin as its parser's do: "python -m hf_tinytx.convert: error: ..."
    return exit_status(f"{parser.prog}:", command, refused=refused, failed=(DiskFullError,), stopped=stopped)


if __name__ == "__main__":
    sys.exit(main())
