"""The run's output folder: checked before anything is written, then held with a lock for the
whole run: an `flock` on `output_dir/.lock`, which the kernel releases however the process
ends, so a killed run never leaves it stuck.
"""

import contextlib
import fcntl
import os

from hf_tinytx.folders import safe as folders
from hf_tinytx_training.errors import UserInputError, as_user_input_error


LOCK_FILE = ".lock"
# Names an export writes; an output folder holding some of them already holds an exported model.
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")
# What else marks an earlier run: its checkpoints, pretrain's log, finetune's LoRA adapter and arguments.
TRAINING_FILES = ("checkpoints", "metrics.jsonl", "adapter_config.json", "finetune_args.json")
RUN_FILES = (*MODEL_FILES, *TRAINING_FILES)
# All that a start which failed before its first checkpoint leaves in checkpoints/
# (pretrain's tokenizer, maybe under its temporary name; finetune's checkpoint staging
# folder): no run to lose, the next start replaces them.
STARTED_ONLY = ("tokenizer", ".tmp_tokenizer", ".tmp_checkpoint")


def check_output_dir(output_dir: str, train_args, flag: str = "--output_dir") -> None:
    """Refuses an output folder (named by `flag`) that cannot be written, is in use, or would lose a run."""
    if (problem := folders.uncreatable(output_dir)) is not None:
        fix = "; choose a folder path." if problem == "is a file" else f". Choose another {flag}."
        raise UserInputError(f"{flag} {output_dir} {problem}{fix}")
    if not os.path.isdir(output_dir):
        return
    refuse_links_out(output_dir)  # a save or the lock would write through such a link, and a push read it
    if os.environ.get("RANK", "0") == "0":  # one process asks; the others would only race with it
        refuse_if_locked(output_dir, flag)
    refuse_earlier_run(output_dir, train_args, flag)


def refuse_links_out(folder: str) -> list[str]:
    """The folder's files (folders.regular_files); a link in it that leads out of it is a one-line error."""
    with as_user_input_error(folders.UnsafeLinkError):
        return folders.regular_files(folder)


def check_second_destination(
    folder: str, flag: str, output_dir: str, train_args, writer: str, default: str
) -> None:
    """A second folder a run writes (--merged_output_dir) gets the output folder's checks, lies apart from it
    (unless it is the `default` sub-folder), and holds no run nor another's model."""
    if folder != default:
        refuse_overlap(output_dir, folder, ("--output_dir", flag), "the folders one run writes never overlap")
    if os.path.isdir(folder):
        if run := sorted(set(os.listdir(folder)) & set(TRAINING_FILES)):
            raise UserInputError(
                f"{flag} {folder} holds a training run ({', '.join(run)}), which a merged model would "
                f"replace; choose another {flag}."
            )
        if model := [
            name for name in folders.others_files(folder, writer) if folders.would_replace(name, ())
        ]:
            raise UserInputError(
                f"{flag} {folder} holds a model that {writer} did not write ({', '.join(model)}); "
                f"--overwrite_output_dir replaces only a fine-tune's own files: choose another {flag}, or "
                "move that model away first."
            )
    check_output_dir(folder, train_args, flag)


def refuse_overlap(
    source: str, destination: str, flag_names: tuple[str, str], reason: str = folders.READ_APART
):
    """folders.refuse_overlap as a UserInputError: `destination` neither `source`, inside nor above it."""
    with as_user_input_error(folders.OverlapError):
        folders.refuse_overlap(source, destination, flag_names, reason=reason)


def refuse_earlier_run(output_dir: str, train_args, flag: str = "--output_dir") -> None:
    """A folder holding an earlier run is taken only to resume it or, said so, to replace it."""
    if train_args.resume_from_checkpoint or not os.path.isdir(output_dir):
        return
    earlier_run = sorted(name for name in set(os.listdir(output_dir)) & set(RUN_FILES)
                         if not only_started(os.path.join(output_dir, name)))
    if earlier_run and not train_args.overwrite_output_dir:
        raise UserInputError(
            f"{flag} {output_dir} already holds an earlier run ({', '.join(earlier_run)}). Pass "
            "--resume_from_checkpoint latest to continue it, --overwrite_output_dir to replace it, or pick "
            "a new folder."
        )


def only_started(path: str) -> bool:
    """A checkpoints/ folder holding no checkpoint, only what a start that failed left (STARTED_ONLY)."""
    return os.path.basename(path) == "checkpoints" and os.path.isdir(path) and not os.path.islink(path) \
        and set(os.listdir(path)) <= set(STARTED_ONLY)


def refuse_if_locked(output_dir: str, flag: str = "--output_dir") -> None:
    """Asks, without writing, whether a living run holds the folder (a shared lock
    fails only against its lock)."""
    path = os.path.join(output_dir, LOCK_FILE)
    if os.path.islink(path) or not os.path.isfile(path):
        return  # a link is no lock of a run's (take_lock replaces it)
    with open(path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise in_use(output_dir, handle.read().strip(), flag) from None


def in_use(output_dir: str, holder: str, flag: str = "--output_dir") -> UserInputError:
    return UserInputError(
        f"{flag} {output_dir} is in use by another training run (process {holder or 'unknown'}); wait for it "
        f"to finish, or choose another {flag}."
    )


def take_lock(output_dir: str):
    """Creates the folder if needed and locks it for this process; refuses when another run holds it."""
    os.makedirs(output_dir, exist_ok=True)
    # a link there is replaced, not followed
    handle = folders.open_new(os.path.join(output_dir, LOCK_FILE), "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        raise in_use(output_dir, holder) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def claim(output_dir: str, checkpoints_dir: str, replace: bool, recheck=None):
    """Locks output_dir once every check passed; returns the lock. `recheck`: flags to ask again for an
    earlier run; `replace`: only now may its checkpoints go."""
    lock = take_lock(output_dir)
    if recheck is not None:
        refuse_earlier_run(output_dir, recheck)
    if replace:
        folders.remove_tree(checkpoints_dir)  # --overwrite_output_dir: the earlier run's checkpoints
    return lock


def release_lock(handle, output_dir: str) -> None:
    """A finished run takes its lock file away (unlinked while still held: a later run locks a new file)."""
    if handle is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(output_dir, LOCK_FILE))
    handle.close()


def refuse_writing_where_read(model_args, output_dir: str) -> None:
    """A model or tokenizer folder the run starts from lies apart from --output_dir (an --overwrite_output_dir
    would otherwise remove its checkpoints, and the export replace its model)."""
    for flag, folder in (
        ("--init_from", model_args.init_from), ("--tokenizer_name", model_args.tokenizer_name),
    ):
        if folder and os.path.isdir(folder):
            refuse_overlap(folder, output_dir, (flag, "--output_dir"))


@contextlib.contextmanager
def replacing_earlier_files(folder: str, writer: str):
    """`writing_into(folder)`, then the files an earlier run of `writer` wrote there and this one did not go,
    and what this one wrote is recorded. The record names the new files before the first moves in: a kill
    mid-publish never leaves a model "another" wrote."""
    earlier = folders.written_before(folder, writer)
    with folders.writing_into(folder) as staged:
        yield staged
        written = set(folders.regular_files(staged))
        folders.record_written(folder, writer, earlier | written)
    folders.remove_written(folder, earlier - written)
    folders.record_written(folder, writer, written)


def remove_earlier_merge(merged_dir: str, writer: str) -> None:
    """Removes the merged model an earlier fine-tune wrote into `merged_dir` (this run merged nothing)."""
    if earlier := folders.written_before(merged_dir, writer):
        folders.remove_written(merged_dir, earlier | {folders.MANIFEST_NAME})
        with contextlib.suppress(OSError):  # something else is in it: it stays
            os.rmdir(merged_dir)
