# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Which head does what: a score for every (layer, head) on a few roles that can be read off attention weights.

* previous-token: mean weight a token puts on the token just before it (position i-1);
* first-token: mean weight on position 0 (a "resting place" many trained heads fall back to);
* coreference: in the corpus's Winograd sentences ("The animal didn't cross the street because it was too tired.
  The"), weight on the noun "it" refers to minus weight on the other noun, averaged over sentences.

A head that spreads its weight evenly over the i+1 visible tokens scores `uniform_baseline(n)` on the first two
roles and zero on coreference; that is the bar a specialised head has to clear.

Where the coreference score is read matters in a causal model. At the token "it" the model has not yet seen the
adjective that decides the referent ("tired" -> the animal, "wide" -> the street), so no head can know the answer
there; `query="adjective"` and `query="last"` (the final "The", where the noun must be predicted) read the score
where the sentence has been resolved.
"""

import re
from dataclasses import dataclass

import torch

from .attention_maps import attention_weights


ROLES = {
    "previous_token": "mean weight on position i-1",
    "first_token": "mean weight on position 0",
    "coref": "weight on the referent noun minus weight on the other noun",
}
COREF_QUERIES = ("it", "adjective", "last")


@dataclass(frozen=True)
class RankedHead:
    layer: int
    head: int
    score: float


def previous_token_scores(weights: torch.Tensor) -> torch.Tensor:
    """(layers, heads) mean of w[i, i-1] over i >= 1, from weights of shape (layers, heads, n, n)."""
    _check_weights(weights)
    return torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1).mean(-1)


def first_token_scores(weights: torch.Tensor) -> torch.Tensor:
    """(layers, heads) mean of w[i, 0] over i >= 1 (position 0 can only look at itself, so it is left out)."""
    _check_weights(weights)
    return weights[..., 1:, 0].mean(-1)


def uniform_baseline(n: int) -> float:
    """What a head attending evenly to everything visible scores on `previous_token` and `first_token`."""
    if n < 2:
        raise ValueError(f"Positional head scores need at least 2 tokens, got {n}.")
    return sum(1.0 / (i + 1) for i in range(1, n)) / (n - 1)


def _check_weights(weights: torch.Tensor) -> None:
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 2:
        raise ValueError(
            f"Expected attention weights (layers, heads, n, n) with n >= 2, got shape {tuple(weights.shape)}."
        )


def positional_head_scores(model, tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    """`previous_token` and `first_token` scores, each (layers, heads), averaged over `texts`."""
    if isinstance(texts, str) or not texts:
        raise ValueError("`texts` must be a non-empty list of strings.")
    totals = {"previous_token": 0.0, "first_token": 0.0}
    for text in texts:
        input_ids = list(tokenizer(text)["input_ids"])
        if len(input_ids) < 2:
            raise ValueError(f"{text!r} is a single token; positional roles need at least two.")
        weights = attention_weights(model, torch.tensor([input_ids]))[:, 0]
        totals["previous_token"] = totals["previous_token"] + previous_token_scores(weights)
        totals["first_token"] = totals["first_token"] + first_token_scores(weights)
    return {role: total / len(texts) for role, total in totals.items()}


@dataclass(frozen=True)
class CorefSentence:
    """One coreference probe located in token space."""

    input_ids: list[int]
    query: int  # token position that looks
    referent: list[int]  # token positions of the noun "it" refers to
    other: list[int]  # token positions of the other noun


def _tokens_covering(offsets, start: int, end: int) -> list[int]:
    return [i for i, (s, e) in enumerate(offsets) if s < end and e > start]


def _word_span(text: str, word: str) -> tuple[int, int]:
    match = re.search(rf"\b{re.escape(word)}\b", text)
    if match is None:
        raise ValueError(f"The word {word!r} does not occur in {text!r}.")
    return match.span()


def locate_coref_probe(tokenizer, probe, query: str = "it") -> CorefSentence:
    """Token positions of the query and of both nouns of a `coref`/`coref_new_nouns` probe from `make_probes`."""
    if query not in COREF_QUERIES:
        raise ValueError(f"`query` must be one of {COREF_QUERIES}, got {query!r}.")
    if probe.kind not in ("coref", "coref_new_nouns"):
        raise ValueError(f"Coreference scores need coref probes, got a {probe.kind!r} probe.")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            "Locating words in tokens needs a fast tokenizer (character offsets); load it with use_fast=True."
        )
    text = probe.prompt
    encoding = tokenizer(text, return_offsets_mapping=True)
    offsets = encoding["offset_mapping"]
    referent, other = probe.answer.strip(), probe.distractors[0].strip()
    statement_end = text.rindex(".") + 1  # the nouns are looked up in the statement, not in the trailing "The"
    spans = {name: _word_span(text[:statement_end], word) for name, word in (("referent", referent), ("other", other))}
    if query == "last":
        query_position = len(encoding["input_ids"]) - 1
    else:
        if query == "it":
            start, end = _word_span(text[:statement_end], "it")
        else:  # the adjective: the last word of the statement
            match = re.search(r"(\w+)\.\s*\w*$", text)
            start, end = match.span(1)
        query_position = _tokens_covering(offsets, start, end)[-1]
    return CorefSentence(
        input_ids=list(encoding["input_ids"]),
        query=query_position,
        referent=_tokens_covering(offsets, *spans["referent"]),
        other=_tokens_covering(offsets, *spans["other"]),
    )


def coref_head_scores(model, tokenizer, probes, query: str = "it") -> dict[str, torch.Tensor]:
    """Per (layer, head), averaged over the coref probes in `probes`:

    `referent` and `other`: weight from the query token onto each noun (summed over the noun's tokens);
    `score`: referent minus other; `agreement`: fraction of sentences where the referent gets more weight.
    """
    sentences = [locate_coref_probe(tokenizer, p, query) for p in probes if p.kind in ("coref", "coref_new_nouns")]
    if not sentences:
        raise ValueError("No coref probes given; build some with `make_probes()` and keep kind 'coref'.")
    referent_total, other_total, agree_total = 0.0, 0.0, 0.0
    for sentence in sentences:
        weights = attention_weights(model, torch.tensor([sentence.input_ids]))[:, 0]  # (layers, heads, n, n)
        row = weights[..., sentence.query, :]
        on_referent = row[..., sentence.referent].sum(-1)
        on_other = row[..., sentence.other].sum(-1)
        referent_total = referent_total + on_referent
        other_total = other_total + on_other
        agree_total = agree_total + (on_referent > on_other).float()
    count = len(sentences)
    return {
        "referent": referent_total / count,
        "other": other_total / count,
        "score": (referent_total - other_total) / count,
        "agreement": agree_total / count,
    }


def rank_heads(scores: torch.Tensor, top: int = 3) -> list[RankedHead]:
    """The `top` heads of a (layers, heads) score table, best first."""
    if scores.dim() != 2:
        raise ValueError(f"Expected a (layers, heads) score table, got shape {tuple(scores.shape)}.")
    flat = scores.flatten()
    order = torch.argsort(flat, descending=True)[:top]
    num_heads = scores.shape[1]
    return [RankedHead(int(i) // num_heads, int(i) % num_heads, float(flat[i])) for i in order]


def find_heads(model, tokenizer, texts: list[str], coref_probes=None, top: int = 3) -> dict[str, list[RankedHead]]:
    """The best heads for each role: `previous_token` and `first_token` on `texts`, and, given coref probes,
    `coref@it`, `coref@adjective` and `coref@last` (where the coreference score is read; see the module notes)."""
    scores = positional_head_scores(model, tokenizer, texts)
    found = {role: rank_heads(table, top) for role, table in scores.items()}
    if coref_probes:
        for query in COREF_QUERIES:
            scores = coref_head_scores(model, tokenizer, coref_probes, query)["score"]
            found[f"coref@{query}"] = rank_heads(scores, top)
    return found


__all__ = [
    "COREF_QUERIES",
    "ROLES",
    "CorefSentence",
    "RankedHead",
    "coref_head_scores",
    "find_heads",
    "first_token_scores",
    "locate_coref_probe",
    "positional_head_scores",
    "previous_token_scores",
    "rank_heads",
    "uniform_baseline",
]
