"""Reading and writing model folders safely: never through a link that leaves the folder, never half-written.

A model is staged, then published one `os.replace` a file, config last, so the folder always loads as the old
model or the new one. No command writes where it reads (`refuse_overlap`), and a record of what a command
wrote limits what a later `--overwrite` replaces.
"""

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path


STAGING_NAME = ".tinytx-staging"  # inside the destination; only ever written by `staging_folder`
# a model's, a LoRA adapter's: what loading looks for first
CONFIG_NAMES = ("config.json", "adapter_config.json")
# The weight files `save_pretrained` names; a new save removes older ones it does not replace.
WEIGHT_FILE = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?$")
# inside the staging folder: the old configs `publish` took out of the destination
REPLACED_CONFIGS = ".replaced"
# A record of the files a command wrote into a destination: `--overwrite` replaces those and no others.
MANIFEST_NAME = ".tinytx-written.json"
# refuse_overlap's reason by default
READ_APART = "a command never writes where it reads, --overwrite included"


class UnsafeLinkError(ValueError):
    """A link inside a folder points outside it."""


class DiskFullError(OSError):
    """The disk filled while a command wrote: a fault of the machine, not of the input."""


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
                        f"{path} is a link to {target}, outside {root}; copy the file into the folder (or "
                        "remove the link) first: links out of a folder are never read or "
                        f"uploaded{cache if '/blobs/' in str(target) else ''}."
                    )
                if target.is_dir():
                    continue  # its files are listed where they really live
            if path.is_file():
                found.append(str(path.relative_to(root)))
    return sorted(found)


def link_or_copy(folder: str | os.PathLike, target: str | os.PathLike, names=None) -> None:
    """Puts `names` (default: every regular file) of `folder` into `target`: hard
    links, copies across devices."""
    for name in regular_files(folder) if names is None else names:
        source, destination = Path(folder) / name, Path(target) / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source.resolve(), destination)
        except OSError:
            shutil.copy2(source.resolve(), destination)


# "w" creates a new file (a hard link at the name is unlinked first, never written through); "a+" also reads.
_OPEN_FLAGS = {"w": os.O_WRONLY | os.O_CREAT | os.O_EXCL, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND}


def open_new(path: str | os.PathLike, mode: str = "w"):
    """Opens `path` to write ("w", "a", "a+"; with "b" for bytes), never through a link: a link at `path` is
    removed, and O_NOFOLLOW refuses one planted in between."""
    flags = _OPEN_FLAGS[mode.replace("b", "")] | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with contextlib.suppress(FileNotFoundError):
        if os.path.islink(path) or (mode.startswith("w") and not os.path.isdir(path)):
            os.unlink(path)
    fd = os.open(path, flags, 0o666)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def remove_tree(path: str | os.PathLike) -> None:
    """Removes the folder `path`, or only the link if `path` is one (which
    shutil.rmtree would leave in place)."""
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.exists(path):
        shutil.rmtree(path)


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """The hex digest of a file's bytes, read 1 MiB at a time."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def uncreatable(folder: str | os.PathLike) -> str | None:
    """Why `folder` cannot be written into ("is a file", or its nearest existing parent is a file or not
    writable); None when it can."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "is a file"
    ancestor = os.path.abspath(folder)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor) or not os.access(ancestor, os.W_OK):
        why = "not a folder" if not os.path.isdir(ancestor) else "not writable"
        return f"cannot be created: {ancestor} is {why}"
    return None


def folders_to_create(path: str | os.PathLike) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first: what
    `mkdir(parents=True)` creates."""
    path, missing = Path(os.path.abspath(path)), []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def remove_created(folders: list[Path]) -> None:
    """Removes `folders` (from `folders_to_create`) deepest first, each only if empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (or already gone): it and its parents stay
            if folder.exists():
                return


def staging_folder(destination: str | os.PathLike) -> Path:
    """A fresh, empty staging folder inside `destination`; a killed save's leftover is removed first."""
    staged = Path(destination) / STAGING_NAME
    remove_tree(staged)
    staged.mkdir(parents=True)
    return staged


@contextlib.contextmanager
def writing_into(destination: str | os.PathLike):
    """Yields a staging folder, published into `destination` when the block ends (removed if it raises)."""
    staged = staging_folder(destination)
    try:
        yield staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    publish(staged, destination)


def _new_file_mode() -> int:
    """The mode `open` gives a new file under this process's umask (read at import, while one thread runs)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


NEW_FILE_MODE = _new_file_mode()


def fsync_tree(folder: str | os.PathLike) -> None:
    """Flushes every file and folder under `folder`, so a rename that follows cannot expose empty files. Each
    file also gets NEW_FILE_MODE: safetensors writes 0600, which other users could not read."""
    for directory, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                if os.fstat(f.fileno()).st_mode & 0o777 != NEW_FILE_MODE:
                    os.fchmod(f.fileno(), NEW_FILE_MODE)
                os.fsync(f.fileno())
        fsync_dir(directory)


def fsync_dir(folder: str | os.PathLike) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staged: str | os.PathLike, destination: str | os.PathLike) -> None:
    """Moves every file of `staged` into `destination`, flushed, one `os.replace` each: the weights first, the
    config last; files that are not the model's are never touched.

    Unless the new config equals the old and one weight file moves, the old configs are
    first moved out, so that a kill leaves a folder `from_pretrained` refuses
    (`interrupted_save`), never old config with new weights.
    """
    staged, destination = Path(staged), Path(destination)
    names = regular_files(staged)
    fsync_tree(staged)
    weights = sorted(
        (name for name in names if WEIGHT_FILE.match(name)), key=lambda name: name.endswith(".json")
    )
    rest = sorted(set(names) - set(weights), key=lambda name: name in CONFIG_NAMES)
    if not _old_config_fits(staged, destination, weights):
        _take_configs_out(staged, destination)
    for name in weights:  # shards before their index: an index never names a shard not yet in place
        os.replace(staged / name, destination / name)
    for old in os.listdir(destination):
        if WEIGHT_FILE.match(old) and old not in weights and (destination / old).is_file():
            (destination / old).unlink()  # an older save's shards, which the new index no longer names
    for name in rest:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged / name, destination / name)
    fsync_dir(destination)
    shutil.rmtree(staged)


def _old_config_fits(staged: Path, destination: Path, weights: list[str]) -> bool:
    """Whether the destination's configs may stay while the new weights move in:
    equal configs, one weight file."""
    if len(weights) > 1:
        return False
    for name in CONFIG_NAMES:
        old, new = read_json_or_none(destination / name), read_json_or_none(staged / name)
        # an unreadable config: replace
        if old != new or (old is None and os.path.lexists(destination / name)):
            return False
    return True


def read_json_or_none(path: str | os.PathLike):
    """The file's JSON, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _take_configs_out(staged: Path, destination: Path) -> None:
    """Moves the destination's configs (a link as itself) into `staged`, to go once the new config is in."""
    moved = False
    for name in CONFIG_NAMES:
        old = destination / name
        if os.path.lexists(old) and not (old.is_dir() and not old.is_symlink()):
            (staged / REPLACED_CONFIGS).mkdir(exist_ok=True)
            os.replace(old, staged / REPLACED_CONFIGS / name)
            moved = True
    if moved:
        fsync_dir(destination)  # the config is gone on disk before any new weight arrives


def interrupted_save(folder: str | os.PathLike) -> bool:
    """Whether `folder` has no config but a staging folder: a `publish` killed
    after it took the old config out."""
    folder = Path(folder)
    return (folder / STAGING_NAME).is_dir() and not any((folder / name).exists() for name in CONFIG_NAMES)


# ---- what a command may write where: shared by convert, finetune and pretrain ----


class OverlapError(ValueError):
    """A destination that would write into, over or through the folder a command reads."""


def refuse_overlap(source: str | os.PathLike, destination: str | os.PathLike, flag_names=("SRC", "DST"),
                   who: str | None = None, reason: str = READ_APART) -> None:
    """Raises OverlapError when writing `destination` could change `source`: the same path, one inside the
    other (links resolved), or a destination that is a link. `who` starts the line."""
    source, destination = Path(source), Path(destination)
    source_name, destination_name = flag_names
    start = f"{who}: " if who else ""
    # a link higher up the path is resolved below, like any path (macOS's /tmp is one)
    if destination.is_symlink():
        raise OverlapError(
            f"{start}{destination_name} {os.fspath(destination)!r} is a link (to "
            f"{str(destination.resolve())!r}); a command never writes through a link, so that it cannot "
            "empty or replace the folder it leads to: name the real path instead."
        )
    real_source, real_destination = source.resolve(), destination.resolve()
    if real_source == real_destination:
        relation = "is the same folder as"
    elif real_destination.is_relative_to(real_source):
        relation = "is inside"
    elif real_source.is_relative_to(real_destination):
        relation = "holds"
    else:
        return
    raise OverlapError(f"{start}{destination_name} {os.fspath(destination)!r} {relation} {source_name} "
                       f"{os.fspath(source)!r}; {reason}: choose a {destination_name} outside {source_name}.")


def is_disk_full(error: BaseException, path: str | os.PathLike | None = None) -> bool:
    """Whether `error` comes from a full disk; for writers that say so without an errno (numpy, safetensors),
    the file system of `path` is asked while the partial file still holds its space."""
    if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "os error 28" in str(error):
        return True
    # Only the bare error types such writers raise: a refusal (FileExistsError, ...) is no full disk.
    if path is None or (
        type(error) not in (OSError, RuntimeError) and type(error).__name__ != "SafetensorError"
    ):
        return False
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False


def mib(size: int) -> str:
    """A size for a disk-full message: "12.3 MiB", or "less than 0.1 MiB" (never
    "0.0 MiB", which reads as none)."""
    return f"{size / 2**20:.1f} MiB" if size >= 0.05 * 2**20 else "less than 0.1 MiB"


def written_before(destination: str | os.PathLike, writer: str) -> set[str]:
    """The files `writer` recorded writing into `destination`: plain relative names only."""
    try:
        record = json.loads((Path(destination) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if (
        not isinstance(record, dict)
        or record.get("writer") != writer
        or not isinstance(record.get("files"), list)
    ):
        return set()
    return {name for name in record["files"] if isinstance(name, str) and _plain_relative(name)}


def _plain_relative(name: str) -> bool:
    path = Path(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and path.parts[0] != STAGING_NAME


def record_written(destination: str | os.PathLike, writer: str, files) -> None:
    """Replaces the record of what `writer` wrote into `destination`, in one rename."""
    replace_file(
        Path(destination) / MANIFEST_NAME, json.dumps({"writer": writer, "files": sorted(files)}, indent=1)
    )


def replace_file(path: str | os.PathLike, text: str, temporary: str | os.PathLike | None = None) -> None:
    """`path` replaced by `text` in one rename, flushed first: a kill leaves the old file or the
    new, never half of one, and a failed write (a full disk) leaves the old one whole.
    `temporary`: the name written first (path.new)."""
    path = Path(path)
    temporary = Path(temporary or path.with_name(f"{path.name}.new"))
    try:
        with open_new(temporary) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
    fsync_dir(path.parent)


def others_files(destination: str | os.PathLike, writer: str) -> list[str]:
    """Files in `destination` that `writer` did not write there (its record and staging folder aside)."""
    if not Path(destination).is_dir():
        return []
    ours = written_before(destination, writer) | {MANIFEST_NAME, f"{MANIFEST_NAME}.new"}
    found = []
    for directory, subdirectories, names in os.walk(destination, followlinks=False):
        subdirectories[:] = [
            name for name in subdirectories if name != STAGING_NAME or directory != str(destination)
        ]
        for name in names + [
            name for name in subdirectories if os.path.islink(os.path.join(directory, name))
        ]:
            relative = os.path.relpath(os.path.join(directory, name), destination)
            if relative not in ours:
                found.append(relative)
    return sorted(found)


def would_replace(name: str, new_files) -> bool:
    """Whether `publish` of `new_files` replaces or removes the file `name` of the destination."""
    return name in set(new_files) or name in CONFIG_NAMES or bool(WEIGHT_FILE.match(name))


def remove_written(destination: str | os.PathLike, names) -> None:
    """Removes files an earlier run recorded writing (links themselves), then
    the folders this leaves empty."""
    root = Path(destination)
    for name in sorted(names):
        path = root / name
        if not path.parent.resolve().is_relative_to(root.resolve()):
            continue  # a folder on the way became a link out of the destination: not ours to touch
        if path.is_symlink() or path.is_file():
            path.unlink()
        parent = path.parent
        while parent != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
