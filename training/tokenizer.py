"""Loading a named tokenizer (a folder or Hub id) for training; a new byte-level BPE is trained by
`hf_tinytx.tokenization.train_bpe_tokenizer`."""

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from .args import UserInputError


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise UserInputError(
            f"Could not load the tokenizer {name_or_path!r} ({error}). Give a folder holding tokenizer files or a "
            f"Hub id, or leave --tokenizer_name out to train a BPE on the data."
        ) from error
    if tokenizer.eos_token is None:
        raise UserInputError(
            f"The tokenizer {name_or_path!r} has no EOS token, which separates packed documents; pick one that has."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # batched evaluation and generation need a pad id
    return tokenizer
