"""hf_tinytx/commands/flags.py's OneLineParser, the parser of every command: each mistake one line, exit 2."""

import pytest

from hf_tinytx.commands.flags import OneLineParser


def parser(**kwargs) -> OneLineParser:
    parser = OneLineParser(prog="tinytx demo", allow_abbrev=False, **kwargs)
    parser.add_argument("folder")
    parser.add_argument("--max_new_tokens", type=int, default=3)
    parser.add_argument("--do_sample", action="store_true")
    return parser


def refusal(capsys, flags: list[str], **kwargs) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parser(**kwargs).parse_args(flags)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, err  # no usage block
    return err.rstrip("\n")


@pytest.mark.parametrize("flags, line", [
    (["f", "--max_new_token", "3"], "unknown flag --max_new_token; did you mean --max_new_tokens?"),
    (["f", "--max_new_token=3"], "unknown flag --max_new_token; did you mean --max_new_tokens?"),
    (["f", "--max"], "unknown flag --max; run with --help to list the flags."),  # no abbreviations
    (["f", "--zzz"], "unknown flag --zzz; run with --help to list the flags."),
    (["f", "g"], "unexpected value 'g': every value follows its flag (--name value); see --help."),
    (["f", "--max_new_tokens", "many"],
     "argument --max_new_tokens: invalid int value: 'many' (--help lists the flags)"),
    ([], "the following arguments are required: folder (--help lists the flags)"),
])
def test_each_mistake_is_one_line_naming_the_fix(capsys, flags, line):
    assert refusal(capsys, flags) == f"tinytx demo: error: {line}"


def test_a_command_says_what_a_stray_value_means_for_it(capsys):
    line = refusal(capsys, ["f", "cat"], stray_value="text with spaces goes in quotes.")
    assert line == "tinytx demo: error: unexpected value 'cat': text with spaces goes in quotes."


def test_good_flags_parse_as_argparse_parses_them():
    args = parser().parse_args(["f", "--max_new_tokens=5", "--do_sample"])
    assert (args.folder, args.max_new_tokens, args.do_sample) == ("f", 5, True)
