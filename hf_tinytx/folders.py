"""Reading and writing model folders safely: never through a link that leaves the folder, never half-written.

- `regular_files(folder)`: the files to copy or upload. A symbolic link that resolves outside the folder is refused
  (with its name), so a folder can never smuggle in a file from elsewhere on the machine.
- `link_or_copy(folder, target)`: a snapshot of those files (hard links where possible, copies elsewhere).
- `local_folder_or_hub_id(name)`: a command-line model argument, checked: a path that does not exist fails at once
  instead of being sent to the Hub as an id.
- `writing_into(destination)`: a staging folder to write a model into, published when the block ends (removed if
  it raises).
- `publish(staged, destination)`: moves freshly written files into a folder one `os.replace` each, after `fsync`,
  with `config.json` (a PEFT adapter's `adapter_config.json`) last: at every moment the folder holds either no config
  or a complete model, files that are not the model's are never touched, and it works when `destination` is a mount
  point (the staging folder lives inside it, on the same file system).
"""

import contextlib
import os
import re
import shutil
from pathlib import Path


STAGING_NAME = ".tinytx-staging"  # inside the destination; only ever written by `staging_folder`
CONFIG_NAMES = ("config.json", "adapter_config.json")  # a model's, a LoRA adapter's: what loading looks for first
# The weight files `save_pretrained` names; a new save removes older ones it does not replace (other shard counts).
WEIGHT_FILE = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?$")


class UnsafeLinkError(ValueError):
    """A link inside a folder points outside it."""


def regular_files(folder: str | os.PathLike) -> list[str]:
    """Relative paths of every file under `folder`; links are followed only while they stay inside it."""
    root = Path(folder).resolve()
    found = []
    for directory, subdirectories, names in os.walk(root, followlinks=False):
        for name in sorted(subdirectories) + sorted(names):
            path = Path(directory) / name
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(root):
                    cache = " (a Hub cache snapshot? `hf download REPO --local-dir DIR` gives real files)"
                    raise UnsafeLinkError(
                        f"{path} is a link to {target}, outside {root}; copy the file into the folder (or remove "
                        f"the link) first: links out of a folder are never read or uploaded"
                        f"{cache if '/blobs/' in str(target) else ''}."
                    )
                if target.is_dir():
                    continue  # its files are listed where they really live
            if path.is_file():
                found.append(str(path.relative_to(root)))
    return sorted(found)


def link_or_copy(folder: str | os.PathLike, target: str | os.PathLike, names=None) -> None:
    """Puts `names` (default: every regular file) of `folder` into `target`: hard links, copies across devices."""
    for name in regular_files(folder) if names is None else names:
        source, destination = Path(folder) / name, Path(target) / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source.resolve(), destination)
        except OSError:
            shutil.copy2(source.resolve(), destination)


def staging_folder(destination: str | os.PathLike) -> Path:
    """A fresh, empty staging folder inside `destination` (created if needed); a leftover of a killed save is ours
    to remove, nothing else is."""
    staged = Path(destination) / STAGING_NAME
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir(parents=True)
    return staged


@contextlib.contextmanager
def writing_into(destination: str | os.PathLike):
    """Yields a fresh `staging_folder(destination)` to write into; its files are published into `destination` when
    the block ends, and the staging folder is removed if the block raises."""
    staged = staging_folder(destination)
    try:
        yield staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    publish(staged, destination)


def fsync_tree(folder: str | os.PathLike) -> None:
    """Flushes every file and folder under `folder` to disk, so a rename that follows cannot expose empty files."""
    for directory, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(directory)


def fsync_dir(folder: str | os.PathLike) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staged: str | os.PathLike, destination: str | os.PathLike) -> None:
    """Moves every file of `staged` (a `staging_folder(destination)`) into `destination`, then removes `staged`."""
    staged, destination = Path(staged), Path(destination)
    names = regular_files(staged)
    fsync_tree(staged)
    for config in set(CONFIG_NAMES) & set(names):  # no config while the files change: nothing loads a half-new model
        (destination / config).unlink(missing_ok=True)
    new = set(names)
    for old in os.listdir(destination):
        if WEIGHT_FILE.match(old) and old not in new and (destination / old).is_file():
            (destination / old).unlink()  # an older save's shards, which the new index no longer names
    for name in sorted(names, key=lambda name: name in CONFIG_NAMES):
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged / name, destination / name)
    fsync_dir(destination)
    shutil.rmtree(staged)


def local_folder_or_hub_id(name: str) -> str:
    """`name` as `from_pretrained` should get it: an existing local path, or else a Hub id.

    Something that looks like a path (starts with `.`, `/` or `~`, has two or more `/`, or its parent folder exists)
    but is missing raises at once: transformers would take it for a Hub id and wait on the network before failing.
    """
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or ("/" in name and path.parent.is_dir())
    if looks_local:
        raise FileNotFoundError(f"no such folder: {name} (check the path; a Hub id looks like owner/name)")
    return name
