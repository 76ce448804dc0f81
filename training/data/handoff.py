"""The data prepared once, by the main process, for every process of a launch.

Tokenizing a corpus can take longer than --ddp_timeout lets a collective wait, so the other processes poll
instead for the file the main process writes when it is done, in a folder of --output_dir named for this
launch. They give up, in one line, when the main process has written nothing for --ddp_timeout seconds.
The folder goes once every process has read it; a killed launch's is removed by the next.
`prepare_as_main` and `receive_data` are the two sides.
"""

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
        if accelerator.is_main_process:
            if os.path.isdir(output_dir):
                for name in os.listdir(output_dir):
                    if name.startswith(PREFIX):
                        remove_tree(os.path.join(output_dir, name))  # a killed launch's
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
            remove_tree(self.folder)


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
    remove_tree(handoff.folder)
    if (
        refused
        and made[0]
        and os.path.isdir(store)
        and (handoff.published or not token_store.holds_shards(store))
    ):
        remove_tree(store)
    for folders in made:
        remove_created(folders)
