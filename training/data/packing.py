"""How a batch is read from the token store, on every process, in the order the run does it.

token_store.py builds the store: the main process tokenizes, and handoff.py passes what it made on.
1. `tokens`: which shards (the main process's, or the built-in corpus's, tokenized in memory by each
   process); `split`: which of their tokens train and which validate, each text a `TokenStream`.
2. `pack_fitted`: both cut into blocks of `block_size` tokens, at sizes fitted to a small text
   (sizing.py). Documents are joined by EOS with no padding, so every block carries the same number of
   targets, which keeps the mean loss of gradient accumulation and of data parallelism exact.
   (`pack_streamed`: a text read as training goes, --streaming, streaming.py.)
3. `make_dataloaders`: the batch of each process and step; `TrainingBlocks`: each epoch's order and cuts.
4. `Blocks.rows`: which block an item is and where it starts; `TokenStream.read`: which shard, which
   offset; `read_tokens`: a memory map. Nothing here holds more than one shard's document index at a
   time, nor any tokens but those read.
"""

import os
from dataclasses import dataclass

import numpy as np
import torch

from hf_tinytx_training.data import sizing, streaming, token_store
from hf_tinytx_training.data.sources import Sources
from hf_tinytx_training.errors import UserInputError


GROUP = 1000  # documents: each group gives the validation the same share


def tokens(description: dict, sources: Sources | None, tokenizer, data_args) -> "Split":
    """Every process: the training and validation streams the main process's description stands for."""
    if description["kind"] in ("files", "dataset"):
        train = [token_store.Shard(**shard) for shard in description["train"]]
        validation = [token_store.Shard(**shard) for shard in description["validation"]] \
            if description["validation"] is not None else None
        shards = train + (validation or [])
        missing = next((shard.path for shard in shards if not os.path.isfile(shard.path)), None)
        if missing:
            raise UserInputError(f"{missing} (a shard of the token store) is missing on this machine: put "
                                 f"--token_store on storage every node mounts at the same path.")
    else:
        train = [shard for source in sources.train for shard in token_store.in_memory(source, tokenizer)]
        validation = [shard for source in sources.validation
                      for shard in token_store.in_memory(source, tokenizer)]
    limit = data_args.num_train_documents if data_args.train_file or data_args.dataset_name else None
    data = split(train, validation, data_args.validation_split_percentage, limit)
    if not len(data.train):
        raise UserInputError("Every training document is empty: there is nothing to learn; give text in the "
                             f"{data_args.text_column!r} column or the files.")
    return data


@dataclass
class Split:
    train: "TokenStream"
    validation: "TokenStream"
    validation_bytes: int  # UTF-8 bytes of the validation documents
    held_out: bool  # the validation documents were held out of the training ones


def split(train_shards: list, validation_shards: list | None, percent: int,
          max_train_documents: int | None) -> Split:
    """The training and validation streams: `validation_shards` whole when given, else documents held out
    of the training ones (a single document holds nothing out); at most `max_train_documents` to train on.

    Held out, in each group of GROUP documents (in file order): the first `percent`% of them, rounded up.
    So the validation text comes from all over the corpus, a text of 12 paragraphs keeps one, and the
    choice does not depend on the seed (runs of several seeds share one store and one validation text)."""
    documents = sum(shard.docs for shard in train_shards)
    hold_out = validation_shards is None and documents >= 2
    train, validation, train_documents, validation_bytes = [], [], 0, 0
    first = 0  # the global number of the shard's first document
    for number, shard in enumerate(train_shards):
        ends, sizes = document_index(shard)
        held = (
            held_out_mask(first, shard.docs, documents, percent) if hold_out else np.zeros(shard.docs, bool)
        )
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
        return Split(train_stream, TokenStream(train_shards, validation), validation_bytes, True)
    whole = [(number, 0, shard.tokens) for number, shard in enumerate(validation_shards)]
    validation_bytes = sum(shard.text_bytes for shard in validation_shards)
    return Split(train_stream, TokenStream(validation_shards, whole), validation_bytes, False)


def held_out_mask(first: int, count: int, total: int, percent: int) -> np.ndarray:
    """Whether each of documents first .. first + count - 1 (of `total`) is held out."""
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


@dataclass
class PackedData:
    train: object  # Blocks, or streaming.StreamedBlocks (no length)
    validation: "Blocks"
    bytes_per_token: float  # UTF-8 bytes a validation token: turns nats/token into bits/byte


def bytes_per_token(data: Split) -> float:
    """Of the validation documents, or (none held out) of all the text."""
    if len(data.validation):
        return data.validation_bytes / len(data.validation)
    return text_bytes_per_token(data.train.shards)


def text_bytes_per_token(shards: list) -> float:
    return sum(shard.text_bytes for shard in shards) / max(sum(shard.tokens for shard in shards), 1)


def pack_fitted(data: Split, data_args, train_args, num_processes: int, explicit: frozenset,
                say) -> PackedData:
    """The blocks at the sizes asked; for a text too small for them, at the sizes sizing.py fits to it
    (each change said through `say` and set in the run's arguments, so that its record shows them), or
    one line saying what cannot fit."""
    block, batch = data_args.block_size, train_args.per_device_train_batch_size
    per_step = batch * train_args.gradient_accumulation_steps * num_processes
    ratio = bytes_per_token(data)
    if len(data.validation) >= block and len(data.train) // block >= per_step:
        return PackedData(Blocks(data.train, block), Blocks(data.validation, block), ratio)
    text = sizing.Text((len(data.train),), len(data.validation), data.held_out)
    asked = sizing.Asked(block, batch, train_args.gradient_accumulation_steps, num_processes, explicit)
    plan = sizing.fit_sizes(text, asked, share=data_args.validation_split_percentage / 100)
    if plan.problem:
        raise UserInputError(plan.problem)
    for note in plan.notes:
        say(note)
    data_args.block_size = plan.block_size
    train_args.per_device_train_batch_size = plan.per_device_train_batch_size
    train, validation = data.train, data.validation
    if plan.validation_from_end:
        whole = train + validation  # the held-out documents back at the end of the text
        cut = len(whole) - plan.validation_from_end
        train, validation = whole.slice(0, cut), whole.slice(cut, len(whole))
    return PackedData(Blocks(train, plan.block_size), Blocks(validation, plan.block_size), ratio)


def pack_streamed(sources: Sources, tokenizer, data_args, max_eval_tokens: int, seed: int) -> PackedData:
    """A streamed text (--streaming): its validation (bounded, read now, in memory) and its training
    blocks (read as training goes)."""
    shard, skip = streaming.validation_text(sources, tokenizer, max_eval_tokens)
    blocks = Blocks(TokenStream([shard], [(0, 0, shard.tokens)]), data_args.block_size)
    if not len(blocks):
        raise UserInputError(
            f"The validation text is shorter than one block of {data_args.block_size} tokens ({shard.tokens} "
            "tokens); lower --block_size."
        )
    train = streaming.StreamedBlocks(sources.train, tokenizer, data_args.block_size, seed, skip)
    return PackedData(train, blocks, text_bytes_per_token([shard]))


def make_dataloaders(packed: PackedData, train_args, seed: int, global_batch: int | None = None):
    """(training loader, validation loader).

    Batch k of an epoch is items k*B .. k*B + B - 1 of `TrainingBlocks` (B: per_device_train_batch_size),
    and Accelerate's prepared loader gives it to process k mod P of P: an optimizer step reads the next
    P x accumulation batches. An epoch is a whole number of steps of `global_batch` blocks, the blocks left
    over waiting for the next epoch's order: otherwise the processes would share the tail unevenly, and
    the same command would train differently on another process count. Each loader draws from its own
    generator, so that a resumed run (which builds one more iterator) stays in step with the global RNG.

    An evaluation reads at most `eval_limit` blocks, spread evenly over the validation (the same blocks on
    any process count), from the shards as it goes. It always reads its loader to the end: leaving a
    prepared loader early leaves Accelerate's end-of-data flag stale, which breaks gradient accumulation."""
    validation = packed.validation
    limit = eval_limit(train_args, validation.block_size)
    validation = Blocks(validation.stream, validation.block_size, evenly_spaced(len(validation), limit))
    train = packed.train
    if hasattr(train, "__len__"):  # not a stream
        global_batch = global_batch or train_args.per_device_train_batch_size
        train = TrainingBlocks(train, seed, take=len(train) // global_batch * global_batch)
    # drop_last: full batches only, so every micro-batch weighs the same in the averaged loss
    training = torch.utils.data.DataLoader(train, batch_size=train_args.per_device_train_batch_size,
                                           drop_last=True, generator=torch.Generator().manual_seed(seed))
    evaluation = torch.utils.data.DataLoader(validation, batch_size=train_args.per_device_eval_batch_size,
                                             generator=torch.Generator().manual_seed(seed))
    return training, evaluation


def eval_limit(train_args, block_size: int) -> int | None:
    """The most validation blocks an evaluation scores (None: all): --max_eval_tokens, --max_eval_batches."""
    limits = []
    if getattr(train_args, "max_eval_tokens", 0):
        limits.append(max(1, train_args.max_eval_tokens // block_size))
    if train_args.max_eval_batches:
        limits.append(train_args.max_eval_batches * train_args.per_device_eval_batch_size)
    return min(limits) if limits else None


def evenly_spaced(count: int, limit: int | None) -> np.ndarray:
    """`limit` indices of `count`, spread evenly from the first (all of them: `limit` None or larger)."""
    take = count if limit is None else min(count, limit)
    return np.arange(take, dtype=np.int64) * count // max(take, 1)


class Blocks(torch.utils.data.Dataset):
    """The `block_size`-token blocks of a token stream, its last tokens short of a block left out. Item i
    is block `order[i]` (by default block i), read `shift` tokens further in: the last block then wraps
    round to the stream's start."""

    def __init__(self, stream: "TokenStream", block_size: int, order: np.ndarray | None = None):
        self.stream, self.block_size = stream, block_size
        self.count = len(stream) // block_size
        self.order = np.arange(self.count, dtype=np.int64) if order is None else order
        self.shift = 0

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        """Each item's tokens, in order, read one at a time."""
        for item in range(len(self)):
            yield self.rows([item])[0]

    def __getitems__(self, items: list[int]) -> list[dict]:
        rows = torch.from_numpy(self.rows(items))  # one read for the whole batch
        return [{"input_ids": row} for row in rows]

    def __getitem__(self, item: int) -> dict:
        return self.__getitems__([item])[0]

    def rows(self, items) -> np.ndarray:
        size, usable = self.block_size, self.count * self.block_size
        rows = np.empty((len(items), size), dtype=np.int64)
        for row, item in enumerate(items):
            start = int(self.order[item]) * size + self.shift
            first = min(size, usable - start)
            rows[row, :first] = self.stream.read(start, first)
            if first < size:
                rows[row, first:] = self.stream.read(0, size - first)
        return rows


class TrainingBlocks(Blocks):
    """The training blocks as an epoch reads them: the first `take` of a fresh order and, after the first
    epoch, each block cut `shift` tokens further in. Several passes over a small text would otherwise show
    the model the very same blocks, so it learns their cuts (nanoGPT reads windows at random offsets
    instead; docs/results.md).

    Both depend on (seed, epoch) alone: every process computes the same, and a resumed run replays the
    epoch and skips exactly the batches it trained on, with nothing to save but the epoch. Accelerate's
    prepared loader calls `set_epoch` (its sampler has none), and so does the run before each epoch."""

    def __init__(self, blocks: Blocks, seed: int, take: int):
        super().__init__(blocks.stream, blocks.block_size)
        self.seed, self.take = seed, take
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        order = torch.randperm(self.count, generator=torch.Generator().manual_seed(self.seed + epoch))
        self.order = order[: self.take].numpy()
        shifts = torch.Generator().manual_seed(self.seed * 7919 + epoch)  # not the order's stream
        self.shift = 0 if epoch == 0 else int(torch.randint(1, self.block_size, (1,), generator=shifts))


class TokenStream:
    """Tokens of `shards` (token_store.Shard) in the ranges `segments`: rows of (shard, start, stop)."""

    def __init__(self, shards: list, segments):
        segments = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
        self.shards = shards
        self.segments = segments[segments[:, 2] > segments[:, 1]]
        self.starts = np.concatenate([[0], np.cumsum(self.segments[:, 2] - self.segments[:, 1])])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count) of the stream, segment by segment."""
        parts = []
        at = int(np.searchsorted(self.starts, start, side="right")) - 1
        while count > 0:
            shard, first, last = (int(value) for value in self.segments[at])
            offset = first + start - int(self.starts[at])
            take = min(count, last - offset)
            parts.append(read_tokens(self.shards[shard], offset, offset + take))
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


def read_tokens(shard, start: int, stop: int) -> np.ndarray:
    """Tokens [start, stop) of a shard: from memory, or through a memory map opened for this read and
    closed after it, as nanoGPT does, so that the pages read do not stay counted in the process's memory."""
    if shard.array is not None:
        return shard.array[0][start:stop]
    offset, shape = start * np.dtype(shard.dtype).itemsize, (stop - start,)
    return np.array(np.memmap(shard.path, dtype=shard.dtype, mode="r", offset=offset, shape=shape))


def document_index(shard) -> tuple[np.ndarray, np.ndarray]:
    """(the token each document of a shard ends at, its UTF-8 bytes), one entry a document."""
    if shard.array is not None:
        return shard.array[1], shard.array[2]
    if not shard.docs:
        return np.zeros(0, np.uint32), np.zeros(0, np.uint32)
    index = np.memmap(shard.path, dtype="<u4", mode="r", offset=shard.index_offset, shape=(2, shard.docs))
    index = np.array(index)
    return index[0], index[1]


def document_starts(blocks, eos_token_id: int, count: int, length: int = 8) -> list[list[int]]:
    """The first `length` tokens (at least 2) of the first `count` validation documents whose start lies
    within a block (`blocks`: token lists, in order): the prompts of a run's samples on its own text.
    Documents start at the validation's first token and right after each EOS."""
    starts = []
    if count <= 0:
        return starts
    for number, block in enumerate(blocks):
        block = [int(token) for token in block]
        points = ([0] if number == 0 else []) + [
            i + 1 for i, token in enumerate(block) if token == eos_token_id
        ]
        for point in points:
            ids = block[point : point + length]
            ids = ids[: ids.index(eos_token_id)] if eos_token_id in ids else ids
            if len(ids) >= 2:
                starts.append(ids)
            if len(starts) == count:
                return starts
    return starts
