"""The tokenizer a run trains with: loaded by name (a folder or Hub id), the run's saved one, or a byte-level BPE
trained on the data (`hf_tinytx.tokenization.train_bpe_tokenizer`)."""

import os

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_tinytx.sources import TOKENIZER_MARKERS
from hf_tinytx.tokenization import train_bpe_tokenizer
from hf_tinytx_training.checkpoints import tokenizer_source
from hf_tinytx_training.errors import UserInputError


def run_tokenizer(model_args, saved: str, reuse_saved: bool, texts, max_length: int, say) -> PreTrainedTokenizerFast:
    """Pretrain's tokenizer: the one saved in `saved` when `reuse_saved` (a resumed run, or a process other than the
    main one), else --tokenizer_name (or --init_from's), else a byte-level BPE trained now on `texts()`."""
    if reuse_saved:
        return load_tokenizer(saved, what=f"The run's saved tokenizer {saved}")
    if model_args.tokenizer_name or model_args.init_from:
        return load_tokenizer(model_args.tokenizer_name or tokenizer_source(model_args.init_from))
    say(f"Training a byte-level BPE tokenizer ({model_args.vocab_size} tokens asked) on the data...")
    tokenizer = train_bpe_tokenizer(texts(), model_args.vocab_size, max_length)
    if len(tokenizer) < model_args.vocab_size:
        say(f"The text holds merges for {len(tokenizer)} tokens only: the vocabulary has {len(tokenizer)} of the "
            f"{model_args.vocab_size} asked (nothing to fix: BPE stops when no pair of tokens repeats, and the model "
            f"is built with {len(tokenizer)}).")
    return tokenizer


def load_tokenizer(name_or_path: str, what: str | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer folder or Hub id; `what` names it in errors (default: the --tokenizer_name value)."""
    what = what or f"The tokenizer {name_or_path!r}"
    if os.path.isdir(name_or_path) and not any(
        os.path.isfile(os.path.join(name_or_path, name)) for name in TOKENIZER_MARKERS
    ):
        raise UserInputError(
            f"{what} has no tokenizer files (tokenizer.json or tokenizer_config.json); it may have been left half "
            f"written: give a folder saved with tokenizer.save_pretrained, or remove it."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserInputError(
            f"{what} could not be loaded ({reason}). Give a folder holding tokenizer files or a Hub id, or leave "
            f"--tokenizer_name out to train a BPE on the data."
        ) from None
    if tokenizer.eos_token is None:
        raise UserInputError(f"{what} has no EOS token, which separates packed documents; pick one that has.")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # batched evaluation and generation need a pad id
    return tokenizer
