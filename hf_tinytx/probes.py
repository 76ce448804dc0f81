# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""Scores the corpus probes (:func:`hf_tinytx.corpus.make_probes`) with any causal language model.

A probe is multiple choice: the model is right when it gives the correct continuation a higher
total log-probability than every distractor. Works with anything that maps `input_ids` to
next-token logits, plus a transformers tokenizer.
"""

import inspect
import os
from collections import defaultdict
from dataclasses import dataclass

import torch

from hf_tinytx.corpus import Probe
from hf_tinytx.tokenization import adds_bos


def _token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    # One batched call: fast tokenizers encode a list in parallel.
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _split_candidate(
    prompt_ids: list[int], full_ids: list[int], prompt: str, candidate: str
) -> tuple[list, list]:
    """(context ids, candidate ids) from the tokens of `prompt` and of `prompt +
    candidate`. BPE may merge across the boundary: the candidate's tokens are those after
    the longest common prefix with the prompt's."""
    common = len(os.path.commonprefix([prompt_ids, full_ids]))
    if common == 0:
        raise ValueError(
            f"Probe prompt {prompt!r} leaves no token before the candidate {candidate!r}, so its first token "
            "has nothing to be predicted from; use a non-empty prompt or a tokenizer with a `bos_token`."
        )
    if common == len(full_ids):
        raise ValueError(
            f"Candidate {candidate!r} adds no tokens to prompt {prompt!r}; candidates must be non-empty."
        )
    return full_ids[:common], full_ids[common:]


def model_device(model) -> torch.device:
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return parameter.device if parameter is not None else torch.device("cpu")


def _forward_takes(model) -> tuple[bool, bool]:
    """(logits_to_keep, attention_mask): whether the model's forward takes each. `logits_to_keep` only when
    named (a `**kwargs` forward might pass it on to a layer that rejects it)."""
    try:
        parameters = dict(inspect.signature(model.forward).parameters)
    except (AttributeError, TypeError, ValueError):
        return False, True
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return "logits_to_keep" in parameters, "attention_mask" in parameters or takes_kwargs


@dataclass(frozen=True)
class _Request:
    """Score `tokens`, which sit at positions `first`, `first + 1`, ... of model input number `row`."""

    row: int
    first: int
    tokens: list[int]


def _plan_inputs(
    split_candidates: list[tuple[list[int], list[int]]], rows: list[list[int]]
) -> list[_Request]:
    """Model inputs for one probe's candidates, appended to `rows`, and where to read each candidate's score.

    A candidate needs the input `(context + candidate)[:-1]`. A causal model's logits on a
    prefix do not depend on what follows, so one input serves every candidate whose input is a
    prefix of it (all one-token candidates).
    """
    own_rows: list[int] = []
    requests: list[_Request | None] = [None] * len(split_candidates)
    longest_first = sorted(range(len(split_candidates)), key=lambda i: -sum(map(len, split_candidates[i])))
    for i in longest_first:
        context, candidate = split_candidates[i]
        needed = (context + candidate)[:-1]
        row = next((r for r in own_rows if rows[r][: len(needed)] == needed), None)
        if row is None:
            rows.append(needed)
            row = len(rows) - 1
            own_rows.append(row)
        requests[i] = _Request(row, len(context), candidate)
    return requests


@torch.no_grad()
def _score_requests(
    model, rows: list[list[int]], requests: list[_Request], batch_size: int, pad_id: int
) -> list:
    """Sum of log p(token | everything before it) over each request's tokens."""
    device = model_device(model)
    # The mask only marks right padding, which a causal model never looks back
    # at; sent to models that take it.
    keep_logits_arg, send_mask = _forward_takes(model)
    requests_of_row: list[list[int]] = [[] for _ in rows]
    for index, request in enumerate(requests):
        requests_of_row[request.row].append(index)
    scores = [0.0] * len(requests)
    # Similar lengths share a batch, which keeps padding (wasted work) small.
    order = sorted(range(len(rows)), key=lambda r: len(rows[r]))
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(len(rows[r]) for r in batch)
        # Right padding: every real token keeps its natural position and, the model
        # being causal, never sees a pad.
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for b, r in enumerate(batch):
            input_ids[b, : len(rows[r])] = torch.tensor(rows[r])
            attention_mask[b, : len(rows[r])] = 1
        # Only positions from the earliest candidate onward are needed.
        first_needed = min(requests[i].first - 1 for r in batch for i in requests_of_row[r])
        kwargs = {"logits_to_keep": width - first_needed} if keep_logits_arg else {}
        if send_mask:
            kwargs["attention_mask"] = attention_mask.to(device)
        output = model(input_ids=input_ids.to(device), **kwargs)
        logits = output.logits if hasattr(output, "logits") else output[0]
        offset = width - logits.shape[1]  # sequence position of logits[:, 0]
        log_probs = torch.log_softmax(logits.float(), dim=-1).cpu()
        for b, r in enumerate(batch):
            for i in requests_of_row[r]:
                request = requests[i]
                positions = torch.arange(request.first - 1, request.first - 1 + len(request.tokens)) - offset
                scores[i] = log_probs[b, positions, torch.tensor(request.tokens)].sum().item()
    return scores


def candidate_log_probs(model, tokenizer, probes: list[Probe], batch_size: int = 32) -> list[list[float]]:
    """For each probe, the model's total log-probability of `[answer, *distractors]` given the prompt.

    `batch_size` counts model inputs per forward pass; lower it to save memory.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
    leading = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []  # as the model saw its training text
    candidates_of = [(probe.answer, *probe.distractors) for probe in probes]
    prompt_ids = _token_ids(tokenizer, [probe.prompt for probe in probes])
    full_ids = iter(_token_ids(tokenizer, [p.prompt + c for p, cs in zip(probes, candidates_of) for c in cs]))
    rows: list[list[int]] = []
    requests: list[_Request] = []
    for probe, candidates, prompt_tokens in zip(probes, candidates_of, prompt_ids):
        split = [
            _split_candidate(leading + prompt_tokens, leading + next(full_ids), probe.prompt, candidate)
            for candidate in candidates
        ]
        requests += _plan_inputs(split, rows)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    # any id will do: padded positions are masked and never scored
    pad_id = pad_id if pad_id is not None else 0

    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        flat = _score_requests(model, rows, requests, batch_size, pad_id)
    finally:
        if was_training:
            model.train()

    scores = iter(flat)
    return [[next(scores) for _ in candidates] for candidates in candidates_of]


def probe_key(probe: Probe) -> str:
    """The result key a probe counts towards: its kind, with the distance for recall (`recall@200`) and for
    copying over filler (`copy@200`; plain `copy` when the repetition follows the list at once)."""
    if probe.kind == "recall" or (probe.kind == "copy" and probe.distance > 0):
        return f"{probe.kind}@{probe.distance}"
    return probe.kind


def score_probes(model, tokenizer, probes: list[Probe], batch_size: int = 32) -> dict[str, float]:
    """Accuracy per `probe_key`: right when the answer beats every distractor (ties count wrong), with a
    matching `n_{key}` count (as a float, like every value)."""
    if not probes:
        raise ValueError("`probes` is empty; build some with `hf_tinytx.corpus.make_probes()`.")
    scores = candidate_log_probs(model, tokenizer, probes, batch_size=batch_size)
    correct: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for probe, (answer_score, *distractor_scores) in zip(probes, scores):
        key = probe_key(probe)
        total[key] += 1
        correct[key] += all(answer_score > other for other in distractor_scores)
    results: dict[str, float] = {}
    for key in total:  # in the order the probes came
        results[key] = correct[key] / total[key]
        results[f"n_{key}"] = float(total[key])
    return results


def chance_levels(probes: list[Probe]) -> dict[str, float]:
    """What guessing scores, under the keys of `score_probes`: 1/(k+1) for k distractors, averaged per key."""
    odds: dict[str, list[float]] = defaultdict(list)
    for probe in probes:
        odds[probe_key(probe)].append(1 / (1 + len(probe.distractors)))
    return {key: sum(values) / len(values) for key, values in odds.items()}


__all__ = ["candidate_log_probs", "chance_levels", "probe_key", "score_probes"]
