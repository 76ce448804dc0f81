"""The names and shapes of the tensors a saved model folder stores, from the safetensors headers
only (no torch), a damaged file reported as one ValueError line. Besides safetensors' own checks,
an integer weight in a model that is not quantized is refused: a header saying I32 for F32 data of
the same size would load as values ~1e9.
"""

import json
import os
from pathlib import Path

from safetensors import safe_open


SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
INTEGER_DTYPES = ("I", "U", "BOOL")  # safetensors' I8..I64, U8..U64 and BOOL; floats are F*, BF16
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def has_safetensors(folder: str | os.PathLike) -> bool:
    return (Path(folder) / SINGLE_FILE).is_file() or (Path(folder) / INDEX_FILE).is_file()


def check_weights(folder: str | os.PathLike, shown: str, who: str) -> None:
    """ValueError, one line, unless `folder` (named `shown`) holds safetensors weights whose headers read:
    weights only as a pickle are never loaded, as unpickling a file can run code. `who`: the argument's
    name in stored_shapes' lines."""
    if not has_safetensors(folder):
        if any((Path(folder) / name).is_file() for name in PICKLED):
            raise ValueError(
                f"{shown} holds its weights only as a pickle (pytorch_model.bin), which tinytx never loads: "
                "unpickling a file can run code. Save the model as safetensors (save_pretrained writes "
                "model.safetensors) and give that folder."
            )
        raise ValueError(
            f"{shown} has a config but no weights (no model.safetensors): save the model into it again, or "
            "give the folder that holds them."
        )
    stored_shapes(folder, who)


def stored_shapes(folder: str | os.PathLike, who: str) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """{tensor name: (file, shape)} of every tensor in the folder's safetensors
    (one file or an index's shards)."""
    folder = Path(folder)
    if (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        files = sorted(set(_weight_map(folder / INDEX_FILE, who).values()))
    shapes, quantized = {}, _quantized(folder)
    for name in files:
        path = folder / name
        if not path.is_file():
            raise ValueError(
                f"{who}: {folder / INDEX_FILE} names the shard {name}, which is missing; copy it in."
            )
        try:
            # "numpy": the header is read as for "pt", without importing torch; the data stays on disk.
            with safe_open(path, framework="numpy") as f:
                names = f.keys()  # a safe_open handle, not a dict
                slices = {key: f.get_slice(key) for key in names}
                shapes.update({key: (path, tuple(piece.get_shape())) for key, piece in slices.items()})
                dtypes = {key: piece.get_dtype() for key, piece in slices.items()}
        except Exception as error:  # noqa: BLE001  (SafetensorError, or whatever else a damaged file raises)
            raise ValueError(f"{who}: {path} is damaged or truncated ({str(error).strip()}); copy or save it "
                             "again.") from None
        integer = [f"{key} ({dtype})" for key, dtype in dtypes.items()
                   if key.endswith((".weight", ".bias")) and dtype.upper().startswith(INTEGER_DTYPES)]
        if integer and not quantized:
            raise ValueError(
                f"{who}: {path} stores {', '.join(integer[:3])}{' and more' if len(integer) > 3 else ''} as "
                "an integer type, but the weights of a model that is not quantized are floating point (F32, "
                "F16, BF16): its header does not describe its data; copy or save it again."
            )
    return shapes


def _quantized(folder: Path) -> bool:
    """Whether config.json names a quantization (whose packed weights are integers)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("quantization_config") is not None


def _weight_map(index: Path, who: str) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values()):
            return weight_map
    except (ValueError, KeyError, TypeError):
        pass
    raise ValueError(
        f'{who}: {index} is not an index with a "weight_map" of tensor names to files; save it again.'
    )
