"""The local data files of --train_file and --validation_file: found, and checked to be text of one format,
with nothing beyond Python's own modules, so that a wrong path, an empty or a binary file is refused before
torch and `datasets` load (~7 s on a small CPU)."""

import codecs
import glob
import os

from hf_tinytx_training.errors import UserInputError


CHUNK = 1 << 20  # bytes read at a time by the text check
FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def local_data_files(data_args, checked: frozenset = frozenset()) -> tuple[dict[str, list[str]], str]:
    """({"train": paths, "validation": paths (if given)}, the `datasets` builder that reads them). The text of
    files whose absolute path is in `checked` (tokenized already, unchanged since) is not read again."""
    data_files = {"train": _expand(data_args.train_file, "--train_file", checked)}
    if data_args.validation_file:
        data_files["validation"] = _expand(data_args.validation_file, "--validation_file", checked)
    extensions = {os.path.splitext(path)[1].lower() for paths in data_files.values() for path in paths}
    unknown = extensions - set(FILE_BUILDERS)
    if unknown or len({FILE_BUILDERS[ext] for ext in extensions}) != 1:
        raise UserInputError(
            f"Data files must all be of one kind among {sorted(FILE_BUILDERS)}; got {sorted(extensions)}. "
            "Convert them, or pass training and validation files of the same format."
        )
    return data_files, FILE_BUILDERS[extensions.pop()]


def _expand(pattern: str, flag: str, checked: frozenset) -> list[str]:
    if os.path.isdir(os.path.expanduser(pattern)):
        raise UserInputError(f"{flag} {pattern!r} is a folder; give its files (a glob like "
                             f"'{os.path.join(pattern, '*.txt')}' takes them all).")
    paths = matching_files(pattern)
    if not paths:
        raise UserInputError(
            f"{flag} {pattern!r} matches no file. Check the path (globs like 'data/*.jsonl' work)."
        )
    if all(os.path.getsize(path) == 0 for path in paths):
        raise UserInputError(f"{flag} {pattern!r}: the data is empty (0 bytes); give a file with text in it.")
    for path in paths:
        if os.path.abspath(path) not in checked:
            _check_is_text(path, flag)
    return paths


def matching_files(pattern: str) -> list[str]:
    """The files a --train_file or --validation_file value names (a path or a glob), sorted."""
    return sorted(path for path in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(path))


def _check_is_text(path: str, flag: str) -> None:
    """Text formats must be UTF-8 without NUL bytes, all of the file: a binary or mis-encoded part
    anywhere would train on garbage, or fail deep inside `datasets` with no file named. The line is
    counted on the way, for the message."""
    if path.lower().endswith(".parquet"):
        return
    line, decoder = 1, codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if b"\x00" in chunk:
                raise UserInputError(
                    f"{flag} {path}, line {line + chunk[:chunk.index(0)].count(10)}: a NUL byte, so it is a "
                    "binary file (or UTF-16 text), not UTF-8 text; give a text file."
                )
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                # the chunk, after the start of a character the last one cut (no line break)
                data = error.object
                raise UserInputError(
                    f"{flag} {path}, line {line + data[:error.start].count(10)}: not UTF-8 text (byte "
                    f"{data[error.start]:#04x}); save the file as UTF-8 text, or give a .parquet file."
                ) from None
            line += chunk.count(10)
            if not chunk:
                return
