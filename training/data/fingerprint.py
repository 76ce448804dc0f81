"""What decides a run's data, recorded in each checkpoint (checkpoints.DATA_FILE) so that a resume reading
other data is refused instead of training on it.

A data file counts by its name, size and modification time, and, where a flag's files hold at most
DIGEST_LIMIT bytes, by a hash of its bytes too: a file touched, or copied without its times (`cp` without
`-p`), is then still the same data, and only a changed byte refuses the resume. Past the limit a start reads
no file for this (hashing 10 GB takes ~14 s): a file moved with its times kept is the same data, one written
again is not. A Hub dataset counts by its name and configuration, the built-in corpus by its document
count; the flags that choose which documents are read count too.
"""

import os

from hf_tinytx.folders.safe import file_digest
from hf_tinytx_training.data.files import matching_files


SHOWN = 3  # file names a message lists before "and N more"
DIGEST_LIMIT = 1 << 30  # bytes of a flag's files hashed at each start (sha256: ~1.4 s at ~760 MB/s)
DIGEST = "sha256"  # as the token store's shards and the checkpoints are hashed


def data_files(paths: list[str]) -> list[dict]:
    """Each file as it counts: {"name", "size", "mtime_ns"}, and DIGEST while the files are small."""
    found = []
    for path in paths:
        stat = os.stat(path)
        found.append({"name": os.path.basename(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    if sum(entry["size"] for entry in found) <= DIGEST_LIMIT:
        for path, entry in zip(paths, found):
            entry[DIGEST] = file_digest(path, DIGEST)
    return found


def same_file(before: dict, now: dict) -> bool:
    """The same data: the same bytes where both were hashed, else the same name, size and time."""
    if DIGEST in before and DIGEST in now:
        return (before["name"], before[DIGEST]) == (now["name"], now[DIGEST])
    return all(before.get(key) == now.get(key) for key in ("name", "size", "mtime_ns"))


def pretrain_data(data_args, builtin_documents: int) -> dict:
    """pretrain's data, flag by flag. `builtin_documents`: the built-in corpus's default size."""
    builtin = not (data_args.train_file or data_args.dataset_name)
    return {
        "--train_file": data_files(matching_files(data_args.train_file)) if data_args.train_file else None,
        "--validation_file": (
            data_files(matching_files(data_args.validation_file)) if data_args.validation_file else None
        ),
        "--dataset_name": data_args.dataset_name,
        "--dataset_config_name": data_args.dataset_config_name,
        "--num_train_documents": (
            (data_args.num_train_documents or builtin_documents) if builtin else data_args.num_train_documents
        ),
        "--text_column": data_args.text_column,
        "--validation_split_percentage": data_args.validation_split_percentage,
        "--streaming": data_args.streaming,
    }


def finetune_data(args) -> dict:
    """finetune's data, flag by flag: its files (each one path, never a glob), and the
    flags that cut them into rows."""
    return {
        "--train_file": data_files([args.train_file]),
        "--validation_file": data_files([args.validation_file]) if args.validation_file else None,
        "--max_seq_length": args.max_seq_length,
        "--packing": args.packing,
    }


def data_changes(saved: dict, now: dict) -> list[str]:
    """How this run's data differs from what a checkpoint recorded, one phrase a flag; [] when it does not. A
    flag the checkpoint did not record (written by an older version) is not compared."""
    changes = []
    for flag in [flag for flag in now if flag in saved and saved[flag] != now[flag]]:
        was, new = saved[flag], now[flag]
        if isinstance(was, list) and isinstance(new, list) and names(was) == names(new):
            rewritten = [entry["name"] for entry, before in zip(new, was) if not same_file(before, entry)]
            if rewritten:
                hashed = all(DIGEST in entry for entry in (*was, *new))
                how = "other bytes" if hashed else "another size or modification time"
                changes.append(f"{flag} {listed(rewritten)} changed since ({how})")
        else:
            changes.append(f"{flag} was {shown(was)}, this run has {shown(new)}")
    return changes


def names(files: list[dict]) -> list[str]:
    return [entry["name"] for entry in files]


def shown(value) -> str:
    if isinstance(value, list):
        return listed(names(value))
    return "none" if value is None else str(value)


def listed(items: list[str]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more
