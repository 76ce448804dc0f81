"""The tokenizer: a named one (`AutoTokenizer`), or a byte-level BPE trained here on the training text.

Byte-level BPE starts from the 256 byte values, so every string encodes (nothing is ever "unknown"), then merges
the most frequent neighbouring pairs until the vocabulary is full.
"""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from args import UserInputError


# Ids 0, 1, 2 match TinyTxConfig's defaults (pad unset, bos_token_id=1, eos_token_id=2).
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}


def train_bpe_tokenizer(texts: Iterable[list[str]], vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE on batches of documents and wraps it as a transformers tokenizer."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, model_max_length=model_max_length, **SPECIAL_TOKENS)


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
