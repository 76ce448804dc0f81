"""What a run reads, as documents.py sources: local files (--train_file, --validation_file),
a `datasets` dataset (--dataset_name, downloaded or streamed), or the built-in corpus; and
the texts its tokenizer is trained on."""

import contextlib
import hashlib
import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path

from hf_tinytx.folders.safe import is_disk_full, mib
from hf_tinytx_training.data.documents import RowsSource, StreamSource, check_column, file_sources
from hf_tinytx_training.data.files import local_data_files
from hf_tinytx_training.errors import RunError, UserInputError


DEFAULT_CORPUS_DOCUMENTS = 60000
TOKENIZER_DOCUMENTS = 50_000  # the tokenizer is trained on at most this many documents...
# ...and 32M characters, shared among the files by their sizes: enough for the merges
TOKENIZER_CHARS = 1 << 25


@dataclass
class Sources:
    train: list
    validation: list | None  # None: held out of the training documents (packing.split)
    kind: str  # "files", "dataset", "builtin" (tokenized in memory) or "stream" (read as training goes)


def run_sources(data_args, seed: int) -> Sources:
    column = data_args.text_column
    if data_args.train_file:
        data_files, builder = local_data_files(data_args)
        train = file_sources(data_files["train"], "--train_file", builder, column)
        validation = file_sources(data_files["validation"], "--validation_file", builder, column) \
            if "validation" in data_files else None
        return Sources(train, validation, "stream" if data_args.streaming else "files")
    if data_args.dataset_name:
        return _dataset_sources(data_args)
    from hf_tinytx.corpus import default_corpus

    splits = default_corpus(
        num_documents=data_args.num_train_documents or DEFAULT_CORPUS_DOCUMENTS, seed=seed
    )
    rows = {
        name: RowsSource(
            f"the built-in corpus ({name})", documents, None,
            {"kind": "builtin", "sha256": hashlib.sha256("\0".join(documents).encode()).hexdigest()},
        )
        for name, documents in splits.items()
    }
    return Sources([rows["train"]], [rows["validation"]], "builtin")


def _dataset_sources(data_args) -> Sources:
    import datasets

    name, config = data_args.dataset_name, data_args.dataset_config_name
    try:
        with datasets_cache_space():
            raw = datasets.load_dataset(name, config, streaming=data_args.streaming)
    except RunError:
        raise
    except Exception as error:  # datasets raises many kinds (network, missing config, bad files)
        raise UserInputError(
            f"Could not load the dataset {name!r} (config {config!r}): {error}. Check the name and "
            "--dataset_config_name, or use --train_file for local text."
        ) from error
    if "train" not in raw:
        raise UserInputError(f"The dataset {name!r} has no 'train' split (it has {list(raw)}).")
    column, sources = data_args.text_column, {}
    for split in ("train", "validation"):
        if split not in raw:
            continue
        where = f"the {split} split of {name}"
        if raw[split].features is not None:
            check_column(raw[split].features, column, where)
        if data_args.streaming:
            sources[split] = [StreamSource(where, raw[split], column)]
        else:
            key = {"kind": "dataset", "name": name, "config": config, "split": split, "column": column,
                   "fingerprint": raw[split]._fingerprint}
            sources[split] = [RowsSource(where, raw[split].select_columns([column]), column, key)]
    return Sources(
        sources["train"], sources.get("validation"), "stream" if data_args.streaming else "dataset"
    )


def tokenizer_texts(sources: list):
    """The documents the tokenizer is trained on: the first of each source, each its share
    of TOKENIZER_CHARS by size (so that the merges see every file, not the first ones
    alone), at most TOKENIZER_DOCUMENTS in all."""
    sizes = [getattr(source, "size", 0) or 1 for source in sources]
    total = sum(sizes)
    openings = (
        _opening(source, max(1, TOKENIZER_CHARS * size // total)) for source, size in zip(sources, sizes)
    )
    return itertools.islice(itertools.chain.from_iterable(openings), TOKENIZER_DOCUMENTS)


def _opening(source, budget: int):
    """The source's first documents, up to the one that reaches `budget` characters."""
    for piece in source.pieces():
        for document in source.documents(piece):
            if budget <= 0:
                return
            yield document
            budget -= len(document)


@contextlib.contextmanager
def datasets_cache_space():
    """A full disk while `datasets` downloads and converts a Hub dataset into its cache, as
    one line naming the cache folder and the fix; the partial table it was writing (`tmp*`)
    is removed to give its space back."""
    import datasets

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
            f"No space left on the device in the datasets cache {cache} "
            f"({mib(shutil.disk_usage(cache).free)} free); nothing was written to --output_dir: free space "
            "there, or set HF_DATASETS_CACHE to a folder on a disk with room, and run the same command "
            "again."
        ) from None
