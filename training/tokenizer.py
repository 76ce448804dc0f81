"""Loading a named tokenizer (a folder or Hub id) for training; a new byte-level BPE is trained by
`hf_tinytx.tokenization.train_bpe_tokenizer`."""

import os

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_tinytx.sources import TOKENIZER_MARKERS

from .errors import UserInputError


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
