"""Training text in, fixed-length token blocks out, on every process of a run.

1. `prepare` (the main process): the run's sources tokenized once into the token store, whose shards every process
   reads; the description it returns reaches the other processes through handoff.py.
2. `tokens` and `pack_fitted` (every process): the training and validation streams cut into blocks, with sizes fitted
   to a small text (sizing.py). Documents are joined by EOS with no padding, so every block carries the same number of
   targets, which keeps the mean loss of gradient accumulation and of data parallelism exact.
3. `make_dataloaders`: every epoch a new order of the blocks and, after the first, new cuts through the same text.
"""

import os
from dataclasses import asdict, dataclass

import torch

from hf_tinytx_training.data import sizing, streaming, token_store
from hf_tinytx_training.data.sources import Sources
from hf_tinytx_training.data.streams import Blocks, Split, evenly_spaced, split
from hf_tinytx_training.errors import UserInputError


def workers(data_args) -> int:
    """--preprocessing_num_workers, else every core this process may run on."""
    if data_args.preprocessing_num_workers:
        return data_args.preprocessing_num_workers
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prepare(sources: Sources, tokenizer, recipe: dict | None, store: str, data_args, say) -> dict:
    """The main process: files and datasets tokenized into the store folder `store`, described for every process (the
    built-in corpus is tokenized in memory by each, a stream as training reads it)."""
    if sources.kind not in ("files", "dataset"):
        return {"kind": sources.kind}
    shards = token_store.build(store, tokenizer, recipe, sources.train + (sources.validation or []), workers(data_args),
                               say)
    train = [shard for per_source in shards[: len(sources.train)] for shard in per_source]
    validation = [shard for per_source in shards[len(sources.train):] for shard in per_source]
    return {"kind": sources.kind, "train": [asdict(shard) for shard in train],
            "validation": [asdict(shard) for shard in validation] if sources.validation else None}


def tokens(description: dict, sources: Sources | None, tokenizer, data_args) -> Split:
    """Every process: the training and validation streams the description stands for."""
    if description["kind"] in ("files", "dataset"):
        train = [token_store.Shard(**shard) for shard in description["train"]]
        validation = [token_store.Shard(**shard) for shard in description["validation"]] \
            if description["validation"] is not None else None
        missing = next((shard.path for shard in train + (validation or []) if not os.path.isfile(shard.path)), None)
        if missing:
            raise UserInputError(f"{missing} (a shard of the token store) is missing on this machine: put "
                                 f"--token_store on storage every node mounts at the same path.")
    else:
        train = [shard for source in sources.train for shard in token_store.in_memory(source, tokenizer)]
        validation = [shard for source in sources.validation for shard in token_store.in_memory(source, tokenizer)]
    limit = data_args.num_train_documents if data_args.train_file or data_args.dataset_name else None
    data = split(train, validation, data_args.validation_split_percentage, limit)
    if not len(data.train):
        raise UserInputError("Every training document is empty: there is nothing to learn; give text in the "
                             f"{data_args.text_column!r} column or the files.")
    return data


@dataclass
class PackedData:
    train: object  # Blocks, or streaming.StreamedBlocks (no length)
    validation: Blocks
    bytes_per_token: float  # UTF-8 bytes of validation text per validation token: turns nats/token into bits/byte


def bytes_per_token(data: Split) -> float:
    """Of the validation documents, or (none held out) of all the text."""
    if len(data.validation):
        return data.validation_bytes / len(data.validation)
    return text_bytes_per_token(data.train.shards)


def text_bytes_per_token(shards: list) -> float:
    return sum(shard.text_bytes for shard in shards) / max(sum(shard.tokens for shard in shards), 1)


def pack_fitted(data: Split, data_args, train_args, num_processes: int, explicit: frozenset, say) -> PackedData:
    """The blocks at the sizes asked; for a text too small for them, at the sizes sizing.py fits to it (each change
    said through `say` and set in the run's arguments, so that its record shows them), or one line saying what cannot
    fit."""
    block, per_step = data_args.block_size, (train_args.per_device_train_batch_size
                                             * train_args.gradient_accumulation_steps * num_processes)
    ratio = bytes_per_token(data)
    if len(data.validation) >= block and len(data.train) // block >= per_step:
        return PackedData(Blocks(data.train, block), Blocks(data.validation, block), ratio)
    text = sizing.Text((len(data.train),), len(data.validation), data.held_out)
    asked = sizing.Asked(block, train_args.per_device_train_batch_size, train_args.gradient_accumulation_steps,
                      num_processes, explicit)
    plan = sizing.fit_sizes(text, asked, share=data_args.validation_split_percentage / 100)
    if plan.problem:
        raise UserInputError(plan.problem)
    for note in plan.notes:
        say(note)
    data_args.block_size, train_args.per_device_train_batch_size = plan.block_size, plan.per_device_train_batch_size
    train, validation = data.train, data.validation
    if plan.validation_from_end:
        whole = train + validation  # the held-out documents back at the end of the text
        cut = len(whole) - plan.validation_from_end
        train, validation = whole.slice(0, cut), whole.slice(cut, len(whole))
    return PackedData(Blocks(train, plan.block_size), Blocks(validation, plan.block_size), ratio)


def pack_streamed(sources: Sources, tokenizer, data_args, max_eval_tokens: int, seed: int) -> PackedData:
    """A streamed text: its validation (bounded, read now, in memory) and its training blocks (read as training
    goes)."""
    validation, skip = streaming.validation_text(sources, tokenizer, max_eval_tokens)
    blocks = Blocks(validation, data_args.block_size)
    if not len(blocks):
        raise UserInputError(f"The validation text is shorter than one block of {data_args.block_size} tokens "
                             f"({len(validation)} tokens); lower --block_size.")
    train = streaming.StreamedBlocks(sources.train, tokenizer, data_args.block_size, seed, skip)
    return PackedData(train, blocks, text_bytes_per_token(validation.shards))


def make_dataloaders(packed: PackedData, train_args, seed: int, global_batch: int | None = None):
    """(sampler or None, training loader, validation loader).

    An epoch is a whole number of optimizer steps of `global_batch` blocks, the blocks left over waiting for the next
    epoch's order: otherwise the processes would share the tail unevenly, and the same command would train
    differently on another process count. Each loader draws from its own generator, so that a resumed run (which
    builds one more iterator) stays in step with the global RNG of an uninterrupted one. The validation loader is
    always read to the end: leaving a prepared loader early leaves Accelerate's end-of-data flag stale, which breaks
    gradient accumulation."""
    validation = EvalBlocks(packed.validation, eval_limit(train_args, packed.validation.block_size))
    if not hasattr(packed.train, "__len__"):
        blocks, sampler = packed.train, None
    else:
        blocks = ShiftingBlocks(packed.train, seed=seed)
        global_batch = global_batch or train_args.per_device_train_batch_size
        usable = len(blocks) // global_batch * global_batch
        sampler = EpochShuffleSampler(len(blocks), seed=seed, blocks=blocks, take=usable)
    # drop_last: full batches only, so every micro-batch weighs the same in the averaged loss
    train = torch.utils.data.DataLoader(blocks, sampler=sampler, batch_size=train_args.per_device_train_batch_size,
                                        drop_last=True, generator=torch.Generator().manual_seed(seed))
    evaluation = torch.utils.data.DataLoader(validation, batch_size=train_args.per_device_eval_batch_size,
                                             generator=torch.Generator().manual_seed(seed))
    return sampler, train, evaluation


def eval_limit(train_args, block_size: int) -> int | None:
    """The most validation blocks an evaluation scores (None: all): --max_eval_tokens and --max_eval_batches."""
    limits = []
    if getattr(train_args, "max_eval_tokens", 0):
        limits.append(max(1, train_args.max_eval_tokens // block_size))
    if train_args.max_eval_batches:
        limits.append(train_args.max_eval_batches * train_args.per_device_eval_batch_size)
    return min(limits) if limits else None


class EvalBlocks(torch.utils.data.Dataset):
    """At most `limit` blocks of the validation text, spread evenly over it (the same blocks on any process count),
    read from the shards as the evaluation goes: its memory does not grow with the validation text."""

    def __init__(self, blocks: Blocks, limit: int | None):
        self.blocks, self.indices = blocks, evenly_spaced(len(blocks), limit)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, indices: list[int]) -> list[dict]:
        rows = torch.from_numpy(self.blocks.rows(self.indices[indices]))
        return [{"input_ids": row} for row in rows]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])[0]


class EpochShuffleSampler(torch.utils.data.Sampler):
    """A fresh random order every epoch, fixed by (seed, epoch) alone: every process computes the same one, and a
    resumed run replays it and skips exactly the batches it already trained on. Unlike Accelerate's seedable sampler
    it has no state, so a checkpoint needs no pickled sampler."""

    def __init__(self, num_samples: int, seed: int, blocks: "ShiftingBlocks | None" = None, take: int | None = None):
        self.num_samples = num_samples
        self.take = num_samples if take is None else take  # the first `take` of each epoch's order are read
        self.seed = seed
        self.epoch = 0
        self.blocks = blocks  # told the epoch too: it shifts where blocks start

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.blocks is not None:
            self.blocks.set_epoch(epoch)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=generator)[: self.take].tolist())

    def __len__(self) -> int:
        return self.take


class ShiftingBlocks(torch.utils.data.Dataset):
    """The training blocks, cut at other places every epoch: in epoch e, block i holds the `block_size` tokens that
    start `shift(e)` tokens into block i (the last block wraps around). Several passes over a small text would
    otherwise show the model the very same blocks, so it learns their cuts (nanoGPT reads windows at random offsets
    instead; docs/results.md). Epoch 0 is not shifted, and the shift depends on (seed, epoch) alone, so a resumed run
    reads exactly what an uninterrupted one read."""

    def __init__(self, blocks: Blocks, seed: int):
        self.blocks = blocks
        self.seed = seed
        self.shift = 0

    def set_epoch(self, epoch: int) -> None:
        generator = torch.Generator().manual_seed(self.seed * 7919 + epoch)  # not the sampler's stream
        self.shift = 0 if epoch == 0 else int(torch.randint(1, self.blocks.block_size, (1,), generator=generator))

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitems__(self, indices: list[int]) -> list[dict]:
        rows = torch.from_numpy(self.blocks.rows(indices, self.shift))  # one read for the whole batch
        return [{"input_ids": row} for row in rows]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])[0]


def document_starts(blocks, eos_token_id: int, count: int, length: int = 8) -> list[list[int]]:
    """The first `length` tokens (at least 2) of the first `count` validation documents whose start lies within a
    block (`blocks`: token lists, in order): the prompts of a run's samples on its own text. Documents start at the
    validation's first token and right after each EOS."""
    starts = []
    if count <= 0:
        return starts
    for number, block in enumerate(blocks):
        block = [int(token) for token in block]
        points = ([0] if number == 0 else []) + [i + 1 for i, token in enumerate(block) if token == eos_token_id]
        for point in points:
            ids = block[point : point + length]
            ids = ids[: ids.index(eos_token_id)] if eos_token_id in ids else ids
            if len(ids) >= 2:
                starts.append(ids)
            if len(starts) == count:
                return starts
    return starts

