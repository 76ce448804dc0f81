"""The token store: a corpus tokenized once, by every core, into compact shards that the run's processes read.

    STORE/store.json        what every shard's tokens depend on: the tokenizer (a hash of its tokenizer.json),
                            the token type and the document rules (documents.RULES); a store of other tokens,
                            or without this file, is emptied of its shards, in one line, never read
    STORE/shards.jsonl      one line per finished shard, appended as it finishes, with its checksum: a killed
                            build goes on from there, and a damaged shard is made again
    STORE/tokenizer/        the tokenizer of those tokens, with what it was trained from (data/tokenizer.py
                            reuses it)
    STORE/NAME-ID-NNNNN.bin a shard: its tokens, then for each document the token it ends at and its UTF-8
                            bytes
    STORE/.lock             held by the one process that builds
    STORE/.in-use           held shared by every run that reads the store, from its build to its end: a build
                            that finds it held removes nothing, and refuses to empty the store

Only entries of these names (and their .tmp- temporaries) are ever removed: a folder holding others and no
store.json is refused, and other files kept in a store are left alone.

A shard holds one piece of one source (documents.py). Its ID hashes the source's key (a file's path,
size and mtime), so a changed file gets new shards, and a shard is only ever read under the key it was
made for. Shards are written under a temporary name and renamed once complete. The workers are forked:
they inherit the sources, encode with the `tokenizers` library on one thread each, and die with the
main process (distributed/preemption.py).

`prepare` (the main process) builds the store and describes its shards; handoff.py passes that on, and
packing.py reads the shards on every process.
"""

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import re
import shutil
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass

import numpy as np

from hf_tinytx.folders.safe import (
    file_digest,
    is_disk_full,
    mib,
    open_new,
    read_json_or_none,
    remove_tree,
    replace_file,
    uncreatable,
)
from hf_tinytx_training.data.documents import RULES
from hf_tinytx_training.data.progress import Progress
from hf_tinytx_training.distributed.cpu_threads import usable_cpus
from hf_tinytx_training.errors import RunError, UserInputError


FORMAT = 2  # 2: a checksum in each journal entry
HEADER, JOURNAL, TOKENIZER_DIR, LOCK, IN_USE = "store.json", "shards.jsonl", "tokenizer", ".lock", ".in-use"
SHARD = re.compile(r"[A-Za-z0-9._-]{1,40}-[0-9a-f]{16}-[0-9]{5,}\.bin")  # shard_name's
CHECKSUM = "sha256"  # the journal's key; hashlib's sha256 is the fastest of its hashes with SHA-NI
# in tokenizer/, beside a tokenizer trained for the store: what it was trained on
RECIPE = "tinytx_recipe.json"
TEMPORARY = ".tmp-"
SUFFIX = ".bin"
ENCODE_CHARS = 1 << 18  # characters of documents encoded in one batch (~1,000 paragraphs)
WHAT = {"format": "store format", "tokenizer": "tokenizer", "dtype": "token type", "eos": "EOS token",
        "rules": "set of document rules"}


def token_dtype(vocabulary: int) -> np.dtype:
    return np.dtype("<u2") if vocabulary <= 1 << 16 else np.dtype("<u4")


def tokenizer_hash(spec: dict) -> str:
    """What decides the ids: a tokenizer's JSON (tokenizer.json's, or its backend's to_str) without the
    truncation and padding settings a loaded tokenizer may carry from its last call (the store's encoding
    turns them off)."""
    spec = {key: value for key, value in spec.items() if key not in ("truncation", "padding")}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def own_name(name: str) -> bool:
    """Whether `name` is one the store writes (its temporaries included): the only entries it removes."""
    name = name[len(TEMPORARY):] if name.startswith(TEMPORARY) else name
    return name in (HEADER, JOURNAL, TOKENIZER_DIR, LOCK, IN_USE) or SHARD.fullmatch(name) is not None


def read_header(folder: str) -> dict | None:
    header = read_json_or_none(os.path.join(folder, HEADER))
    return header if isinstance(header, dict) and "format" in header else None


def check_folder(folder: str) -> None:
    """Refuses a folder that is no store (no header) and holds entries the store did not write: they may be
    another program's (a nanoGPT train.bin), and are neither the store's to remove nor to read. A path that
    cannot be a folder (a file, or under one) is refused too."""
    if (problem := uncreatable(folder)) is not None:
        raise UserInputError(f"--token_store {folder} {problem}: give --token_store a new or empty folder.")
    if not os.path.isdir(folder) or read_header(folder) is not None:
        return
    others = sorted(name for name in os.listdir(folder) if not own_name(name))
    if others:
        listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise UserInputError(
            f"{folder} is not a token store (it has no {HEADER}) and holds other files ({listed}): give "
            "--token_store a new or empty folder."
        )


def source_id(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Shard:
    """One shard as the journal records it: its file (None: held in `array`, in memory), its tokens,
    documents, UTF-8 bytes and token type. packing.py reads it."""

    path: str | None
    tokens: int
    docs: int
    text_bytes: int
    dtype: str
    array: object = None  # in memory: (tokens, document ends, document bytes)

    @property
    def index_offset(self) -> int:
        """Where the document index starts: after the tokens, padded to 4 bytes."""
        return -(-self.tokens * np.dtype(self.dtype).itemsize // 4) * 4

    def file_size(self) -> int:
        return self.index_offset + 8 * self.docs


def encoded(tokenizer, documents, eos: int, dtype: np.dtype):
    """(tokens, document ends, document bytes) arrays, a batch of documents at a time: each document's ids
    with EOS after it. `tokenizer` is a `tokenizers.Tokenizer`."""
    batch, chars = [], 0
    for document in documents:
        if document:
            batch.append(document)
            chars += len(document)
        if chars >= ENCODE_CHARS:
            yield _encode(tokenizer, batch, eos, dtype)
            batch, chars = [], 0
    if batch:
        yield _encode(tokenizer, batch, eos, dtype)


def _encode(tokenizer, batch: list[str], eos: int, dtype: np.dtype):
    ids, lengths = [], []
    for encoding in tokenizer.encode_batch_fast(batch, add_special_tokens=False):
        document = encoding.ids  # a new list at each access
        ids += document
        ids.append(eos)
        lengths.append(len(document) + 1)
    sizes = [len(text) if text.isascii() else len(text.encode("utf-8")) for text in batch]
    return np.array(ids, dtype=dtype), np.cumsum(lengths, dtype=np.int64), np.array(sizes, dtype=np.uint32)


def plain_tokenizer(tokenizer):
    """A `tokenizers.Tokenizer` with the ids of `tokenizer` (a fast transformers tokenizer, or
    tokenizer.json's path), truncation and padding off."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(tokenizer) if isinstance(tokenizer, str) else \
        Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


def in_memory(source, tokenizer) -> list[Shard]:
    """The shards of a small source (the built-in corpus) made in this process and kept in memory."""
    backend, eos, dtype = plain_tokenizer(tokenizer), tokenizer.eos_token_id, token_dtype(len(tokenizer))
    return [memory_shard(list(encoded(backend, source.documents(piece), eos, dtype)), dtype)
            for piece in source.pieces()]


def memory_shard(parts: list, dtype: np.dtype) -> Shard:
    """`encoded`'s parts joined into one shard held in memory."""
    parts = parts or [(np.zeros(0, dtype), np.zeros(0, np.int64), np.zeros(0, np.uint32))]
    offsets = np.cumsum([0] + [len(tokens) for tokens, _, _ in parts])
    tokens = np.concatenate([tokens for tokens, _, _ in parts])
    ends = np.concatenate([ends + offset for (_, ends, _), offset in zip(parts, offsets)]).astype(np.uint32)
    sizes = np.concatenate([sizes for _, _, sizes in parts])
    return Shard(None, len(tokens), len(ends), int(sizes.sum()), dtype.str, (tokens, ends, sizes))


_IN_USE = {}  # store folder: the file this process holds shared (IN_USE) until it ends


class TokenStore:
    """A store folder, as the one process that builds it sees it (`build` holds its lock)."""

    def __init__(self, folder: str, say):
        self.folder, self.say = os.path.abspath(folder), say

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    @contextlib.contextmanager
    def locked(self):
        """The store's lock, waited for (saying so) while another run builds into the same folder. Yields
        whether no other run reads the store; once built, this process holds IN_USE shared until it ends (a
        kill lets go of it), so that a later build knows."""
        os.makedirs(self.folder, exist_ok=True)
        with open_new(self.path(LOCK), "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.say(f"Waiting for another run that is writing the token store {self.folder}...")
                fcntl.flock(handle, fcntl.LOCK_EX)
            with contextlib.suppress(KeyError):
                _IN_USE.pop(self.folder).close()  # this process's earlier build of the store
            in_use = open_new(self.path(IN_USE), "a+")
            try:
                fcntl.flock(in_use, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except BlockingIOError:
                alone = False
            try:
                yield alone
            except BaseException:
                in_use.close()
                raise
            # never waits: an exclusive hold is only taken under .lock, which this process holds
            fcntl.flock(in_use, fcntl.LOCK_SH)
            _IN_USE[self.folder] = in_use

    def entries(self) -> dict[tuple[str, int], dict]:
        """{(source id, piece): journal entry} of the shards that are there, whole. A torn last
        line (a kill while appending) is skipped; so is a shard whose file is missing or of
        another size (it is made again)."""
        entries = {}
        try:
            with open(self.path(JOURNAL), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return entries
        for line in lines:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                entries[(entry["source"], int(entry["piece"]))] = entry
        return {key: entry for key, entry in entries.items() if self._intact(entry)}

    def _intact(self, entry: dict) -> bool:
        try:
            return os.path.getsize(self.path(entry["file"])) == self.shard(entry).file_size()
        except OSError:
            return False

    def shard(self, entry: dict) -> Shard:
        return Shard(self.path(entry["file"]), entry["tokens"], entry["docs"], entry["bytes"], entry["dtype"])

    def damaged(self, entry: dict) -> bool:
        """Whether the shard's bytes differ from those it was written with (bit rot, an overwrite)."""
        return file_digest(self.path(entry["file"]), CHECKSUM) != entry.get(CHECKSUM)

    def start(self, expected: dict, alone: bool) -> dict[tuple[str, int], dict]:
        """Under the lock: a store of other tokens, or without a readable header (whose shards' tokens are
        unknown), emptied of its shards (said in one line), unless another run reads it: that is refused.
        Returns the shards that can be kept."""
        header = read_header(self.folder)
        if header == expected:
            return self.entries()
        if header is None:
            why = f"has no readable {HEADER}"
        else:
            changed = sorted(WHAT.get(name, name) for name in {*header, *expected}
                             if header.get(name) != expected.get(name))
            why = f"holds tokens made with another {' and '.join(changed)}"
        if not alone:
            raise UserInputError(
                f"The token store {self.folder} is in use by another run and {why}: give this run another "
                "--token_store, or run it once the other has ended."
            )
        shards = [name for name in os.listdir(self.folder) if SHARD.fullmatch(name)]
        if shards:
            self.say(f"The token store {self.folder} {why}: its {len(shards)} shard(s) are removed and the "
                     "data is tokenized again.")
        for name in shards:
            os.unlink(self.path(name))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(JOURNAL))
        replace_file(self.path(HEADER), json.dumps(expected, indent=1, sort_keys=True),
                     self.path(TEMPORARY + HEADER))
        return {}

    def remove_temporaries(self) -> None:
        """A killed build's: under the lock, no other process writes any."""
        for name in os.listdir(self.folder):
            if name.startswith(TEMPORARY) and own_name(name):
                path = self.path(name)
                if os.path.isdir(path) and not os.path.islink(path):
                    remove_tree(path)
                else:
                    os.unlink(path)

    def keep_only(self, entries: dict, drop_paths: set[str], alone: bool) -> dict:
        """The journal rewritten without the shards of the sources at `drop_paths` (changed since), whose
        files go; so do shard files no entry names (a killed build's last, renamed but not recorded). While
        another run reads the store, no file goes: it may be reading them (a later build removes them)."""
        kept = {key: entry for key, entry in entries.items() if entry.get("path") not in drop_paths}
        names = {entry["file"] for entry in kept.values()}
        for name in os.listdir(self.folder) if alone else []:
            if SHARD.fullmatch(name) and name not in names:
                os.unlink(self.path(name))
        lines = [json.dumps(entry, sort_keys=True) + "\n" for entry in kept.values()]
        replace_file(self.path(JOURNAL), "".join(lines), self.path(TEMPORARY + JOURNAL))
        return kept

    def place_tokenizer(self, tokenizer, recipe: dict | None, ids: str) -> str:
        """The store's tokenizer/ replaced by `tokenizer` (in one rename) unless it holds the same ids (their
        hash `ids`) already and no recipe is new; returns its tokenizer.json."""
        final, temporary = self.path(TOKENIZER_DIR), self.path(TEMPORARY + TOKENIZER_DIR)
        tokenizer_json = os.path.join(final, "tokenizer.json")
        if recipe is None and tokenizer_hash(read_json_or_none(tokenizer_json) or {}) == ids:
            return tokenizer_json
        remove_tree(temporary)
        tokenizer.save_pretrained(temporary)
        if recipe is not None:
            with open(os.path.join(temporary, RECIPE), "w", encoding="utf-8") as f:
                json.dump(recipe, f, sort_keys=True)
        remove_tree(final)
        os.replace(temporary, final)
        return tokenizer_json

    def record(self, journal, entry: dict) -> None:
        """One finished shard, appended (and flushed) once its file is in place."""
        journal.write(json.dumps(entry, sort_keys=True) + "\n")
        journal.flush()
        os.fsync(journal.fileno())


def store_folder(data_args, output_dir: str) -> str:
    """--token_store, else token_store/ in the output folder."""
    return os.path.abspath(data_args.token_store or os.path.join(output_dir, "token_store"))


def tokenized_files(folder: str) -> set[str]:
    """The files the store holds every shard of, unchanged since (same size and mtime): their text was checked
    when they were tokenized (files.py need not read them again)."""
    pieces = {}
    for entry in TokenStore(folder, print).entries().values() if read_header(folder) is not None else []:
        key = entry.get("key") or {}
        pieces.setdefault(entry["source"], [key, entry["pieces"], 0])[2] += 1
    complete = set()
    for key, count, have in pieces.values():
        with contextlib.suppress(OSError, KeyError):
            stat = os.stat(key["path"])
            if have == count and (stat.st_size, stat.st_mtime_ns) == (key["size"], key["mtime_ns"]):
                complete.add(key["path"])
    return complete


def disk_full(folder: str) -> str:
    free = mib(shutil.disk_usage(folder).free)
    return (
        f"No space left on the device while writing the token store {folder} ({free} free); the shards "
        "finished so far are kept: free space, or give --token_store a folder on a disk with room, and run "
        "the same command again."
    )


def holds_shards(folder: str) -> bool:
    return any(name.endswith(SUFFIX) for name in os.listdir(folder))


def shard_name(source, sid: str, piece: int) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.splitext(source.name)[0])[:40] or "data"
    return f"{stem}-{sid}-{piece:05d}{SUFFIX}"


def prepare(sources, tokenizer, recipe: dict | None, store: str, data_args, say) -> dict:
    """The main process: the files and datasets of `sources` (sources.Sources) tokenized into the store
    folder `store`, described for every process (the built-in corpus is tokenized in memory by each, a
    stream as training reads it)."""
    if sources.kind not in ("files", "dataset"):
        return {"kind": sources.kind}
    every = sources.train + (sources.validation or [])
    shards = build(store, tokenizer, recipe, every, workers(data_args), say)
    train = [shard for per_source in shards[: len(sources.train)] for shard in per_source]
    validation = [shard for per_source in shards[len(sources.train):] for shard in per_source]
    return {"kind": sources.kind, "train": [asdict(shard) for shard in train],
            "validation": [asdict(shard) for shard in validation] if sources.validation else None}


def workers(data_args) -> int:
    """--preprocessing_num_workers, else every core this process may run on."""
    if data_args.preprocessing_num_workers:
        return data_args.preprocessing_num_workers
    return len(usable_cpus())


def build(folder: str, tokenizer, recipe: dict | None, sources: list, workers: int, say) -> list:
    """Every source's shards (a list of Shard per source, in piece order), tokenizing only the pieces the
    store lacks, `workers` processes side by side. `tokenizer` (a fast transformers tokenizer) goes into the
    store first, with the `recipe` it was trained from (None: it was loaded, not trained)."""
    store = TokenStore(folder, say)
    check_folder(store.folder)
    dtype, eos = token_dtype(len(tokenizer)), tokenizer.eos_token_id
    ids_hash = tokenizer_hash(json.loads(tokenizer.backend_tokenizer.to_str()))
    expected = json.loads(json.dumps({"format": FORMAT, "tokenizer": ids_hash, "dtype": dtype.str, "eos": eos,
                                      "rules": RULES}))  # as read back
    ids = [source_id(source.key()) for source in sources]
    with store.locked() as alone:
        store.remove_temporaries()
        entries = store.start(expected, alone)
        tokenizer_json = store.place_tokenizer(tokenizer, recipe, ids_hash)
        entries = _reusable(store, entries, sources, ids, alone)
        tasks = []
        for number, (source, sid) in enumerate(zip(sources, ids)):
            have = [entry for (known, _), entry in entries.items() if known == sid]
            if have and len(have) == have[0]["pieces"]:
                continue  # complete: its pieces need not be found again
            pieces = source.pieces()
            tasks += [(number, sid, index, len(pieces), piece) for index, piece in enumerate(pieces)
                      if (sid, index) not in entries]
        if tasks:
            entries.update(_tokenize(store, tokenizer_json, eos, dtype, sources, tasks, workers, say))
    shards = []
    for sid in ids:
        mine = sorted((piece, entry) for (known, piece), entry in entries.items() if known == sid)
        shards.append([store.shard(entry) for _, entry in mine])
    return shards


def _reusable(store: TokenStore, entries: dict, sources: list, ids: list[str], alone: bool) -> dict:
    """The journal's `entries` less the shards of files changed since they were tokenized and the damaged
    shards of this run's sources (each said in one line: they are made again)."""
    done_ids = {sid for sid, _ in entries}
    paths = {source.key().get("path") for source, sid in zip(sources, ids) if sid not in done_ids}
    changed = sorted(
        {entry["path"] for (sid, _), entry in entries.items() if entry.get("path") in paths} - {None}
    )
    for path in changed:
        store.say(f"{path} changed since it was tokenized (size or time): its shards are made again.")
    entries = store.keep_only(entries, set(changed), alone)
    mine = set(ids)  # read once a run, by the process that builds: a checksum costs a read of the shard
    for key in [key for key, entry in entries.items() if key[0] in mine and store.damaged(entry)]:
        store.say(f"The shard {store.path(entries.pop(key)['file'])} of the token store is damaged (its "
                  "checksum differs from the one recorded when it was written): it is made again.")
    return entries


def _tokenize(store: TokenStore, tokenizer_json: str, eos: int, dtype: np.dtype, sources: list, tasks: list,
              workers: int, say) -> dict:
    """The shards of `tasks`, made by a pool of forked processes, each recorded as it finishes; the progress
    shown. A worker that dies (the out-of-memory killer) breaks the pool, and the build ends in one line."""
    unit = "B" if hasattr(sources[tasks[0][0]], "path") else "rows"
    total = sum(piece.stop - piece.start for *_, piece in tasks)
    context = multiprocessing.get_context("fork")
    counter = context.Value("q", 0)
    workers = max(1, min(workers, len(tasks)))
    say(f"Tokenizing {len(tasks)} piece(s) of the data into {store.folder} with {workers} process(es)...")
    progress = Progress(total, "Tokenizing", say, unit=unit)
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, context, _start_worker, (tokenizer_json, eos, dtype.str, sources, store.folder, counter)
    )
    new = {}
    try:
        with _without_tokenizer_threads():  # the workers are forked at the first submit
            pending = {pool.submit(_tokenize_piece, task) for task in tasks}
        with open(store.path(JOURNAL), "a", encoding="utf-8") as journal:
            while pending:
                done, pending = concurrent.futures.wait(pending, 0.5, concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    entry = future.result()
                    store.record(journal, entry)
                    new[(entry["source"], entry["piece"])] = entry
                progress.update(counter.value)
    except BaseException as error:
        _stop(pool)
        store.remove_temporaries()  # what the workers were writing
        if isinstance(error, BrokenProcessPool):
            raise RunError(lost_worker(store.folder)) from None
        if isinstance(error, OSError) and is_disk_full(error, store.folder):  # the journal's line
            raise RunError(disk_full(store.folder)) from None
        raise
    pool.shutdown()
    seconds = progress.close()
    tokens = sum(entry["tokens"] for entry in new.values())
    on_disk = sum(store.shard(entry).file_size() for entry in new.values())
    rate = f"{total / 1e6 / seconds:.2f} MB/s" if unit == "B" else f"{total / seconds:,.0f} rows/s"
    say(
        f"Tokenized {len(new)} piece(s) in {seconds:.1f} s ({rate} with {workers} process(es)): {tokens:,} "
        f"tokens, {mib(on_disk)} on disk."
    )
    return new


def _stop(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """The workers killed now, not after their pieces, so that none writes into the store once the build
    has ended. ProcessPoolExecutor has no public way before Python 3.14 (terminate_workers)."""
    for process in list((pool._processes or {}).values()):
        process.kill()
    pool.shutdown(cancel_futures=True)


def lost_worker(folder: str) -> str:
    return (
        f"A process tokenizing the data into the token store {folder} ended abruptly (killed, as the "
        "out-of-memory killer does when memory runs short); the shards finished are kept: run the same "
        "command again to go on from them, with fewer --preprocessing_num_workers if memory is short."
    )


@contextlib.contextmanager
def _without_tokenizer_threads():
    """TOKENIZERS_PARALLELISM=false while the workers are forked: one thread in each, and no warning of the
    fork (which `tokenizers` gives when the variable is unset and the parent has used its threads)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        os.environ.pop("TOKENIZERS_PARALLELISM")
        if before is not None:
            os.environ["TOKENIZERS_PARALLELISM"] = before


_WORKER = {}  # what a worker process was started with


def _start_worker(tokenizer_json: str, eos: int, dtype: str, sources: list, folder: str, counter) -> None:
    _WORKER.update(tokenizer=plain_tokenizer(tokenizer_json), eos=eos, dtype=np.dtype(dtype), sources=sources,
                   folder=folder, counter=counter)


def _count(amount: int) -> None:
    counter = _WORKER["counter"]
    with counter.get_lock():
        counter.value += amount


def _tokenize_piece(task) -> dict:
    """Writes one piece's shard under a temporary name, then renames it; returns its journal entry."""
    number, sid, index, pieces, piece = task
    source, folder, dtype = _WORKER["sources"][number], _WORKER["folder"], _WORKER["dtype"]
    name = shard_name(source, sid, index)
    temporary = os.path.join(folder, TEMPORARY + name)
    tokens, ends, sizes, digest = 0, [], [], hashlib.sha256()
    try:
        with open_new(temporary, "wb") as f:
            for part, part_ends, part_sizes in encoded(_WORKER["tokenizer"], source.documents(piece, _count),
                                                       _WORKER["eos"], dtype):
                _write(f, digest, part.tobytes())
                ends.append(part_ends + tokens)
                sizes.append(part_sizes)
                tokens += len(part)
            if tokens >= 1 << 32:
                raise RunError(
                    f"A piece of {source.name} holds {tokens:,} tokens, more than a shard can index; split "
                    "the file into smaller files."
                )
            _write(f, digest, bytes(-(-tokens * dtype.itemsize // 4) * 4 - tokens * dtype.itemsize))
            for parts in (ends, sizes):
                _write(f, digest, (np.concatenate(parts) if parts else np.zeros(0)).astype("<u4").tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, os.path.join(folder, name))
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError) and is_disk_full(error, folder):
            raise RunError(disk_full(folder)) from None
        raise
    key, documents = source.key(), sum(len(part) for part in ends)
    return {
        "source": sid, "piece": index, "pieces": pieces, "file": name, "tokens": tokens, "docs": documents,
        "bytes": int(sum(int(part.sum()) for part in sizes)), "dtype": dtype.str, "path": key.get("path"),
        "key": key, CHECKSUM: digest.hexdigest(),
    }


def _write(f, digest, data: bytes) -> None:
    f.write(data)
    digest.update(data)
