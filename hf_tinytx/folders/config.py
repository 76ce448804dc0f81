"""What a saved model folder's own files say, read with the standard library only (before
torch loads): config.json, and its tokenizer's size against the embedding's rows. Each problem
is one ValueError line naming the fix.
"""

import json
import os
from pathlib import Path


def read_config_json(folder: str | os.PathLike, who: str | None, expected_type: str | None = None) -> dict:
    """config.json as a dict (`rope_parameters` an object where given; with `expected_type`, a `model_type`).
    `who` starts the error's line (None: no prefix)."""
    path = Path(folder) / "config.json"
    start = f"{who}: " if who else ""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        values = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        where = "nested too deep"
        if isinstance(error, ValueError):
            where = f"line {error.lineno}, column {error.colno}: {error.msg}"
        raise ValueError(
            f"{start}{path} is not valid JSON ({where}); fix that line or save the model again with "
            "save_pretrained."
        ) from None
    if not isinstance(values, dict):
        raise ValueError(
            f"{start}{path} holds a JSON {type(values).__name__}, not an object of config fields; save the "
            "model again with save_pretrained."
        )
    rope = values.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise ValueError(
            f'{start}{path} has "rope_parameters": {json.dumps(rope)[:60]}, which must be an object such '
            'as {"rope_type": "default", "rope_theta": 10000.0}; fix it.'
        )
    if expected_type is not None and values.get("model_type") is None:
        raise ValueError(
            f'{start}{path} has no "model_type"; this conversion reads a {expected_type!r} model, so add '
            f'"model_type": "{expected_type}" if the folder holds one.'
        )
    return values


def tokenizer_size(folder: str | os.PathLike) -> int | None:
    """How many token ids the folder's tokenizer.json gives (largest id + 1,
    added tokens included), or None."""
    try:
        tokenizer = json.loads((Path(folder) / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = tokenizer["model"]["vocab"]
        # Unigram: a list of pieces
        ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]
        ids += [token["id"] for token in tokenizer.get("added_tokens") or []]
        return max(ids) + 1 if ids and all(isinstance(i, int) for i in ids) else None
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None


def check_vocabulary_fits(folder: str | os.PathLike, config: dict, who: str | None) -> None:
    """Refuses a tokenizer with ids past the embedding's rows (config.json's vocab_size)."""
    rows, tokens = config.get("vocab_size"), tokenizer_size(folder)
    if isinstance(rows, int) and tokens is not None and tokens > rows:
        start = f"{who}: " if who else ""
        raise ValueError(
            f"{start}{folder}'s tokenizer has {tokens} tokens but the model's embedding only {rows} rows "
            "(config.json's vocab_size); save the tokenizer the model was trained with into the folder, or "
            "grow the model first (model.resize_token_embeddings(len(tokenizer)); "
            "model.save_pretrained(folder))."
        )
