"""Reads back what the experiment trackers wrote: trackio's SQLite file, and wandb's offline run
file (protobuf records in LevelDB's log format: 32 KiB blocks of chunks with 7-byte headers;
wandb's own reader is in its Go core)."""

import contextlib
import json
import sqlite3
import struct
from pathlib import Path


def trackio_rows(database: Path) -> tuple[list[tuple[int, dict]], dict]:
    """(step, metrics) in the order logged, and the run's config."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        logged = db.execute("SELECT step, metrics FROM metrics ORDER BY id")
        rows = [(step, json.loads(metrics)) for step, metrics in logged]
        (config,) = db.execute("SELECT config FROM configs").fetchone()
    return rows, json.loads(config)


def wandb_records(run_file: Path):
    """Every record of an offline wandb run file, as wandb's protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    raw, block, position, pieces = run_file.read_bytes(), 32768, 7, b""
    assert raw.startswith(b":W&B"), f"{run_file} is not a wandb run file"
    while position + 7 <= len(raw):
        room = block - position % block
        _, length, kind = struct.unpack("<IHB", raw[position:position + 7])
        if room < 7 or (kind == 0 and length == 0):  # the rest of a block is padding
            position += room
            continue
        pieces += raw[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def wandb_rows(run_file: Path) -> tuple[list[tuple[int, dict]], dict]:
    """(step, values) per history row (wandb merges what was logged at one step
    into one row) and the config."""
    history, config = [], {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            values = decoded(record.history.item)
            history.append((values.pop("_step"), {k: v for k, v in values.items() if not k.startswith("_")}))
        elif kind == "config":
            config.update(decoded(record.config.update))
    return history, config


def decoded(items) -> dict:
    """Key -> value of wandb's items; its own keys (_step, _runtime, ...) come as one-part `nested_key`s."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
