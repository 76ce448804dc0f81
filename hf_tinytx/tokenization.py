"""A byte-level BPE tokenizer trained from text, wrapped as a transformers tokenizer. It
starts from the 256 byte values, so every string encodes, then merges the most frequent
neighbouring pairs until the vocabulary is full.
"""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


# Ids 0, 1, 2 in this order, matching TinyTxConfig's defaults (bos_token_id=1, eos_token_id=2).
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}


def train_bpe_tokenizer(texts: Iterable[str] | Iterable[list[str]], vocab_size: int,
                        model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Trains on `texts` (strings, or batches of strings) and returns a fast
    tokenizer with pad/bos/eos set."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, model_max_length=model_max_length, **SPECIAL_TOKENS)


def adds_bos(tokenizer) -> bool:
    """Whether this tokenizer puts its BOS in front of every text (Llama-style)
    rather than none (GPT-2-style)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos is not None and list(tokenizer("x")["input_ids"])[:1] == [bos]
