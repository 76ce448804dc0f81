"""A text read as training goes (--streaming), nothing tokenized ahead: the first step comes at once.

Blocks wait in a buffer of BUFFER and leave it in an order seeded by (seed, epoch): neighbouring blocks of one
document are not trained on one after another, and a resumed run (which reads the stream again and skips what
it trained on) reads exactly what an uninterrupted one read. The validation text is read first, in memory,
bounded: the validation sources, or else the stream's first documents, which training then skips.
"""

import numpy as np
import torch

from hf_tinytx_training.data import token_store
from hf_tinytx_training.data.documents import documents_of


BUFFER = 4096  # blocks
VALIDATION_DOCUMENTS = 1000  # the validation's documents when --max_eval_tokens 0 sets no bound


def validation_text(sources, tokenizer, max_tokens: int) -> tuple[token_store.Shard, int]:
    """(the validation tokens, in one shard in memory; the training documents they take: 0 when
    validation sources are given)."""
    eos, dtype = tokenizer.eos_token_id, token_store.token_dtype(len(tokenizer))
    given = sources.validation is not None
    documents = documents_of(sources.validation if given else sources.train)
    backend, parts, count, taken = token_store.plain_tokenizer(tokenizer), [], 0, 0
    for document in documents:
        if (max_tokens and count >= max_tokens) or (not max_tokens and taken >= VALIDATION_DOCUMENTS):
            break
        part = next(token_store.encoded(backend, [document], eos, dtype), None)
        if part is not None:
            parts.append(part)
            count, taken = count + len(part[0]), taken + 1
    return token_store.memory_shard(parts, dtype), 0 if given else taken


class StreamedBlocks(torch.utils.data.IterableDataset):
    """Training blocks of `block_size` tokens from the documents of `sources` (after the first `skip`),
    tokenized as they are read, shuffled in a buffer seeded by (seed, epoch)."""

    def __init__(self, sources: list, tokenizer, block_size: int, seed: int, skip: int = 0):
        self.sources, self.block_size, self.seed, self.skip = sources, block_size, seed, skip
        self.tokenizer = tokenizer
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        buffer = []
        for block in self._blocks():
            buffer.append(block)
            if len(buffer) == BUFFER:
                yield {"input_ids": torch.from_numpy(_take(buffer, rng))}
        while buffer:
            yield {"input_ids": torch.from_numpy(_take(buffer, rng))}

    def _blocks(self):
        eos, dtype = self.tokenizer.eos_token_id, token_store.token_dtype(len(self.tokenizer))
        backend = token_store.plain_tokenizer(self.tokenizer)
        pending = np.zeros(0, np.int64)
        for tokens, _, _ in token_store.encoded(backend, documents_of(self.sources, self.skip), eos, dtype):
            pending = np.concatenate([pending, tokens.astype(np.int64)])
            whole = len(pending) // self.block_size * self.block_size
            # not views: see _take
            yield from (row.copy() for row in pending[:whole].reshape(-1, self.block_size))
            pending = pending[whole:]


def _take(buffer: list, rng) -> np.ndarray:
    """A block out of `buffer` at random (the last one fills its place). Each block is its own array: a view
    would keep the whole batch it was cut from alive while it waits here."""
    at = int(rng.integers(len(buffer)))
    block, buffer[at] = buffer[at], buffer[-1]
    buffer.pop()
    return block
