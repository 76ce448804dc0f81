"""`tinytx generate FOLDER "prompt"`: continue a prompt with a saved causal LM, the text printed as it comes.

    tinytx generate out/tinytx "The animal didn't cross the street because" --max_new_tokens 24
    tinytx generate out/tinytx "Once" --do_sample --temperature 0.8 --top_p 0.95 --seed 0
    tinytx generate out/tinytx "Once" --compile     # static cache and a compiled forward
                                                    # (docs/performance.md)

The flags and the folder are checked before torch loads: a mistake is one line, exit 2. chat.py shares this
module's flags, checks and loading.
"""

import argparse
import difflib
import json
import math
import os
import re
import shutil
import sys

from hf_tinytx.commands import exits
from hf_tinytx.commands.exits import UserInputError
from hf_tinytx.commands.flags import OneLineParser
from hf_tinytx.folders import config as folder_config
from hf_tinytx.folders import location as sources
from hf_tinytx.folders import weights as stored_weights


PROG = "tinytx generate"
DEFAULT_MAX_NEW_TOKENS = 64  # when neither the flag nor the folder's generation_config says
# passed to `generate` as given; None leaves the folder's value
SAMPLING_FLAGS = ("temperature", "top_k", "top_p")
DEVICE_NAME = re.compile(r"^[a-z]+(:\d+)?$")  # cpu, cuda, cuda:1, mps, xpu, ...
CXX_COMPILERS = ("g++", "clang++", "c++")  # what inductor's C++ wrapper builds with on a CPU
STRAY_WORD = 'text with spaces goes in quotes ("the cat sat").'  # a second word of an unquoted prompt


def add_generation_flags(parser: argparse.ArgumentParser, default_max_new_tokens: int, example: str) -> None:
    """The flags `tinytx generate` and `tinytx chat` share."""
    parser.add_argument(
        "folder", metavar="FOLDER",
        help=f"a model folder with its tokenizer, as pretrain or finetune write it (e.g. {example})",
    )
    parser.add_argument(
        "--max_new_tokens",
        type=int,
        default=None,
        help="at most this many new tokens (default: the folder's generation_config max_new_tokens, else "
        f"{default_max_new_tokens})",
    )
    parser.add_argument(
        "--do_sample", action="store_true", help="sample the tokens (default: greedy decoding)"
    )
    parser.add_argument("--temperature", type=float, default=None,
                        help="with --do_sample: divide the logits by this (default: the folder's, else 1.0)")
    parser.add_argument(
        "--top_k", type=int, default=None,
        help="with --do_sample: sample among the k likeliest tokens (default: the folder's, else 50)",
    )
    parser.add_argument(
        "--top_p",
        type=float,
        default=None,
        help="with --do_sample: sample among the likeliest tokens whose probabilities add up to p "
        "(default: the folder's, else 1.0)",
    )
    parser.add_argument(
        "--seed", type=int, default=None,
        help="with --do_sample: seed torch's generator, so that the same command gives the same text",
    )
    parser.add_argument(
        "--device", default="cpu", help="where the model runs: cpu (default), cuda, cuda:1, mps, ..."
    )
    parser.add_argument(
        "--trust_remote_code", action="store_true",
        help="run a folder's own modeling code (a model transformers does not know; TinyTx needs none)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1], stray_value=STRAY_WORD,
    )
    add_generation_flags(parser, DEFAULT_MAX_NEW_TOKENS, "out/tinytx")
    parser.add_argument("prompt", metavar="PROMPT", help="the text to continue")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="a static key/value cache and, on a CPU, the forward compiled by torch.compile: faster tokens "
        "after 5-30 s of compiling",
    )
    return parser


def check_flags(args: argparse.Namespace) -> None:
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UserInputError(f"--max_new_tokens must be at least 1, got {args.max_new_tokens}.")
    if args.temperature is not None and not (math.isfinite(args.temperature) and args.temperature > 0):
        raise UserInputError(
            f"--temperature must be a number above 0, got {args.temperature}; for the likeliest token every "
            "time leave --do_sample out."
        )
    if args.top_k is not None and args.top_k < 1:
        raise UserInputError(f"--top_k must be at least 1, got {args.top_k}.")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UserInputError(f"--top_p must lie in (0, 1], got {args.top_p}.")
    if args.seed is not None and args.seed < 0:
        raise UserInputError(f"--seed must be 0 or more, got {args.seed}.")
    given = [f"--{name}" for name in (*SAMPLING_FLAGS, "seed") if getattr(args, name) is not None]
    if given and not args.do_sample:
        applies = "applies" if len(given) == 1 else "apply"
        raise UserInputError(
            f"{', '.join(given)} {applies} only when sampling: add --do_sample (greedy decoding, the "
            "default, always picks the likeliest token)."
        )
    if not DEVICE_NAME.match(args.device):
        raise UserInputError(
            f"--device {args.device!r} is not a device name: use cpu, cuda, cuda:1, mps, ..."
        )


def check_folder(folder: str) -> str:
    """The model folder's absolute path, once it holds a config, a tokenizer
    and weights whose headers read."""
    path = os.path.abspath(os.path.expanduser(folder))
    if not os.path.exists(path) and (problem := sources.link_problem(path)) is not None:
        raise UserInputError(f"{folder} {problem}.")
    if not os.path.exists(path):
        parent = os.path.dirname(path)
        siblings = (
            [entry.name for entry in os.scandir(parent) if entry.is_dir()] if os.path.isdir(parent) else []
        )
        closest = difflib.get_close_matches(os.path.basename(path), siblings, n=1)
        hint = f"did you mean {os.path.join(os.path.dirname(folder), closest[0])!r}? " if closest else ""
        raise UserInputError(f"no such folder: {folder}; {hint}give the folder pretrain or finetune wrote "
                             "(e.g. out/tinytx).")
    if not os.path.isdir(path):
        raise UserInputError(
            f"{folder} is a file, not a model folder: give the folder that holds config.json, the weights "
            "and the tokenizer."
        )
    names = set(os.listdir(path))
    if "config.json" not in names:
        if "adapter_config.json" in names:
            raise UserInputError(f"{folder} holds a LoRA adapter, not a whole model: give the merged folder "
                                 "(finetune --merge writes one, e.g. out/chat-lora/merged).")
        raise UserInputError(
            f"{folder} has no config.json, so it holds no saved model: give the folder save_pretrained wrote "
            "(pretrain's or finetune's --output_dir, e.g. out/tinytx)."
        )
    config = folder_config.read_config_json(path, None)
    if not names.intersection(sources.TOKENIZER_MARKERS):
        raise UserInputError(
            f"{folder} has no tokenizer (no tokenizer.json or tokenizer_config.json): save the model's "
            "tokenizer into it, AutoTokenizer.from_pretrained(base).save_pretrained(folder)."
        )
    folder_config.check_vocabulary_fits(folder, config, None)
    stored_weights.check_weights(path, folder, "FOLDER")
    return path


def read_json(path: str, folder: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, OSError) as error:
        raise UserInputError(
            f"{path} does not read as JSON ({error}); save the model into {folder} again."
        ) from None


def early_checks(args: argparse.Namespace) -> str:
    check_flags(args)
    try:
        return check_folder(args.folder)
    except ValueError as error:  # UserInputError, or stored_weights' line on a damaged file
        raise UserInputError(str(error)) from None


def resolve_device(name: str):
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserInputError(
            f"--device {name!r} is not a device torch knows: use cpu, cuda, cuda:1, mps, ..."
        ) from None
    if device.type == "cpu":
        return device
    backend = getattr(torch, device.type, None)
    available = backend is not None and hasattr(backend, "is_available") and backend.is_available()
    if not available:
        raise UserInputError(
            f"--device {name}: this machine has no {device.type} device torch can use; leave --device out to "
            "run on the CPU."
        )
    if device.index is not None and device.index >= backend.device_count():
        raise UserInputError(
            f"--device {name}: there are only {backend.device_count()} {device.type} devices (0 to "
            f"{backend.device_count() - 1})."
        )
    return device


def load_model(folder: str, device_name: str, trust_remote_code: bool):
    """(model in eval mode on the device, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    import hf_tinytx  # noqa: F401  (registers "tinytx", so a TinyTx folder loads without remote code)
    from hf_tinytx.commands.quiet import quiet_notices

    quiet_notices()
    transformers_logging.disable_progress_bar()  # "Loading weights ..." on stderr says nothing a user acts on
    device = resolve_device(device_name)
    verbosity = transformers_logging.get_verbosity()
    # its load report: refuse_unmatched_weights says it in one line
    transformers_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        # Mismatched shapes are reported below with the missing and unexpected tensors, not raised mid-load.
        model, loading = AutoModelForCausalLM.from_pretrained(
            folder, dtype="auto", trust_remote_code=trust_remote_code, ignore_mismatched_sizes=True,
            output_loading_info=True,
        )
    # Whatever a folder makes transformers raise is the folder's problem.
    except Exception as error:  # noqa: BLE001
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        raise UserInputError(
            f"could not load a causal LM from {folder} ({reason}); give a folder save_pretrained wrote, and "
            "add --trust_remote_code if it ships its own code."
        ) from None
    finally:
        transformers_logging.set_verbosity(verbosity)
    refuse_unmatched_weights(folder, loading)
    return model.to(device).eval(), tokenizer


def refuse_unmatched_weights(folder: str, loading: dict) -> None:
    """transformers fills a tensor the files lack with random values and drops one the config does not expect:
    a config saying 3 layers over weights holding 2 would generate from a model nobody trained."""
    misshapen = [f"{name} {list(stored)} (expected {list(expected)})"
                 for name, stored, expected in loading.get("mismatched_keys") or []]
    kinds = (("missing", sorted(loading.get("missing_keys") or [])),
             ("unexpected", sorted(loading.get("unexpected_keys") or [])), ("misshapen", sorted(misshapen)))
    problems = [f"{kind}: {', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
                for kind, names in kinds if names]
    if problems:
        raise UserInputError(
            f"the weights in {folder} do not match its config.json — {'; '.join(problems)}; fix "
            "config.json to describe these weights, or use the weights saved with it."
        )


def generation_settings(args: argparse.Namespace, model, default_max_new_tokens: int) -> dict:
    """`generate`'s keyword arguments: the flags given, over the folder's generation_config."""
    max_new_tokens = args.max_new_tokens or model.generation_config.max_new_tokens or default_max_new_tokens
    settings = {"max_new_tokens": max_new_tokens, "do_sample": args.do_sample}
    settings.update({name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None})
    return settings


def context_length(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def check_context(model, prompt_tokens: int, max_new_tokens: int) -> None:
    context = context_length(model)
    if context is not None and prompt_tokens + max_new_tokens > context:
        raise UserInputError(
            f"the prompt is {prompt_tokens} tokens and --max_new_tokens {max_new_tokens}: together more than "
            f"the {context} positions the model reads; shorten the prompt or lower --max_new_tokens."
        )


def compile_for_decoding(model) -> dict:
    """A static cache, and on a CPU the forward compiled here (`generate` compiles it by itself on
    accelerators only); returns the settings it adds to `generate`'s."""
    import torch

    if model.device.type == "cpu":
        if not os.environ.get("CXX") and not any(shutil.which(name) for name in CXX_COMPILERS):
            raise UserInputError(
                "--compile on a CPU builds C++ code and needs a C++ compiler (g++ or clang++), and none is "
                "on PATH: install one, or leave --compile out."
            )
        model.forward = torch.compile(model.forward, fullgraph=True, options={"cpp_wrapper": True})
    return {"cache_implementation": "static"}


def continue_prompt(model, tokenizer, prompt: str, settings: dict, streamer=None):
    """The prompt's ids followed by the generated ones, in one row."""
    import torch

    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    if inputs["input_ids"].shape[1] == 0:
        raise UserInputError("the prompt tokenizes to no tokens at all: give some text to continue.")
    check_context(model, inputs["input_ids"].shape[1], settings["max_new_tokens"])
    with torch.no_grad():
        return model.generate(**inputs, **settings, streamer=streamer)


def seed(value: int | None) -> None:
    if value is not None:
        import torch

        torch.manual_seed(value)  # every device's generator


def run(args: argparse.Namespace, folder: str) -> None:
    from transformers import TextStreamer

    model, tokenizer = load_model(folder, args.device, args.trust_remote_code)
    settings = generation_settings(args, model, DEFAULT_MAX_NEW_TOKENS)
    if args.compile:
        settings.update(compile_for_decoding(model))
    seed(args.seed)
    continue_prompt(
        model, tokenizer, args.prompt, settings, TextStreamer(tokenizer, skip_special_tokens=True)
    )


def exit_status(prog: str, command) -> int:
    """Runs `command()` and returns its exit status, as hf_tinytx.commands.exits says."""
    return exits.exit_status(f"{prog}:", command, streams=True)


def utf8_text(text: str, what: str) -> str:
    """`text` once it is UTF-8 (Python keeps other bytes as surrogates, on which a tokenizer fails)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = text[error.start]
        byte = f"byte {ord(bad) - 0xDC00:#04x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"{bad!r}"
        raise UserInputError(f"{what} is not UTF-8 text ({byte} at character {error.start + 1}); give it as "
                             "UTF-8 (iconv -f latin1 -t utf-8 converts a Latin-1 text).") from None
    return text


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command():
        if args.prompt == "":
            raise UserInputError("the prompt is empty: give some text to continue.")
        utf8_text(args.prompt, "the prompt")
        run(args, early_checks(args))

    return exit_status(PROG, command)


if __name__ == "__main__":
    sys.exit(main())
