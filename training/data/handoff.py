"""The data prepared once, by the main process, for every process of a launch.

Tokenizing a corpus can take longer than --ddp_timeout lets a collective wait, so the other processes poll instead
for the file the main process writes when it is done, in a folder of --output_dir named for this launch. They give up,
in one line, when the main process has written nothing for --ddp_timeout seconds. The folder goes once every process
has read it; a killed launch's is removed by the next.
"""

import json
import os
import secrets
import time

from hf_tinytx.folders import remove_tree, replace_file
from hf_tinytx_training.data.token_store import JOURNAL
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
        """Another process: the main process's description of the data, once it is ready. It waits in silence: the
        main process reports the work (training/cli.py)."""
        path = os.path.join(self.folder, READY)
        last_change, seen = time.monotonic(), None
        while not os.path.isfile(path):
            now = time.monotonic()
            state = _store_state(store_folder)
            if state != seen:
                last_change, seen = now, state
            if now - last_change > self.timeout:
                raise RunError(f"Process {self.accelerator.process_index} waited {self.timeout:g} s (--ddp_timeout) "
                               f"for the main process to prepare the data, which wrote nothing in that time (frozen, "
                               f"or lost with its node); run the same command again (a token store keeps every "
                               f"shard it finished).")
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
