"""Training text in, fixed-length token blocks out.

1. `load_text_datasets`: a Hub dataset, local files, or the embedded default corpus, as train/validation splits of
   documents (a validation split is carved out when none is given). Every problem is reported here, before any
   training starts.
2. `tokenize`, then `pack`: tokenize with a batched `map` (cached on disk when the text came from files), append EOS
   to every document, concatenate, and cut into `block_size` blocks (between the two, fit.py fits the sizes to
   a small text). No padding anywhere, so every block carries the same number of targets, which keeps the mean loss
   of gradient accumulation and of data parallelism exact.
3. `make_dataloaders`: every epoch a new order of the blocks (`EpochShuffleSampler`) and, after the first, new cuts
   through the same token stream (`ShiftingBlocks`).
"""

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from datasets import Dataset, DatasetDict

from hf_tinytx.folders import is_disk_full, mib
from hf_tinytx_training.args import DataArguments
from hf_tinytx_training.data import fit
from hf_tinytx_training.data.files import local_data_files
from hf_tinytx_training.errors import RunError, UserInputError


DEFAULT_CORPUS_DOCUMENTS = 12000
# Documents read from a streamed dataset to make its validation split and to train the tokenizer.
STREAMING_VALIDATION_DOCUMENTS = 1000


def load_text_datasets(data_args: DataArguments, seed: int) -> DatasetDict:
    """Returns {"train", "validation"} datasets of documents in `data_args.text_column`."""
    return load_texts(data_args, seed)[0]


def load_texts(data_args: DataArguments, seed: int) -> tuple[DatasetDict, bool]:
    """({"train", "validation"} datasets of documents, whether the validation documents were held out of the
    training ones). A single document is all training text (its validation then comes from its end: fit.py)."""
    held_out = False
    if data_args.dataset_name:
        raw = _load_hub_dataset(data_args)
    elif data_args.train_file:
        raw = _load_local_files(data_args)
    else:
        from hf_tinytx.corpus import default_corpus

        splits = default_corpus(num_documents=data_args.num_train_documents or DEFAULT_CORPUS_DOCUMENTS, seed=seed)
        raw = DatasetDict({name: Dataset.from_dict({data_args.text_column: docs}) for name, docs in splits.items()})

    if "validation" in raw and data_args.streaming:
        # Evaluation needs a finite, re-readable split: the stream's first documents of its own validation split.
        raw["validation"] = Dataset.from_list(list(raw["validation"].take(STREAMING_VALIDATION_DOCUMENTS)))
    if "validation" not in raw:
        if data_args.streaming:
            # A stream cannot be split at random: the first documents become the validation set.
            validation = list(raw["train"].take(STREAMING_VALIDATION_DOCUMENTS))
            raw["validation"] = Dataset.from_list(validation)
            raw["train"] = raw["train"].skip(STREAMING_VALIDATION_DOCUMENTS)
        else:
            _check_documents(raw["train"], data_args.text_column, "training")
            held_out = True
            if len(raw["train"]) < 2:  # nothing to hold out
                split = {"train": raw["train"], "test": raw["train"].select([])}
            else:
                split = raw["train"].train_test_split(
                    test_size=data_args.validation_split_percentage / 100, seed=seed, shuffle=True
                )
            raw = DatasetDict({"train": split["train"], "validation": split["test"]})

    if data_args.num_train_documents and data_args.train_file and len(raw["train"]) > data_args.num_train_documents:
        raw["train"] = raw["train"].select(range(data_args.num_train_documents))
    for name in ("train", "validation") if not (held_out and len(raw["validation"]) == 0) else ("train",):
        _check_documents(raw[name], data_args.text_column, name)
    return DatasetDict({"train": raw["train"], "validation": raw["validation"]}), held_out


def _load_hub_dataset(data_args: DataArguments):
    try:
        raw = datasets.load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, streaming=data_args.streaming
        )
    except Exception as error:  # datasets raises many kinds (network, missing config, bad files)
        raise UserInputError(
            f"Could not load the dataset {data_args.dataset_name!r} (config {data_args.dataset_config_name!r}): "
            f"{error}. Check the name and --dataset_config_name, or use --train_file for local text."
        ) from error
    if "train" not in raw:
        raise UserInputError(f"The dataset {data_args.dataset_name!r} has no 'train' split (it has {list(raw)}).")
    return raw


def _load_local_files(data_args: DataArguments) -> DatasetDict:
    data_files, builder = local_data_files(data_args)
    # Plain text: one document per paragraph (blank-line separated), line breaks kept.
    options = {"sample_by": "paragraph", "keep_linebreaks": True} if builder == "text" else {}
    try:
        with datasets_cache_space():
            raw = datasets.load_dataset(builder, data_files=data_files, **options)
    except RunError:
        raise
    except Exception as error:
        if builder == "json" and (bad_line := _first_bad_json_line(data_files)):
            raise UserInputError(bad_line) from None
        raise UserInputError(
            f"Could not read {data_files} as {builder}: {type(error).__name__}: {error}. Check that the files are "
            f"valid {builder} (JSON Lines: one object per line with a {data_args.text_column!r} field)."
        ) from error
    for name, split in raw.items():
        _check_text_type(split, data_args.text_column, f"--{name}_file {', '.join(data_files[name])}")
    return raw


def _first_bad_json_line(data_files: dict[str, list[str]]) -> str | None:
    """Why `datasets` could not read JSON Lines, as "FILE, line N: ...", or None: it names neither file nor line. Read
    only after it failed (the files are UTF-8 text by then: data_files.py checked every byte)."""
    named = [(f"--{split}_file", path) for split, paths in data_files.items() for path in paths]
    for flag, path in [(flag, path) for flag, path in named if path.lower().endswith(".jsonl")]:
        with open(path, encoding="utf-8-sig") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as error:
                    reason = f"not valid JSON ({error.msg} at column {error.colno})"
                except RecursionError:  # Python's parser recurses per bracket: a line of 100000 `[` exhausts it
                    reason = "JSON nested too deeply to read (thousands of brackets)"
                else:
                    if isinstance(value, dict):
                        continue
                    reason = f"a JSON {type(value).__name__}, not an object"
                return (f'{flag} {path}, line {number}: {reason}; each line must be one JSON object such as '
                        f'{{"text": "..."}}.')
    return None


def _check_text_type(split: Dataset, text_column: str, files: str) -> None:
    """A text column of numbers (a parquet column of int64, a CSV column of digits) would reach the tokenizer
    trainer as ints and fail there with a TypeError: refused naming the files and the column's type."""
    feature = split.features.get(text_column)
    dtype = getattr(feature, "dtype", None)
    if isinstance(feature, datasets.Value) and dtype not in ("string", "large_string", "null"):
        raise UserInputError(
            f"{files}: column {text_column!r} holds {dtype} values, not text; store the documents as "
            f"strings (e.g. df[{text_column!r}].astype(str) before writing), or pass --text_column with the column "
            f"that holds the text."
        )


def _check_documents(split, text_column: str, name: str) -> None:
    columns = split.column_names
    if columns is not None and text_column not in columns:
        raise UserInputError(
            f"The {name} data has no column {text_column!r} (its columns are {columns}); pass --text_column with "
            f"the column that holds the text."
        )
    if isinstance(split, Dataset):
        if len(split) == 0:
            raise UserInputError(f"The {name} data is empty (no documents); give a file or dataset with text in it.")
        if not any(text for text in split[text_column]):
            raise UserInputError(
                f"Every {name} document in column {text_column!r} is empty; there is nothing to learn."
            )


def training_texts(train, text_column: str, max_documents: int = 50000, batch_size: int = 1000):
    """Batches of training documents for the tokenizer trainer (at most `max_documents`: enough for the merges)."""
    batch = []
    for i, example in enumerate(train):
        if i >= max_documents:
            break
        batch.append(example[text_column] or "")
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


@dataclass
class PackedData:
    train: object  # Dataset (or IterableDataset when streaming) of {"input_ids": [block_size ints]}
    validation: Dataset
    bytes_per_token: float  # UTF-8 bytes of validation text per validation token: turns nats/token into bits/byte


@dataclass
class Tokens:
    """The documents as token ids (EOS appended to each), before they are cut into blocks."""

    train: object  # Dataset (or IterableDataset) of {"input_ids": [...]}
    validation: Dataset
    bytes_per_token: float  # UTF-8 bytes of validation text per validation token
    held_out: bool  # the validation documents were held out of the training documents (data_fit may regroup them)


def tokenize(raw: DatasetDict, tokenizer, text_column: str, num_proc=None, held_out: bool = False) -> Tokens:
    eos = tokenizer.eos_token_id

    def to_ids(batch):
        texts = [text or "" for text in batch[text_column]]
        # verbose=False: documents longer than the model's context are fine here, they are cut into blocks later.
        ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        return {"input_ids": [doc + [eos] for doc in ids], "num_bytes": [len(text.encode("utf-8")) for text in texts]}

    tokens = {}
    with datasets_cache_space():  # each map writes its result into the cache
        for name in ("train", "validation"):
            split = raw[name].select_columns([text_column])  # other columns would not survive packing anyway
            map_options = {"num_proc": num_proc, "desc": f"Tokenizing {name}"} if isinstance(split, Dataset) else {}
            tokens[name] = split.map(to_ids, batched=True, remove_columns=[text_column], **map_options)
        measured = tokens["validation"]
        if len(measured) == 0:  # no validation documents (one document in all): the training text's start
            measured = tokens["train"].select(range(min(1000, len(tokens["train"]))))
            tokens["validation"] = Dataset.from_dict({"input_ids": []})  # (mapping no rows gave no columns)
        bytes_per_token = sum(measured["num_bytes"]) / max(num_tokens_of(measured), 1)
        train, validation = (tokens[name].select_columns(["input_ids"]) for name in ("train", "validation"))
    return Tokens(train, validation, bytes_per_token, held_out)


def pack(tokens: Tokens, block_size: int, num_proc=None, validation_from_end: int = 0) -> PackedData:
    """Cuts each split's token stream into blocks (the tail of each 1000-document batch is dropped); with
    `validation_from_end`, the validation is that many tokens from the end of all the text instead (fit.py)."""
    if validation_from_end:
        return _pack_with_validation_from_end(tokens, block_size, validation_from_end)

    def cut(batch):
        stream = [token for doc in batch["input_ids"] for token in doc]
        usable = len(stream) // block_size * block_size
        return {"input_ids": [stream[i : i + block_size] for i in range(0, usable, block_size)]}

    packed = {}
    with datasets_cache_space():
        for name in ("train", "validation"):
            split = getattr(tokens, name)
            map_options = {"num_proc": num_proc, "desc": f"Packing {name} into blocks of {block_size}"} \
                if isinstance(split, Dataset) else {}
            packed[name] = split.map(cut, batched=True, batch_size=1000, remove_columns=["input_ids"], **map_options)
    return PackedData(train=packed["train"], validation=packed["validation"], bytes_per_token=tokens.bytes_per_token)


def _pack_with_validation_from_end(tokens: Tokens, block_size: int, validation_tokens: int) -> PackedData:
    """A small text (data_fit chose this only when the held-out documents hold less than one block): its documents
    regrouped into one stream, the last `validation_tokens` held out, the rest cut into blocks."""
    stream = [token for split in (tokens.train, tokens.validation) for doc in split["input_ids"] for token in doc]
    train, validation = stream[:-validation_tokens], stream[-validation_tokens:]
    usable = len(train) // block_size * block_size

    def blocks(ids: list[int]) -> Dataset:
        return Dataset.from_dict({"input_ids": [ids[i : i + block_size] for i in range(0, len(ids), block_size)]})

    return PackedData(train=blocks(train[:usable]), validation=blocks(validation),
                      bytes_per_token=tokens.bytes_per_token)


def chunk_tokens(split: Dataset) -> tuple[int, ...]:
    """Tokens per 1000-document batch of a tokenized split: what packing cuts into blocks, batch by batch."""
    lengths = [len(ids) for ids in split["input_ids"]]
    return tuple(sum(lengths[i : i + 1000]) for i in range(0, len(lengths), 1000)) or (0,)


def pack_fitted(tokens: Tokens, data_args, train_args, num_processes: int, explicit: frozenset, say) -> PackedData:
    """The blocks at the sizes asked; for a text too small for them, at the sizes fit.py fits to it (each change
    said through `say` and set in the run's arguments, so that its record shows them), or one line saying what cannot
    fit. Called before anything is written."""
    workers = data_args.preprocessing_num_workers
    packed = pack(tokens, data_args.block_size, workers)
    per_step = train_args.per_device_train_batch_size * train_args.gradient_accumulation_steps * num_processes
    if not hasattr(packed.train, "__len__"):  # streamed: only its validation can be measured
        if len(packed.validation) == 0:
            raise UserInputError(f"The validation text is shorter than one block of {data_args.block_size} tokens "
                                 f"({num_tokens_of(tokens.validation)} tokens); lower --block_size.")
        return packed
    if len(packed.validation) and len(packed.train) >= per_step:
        return packed
    text = fit.Text(chunk_tokens(tokens.train), num_tokens_of(tokens.validation), tokens.held_out)
    asked = fit.Asked(data_args.block_size, train_args.per_device_train_batch_size,
                           train_args.gradient_accumulation_steps, num_processes, explicit)
    plan = fit.fit(text, asked, share=data_args.validation_split_percentage / 100)
    if plan.problem:
        raise UserInputError(plan.problem)
    for note in plan.notes:
        say(note)
    data_args.block_size, train_args.per_device_train_batch_size = plan.block_size, plan.per_device_train_batch_size
    return pack(tokens, plan.block_size, workers, plan.validation_from_end)



@contextlib.contextmanager
def datasets_cache_space():
    """A full disk while `datasets` writes its cache (the files read as Arrow tables, the tokenized blocks) as one
    line naming the cache folder and the fix; without it the error blamed the file's format, or "the output folder",
    which does not exist yet. The partial table a map was writing (`tmp*`, left by datasets) is removed to give its
    space back; the finished tables are kept for the rerun to reuse."""
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = set(cache.rglob("tmp*"))
    try:
        yield
    except Exception as error:
        causes = [error]
        while causes[-1].__cause__ or causes[-1].__context__:  # datasets wraps the OSError in its own errors
            causes.append(causes[-1].__cause__ or causes[-1].__context__)
        if not any(is_disk_full(cause, cache) for cause in causes):
            raise
        for partial in set(cache.rglob("tmp*")) - before:
            if partial.is_file() and not partial.is_symlink():
                partial.unlink(missing_ok=True)
        raise RunError(
            f"No space left on the device in the datasets cache {cache} ({mib(shutil.disk_usage(cache).free)} free); "
            f"nothing was written to --output_dir: free space there, or set HF_DATASETS_CACHE to a folder on a disk "
            f"with room, and run the same command again."
        ) from None


def num_tokens_of(tokens: Dataset) -> int:
    return sum(len(ids) for ids in tokens["input_ids"])


def make_dataloaders(packed: PackedData, train_args, seed: int, global_batch: int | None = None):
    """(sampler or None, training loader, validation loader).

    An epoch is a whole number of optimizer steps of `global_batch` blocks (the blocks left over after the last full
    step wait for the next epoch's order): otherwise the processes would share the tail unevenly (Accelerate pads the
    last batches with blocks from the epoch's start, or ends it on a short accumulation), and the same command would
    train differently on another process count from the second epoch on.

    Each loader draws from its own generator: building an iterator from one would otherwise take a number from the
    global RNG, so a resumed run (which builds one more iterator) would drop out of step with an uninterrupted one.
    The validation loader holds at most --max_eval_batches batches in all (the same blocks on any process count,
    shared out among the processes) and is always read to the end (leaving
    a prepared loader early leaves Accelerate's end-of-data flag stale, which breaks gradient accumulation)."""
    streaming = not hasattr(packed.train, "__len__")
    packed.validation.set_format("torch")
    validation = packed.validation
    if train_args.max_eval_batches:
        limit = train_args.max_eval_batches * train_args.per_device_eval_batch_size  # over all processes
        validation = validation.select(range(min(limit, len(validation))))
    if streaming:
        blocks, sampler = packed.train.with_format("torch"), None
    else:
        blocks = ShiftingBlocks(packed.train, seed=seed)
        global_batch = global_batch or train_args.per_device_train_batch_size
        usable = len(blocks) // global_batch * global_batch
        sampler = EpochShuffleSampler(len(blocks), seed=seed, blocks=blocks, take=usable)
    train = torch.utils.data.DataLoader(
        blocks,
        sampler=sampler,
        batch_size=train_args.per_device_train_batch_size,
        drop_last=True,  # full batches only: every micro-batch weighs the same in the averaged loss
        generator=torch.Generator().manual_seed(seed),
    )
    evaluation = torch.utils.data.DataLoader(
        validation, batch_size=train_args.per_device_eval_batch_size, generator=torch.Generator().manual_seed(seed)
    )
    return sampler, train, evaluation


class EpochShuffleSampler(torch.utils.data.Sampler):
    """A fresh random order every epoch, fixed by (seed, epoch) alone, so a resumed run replays the same order and
    can skip exactly the batches it already trained on. Every process computes the same order.

    Kept instead of Accelerate's seedable sampler: this one has no state, so a checkpoint needs no pickled sampler."""

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
    """The packed training blocks, cut at other places every epoch: in epoch e, block i holds the `block_size` tokens
    that start `shift(e)` tokens into packed block i (its end comes from block i + 1; the last block wraps around).

    Several passes over a small text would otherwise show the model the very same blocks each time, so it learns
    their exact cuts; shifted, each pass is new context windows over the same text, as nanoGPT gets by reading
    windows at random offsets (tinyshakespeare in 1,550 steps: 2.049 bits/byte instead of 2.064-2.066, two seeds;
    benchmarks/results/shakespeare_sweep.txt). Epoch 0 is not shifted, and the shift depends on (seed, epoch) alone,
    so a resumed run reads exactly what an uninterrupted one read. Where packing dropped the tail of a batch of
    documents, two neighbouring blocks are not adjacent text, and a shifted block spans that seam."""

    def __init__(self, blocks: Dataset, seed: int):
        self.blocks = blocks.with_format("torch")
        self.seed = seed
        self.shift = 0

    def set_epoch(self, epoch: int) -> None:
        block_size = len(self.blocks[0]["input_ids"])
        generator = torch.Generator().manual_seed(self.seed * 7919 + epoch)  # not the sampler's stream
        self.shift = 0 if epoch == 0 else int(torch.randint(1, block_size, (1,), generator=generator))

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitems__(self, indices: list[int]) -> list[dict]:
        rows = self.blocks[indices]["input_ids"]  # one read for the whole batch
        if self.shift:
            following = self.blocks[[(i + 1) % len(self.blocks) for i in indices]]["input_ids"]
            rows = torch.cat((rows[:, self.shift:], following[:, : self.shift]), dim=1)
        return [{"input_ids": row} for row in rows]

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])[0]


def document_starts(validation: Dataset, eos_token_id: int, count: int, length: int = 8) -> list[list[int]]:
    """The first `length` tokens (at least 2) of the first `count` validation documents whose start lies within a
    block: the prompts of a run's samples on its own text. Documents start at the validation's first token and right
    after each EOS."""
    starts = []
    if count <= 0:
        return starts
    for number, block in enumerate(validation["input_ids"]):
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
