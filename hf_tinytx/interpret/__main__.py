# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""`python -m hf_tinytx.interpret MODEL "text" --out DIR`: attention maps and head roles of a
text. What it draws and writes, and its flags: hf_tinytx/commands/flags.py (the text `--help`
prints; parsed there without torch)."""

import json
import os
import sys
from pathlib import Path

from hf_tinytx.commands import exits
from hf_tinytx.commands.exits import UserInputError
from hf_tinytx.commands.flags import interpret_parser
from hf_tinytx.commands.generate import check_folder, utf8_text
from hf_tinytx.commands.quiet import quiet_notices
from hf_tinytx.folders.location import local_folder_or_hub_id, looks_local
from hf_tinytx.folders.safe import OverlapError, open_new, refuse_overlap, uncreatable
from hf_tinytx.interpret.attention_maps import attention_maps, save_attention_maps
from hf_tinytx.interpret.head_roles import find_heads, induction_baseline, uniform_baseline


def load_model_and_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """A causal LM with eager attention (the only kind that returns weights) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_tinytx  # noqa: F401  (registers "tinytx" so plain folders load without remote code)

    try:
        name_or_path = local_folder_or_hub_id(name_or_path)
    except FileNotFoundError as error:
        raise UserInputError(str(error)) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, attn_implementation="eager",
                                                     trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        reason = " ".join(str(error).split())[:300]
        raise UserInputError(
            f"could not load a model and tokenizer from {name_or_path!r} ({reason}); give a folder written "
            "by save_pretrained (e.g. pretrain's --output_dir) or a Hub id, and add --trust_remote_code if "
            "the checkpoint ships its own modeling code."
        ) from None
    return model.eval(), tokenizer


def check_input(args) -> None:
    """The text, the model folder and --out, before torch loads and before anything is written."""
    if not args.text.strip():
        raise UserInputError('the text is empty: give a sentence to look at, in quotes ("The animal ...").')
    utf8_text(args.text, "the text")
    if args.dpi < 1:
        raise UserInputError(f"--dpi must be at least 1, got {args.dpi} (the default is 100).")
    if args.coref_probes < 0:
        raise UserInputError(f"--coref_probes must be 0 or more, got {args.coref_probes}.")
    if (problem := uncreatable(args.out)) is not None:
        raise UserInputError(f"--out {args.out} {problem}: give --out a folder it can write.")
    if os.path.isdir(args.model) or looks_local(args.model):
        try:
            check_folder(args.model)
        except ValueError as error:  # UserInputError, or a damaged weights file's line
            raise UserInputError(str(error)) from None
    if os.path.isdir(args.model):  # the PNGs and heads.json never land in (or around) the model they read
        try:
            refuse_overlap(args.model, args.out, ("MODEL", "--out"), reason="it never writes where it reads")
        except OverlapError as error:
            raise UserInputError(str(error)) from None


def main(argv=None) -> int:
    parser = interpret_parser()
    args = parser.parse_args(argv)
    return exits.exit_status(f"{parser.prog}:", lambda: interpret(args))  # as its parser's lines begin


def check_layers_and_heads(args, config) -> None:
    """--layers and --heads name ones the model has (its config is known once it loads)."""
    for flag, chosen, count, what in (("--layers", args.layers, config.num_hidden_layers, "layers"),
                                      ("--heads", args.heads, config.num_attention_heads, "heads a layer")):
        wrong = [index for index in chosen or () if not 0 <= index < count]
        if wrong:
            raise UserInputError(
                f"{flag} {' '.join(map(str, wrong))}: the model has {count} {what}, numbered 0 to "
                f"{count - 1}."
            )


def interpret(args) -> None:
    quiet_notices()
    check_input(args)
    model, tokenizer = load_model_and_tokenizer(args.model, args.trust_remote_code)
    check_layers_and_heads(args, model.config)
    maps = attention_maps(model, tokenizer, args.text)
    paths = save_attention_maps(maps, args.out, args.layers, args.heads, dpi=args.dpi)
    print(f"{len(paths)} attention maps of {len(maps.tokens)} tokens written to {args.out}")

    report = {"tokens": maps.tokens, "maps": [str(p) for p in paths]}
    if len(maps.tokens) >= 2:
        probes = None
        if args.coref_probes:
            from hf_tinytx.corpus import make_probes

            probes = [p for p in make_probes(args.coref_probes, recall_distances=()) if p.kind == "coref"]
        found = find_heads(model, tokenizer, [args.text], probes)
        report["uniform_baseline"] = uniform_baseline(len(maps.tokens))
        report["heads"] = {role: [vars(h) for h in heads] for role, heads in found.items()}
        print(
            f"{'role':<16} best heads (layer.head: score); an even spread scores "
            f"{report['uniform_baseline']:.3f}"
        )
        if "induction" in found:  # its own bar: only the positions after a repeated token count
            report["induction_baseline"] = induction_baseline(maps.input_ids)
            print(f"{'':<16} (on induction an even spread scores {report['induction_baseline']:.3f})")
        for role, heads in found.items():
            print(f"{role:<16} " + ", ".join(f"{h.layer}.{h.head}: {h.score:.3f}" for h in heads))
    with open_new(Path(args.out, "heads.json")) as f:
        f.write(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
