"""Where a model or a tokenizer is read from: a local folder or a Hub id, and which files make a tokenizer. No
torch: the training scripts check a model argument before torch loads.
"""

import errno
import os
from pathlib import Path

from huggingface_hub.utils import HFValidationError, validate_repo_id


# Every file a saved tokenizer may consist of, its chat template included: what a
# conversion copies with a model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")
# A folder holding any one of these has a tokenizer AutoTokenizer can load
# (fast, or slow from its vocabulary).
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                     "spiece.model")


def is_repo_id(text: str) -> bool:
    """Whether the Hub accepts `text` as a repo id: 'name' or 'owner/name'."""
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def local_folder_or_hub_id(name: str) -> str:
    """`name` as `from_pretrained` should get it: an existing local path, or else a Hub id. A
    missing path that looks local raises at once, where transformers would wait on the network
    (~50 s without one) before failing."""
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    if (problem := link_problem(path)) is not None:
        raise FileNotFoundError(f"{name} {problem}")
    if looks_local(name):
        raise FileNotFoundError(f"no such folder: {name} (check the path; a Hub id looks like owner/name)")
    return name


def link_problem(path: str | os.PathLike) -> str | None:
    """Why `path`, which does not exist to `os.path.exists`, is a link that leads
    nowhere; None when it is not there."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return (
                "is a loop of links (following them leads back to the start): point the link at a real folder"
            )
        if os.path.islink(path):
            return f"is a link to {os.readlink(path)}, which does not exist: point the link at a real folder"
    return None


def looks_local(name: str) -> bool:
    """Whether `name`, which names nothing on disk, was meant as a path: it starts with `.`, `/` or `~`, is no
    valid Hub id, or its folder part exists (`models/typo`)."""
    in_a_folder = "/" in name and Path(name).expanduser().parent.is_dir()
    return name.startswith((".", "/", "~")) or not is_repo_id(name) or in_a_folder
