"""A run's resumable checkpoint on the Hub. With --hub_strategy checkpoint (or all_checkpoints) the newest
checkpoint goes up whole, the run's tokenizer in its tokenizer/ and both in its checksums.json, as one commit
to last-checkpoint/ (and checkpoints/step_N/): a reader never sees half of one. `--resume_from_checkpoint hub`
or `REPO_ID[@REVISION]` downloads that folder into huggingface_hub's cache (a killed download goes on) and
checks every file before the run writes anything; `keep_locally` then copies it into checkpoints/step_N, from
which the run resumes as from its own.
"""

import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace

from hf_tinytx.folders import location
from hf_tinytx.folders.safe import file_digest, link_or_copy, open_new, remove_tree
from hf_tinytx.folders.weights import PICKLED, check_weights, has_safetensors
from hf_tinytx_training import checkpoints
from hf_tinytx_training.errors import RunError, UserInputError
from hf_tinytx_training.publish.hub import scrub


STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")  # Trainer's hub_strategy values
WHOLE = ("checkpoint", "all_checkpoints")  # the strategies that push what resumes
LAST = "last-checkpoint"
OWN_REPO = "hub"  # --resume_from_checkpoint hub: the run's own --hub_model_id
LOG = "metrics.jsonl"  # the run's record up to the checkpoint: no part of the resume, so not checksummed
README = (
    "# Resumable checkpoint\n\nThe newest checkpoint of a TinyTx training run (pretrain or finetune), whole: "
    "the weights, optimizer, scheduler, random states, the place in the data (trainer_state.json), what "
    "decided the data (data_fingerprint.json), the tokenizer and the sha256 of every file (checksums.json). "
    "It is not a model folder: continue the run on any machine with the same command and "
    "`--resume_from_checkpoint {repo_id}`.\n"
)


@dataclass(frozen=True)
class HubCheckpoint:
    """last-checkpoint/ of a repo at one commit; `folder`: where it was downloaded and checked."""

    repo_id: str
    revision: str  # the commit's id, so a push meanwhile changes nothing of what is read
    step: int
    folder: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision[:8]} {LAST}/ (step {self.step})"

    @property
    def tokenizer(self) -> str:
        return os.path.join(self.folder, checkpoints.TOKENIZER_DIR)


# ------------------------------------------------------------------------------------------------ push


def push_whole(pusher, checkpoint: str, step: int, keep_each: bool, tokenizer: str | None = None,
               log: str | None = None) -> None:
    """Queues `checkpoint` (pretrain's step_N with the run's `tokenizer` folder, or Trainer's checkpoint-N,
    which holds its own) for last-checkpoint/ (and, with `keep_each`, checkpoints/<its name>/) in one commit,
    which also removes what the previous last-checkpoint/ held beyond it. `log`: pretrain's metrics.jsonl,
    so the loss curve survives the machine. Without `keep_each`, a newer checkpoint queued behind it
    supersedes it. A failure here never stops training."""
    # hidden, beside the checkpoint: never taken for one
    staging = os.path.join(os.path.dirname(checkpoint), f".hub_whole_{step}")
    remove_tree(staging)  # left by a run killed while staging this step
    try:
        last = os.path.join(staging, LAST)
        link_or_copy(checkpoint, last)
        listed = checkpoints.read_json(os.path.join(last, checkpoints.CHECKSUM_FILE))
        if tokenizer:
            link_or_copy(tokenizer, os.path.join(last, checkpoints.TOKENIZER_DIR))
            listed.update({os.path.join(checkpoints.TOKENIZER_DIR, name): digest
                           for name, digest in checkpoints.checksums(tokenizer).items()})
        with open_new(os.path.join(last, "README.md")) as f:  # a new file, not a link to PEFT's placeholder
            f.write(README.format(repo_id=pusher.repo_id))
        if "README.md" in listed:
            listed["README.md"] = file_digest(os.path.join(last, "README.md"))
        if log and os.path.isfile(log):  # copied: the run appends to it in place
            shutil.copyfile(log, os.path.join(last, LOG))
        # a new file, not the link to the checkpoint's
        checkpoints.write_json(os.path.join(last, checkpoints.CHECKSUM_FILE), listed)
        if keep_each:
            link_or_copy(last, os.path.join(staging, "checkpoints", os.path.basename(checkpoint)))
        pusher.push_async(staging, f"Resumable checkpoint at step {step}", replacing=(LAST,),
                          newest_of=None if keep_each else LAST)
    except Exception as error:  # e.g. a full disk: the checkpoint itself is saved, so go on training
        print(f"Could not stage checkpoint {step} for the Hub ({error}); training goes on.", file=sys.stderr)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ resume


def wait_at_stop(pusher, timeout: float, received: list, step: int, say) -> None:
    """At a stop signal: waits at most `timeout` s (--hub_stop_timeout) for the queued uploads, the stop's
    checkpoint last, and says in one line where a new machine finds the run. A further signal (one more in
    `received`) ends the wait: the previous last-checkpoint/ stays whole on the Hub either way."""
    if pusher is None or timeout <= 0:
        return
    signals, failed, started = len(received), len(pusher.failures), time.monotonic()
    done = pusher.wait(timeout=timeout, stop=lambda: len(received) > signals)
    if done and len(pusher.failures) == failed:
        say(f"Checkpoint step_{step} is on the Hub ({pusher.repo_id}, {LAST}/): on a new machine, the same "
            f"command with --resume_from_checkpoint hub goes on from it.")
        return
    why = (f"did not reach the Hub within {time.monotonic() - started:.0f} s (--hub_stop_timeout {timeout:g})"
           if not done else "could not be pushed")
    say(f"Checkpoint step_{step} {why}: the Hub's {LAST}/ is as it was before this stop.")


def hub_reference(resume_from: str | None, own_repo: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when --resume_from_checkpoint names the Hub: `hub`, or `owner/name[@rev]`
    that is no local path (nor one in a local folder `owner`: a typo there stays a local error); else None
    (a local resume)."""
    if resume_from == OWN_REPO:
        return own_repo, None
    if not resume_from or resume_from == "latest" or os.path.exists(resume_from):
        return None
    repo_id, _, revision = resume_from.partition("@")
    if repo_id.count("/") == 1 and location.is_repo_id(repo_id) and not os.path.isdir(repo_id.split("/")[0]):
        return repo_id, revision or None
    return None


def resume_point(resume_from: str | None, own_repo: str, layout, token: str | None, check, say):
    """What the run resumes from: a local checkpoint folder (or None) as `checkpoints.find_resumable` says, or
    for the Hub a `HubCheckpoint`, downloaded and checked (`check(folder)`: the run's own rules) unless an
    intact local checkpoint is as new. `hub` on a repo without a checkpoint yet starts from scratch."""
    reference = hub_reference(resume_from, own_repo)
    if reference is None:
        return checkpoints.find_resumable(resume_from, layout, say)
    reference = (with_owner(reference[0], token, resume_from), reference[1])
    local = checkpoints.find_resumable("latest", layout, say)
    found = newest_on_hub(*reference, token, resume_from, missing_ok=resume_from == OWN_REPO)
    if found is None:
        say(f"No checkpoint on the Hub in {reference[0]}/{LAST} yet: "
            + (f"resuming from the local {local}." if local else "starting from scratch."))
        return local
    if local and step_of(local) >= found.step:
        say(f"Resuming from the local checkpoint {local}: the Hub's {found} is not newer.")
        return local
    found = replace(found, folder=download(found, token, resume_from))
    with named(found):
        check(found.folder)
    newer = f"newer than the local {os.path.basename(local)}" if local else "there is no local one"
    say(f"Resuming from the Hub's checkpoint {found}: {newer}.")
    return found


def state_on_hub(resume_from: str | None, own_repo: str, token: str | None) -> dict | None:
    """trainer_state.json of the Hub's last-checkpoint/ that --resume_from_checkpoint names (None: it names no
    repo, or the repo has no checkpoint yet)."""
    reference = hub_reference(resume_from, own_repo)
    if reference is None:
        return None
    repo_id = with_owner(reference[0], token, resume_from)
    found = newest_on_hub(repo_id, reference[1], token, resume_from, missing_ok=True)
    if found is None:
        return None
    from huggingface_hub import hf_hub_download

    with hub_errors(resume_from, token):
        path = hf_hub_download(repo_id, f"{LAST}/{checkpoints.STATE_FILE}", revision=found.revision,
                               token=token)
    return checkpoints.read_json(path)


def with_owner(repo_id: str, token: str | None, flag: str) -> str:
    """`owner/name` for a --hub_model_id given as `name` (created in the token's namespace): looked up under
    `name` alone, the run would find nothing, start anew and push over its own checkpoint."""
    if "/" in repo_id:
        return repo_id
    from huggingface_hub import HfApi

    with hub_errors(flag, token):
        return f"{HfApi().whoami(token=token)['name']}/{repo_id}"


def newest_on_hub(repo_id: str, revision: str | None, token: str | None, flag: str,
                  missing_ok: bool) -> HubCheckpoint | None:
    """The repo's last-checkpoint/ at `revision` (its step read from trainer_state.json alone), or None when
    `missing_ok` and the repo or folder does not exist."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    with hub_errors(flag, token):
        try:
            commit = HfApi().model_info(repo_id, revision=revision, token=token).sha
            state = hf_hub_download(repo_id, f"{LAST}/{checkpoints.STATE_FILE}", revision=commit, token=token)
        except LocalEntryNotFoundError:
            raise
        except (RepositoryNotFoundError, EntryNotFoundError):
            if missing_ok and revision is None:
                return None
            raise
    with named(HubCheckpoint(repo_id, commit, 0, os.path.dirname(state))):
        step = step_of(os.path.dirname(state))
    return HubCheckpoint(repo_id, commit, step)


def step_of(folder: str) -> int:
    """The step a checkpoint of pretrain (`step`) or of Trainer (`global_step`) was saved at."""
    try:
        state = checkpoints.read_json(os.path.join(folder, checkpoints.STATE_FILE))
    except (OSError, ValueError):  # damaged: named below
        state = None
    step = state.get("step", state.get("global_step")) if isinstance(state, dict) else None
    if not isinstance(step, int):
        raise UserInputError(f"{folder}/{checkpoints.STATE_FILE} names no step: it is no checkpoint of "
                             "pretrain.py or finetune.py; resume from one of theirs, or start anew.")
    return step


def download(found: HubCheckpoint, token: str | None, flag: str) -> str:
    """last-checkpoint/ of `found`'s commit in the cache, every file checked against checksums.json, its
    weights safetensors and its state files plain data; a refusal names the problem in one line."""
    from huggingface_hub import snapshot_download

    with hub_errors(flag, token):
        root = snapshot_download(found.repo_id, revision=found.revision, allow_patterns=[f"{LAST}/*"],
                                 token=token)
    folder = os.path.join(root, LAST)
    if problem := pickled_weights(folder) or checkpoints.problem_with(folder) or planted_pickle(folder):
        raise UserInputError(
            f"--resume_from_checkpoint {flag}: the Hub's {found} cannot be resumed from: {problem}. Push an "
            "intact checkpoint there (--hub_strategy checkpoint), name another revision (REPO_ID@REVISION), "
            "or start anew."
        )
    return folder


def pickled_weights(folder: str) -> str | None:
    """Why `folder`'s model weights are no readable safetensors (a pickle in their place), or None. A
    checkpoint sharded by FSDP2 or DeepSpeed has none of either: its checksums decide."""
    if not has_safetensors(folder):
        for name in PICKLED:
            if os.path.isfile(os.path.join(folder, name)):
                return (f"its weights are a pickle ({name}) where model.safetensors belongs, and tinytx "
                        "never unpickles weights (that could run code)")
        return None
    try:
        check_weights(folder, "it", "its weights")
    except ValueError as error:
        return str(error).replace(folder + os.sep, "").rstrip(".")
    return None


def planted_pickle(folder: str) -> str | None:
    """The state file (optimizer, scheduler, random states) that holds more than plain data, or None."""
    refused = checkpoints.refused_file(folder)
    if refused:
        return f"{os.path.relpath(refused, folder)} holds Python objects, which unpickling would run"
    return None


@contextlib.contextmanager
def named(found: HubCheckpoint):
    """A refusal about the downloaded folder names the repo first (the path stays for --init_from)."""
    try:
        yield
    except UserInputError as error:
        raise UserInputError(str(error).replace(found.folder, f"The Hub's {found} ({found.folder})", 1)) \
            from None


@contextlib.contextmanager
def hub_errors(flag: str, token: str | None):
    """The Hub's answers as one line: what is not there is refused (exit 2), a Hub out of reach is a
    RunError; never with the token."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    def reason(error: Exception) -> str:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return scrub(lines[0] if lines else type(error).__name__, token)[:200]

    try:
        yield
    except LocalEntryNotFoundError as error:  # no connection (or HF_HUB_OFFLINE=1)
        raise RunError(f"--resume_from_checkpoint {flag}: the Hub cannot be reached ({reason(error)}); "
                       "nothing was written: run again once it can (HF_HUB_OFFLINE must be unset).") from None
    except RepositoryNotFoundError:
        raise UserInputError(f"--resume_from_checkpoint {flag}: no such local folder, nor a repo on the Hub "
                             "that the token may read (a private repo): check the path or repo id, and "
                             "HF_TOKEN or `hf auth login`.") from None
    except RevisionNotFoundError:
        raise UserInputError(f"--resume_from_checkpoint {flag}: the repo has no such revision; give a "
                             "branch, tag or commit id after '@', or none for the newest.") from None
    except EntryNotFoundError:
        raise UserInputError(f"--resume_from_checkpoint {flag}: the repo has no {LAST}/ folder: it was not "
                             "pushed with --hub_strategy checkpoint or all_checkpoints.") from None
    except (HfHubHTTPError, OSError) as error:
        raise RunError(f"--resume_from_checkpoint {flag}: the download failed ({reason(error)}); nothing was "
                       "written: run the same command again (a download goes on where it stopped).") from None


def keep_locally(found: HubCheckpoint, final: str, log: str | None = None) -> None:
    """Copies the checked download into the run's checkpoints/step_N (under a temporary name first): a later
    `latest` finds it, and the cache may go. `log`: where the run keeps metrics.jsonl, taken from the
    download when the folder has none (a new machine)."""
    temporary = os.path.join(os.path.dirname(final), checkpoints.TEMPORARY_PREFIX + os.path.basename(final))
    remove_tree(temporary)
    with checkpoints.disk_space_guard(temporary, checkpoints.Layout(os.path.dirname(final))):
        shutil.copytree(found.folder, temporary)  # the cache's links followed: files of its own
        checkpoints.rename_into_place(temporary, final)
    if log and not os.path.exists(log) and os.path.isfile(os.path.join(found.folder, LOG)):
        with open(os.path.join(found.folder, LOG), "rb") as source, open_new(log, "wb") as target:
            shutil.copyfileobj(source, target)
