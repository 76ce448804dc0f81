"""Flags without torch: OneLineParser, the argparse of every command (generate, chat, pretrain, finetune,
convert, interpret), and the flags of `python -m hf_tinytx.convert` and `python -m hf_tinytx.interpret`, which
`tinytx` parses before it loads the module, so that `--help` and a mistyped flag are answered at once.
"""

import argparse
import difflib


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes are one line on stderr, `PROG: error: ...`, and exit 2, without the usage
    block. An unknown flag is named with the closest known one; `stray_value` says what to do with a value no
    flag takes."""

    def __init__(self, *args, stray_value: str = "every value follows its flag (--name value); see --help.",
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.stray_value = stray_value

    def refuse(self, message: str):
        """Ends the process: `message` as the one line, exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def error(self, message: str):  # argparse's own: a wrong value, a missing argument
        self.refuse(f"{message} (--help lists the flags)")

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:  # argparse's own line says only "unrecognized arguments"
            self.refuse(self.unknown(unknown[0]))
        return parsed

    def unknown(self, text: str) -> str:
        """Why `text`, left over by the parse, is refused: a flag with the closest one, or a stray value."""
        if not text.startswith("-"):
            return f"unexpected value {text!r}: {self.stray_value}"
        flag = text.split("=", 1)[0]
        known = [option for action in self._actions for option in action.option_strings
                 if option.startswith("--")]
        closest = difflib.get_close_matches(flag, known, n=1)
        hint = f"did you mean {closest[0]}?" if closest else "run with --help to list the flags."
        return f"unknown flag {flag}; {hint}"


INTERPRET_DESCRIPTION = """python -m hf_tinytx.interpret MODEL "text" --out DIR

Draws the attention map of every layer and head for the text (DIR/layer{L}_head{H}.png), scores every
head on the previous-token, first-token and (if a token in it occurs twice) induction roles for that text
and, with --coref_probes N, on resolving "it" in N held-out corpus sentences, and writes DIR/heads.json.
MODEL is a local folder or a Hub id; add --trust_remote_code for a checkpoint that carries its own code.
"""


def convert_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m hf_tinytx.convert",
        description="Convert a saved Llama model folder to TinyTx, a TinyTx folder to Llama (safetensors "
        "only), or a TinyTx folder to one GGUF file for llama.cpp / Ollama / LM Studio.",
    )
    parser.add_argument(
        "--to", required=True, choices=("llama", "tinytx", "gguf"), help="the format to convert to"
    )
    parser.add_argument("source", help="folder written by save_pretrained (config.json + model.safetensors)")
    parser.add_argument(
        "destination",
        help="folder to write (a file ending in .gguf for --to gguf); must be absent or empty unless "
        "--overwrite",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what an earlier conversion wrote into the destination folder (other files are kept, "
        "or the command refuses if it would replace them), or replace the destination .gguf file",
    )
    parser.add_argument(
        "--outtype",
        choices=("f32", "f16", "q8_0"),
        default=None,
        help="--to gguf only: how the weight matrices are stored (default f32; norms and biases are always "
        "f32)",
    )
    return parser


def interpret_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m hf_tinytx.interpret", description=INTERPRET_DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model folder or Hub id")
    parser.add_argument("text", help="the text whose attention to draw")
    parser.add_argument("--out", required=True, help="folder for the PNGs and heads.json")
    parser.add_argument("--layers", type=int, nargs="*", help="only these layers (default: all)")
    parser.add_argument("--heads", type=int, nargs="*", help="only these heads (default: all)")
    parser.add_argument(
        "--coref_probes", type=int, default=0, help="also score 'it' heads on N corpus sentences"
    )
    parser.add_argument("--trust_remote_code", action="store_true")
    parser.add_argument("--dpi", type=int, default=100)
    return parser
