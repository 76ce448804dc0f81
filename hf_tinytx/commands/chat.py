"""`tinytx chat FOLDER`: a conversation in the terminal, over the folder's chat template.

    tinytx chat out/chat-lora/merged
    printf 'Count on from 45.\\n/exit\\n' | tinytx chat out/chat-lora/merged     # turns from a pipe work
        alike

Each line read from standard input is a user turn. The reply is generated from the whole conversation so
far (the tokenizer's chat template) and streamed to standard output; it then joins the conversation.
`/reset` starts a new conversation, `/exit` (or Ctrl-D) ends it; notices go to standard error. A reply
stops at the model's last position, with a notice.
"""

import argparse
import importlib.util
import os
import sys

from hf_tinytx.commands.exits import UserInputError
from hf_tinytx.commands.flags import OneLineParser
from hf_tinytx.commands.generate import (
    add_generation_flags,
    context_length,
    early_checks,
    exit_status,
    generation_settings,
    load_model,
    read_json,
    seed,
    utf8_text,
)


PROG = "tinytx chat"
DEFAULT_MAX_NEW_TOKENS = 128
RESET, EXIT = "/reset", "/exit"
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(__doc__.split("\n\n")[:3]),
    )
    add_generation_flags(parser, DEFAULT_MAX_NEW_TOKENS, "out/chat-lora/merged")
    return parser


def no_template(folder: str) -> str:
    return (
        f"{folder}'s tokenizer has no chat template, so a conversation cannot be written as its input: "
        'fine-tune the model on chat records ({"messages": [...]}; finetune then adds a template, e.g. '
        f'out/chat-lora/merged), or continue plain text with tinytx generate {folder} "...".'
    )


def check_chat_ready(folder: str, path: str) -> None:
    """Before torch loads: a chat template in the tokenizer's files (finetune adds
    one), and jinja2 to render it."""
    names = set(os.listdir(path))
    stored = bool(names.intersection(TEMPLATE_FILES))
    if not stored and "tokenizer_config.json" in names:
        values = read_json(os.path.join(path, "tokenizer_config.json"), folder)
        stored = isinstance(values, dict) and bool(values.get("chat_template"))
    if not stored:
        raise UserInputError(no_template(folder))
    if importlib.util.find_spec("jinja2") is None:
        raise UserInputError(
            "chat templates are rendered by jinja2, which is not installed: pip install jinja2 (the `train` "
            "extra brings it)."
        )


def check_input_open() -> None:
    if sys.stdin is None:
        raise UserInputError(
            "standard input is closed, so no turn can be read: type the turns at a terminal, or pipe them "
            "in (printf 'Hello\\n/exit\\n' | tinytx chat FOLDER)."
        )


def user_lines():
    """The user's turns: typed at a prompt on a terminal, else read line by line (a pipe, a file)."""
    # the bytes kept, so utf8_text can name the first wrong one
    sys.stdin.reconfigure(errors="surrogateescape")
    if not sys.stdin.isatty():
        for number, line in enumerate(sys.stdin, start=1):
            yield utf8_text(line.rstrip("\n"), f"line {number} of the input")
        return
    while True:
        try:
            yield utf8_text(input("> "), "the line typed")
        except EOFError:
            print()
            return


def notice(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


def converse(model, tokenizer, settings: dict, lines) -> None:
    import jinja2
    import torch
    from transformers import TextStreamer

    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    messages = []
    for line in lines:
        if line.strip() == EXIT:
            return
        if line.strip() == RESET:
            messages = []
            notice("(a new conversation)")
            continue
        if not line.strip():
            continue
        turn = [*messages, {"role": "user", "content": line}]
        try:
            inputs = tokenizer.apply_chat_template(turn, add_generation_prompt=True, return_dict=True,
                                                   return_tensors="pt").to(model.device)
        except jinja2.TemplateError as error:
            raise UserInputError(
                f"the chat template of the folder's tokenizer fails on this conversation ({error}); fix the "
                "template (chat_template.jinja), or /reset between turns."
            ) from None
        prompt_tokens, context = inputs["input_ids"].shape[1], context_length(model)
        room = settings["max_new_tokens"]
        if context is not None:  # the reply stops at the model's last position
            room = min(room, context - prompt_tokens)
        if room < 1:
            notice(
                f"(the conversation with this turn is {prompt_tokens} tokens, and the model reads {context}: "
                f"{RESET} starts a new conversation)"
            )
            continue
        with torch.no_grad():
            output = model.generate(**inputs, **{**settings, "max_new_tokens": room}, streamer=streamer)
        if output.shape[1] == context and room < settings["max_new_tokens"]:
            notice(
                f"(the reply stopped at the {context} positions the model reads: {RESET} starts a new "
                "conversation)"
            )
        reply = tokenizer.decode(output[0, prompt_tokens:], skip_special_tokens=True)
        if not reply.strip():  # else the user sees a blank line and may wait for more
            notice("(an empty reply: the model ended its turn without a word; try again, or --do_sample)")
        messages = [*turn, {"role": "assistant", "content": reply}]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command():
        check_input_open()
        path = early_checks(args)
        check_chat_ready(args.folder, path)
        model, tokenizer = load_model(path, args.device, args.trust_remote_code)
        # what the tokenizer itself reads, should its files hide one otherwise
        if not tokenizer.chat_template:
            raise UserInputError(no_template(args.folder))
        settings = generation_settings(args, model, DEFAULT_MAX_NEW_TOKENS)
        seed(args.seed)
        notice(f"Chatting with {args.folder}: {RESET} starts a new conversation, {EXIT} or Ctrl-D ends it.")
        converse(model, tokenizer, settings, user_lines())

    return exit_status(PROG, command)


if __name__ == "__main__":
    sys.exit(main())
