"""The training and validation text as token streams over the store's shards, and the blocks cut from them.

`split` holds out, in each group of GROUP documents (in file order), the first `percent`% of them, rounded up, unless
validation documents are given: so the validation text comes from all over the corpus, a text of 12 paragraphs keeps
one, and the choice does not depend on the seed (runs of several seeds share one store and one validation text).
Nothing here holds more than one shard's document index at a time, nor any tokens but those read.
"""

from dataclasses import dataclass

import numpy as np


GROUP = 1000  # documents


class TokenStream:
    """Tokens of `shards` (token_store.Shard) in the ranges `segments`: rows of (shard, start token, stop token)."""

    def __init__(self, shards: list, segments):
        segments = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
        self.shards = shards
        self.segments = segments[segments[:, 2] > segments[:, 1]]
        self.starts = np.concatenate([[0], np.cumsum(self.segments[:, 2] - self.segments[:, 1])])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count) of the stream."""
        parts = []
        at = int(np.searchsorted(self.starts, start, side="right")) - 1
        while count > 0:
            shard, first, last = (int(value) for value in self.segments[at])
            offset = first + start - int(self.starts[at])
            take = min(count, last - offset)
            parts.append(self.shards[shard].read(offset, offset + take))
            start, count, at = start + take, count - take, at + 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def slice(self, start: int, stop: int) -> "TokenStream":
        rows = []
        for (shard, first, last), begins in zip(self.segments, self.starts):
            ends = begins + last - first
            if ends > start and begins < stop:
                rows.append((shard, first + max(0, start - begins), last - max(0, ends - stop)))
        return TokenStream(self.shards, rows)

    def __add__(self, other: "TokenStream") -> "TokenStream":
        moved = other.segments + np.array([len(self.shards), 0, 0])
        return TokenStream(self.shards + other.shards, np.concatenate([self.segments, moved]))


@dataclass
class Split:
    train: TokenStream
    validation: TokenStream
    validation_bytes: int  # UTF-8 bytes of the validation documents
    train_documents: int
    held_out: bool  # the validation documents were held out of the training ones


def split(train_shards: list, validation_shards: list | None, percent: int, max_train_documents: int | None) -> Split:
    """The training and validation streams: `validation_shards` whole when given, else documents held out of the
    training ones (a single document holds nothing out); at most `max_train_documents` training documents."""
    documents = sum(shard.docs for shard in train_shards)
    hold_out = validation_shards is None and documents >= 2
    train, validation, train_documents, validation_bytes = [], [], 0, 0
    first = 0  # the global number of the shard's first document
    for number, shard in enumerate(train_shards):
        ends, sizes = shard.document_index()
        held = held_out_mask(first, shard.docs, documents, percent) if hold_out else np.zeros(shard.docs, bool)
        first += shard.docs
        for start, stop, is_held in runs(held):
            if not is_held and max_train_documents is not None:
                stop = min(stop, start + max_train_documents - train_documents)
                if stop <= start:
                    continue
            tokens = (int(ends[start - 1]) if start else 0, int(ends[stop - 1]))
            if is_held:
                validation.append((number, *tokens))
                validation_bytes += int(sizes[start:stop].sum())
            else:
                train.append((number, *tokens))
                train_documents += stop - start
    train_stream = TokenStream(train_shards, train)
    if validation_shards is None:
        return Split(train_stream, TokenStream(train_shards, validation), validation_bytes, train_documents, True)
    whole = [(number, 0, shard.tokens) for number, shard in enumerate(validation_shards)]
    return Split(train_stream, TokenStream(validation_shards, whole), sum(s.text_bytes for s in validation_shards),
                 train_documents, False)


def held_out_mask(first: int, count: int, total: int, percent: int) -> np.ndarray:
    """Whether each of documents first .. first + count - 1 (of `total`) is held out: the first `percent`% (rounded
    up) of each group of GROUP."""
    number = np.arange(first, first + count, dtype=np.int64)
    group_start = number // GROUP * GROUP
    group_size = np.minimum(GROUP, total - group_start)
    return number - group_start < -(-percent * group_size // 100)


def runs(mask: np.ndarray):
    """(start, stop, value) of each run of equal values in `mask`."""
    if len(mask) == 0:
        return []
    changes = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    bounds = np.concatenate([[0], changes, [len(mask)]])
    return [(int(a), int(b), bool(mask[a])) for a, b in zip(bounds[:-1], bounds[1:])]


class Blocks:
    """The `block_size`-token blocks of a stream (its last tokens short of a block are left out), each read `shift`
    tokens further in; the last block then wraps round to the stream's start."""

    def __init__(self, stream: TokenStream, block_size: int):
        self.stream, self.block_size = stream, block_size
        self.count = len(stream) // block_size

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        """Each block's tokens, in order, read one at a time."""
        for index in range(self.count):
            yield self.rows([index])[0]

    def rows(self, indices, shift: int = 0) -> np.ndarray:
        size, usable = self.block_size, self.count * self.block_size
        rows = np.empty((len(indices), size), dtype=np.int64)
        for row, index in enumerate(indices):
            start = int(index) * size + shift
            first = min(size, usable - start)
            rows[row, :first] = self.stream.read(start, first)
            if first < size:
                rows[row, first:] = self.stream.read(0, size - first)
        return rows


def evenly_spaced(count: int, limit: int | None) -> np.ndarray:
    """`limit` indices of `count`, spread evenly from the first (all of them when `limit` is None or larger)."""
    take = count if limit is None else min(count, limit)
    return np.arange(take, dtype=np.int64) * count // max(take, 1)
