"""The recurrent baseline the seeds argue against: an LSTM language model that reads one token at a time.

Its forward takes what a transformers causal LM takes (`input_ids`, `attention_mask`, `labels`) and returns an
object with `.logits` (and `.loss` given labels), so `hf_tinytx.probes.score_probes` and the training loop in
`seed_claims.py` treat it exactly like TinyTx. `lstm_matching(num_parameters, vocab_size)` picks the width
that gives about the same parameter count as a given transformer.
"""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class LSTMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class LSTMLanguageModel(nn.Module):
    """embedding -> num_layers x LSTM -> linear head. Token t's state needs token
    t-1's: the seeds' waiting chain."""

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int = 2):
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"LSTMLanguageModel: `{name}` must be a positive integer, got {value!r}.")
        self.vocab_size = vocab_size
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.lstm = nn.LSTM(hidden_size, hidden_size, num_layers=num_layers, batch_first=True)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels=None
    ) -> LSTMOutput:
        # `attention_mask` only marks right padding, which a left-to-right reader never reaches before the
        # real tokens; it is accepted so the model takes the same arguments as a transformers causal LM.
        if int(input_ids.max()) >= self.vocab_size or int(input_ids.min()) < 0:
            raise ValueError(
                f"LSTMLanguageModel: token ids must lie in [0, {self.vocab_size}); the tokenizer and model "
                "disagree."
            )
        hidden, _ = self.lstm(self.embed_tokens(input_ids))
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:  # same convention as transformers: labels are the inputs, shifted here
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, self.vocab_size), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return LSTMOutput(logits=logits, loss=loss)


def lstm_parameters(vocab_size: int, hidden_size: int, num_layers: int) -> int:
    """Embedding + head (vocab x width each) + per layer 4 gates of (input +
    recurrent) weights and two biases."""
    per_layer = 4 * (2 * hidden_size * hidden_size + 2 * hidden_size)
    return 2 * vocab_size * hidden_size + num_layers * per_layer


def lstm_matching(num_parameters: int, vocab_size: int, num_layers: int = 2) -> LSTMLanguageModel:
    """The LSTM LM whose parameter count is closest to `num_parameters`."""
    best = min(
        range(8, 4097), key=lambda width: abs(lstm_parameters(vocab_size, width, num_layers) - num_parameters)
    )
    return LSTMLanguageModel(vocab_size, best, num_layers)
