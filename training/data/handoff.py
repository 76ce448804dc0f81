"""The data prepared once, by the main process, for every process of a launch.

Tokenizing a corpus can take longer than --ddp_timeout lets a collective wait, so the other processes poll
instead for the file the main process writes when it is done, in a folder of --output_dir named for this
launch. They give up, in one line, when the main process has written nothing for --ddp_timeout seconds.
The folder goes once every process has read it; a killed launch's is removed by the next. The main process
holds an flock on FOLDER.lock while the folder is in use, so that a second run started on the same
--output_dir at the same moment (refused once it claims the folder) never removes the first one's.
`prepare_as_main` and `receive_data` are the two sides.
"""

import contextlib
import fcntl
import json
import os
import secrets
import time

from hf_tinytx.folders.safe import remove_created, remove_tree, replace_file
from hf_tinytx_training.data import token_store
from hf_tinytx_training.data.sources import run_sources
from hf_tinytx_training.data.token_store import JOURNAL
from hf_tinytx_training.data.tokenizer import load_tokenizer, pretrain_tokenizer
from hf_tinytx_training.errors import RunError


PREFIX = ".data-"
LOCK_SUFFIX = ".lock"
READY = "ready.json"
POLL_SECONDS = 1.0


class Handoff:
    def __init__(self, accelerator, output_dir: str, timeout: float):
        import torch.distributed

        token = [secrets.token_hex(8)]
        if accelerator.num_processes > 1:
            torch.distributed.broadcast_object_list(token, src=0)  # at once: every process is here together
        self.accelerator, self.timeout = accelerator, timeout
        self.published = False  # the main process wrote what it prepared
        self.folder = os.path.join(output_dir, PREFIX + token[0])
        self.held = None  # the main process's flock on the folder's lock file
        if accelerator.is_main_process:
            if os.path.isdir(output_dir):
                remove_abandoned(output_dir)
            os.makedirs(output_dir, exist_ok=True)  # as makedirs(self.folder) made it before
            self.held = hold(self.folder + LOCK_SUFFIX)
            os.makedirs(self.folder)

    @property
    def tokenizer_dir(self) -> str:
        return os.path.join(self.folder, "tokenizer")

    def ready(self, description: dict) -> None:
        """The main process: the data is prepared (the tokenizer saved in `tokenizer_dir` already)."""
        replace_file(os.path.join(self.folder, READY), json.dumps(description))
        self.published = True

    def wait(self, store_folder: str | None) -> dict:
        """Another process: the main process's description of the data, once it is ready. It waits in silence:
        the main process reports the work (training/cli.py)."""
        path = os.path.join(self.folder, READY)
        last_change, seen = time.monotonic(), None
        while not os.path.isfile(path):
            now = time.monotonic()
            state = _store_state(store_folder)
            if state != seen:
                last_change, seen = now, state
            if now - last_change > self.timeout:
                raise RunError(
                    f"Process {self.accelerator.process_index} waited {self.timeout:g} s (--ddp_timeout) for "
                    "the main process to prepare the data, which wrote nothing in that time (frozen, or "
                    "lost with its node); run the same command again (a token store keeps every shard it "
                    "finished)."
                )
            time.sleep(POLL_SECONDS)
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def close(self) -> None:
        """Every process, once it has read what it needs: the folder goes."""
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.remove()

    def remove(self) -> None:
        """The folder, then its lock file, then the lock."""
        remove_tree(self.folder)
        if self.held is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.folder + LOCK_SUFFIX)
            os.close(self.held)
            self.held = None


def hold(path: str) -> int:
    """An exclusive flock on `path` (made if missing, never through a link), held until the descriptor
    closes: the kernel drops it however the process ends."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def remove_abandoned(output_dir: str) -> None:
    """The handoff folders of launches that ended without removing theirs (killed): their lock is free, or
    they have none (an older version's). A folder whose lock a running launch holds is left alone."""
    names = set(os.listdir(output_dir))
    for name in sorted(names):
        if not name.startswith(PREFIX) or name.endswith(LOCK_SUFFIX) and name[:-len(LOCK_SUFFIX)] in names:
            continue  # not a handoff's; or a lock file, dealt with beside its folder
        folder = os.path.join(output_dir, name.removesuffix(LOCK_SUFFIX))
        try:
            fd = os.open(folder + LOCK_SUFFIX, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            remove_tree(folder)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # in use: that run is refused when it claims the folder, or this one is
            os.close(fd)
            continue
        remove_tree(folder)
        os.unlink(folder + LOCK_SUFFIX)
        os.close(fd)


def _store_state(store_folder: str | None) -> tuple[int, int]:
    """(shards recorded, bytes of the journal): changes while the main process tokenizes."""
    if not store_folder:
        return 0, 0
    try:
        with open(os.path.join(store_folder, JOURNAL), "rb") as f:
            journal = f.read()
    except OSError:
        return 0, 0
    return journal.count(b"\n"), len(journal)


def prepare_as_main(
    model_args, data_args, train_args, handoff, store, saved_tokenizer, fresh, model_config, say
):
    """The main process: (tokenizer, the data's description, its sources), the
    data tokenized and handed over."""
    sources = run_sources(data_args, train_args.seed)
    stored = os.path.join(store, token_store.TOKENIZER_DIR) if sources.kind in ("files", "dataset") else None
    tokenizer, recipe = pretrain_tokenizer(model_args, sources.train, stored, saved_tokenizer, not fresh,
                                           model_config.max_position_embeddings, say)
    tokenizer.save_pretrained(handoff.tokenizer_dir)
    description = token_store.prepare(sources, tokenizer, recipe, store, data_args, say)
    handoff.ready(description)
    return tokenizer, description, sources


def receive_data(data_args, train_args, handoff, store):
    """Another process: (tokenizer, description, sources) as the main process prepared them; the sources only
    where this process reads them itself (the built-in corpus, a stream)."""
    stored = None if data_args.streaming or not (data_args.train_file or data_args.dataset_name) else store
    description = handoff.wait(stored)
    tokenizer = load_tokenizer(handoff.tokenizer_dir, what="The main process's tokenizer")
    sources = (
        run_sources(data_args, train_args.seed) if description["kind"] in ("builtin", "stream") else None
    )
    return tokenizer, description, sources


def take_back(handoff, store: str, made: list, refused: bool) -> None:
    """After a failed start: the handoff folder, the token store made for refused input (unless it holds
    shards of files that passed, for the corrected rerun), and the folders left empty."""
    handoff.remove()
    if (
        refused
        and made[0]
        and os.path.isdir(store)
        and (handoff.published or not token_store.holds_shards(store))
    ):
        remove_tree(store)
    for folders in made:
        remove_created(folders)
