"""Where the documents come from, cut into pieces that processes can read side by side.

A source is a local file, a split of a `datasets` dataset, or documents in memory (the built-in corpus). Each
says what decides its content (`key`), how it divides into pieces (`pieces`), and yields one piece's documents
(`documents`). A file's pieces are byte ranges that start and end on a document boundary and depend on its
size alone, not on how many processes read them: the same file always makes the same documents.

Documents are bounded: .txt is cut at blank lines (a paragraph a document, as `datasets`'
paragraph reader does), and a longer document is cut into documents of at most
MAX_DOCUMENT_CHARS, at a line break where there is one.
"""

import codecs
import io
import itertools
import json
import os
from dataclasses import dataclass

from hf_tinytx_training.errors import UserInputError


# ~16K tokens: longer than any block, short enough that encoding it takes little memory
MAX_DOCUMENT_CHARS = 1 << 16
PIECES_PER_FILE = 16  # a file of any size is read by up to 16 processes side by side...
# ...in pieces of 1 to 64 MiB (a resumed build starts again at a piece's start)
PIECE_BYTES = (1 << 20, 1 << 26)
READ_BYTES = 1 << 22  # bytes read at a time within a piece
ROWS_PER_PIECE = (1000, 100_000)  # the same for the rows of a dataset or a list in memory
BOUNDARY_WINDOW = 1 << 20  # how far past a piece's nominal end to look for a blank line to end it on
RULES = {
    "max_document_chars": MAX_DOCUMENT_CHARS, "pieces_per_file": PIECES_PER_FILE, "piece_bytes": PIECE_BYTES,
    "rows_per_piece": ROWS_PER_PIECE, "boundary_window": BOUNDARY_WINDOW, "version": 1,
}


@dataclass(frozen=True)
class Piece:
    start: int  # byte offset (files) or row (datasets, lists)
    stop: int


def bounded(text: str, limit: int = MAX_DOCUMENT_CHARS):
    """`text` in documents of at most `limit` characters, each cut after the last line break within the limit
    (or at the limit, for a line longer than it)."""
    while len(text) > limit:
        cut = text.rfind("\n", 0, limit) + 1 or limit
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text


def paragraphs(chunks, limit: int = MAX_DOCUMENT_CHARS):
    """The documents of a text read in `chunks` (strings): one per non-empty paragraph, each bounded. The cuts
    depend on the text alone, not on where the chunks end."""
    pending = ""
    for chunk in chunks:
        *complete, pending = (pending + chunk).split("\n\n")
        for paragraph in complete:
            yield from bounded(paragraph, limit)
        if len(pending) > limit:  # a paragraph still open, already too long: its full documents go now
            *full, pending = bounded(pending, limit)
            yield from full
    yield from bounded(pending, limit)


def piece_size(size: int, bounds: tuple[int, int], count: int = PIECES_PER_FILE) -> int:
    return min(max(-(-size // count), bounds[0]), bounds[1])


class LocalFile:
    """A local data file: `shown` is its path as the user gave it, for messages; its key is its path, size and
    mtime (and the column read, but for .txt)."""

    def __init__(self, path: str, flag: str, column: str, kind: str):
        self.shown, self.flag, self.column, self.kind = path, flag, column, kind
        self.path = os.path.abspath(path)
        self.name = os.path.basename(self.path)
        stat = os.stat(self.path)
        self.size, self.mtime_ns = stat.st_size, stat.st_mtime_ns

    def key(self) -> dict:
        key = {"kind": self.kind, "path": self.path, "size": self.size, "mtime_ns": self.mtime_ns}
        return key if self.kind == "txt" else {**key, "column": self.column}


class FileSource(LocalFile):
    """A .txt or .jsonl file, read in byte ranges: documents are paragraphs (.txt) or one JSON
    object a line (.jsonl, its `column`)."""

    def __init__(self, path: str, flag: str, column: str):
        self.lines = path.lower().endswith(".jsonl")
        super().__init__(path, flag, column, "jsonl" if self.lines else "txt")

    def pieces(self) -> list[Piece]:
        step = piece_size(self.size, PIECE_BYTES)
        cuts = [0]
        with open(self.path, "rb") as f:
            for nominal in range(step, self.size, step):
                if nominal > cuts[-1]:
                    cuts.append(self._boundary_after(f, nominal))
        cuts = sorted(set(cut for cut in cuts if cut < self.size)) + [self.size]
        return [Piece(a, b) for a, b in zip(cuts, cuts[1:])]

    def _boundary_after(self, f, offset: int) -> int:
        """The first document start at or after `offset`: past a blank line within the window (.txt), else
        past the next line break, else (a line longer than the window) the next character's start."""
        f.seek(offset)
        window = f.read(BOUNDARY_WINDOW)
        if self.lines:  # a JSON line is never cut: read on to its end
            while (at := window.find(b"\n")) < 0:
                if len(window) < BOUNDARY_WINDOW:
                    return self.size
                offset += len(window)
                window = f.read(BOUNDARY_WINDOW)
            return offset + at + 1
        blanks = [at + len(blank) for blank in (b"\n\n", b"\n\r\n") if (at := window.find(blank)) >= 0]
        if blanks:
            return offset + min(blanks)
        if (at := window.find(b"\n")) >= 0:
            return offset + at + 1
        skip = next((i for i, byte in enumerate(window[:4]) if byte & 0xC0 != 0x80), 0)
        return min(offset + skip, self.size)

    def documents(self, piece: Piece, progress=None):
        """The piece's documents; `progress(bytes)` is told of each part read."""
        chunks = self._text_chunks(piece, progress)
        if self.lines:
            yield from self._records(chunks, piece)
        else:
            yield from paragraphs(chunks)

    def _text_chunks(self, piece: Piece, progress):
        decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(), translate=True)
        with open(self.path, "rb") as f:
            f.seek(piece.start)
            position = piece.start
            while position < piece.stop:
                data = f.read(min(READ_BYTES, piece.stop - position))
                if not data:
                    break
                try:
                    text = decoder.decode(data, final=position + len(data) >= piece.stop)
                except UnicodeDecodeError as error:
                    raise UserInputError(self._where(position + error.start) + f": not UTF-8 text (byte "
                                         f"{data[error.start]:#04x}); save the file as UTF-8 text.") from None
                position += len(data)
                if progress:
                    progress(len(data))
                yield text

    def _records(self, chunks, piece: Piece):
        pending = ""
        for chunk in chunks:
            *lines, pending = (pending + chunk).split("\n")
            for text in lines:
                yield from self._record(text, piece)
        yield from self._record(pending, piece)

    def _record(self, text: str, piece: Piece):
        if not text.strip():
            return
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as error:
            reason = (f"not valid JSON ({error.msg} at column {error.colno})" if isinstance(error, ValueError)
                      else "JSON nested too deeply to read (thousands of brackets)")
            raise UserInputError(self._bad_line(text, piece, reason)) from None
        if not isinstance(value, dict):
            raise UserInputError(self._bad_line(text, piece, f"a JSON {type(value).__name__}, not an object"))
        document = value.get(self.column)
        if document is not None and not isinstance(document, str):
            raise UserInputError(
                f"{self.flag} {self.shown}: field {self.column!r} holds {type(document).__name__} values, "
                "not text; store the documents as strings, or pass --text_column with the field that holds "
                "the text."
            )
        if document is None and self.column not in value:
            raise UserInputError(
                f"The data has no column {self.column!r} ({self.flag} {self.shown}: its columns are "
                f"{sorted(value)}); pass --text_column with the column that holds the text."
            )
        yield from bounded(document or "")

    def _bad_line(self, text: str, piece: Piece, reason: str) -> str:
        """Found only on an error, so the line's number is counted then (the
        piece is read again to find it)."""
        with open(self.path, "rb") as f:
            f.seek(piece.start)
            at = piece.start + max(f.read(piece.stop - piece.start).find(text.encode("utf-8")), 0)
        return (f"{self._where(at)}: {reason}; each line must be one JSON object such as "
                f'{{"{self.column}": "..."}}.')

    def _where(self, offset: int) -> str:
        line, position = 1, 0
        with open(self.path, "rb") as f:
            while position < offset:
                data = f.read(min(READ_BYTES, offset - position))
                if not data:
                    break
                line, position = line + data.count(b"\n"), position + len(data)
        return f"{self.flag} {self.shown}, line {line}"


class TableFileSource(LocalFile):
    """A .json, .csv or .parquet file, read whole (one piece) through `datasets`, streamed: nothing goes to
    its cache. `kind` is the `datasets` builder."""

    def pieces(self) -> list[Piece]:
        return [Piece(0, self.size)]

    def documents(self, piece: Piece, progress=None):
        import datasets

        try:
            rows = datasets.load_dataset(self.kind, data_files=[self.path], split="train", streaming=True)
            features = rows.features
        except Exception as error:  # datasets raises many kinds
            raise UserInputError(
                f"Could not read {self.flag} {self.shown} as {self.kind}: {type(error).__name__}: {error}. "
                f"Check that the file is valid {self.kind}."
            ) from None
        if features is not None:
            check_column(features, self.column, f"{self.flag} {self.shown}")
        for row in rows:
            yield from bounded(text_of(row, self.column, f"{self.flag} {self.shown}"))
        if progress:
            progress(self.size)


class RowsSource:
    """Documents in rows: a `datasets.Dataset` split (`key` its fingerprint) or a list of strings (`key` their
    hash). Pieces are ranges of rows."""

    def __init__(self, name: str, rows, column: str | None, key: dict):
        self.name, self.rows, self.column, self._key = name, rows, column, key
        self.size = len(rows)  # rows count as the "bytes" of progress: a row at a time

    def key(self) -> dict:
        return self._key

    def pieces(self) -> list[Piece]:
        step = piece_size(self.size, ROWS_PER_PIECE)
        return [Piece(start, min(start + step, self.size)) for start in range(0, self.size, step)]

    def documents(self, piece: Piece, progress=None):
        for start in range(piece.start, piece.stop, 1000):
            stop = min(start + 1000, piece.stop)
            batch = self.rows[start:stop]
            texts = batch if self.column is None else batch[self.column]
            for text in texts:
                yield from bounded(text_of({"text": text}, "text", self.name))
            if progress:
                progress(stop - start)


def text_of(row: dict, column: str, where: str) -> str:
    if column not in row:
        raise UserInputError(
            f"The data has no column {column!r} ({where}: its columns are {sorted(row)}); pass --text_column "
            "with the column that holds the text."
        )
    value = row[column]
    if value is not None and not isinstance(value, str):
        raise UserInputError(
            f"{where}: column {column!r} holds {type(value).__name__} values, not text; store the documents "
            f"as strings (e.g. df[{column!r}].astype(str) before writing), or pass --text_column with the "
            "column that holds the text."
        )
    return value or ""


def check_column(features, column: str, where: str) -> None:
    """A table's column checked from its schema: there, and text (a parquet column of int64 would
    otherwise reach the tokenizer as ints)."""
    import datasets

    if column not in features:
        raise UserInputError(
            f"The data has no column {column!r} ({where}: its columns are {list(features)}); pass "
            "--text_column with the column that holds the text."
        )
    feature = features[column]
    dtype = getattr(feature, "dtype", None)
    if isinstance(feature, datasets.Value) and dtype not in ("string", "large_string", "null"):
        raise UserInputError(
            f"{where}: column {column!r} holds {dtype} values, not text; store the documents as strings "
            f"(e.g. df[{column!r}].astype(str) before writing), or pass --text_column with the column that "
            "holds the text."
        )


def file_sources(paths: list[str], flag: str, builder: str, column: str) -> list:
    """The sources of local files of one `datasets` builder kind (files.local_data_files)."""
    return [FileSource(path, flag, column) if builder == "text" or path.lower().endswith(".jsonl")
            else TableFileSource(path, flag, column, builder) for path in paths]


class StreamSource:
    """A streamed `datasets` split (--dataset_name --streaming): one piece, read as it comes."""

    def __init__(self, name: str, rows, column: str):
        self.name, self.rows, self.column = name, rows, column

    def key(self) -> dict:
        return {"kind": "stream", "name": self.name}

    def pieces(self) -> list[Piece]:
        return [Piece(0, 0)]

    def documents(self, piece: Piece, progress=None):
        for row in self.rows:
            yield from bounded(text_of(row, self.column, self.name))


def documents_of(sources: list, skip: int = 0):
    """Every document of `sources`, in order, after the first `skip`."""
    documents = (
        document for source in sources for piece in source.pieces() for document in source.documents(piece)
    )
    return itertools.islice(documents, skip, None)
