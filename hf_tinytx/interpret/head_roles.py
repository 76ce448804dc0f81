# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Which head does what: a score for every (layer, head) on a few roles that
can be read off attention weights.

* previous-token: mean weight on position i-1; first-token: mean weight on
  position 0 (a common "resting place");
* induction (lookup): at a token seen once before, weight on the token that followed it then ("Harry Potter
  ... Harry" -> "Potter"; Olsson et al., 2022);
* coreference: in the corpus's Winograd sentences, weight on the noun "it" refers to minus weight
  on the other noun. At "it" a causal model has not yet seen the deciding adjective, so it is
  also read there and at the final "The".

An even spread scores `uniform_baseline(n)`, `induction_baseline(ids)` and zero: the bar a head has to clear.
"""

import re
from dataclasses import dataclass

import torch

from hf_tinytx.interpret.attention_maps import attention_weights


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


def induction_targets(input_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries, targets): each position i whose token occurred exactly once before
    (at j, j + 1 < i), and j + 1."""
    seen: dict[int, list[int]] = {}
    queries, targets = [], []
    for i, token in enumerate(input_ids):
        earlier = seen.setdefault(int(token), [])
        if len(earlier) == 1 and earlier[0] + 1 < i:
            queries.append(i)
            targets.append(earlier[0] + 1)
        earlier.append(i)
    return torch.tensor(queries, dtype=torch.long), torch.tensor(targets, dtype=torch.long)


def induction_scores(weights: torch.Tensor, input_ids: list[int]) -> torch.Tensor:
    """(layers, heads) mean of w[i, j+1] over `induction_targets(input_ids)`, from
    weights (layers, heads, n, n)."""
    _check_weights(weights)
    queries, targets = induction_targets(input_ids)
    if len(queries) == 0:
        raise ValueError(
            "No token occurs exactly twice, so there is nothing to look up; repeat part of the text."
        )
    return weights[..., queries, targets].mean(-1)


def induction_baseline(input_ids: list[int]) -> float:
    """What a head attending evenly to everything visible scores on `induction` for these ids."""
    queries, _ = induction_targets(input_ids)
    if len(queries) == 0:
        raise ValueError("No token occurs exactly twice, so there is no induction score to compare with.")
    return float((1.0 / (queries + 1).double()).mean())


def _check_weights(weights: torch.Tensor) -> None:
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 2:
        raise ValueError("Expected attention weights (layers, heads, n, n) with n >= 2, got shape "
                         f"{tuple(weights.shape)}.")


def _ids(tokenizer, text) -> list[int]:
    """A text's token ids; a list of ids passes through (synthetic tasks have no tokenizer)."""
    if isinstance(text, str):
        if tokenizer is None:
            raise ValueError("Texts given as strings need a tokenizer; pass token ids to go without one.")
        return list(tokenizer(text)["input_ids"])
    return [int(i) for i in text]


def positional_head_scores(model, tokenizer, texts: list) -> dict[str, torch.Tensor]:
    """`previous_token` and `first_token` scores, each (layers, heads), averaged over `texts`
    (strings or lists of token ids); `induction` too, averaged over the texts where some token
    occurs exactly twice (absent if none)."""
    if isinstance(texts, str) or not texts:
        raise ValueError("`texts` must be a non-empty list of strings or of token-id lists.")
    previous, first, induction, repeating = 0.0, 0.0, 0.0, 0
    for text in texts:
        input_ids = _ids(tokenizer, text)
        if len(input_ids) < 2:
            raise ValueError(f"{text!r} is a single token; positional roles need at least two.")
        weights = attention_weights(model, torch.tensor([input_ids]))[:, 0]
        previous = previous + previous_token_scores(weights)
        first = first + first_token_scores(weights)
        if len(induction_targets(input_ids)[0]):
            induction, repeating = induction + induction_scores(weights, input_ids), repeating + 1
    scores = {"previous_token": previous / len(texts), "first_token": first / len(texts)}
    if repeating:
        scores["induction"] = induction / repeating
    return scores


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
    """Token positions of the query and of both nouns of a
    `coref`/`coref_new_nouns` probe from `make_probes`."""
    if query not in COREF_QUERIES:
        raise ValueError(f"`query` must be one of {COREF_QUERIES}, got {query!r}.")
    if probe.kind not in ("coref", "coref_new_nouns"):
        raise ValueError(f"Coreference scores need coref probes, got a {probe.kind!r} probe.")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("Locating words in tokens needs a fast tokenizer (character offsets); load it with "
                         "use_fast=True.")
    text = probe.prompt
    encoding = tokenizer(text, return_offsets_mapping=True)
    offsets = encoding["offset_mapping"]
    # the nouns are looked up in the statement, not in the trailing "The"
    statement = text[: text.rindex(".") + 1]
    referent = _tokens_covering(offsets, *_word_span(statement, probe.answer.strip()))
    other = _tokens_covering(offsets, *_word_span(statement, probe.distractors[0].strip()))
    if query == "last":
        query_position = len(encoding["input_ids"]) - 1
    else:  # "it", or the adjective: the last word of the statement
        span = _word_span(statement, "it") if query == "it" else re.search(r"(\w+)\.\s*\w*$", text).span(1)
        query_position = _tokens_covering(offsets, *span)[-1]
    return CorefSentence(list(encoding["input_ids"]), query_position, referent, other)


def coref_head_scores(model, tokenizer, probes, query: str = "it") -> dict[str, torch.Tensor]:
    """Per (layer, head), averaged over the coref probes: `referent` and `other`, the weight
    from the query token onto each noun's tokens; `score`, their difference; `agreement`,
    how often the referent gets more."""
    sentences = [
        locate_coref_probe(tokenizer, p, query) for p in probes if p.kind in ("coref", "coref_new_nouns")
    ]
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
    return {"referent": referent_total / count, "other": other_total / count,
            "score": (referent_total - other_total) / count, "agreement": agree_total / count}


def rank_heads(scores: torch.Tensor, top: int = 3) -> list[RankedHead]:
    """The `top` heads of a (layers, heads) score table, best first."""
    if scores.dim() != 2:
        raise ValueError(f"Expected a (layers, heads) score table, got shape {tuple(scores.shape)}.")
    flat = scores.flatten()
    order = torch.argsort(flat, descending=True)[:top]
    num_heads = scores.shape[1]
    return [RankedHead(int(i) // num_heads, int(i) % num_heads, float(flat[i])) for i in order]


def find_heads(model, tokenizer, texts: list, coref_probes=None, top: int = 3) -> dict[str, list[RankedHead]]:
    """The best heads for each positional role on `texts` (strings, or token-id lists with `tokenizer=None`)
    and, given coref probes, for `coref@it`, `coref@adjective` and `coref@last`."""
    scores = positional_head_scores(model, tokenizer, texts)
    found = {role: rank_heads(table, top) for role, table in scores.items()}
    if coref_probes:
        for query in COREF_QUERIES:
            scores = coref_head_scores(model, tokenizer, coref_probes, query)["score"]
            found[f"coref@{query}"] = rank_heads(scores, top)
    return found


__all__ = [
    "COREF_QUERIES", "CorefSentence", "RankedHead", "coref_head_scores", "find_heads", "first_token_scores",
    "induction_baseline", "induction_scores", "induction_targets", "locate_coref_probe",
    "positional_head_scores", "previous_token_scores", "rank_heads", "uniform_baseline",
]
