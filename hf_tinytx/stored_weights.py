"""The names and shapes of the tensors a saved model folder stores, read from the safetensors headers only, with a
damaged file reported as one ValueError line naming the file and what to do.

Python's standard library and safetensors only: finetune.py checks its base model this way before torch loads, and
convert and the GGUF export check their sources with it too (saved_folder.py), so every command says the same.
"""

import json
import os
from pathlib import Path

from safetensors import safe_open


SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


def has_safetensors(folder: str | os.PathLike) -> bool:
    return (Path(folder) / SINGLE_FILE).is_file() or (Path(folder) / INDEX_FILE).is_file()


def stored_shapes(folder: str | os.PathLike, who: str) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """{tensor name: (file, shape)} of every tensor in the folder's safetensors (one file or an index's shards)."""
    folder = Path(folder)
    if (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        files = sorted(set(_weight_map(folder / INDEX_FILE, who).values()))
    shapes = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{who}: {folder / INDEX_FILE} names the shard {name}, which is missing; copy it in.")
        try:
            # "numpy": the header is read the same way as for "pt", without importing torch; the data stays on disk.
            with safe_open(path, framework="numpy") as f:
                names = f.keys()  # a safe_open handle, not a dict
                shapes.update({key: (path, tuple(f.get_slice(key).get_shape())) for key in names})
        # safetensors' own SafetensorError, and whatever else a damaged file raises
        except Exception as error:  # noqa: BLE001
            raise ValueError(f"{who}: {path} is damaged or truncated ({str(error).strip()}); copy or save it "
                             "again.") from None
    return shapes


def _weight_map(index: Path, who: str) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values()):
            return weight_map
    except (ValueError, KeyError, TypeError):
        pass
    raise ValueError(f'{who}: {index} is not an index with a "weight_map" of tensor names to files; save it again.')
