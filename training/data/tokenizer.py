"""The tokenizer a run trains with: the run's saved one, a named one (a folder or Hub id), the token store's
(trained by an earlier start on mostly the same data), or a byte-level BPE trained now on the data."""

import json
import os

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_tinytx.folders.location import TOKENIZER_MARKERS
from hf_tinytx.folders.safe import read_json_or_none
from hf_tinytx.tokenization import train_bpe_tokenizer
from hf_tinytx_training.checkpoints import tokenizer_source
from hf_tinytx_training.data.sources import tokenizer_texts
from hf_tinytx_training.data.token_store import RECIPE
from hf_tinytx_training.errors import UserInputError


# the store's tokenizer is reused when this share of its training files (by size) is unchanged
REUSE_SHARE = 0.5


def pretrain_tokenizer(
    model_args, sources: list, stored: str | None, saved: str, resumed: bool, max_length: int, say
) -> tuple[PreTrainedTokenizerFast, dict | None]:
    """(the main process's tokenizer, the recipe it was trained from now, or None): the run's saved one when
    it resumes, else a named one, else the one in `stored` (the token store's tokenizer/) when most of the
    text it was trained on is still there, else a BPE trained now on `sources`."""
    if resumed and os.path.isdir(saved):
        return load_tokenizer(saved, what=f"The run's saved tokenizer {saved}"), None
    recipe = tokenizer_recipe(model_args, sources, max_length)
    named = model_args.tokenizer_name or model_args.init_from
    if stored and not named and (share := reusable_share(stored, recipe)) is not None:
        say(
            f"Reusing the tokenizer trained for this data in {stored} ({share:.0%} of the text it was "
            "trained on is unchanged); remove that folder to train a new one."
        )
        return load_tokenizer(stored, what=f"The token store's tokenizer {stored}"), None
    if named:
        tokenizer = load_tokenizer(model_args.tokenizer_name or tokenizer_source(model_args.init_from))
    else:
        tokenizer = train_tokenizer(model_args, sources, max_length, say)
    if not tokenizer.is_fast:
        raise UserInputError("The tokenizer has no fast (Rust) version, which the data is encoded with; give "
                             "--tokenizer_name a tokenizer that has a tokenizer.json.")
    return tokenizer, None if named else recipe


def train_tokenizer(model_args, sources: list, max_length: int, say) -> PreTrainedTokenizerFast:
    say(f"Training a byte-level BPE tokenizer ({model_args.vocab_size} tokens asked) on the data...")
    tokenizer = train_bpe_tokenizer(tokenizer_texts(sources), model_args.vocab_size, max_length)
    if len(tokenizer) < model_args.vocab_size:
        say(
            f"The text holds merges for {len(tokenizer)} tokens only: the vocabulary has {len(tokenizer)} of "
            f"the {model_args.vocab_size} asked (nothing to fix: BPE stops when no pair of tokens repeats, "
            f"and the model is built with {len(tokenizer)})."
        )
    return tokenizer


def load_tokenizer(name_or_path: str, what: str | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer folder or Hub id; `what` names it in errors (default: the --tokenizer_name value)."""
    what = what or f"The tokenizer {name_or_path!r}"
    markers = [os.path.join(name_or_path, name) for name in TOKENIZER_MARKERS]
    if os.path.isdir(name_or_path) and not any(os.path.isfile(marker) for marker in markers):
        raise UserInputError(
            f"{what} has no tokenizer files (tokenizer.json or tokenizer_config.json); it may have been left "
            "half written: give a folder saved with tokenizer.save_pretrained, or remove it."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserInputError(
            f"{what} could not be loaded ({reason}). Give a folder holding tokenizer files or a Hub id, or "
            "leave --tokenizer_name out to train a BPE on the data."
        ) from None
    if tokenizer.eos_token is None:
        raise UserInputError(f"{what} has no EOS token, which separates packed documents; pick one that has.")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # batched evaluation and generation need a pad id
    return tokenizer


def tokenizer_recipe(model_args, sources: list, max_length: int) -> dict:
    """What a BPE trained by `train_tokenizer` depends on: its sizes, and the
    sources it read (keys and sizes)."""
    return {"vocab_size": model_args.vocab_size, "model_max_length": max_length, "version": 1,
            "sources": [[source.key(), getattr(source, "size", 0)] for source in sources]}


def reusable_share(folder: str, recipe: dict) -> float | None:
    """The share (by size) of the texts the tokenizer in `folder` was trained on that `recipe`
    reads unchanged, when its sizes match and that share is at least REUSE_SHARE; else None. A
    file added to a corpus, or one changed, keeps the tokenizer (and so every other file's
    shards); another corpus does not."""
    earlier = read_json_or_none(os.path.join(folder, RECIPE))  # token_store.place_tokenizer wrote it
    settings = ("vocab_size", "model_max_length", "version")
    if earlier is None or any(earlier.get(name) != recipe[name] for name in settings):
        return None
    now = {json.dumps(key, sort_keys=True) for key, _ in recipe["sources"]}
    sizes = [(json.dumps(key, sort_keys=True) in now, size) for key, size in earlier.get("sources", [])]
    total = sum(size for _, size in sizes)
    share = sum(size for kept, size in sizes if kept) / total if total else 0.0
    return share if share >= REUSE_SHARE else None
