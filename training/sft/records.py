"""Fine-tuning records, read and checked line by line with Python alone, so finetune.py refuses a
bad file (file and line named) before torch loads: `.txt` (a document a line), or `.jsonl` of
`{"prompt": ..., "response": ...}` or `{"messages": [{"role": ..., "content": ...}, ...]}` records.
sft/data.py turns them into token ids and labels.
"""

import json
import os

from hf_tinytx_training.errors import UserInputError


CHAT_ROLES = ("system", "user", "assistant")


def read_records(path: str) -> list[dict]:
    """Every record of a .txt or .jsonl file, checked, with its "kind" and its
    "where" (file and line) for errors."""
    if os.path.isdir(path):
        raise UserInputError(f"Data file {path!r} is a folder; give the path of a .txt or .jsonl file in it.")
    if not os.path.isfile(path):
        raise UserInputError(f"Data file {path!r} does not exist; give the path of a .txt or .jsonl file.")
    extension = os.path.splitext(path)[1].lower()
    if extension == ".txt":
        records = [{"kind": "text", "text": text.rstrip("\r\n"), "where": f"{path}, line {line_number}"}
                   for line_number, text in _lines(path) if text.strip()]
    elif extension in (".jsonl", ".json"):
        records = _read_jsonl(path)
    else:
        raise UserInputError(
            f"Data file {path!r} has extension {extension!r}; use .txt (one document per line) or .jsonl "
            "(prompt/response or chat messages records)."
        )
    if not records:
        raise UserInputError(f"Data file {path!r} holds no records; there is nothing to train on.")
    return records


def _lines(path: str):
    """(line number, text) of every line, decoded strictly as UTF-8: a wrong byte is named, never replaced."""
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            where = f"{path}, line {line_number}"
            if b"\0" in raw:  # UTF-8 text never holds a NUL byte; binary files and UTF-16 text do
                raise UserInputError(
                    f"{where}: a NUL byte, so this is a binary file (or UTF-16 text), not UTF-8 text; give a "
                    ".txt or .jsonl file saved as UTF-8."
                )
            try:
                # a leading BOM is fine
                yield line_number, raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                raise UserInputError(
                    f"{where}: byte {error.start + 1} (0x{raw[error.start]:02x}) is not UTF-8; save the file "
                    "as UTF-8 (e.g. `iconv -f latin1 -t utf-8 old.txt > new.txt`)."
                ) from None


def _read_jsonl(path: str) -> list[dict]:
    records = []
    for line_number, line in _lines(path):
        if not line.strip():
            continue  # blank lines (a trailing newline, spacing) carry no record
        where = f"{path}, line {line_number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserInputError(
                f"{where}: not valid JSON ({error.msg} at column {error.colno}). Each line must be "
                f'one JSON object, e.g. {{"prompt": "...", "response": "..."}}.'
            ) from None
        # Python's parser recurses per bracket: a line of 100000 `[` exhausts the stack
        except RecursionError:
            raise UserInputError(
                f"{where}: JSON nested too deeply to read (thousands of brackets), not a record; each "
                f'line must be one JSON object such as {{"prompt": "...", "response": '
                f'"..."}}.'
            ) from None
        # named again if the chat template fails
        records.append({**_check_record(value, where), "where": where})
    return records


def _check_record(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise UserInputError(f"{where}: expected a JSON object, got {type(value).__name__}.")
    if "messages" in value and ("prompt" in value or "response" in value):
        # Which one would train is a guess either way (TRL's formats are one or the
        # other): refused, not picked.
        raise UserInputError(
            f'{where}: the record has both "messages" and "prompt"/"response", so what it '
            "teaches is ambiguous; keep one of the two formats in each record."
        )
    if "messages" in value:
        return {"kind": "chat", "messages": _check_messages(value["messages"], where)}
    if "prompt" in value or "response" in value:
        for field in ("prompt", "response"):
            if not isinstance(value.get(field), str):
                raise UserInputError(
                    f"{where}: the record needs a string {field!r} field (it has {sorted(value)}); "
                    'give both "prompt" and "response" as strings.'
                )
        if not value["response"]:
            raise UserInputError(
                f'{where}: the "response" is empty, so there is nothing to learn from this record.'
            )
        return {"kind": "prompt", "prompt": _text(value["prompt"], where, '"prompt"'),
                "response": _text(value["response"], where, '"response"')}
    raise UserInputError(
        f'{where}: the record has fields {sorted(value)}, but needs either "prompt" and '
        f'"response" (strings) or "messages" (a list of {{"role", "content"}} objects).'
    )


def _check_messages(messages, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise UserInputError(
            f'{where}: "messages" must be a non-empty list of {{"role", "content"}} objects.'
        )
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("content"), str)):
            raise UserInputError(f"{where}: message {i} must be an object with a string \"content\".")
        if message.get("role") not in CHAT_ROLES:
            raise UserInputError(f"{where}: message {i} has role {message.get('role')!r}; use one of "
                                 f"{list(CHAT_ROLES)}.")
    if not any(message["role"] == "assistant" for message in messages):
        raise UserInputError(
            f'{where}: no "assistant" message, so there is nothing to learn from this record.'
        )
    # An empty reply would train the model to answer with nothing, as an empty "response" would.
    empty = [
        i for i, message in enumerate(messages) if message["role"] == "assistant" and not message["content"]
    ]
    if empty:
        raise UserInputError(
            f'{where}: message {empty[0]} (assistant) has an empty "content", which would teach the '
            "model to say nothing; write the reply, or drop that exchange from the record."
        )
    return [
        {"role": message["role"], "content": _text(message["content"], where, f'message {i}\'s "content"')}
        for i, message in enumerate(messages)
    ]


def _text(text: str, where: str, what: str) -> str:
    """The text, if it can be encoded: a JSON escape can spell half of a UTF-16 surrogate pair, which the
    tokenizer would reject with a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UserInputError(
            f"{where}: {what} holds a lone surrogate \\u{ord(text[error.start]):04x} at character "
            f"{error.start + 1} (half of a UTF-16 pair, written as a JSON escape), which is not text; write "
            "the character itself, or both halves of its pair (e.g. \\ud83d\\ude00)."
        ) from None
    return text
