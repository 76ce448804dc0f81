"""Runs a training script in this process with library functions wrapped, to
act on it from outside the script.

    python tests/helpers/launch.py --kill-at
    after:accelerate.Accelerator.save_state:3 training/pretrain.py ARGS...
    python tests/helpers/launch.py --hash-weights PREFIX training/pretrain.py ARGS...   (works under torchrun
        too)

--kill-at WHEN:FUNCTIONS:N[:TEXT]  SIGKILL right before or after (WHEN) the Nth
call of the dotted FUNCTIONS (one
                                   count) whose str/bytes/path arguments contain TEXT; the last stderr line
                                   starts with KILL_MARK. A call that raises counts but kills nothing.
--signal SIGNAME                   with --kill-at: this signal instead, and the call goes on.
--hash-weights PREFIX              at Accelerator.end_training, PREFIX.rankR.json: a sha256 of this rank's
                                   weights.
--mark-at-exit PREFIX              if the interpreter's shutdown runs (atexit handlers), writes PREFIX.rankR
                                   there.

The script is run with runpy as `__main__` after the wrapping, so even a library's `from safetensors.torch
                                   import
save_file` binds the wrapper. A method is named through its class.
"""

import argparse
import atexit
import functools
import hashlib
import importlib
import json
import os
import runpy
import signal
import sys
import threading


KILL_MARK = "[launch] SIGKILL"


def _owner(dotted: str):
    """"accelerate.Accelerator.save_state" -> (the Accelerator class, "save_state")."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:-1]:
            owner = getattr(owner, attribute)
        return owner, parts[-1]
    raise ImportError(f"cannot import any module of {dotted!r}")


def wrap(target: str, around) -> None:
    """Replaces the function `target` by one that returns `around(original, args, kwargs)`."""
    owner, name = _owner(target)
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return around(original, args, kwargs)

    setattr(owner, name, wrapper)


def _texts(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, (str, bytes, os.PathLike)):
            yield os.fsdecode(value)


def kill_at(spec: str, signum: int = signal.SIGKILL) -> None:
    when, functions, nth, text = (spec.split(":", 3) + [""])[:4]
    if when not in ("before", "after"):
        raise SystemExit(f"launch.py: --kill-at starts with before: or after:, got {spec!r}")
    lock, calls = threading.Lock(), [0]
    mark = KILL_MARK if signum == signal.SIGKILL else f"[launch] {signal.Signals(signum).name}"

    def die(name, args, kwargs):
        sys.stdout.flush()
        sys.stderr.write(f"{mark} {when} call {nth} of {name}{tuple(_texts(args, kwargs))}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signum)

    def counting(name):
        def around(original, args, kwargs):
            hit = False
            if not text or any(text in value for value in _texts(args, kwargs)):
                with lock:
                    calls[0] += 1
                    hit = calls[0] == int(nth)
            if hit and when == "before":
                die(name, args, kwargs)
            result = original(*args, **kwargs)
            if hit:
                die(name, args, kwargs)
            return result
        return around

    for name in functions.split(","):
        wrap(name, counting(name))


def hash_weights(prefix: str) -> None:
    def end_training(original, args, kwargs):
        result = original(*args, **kwargs)
        accelerator = args[0]
        model = accelerator.unwrap_model(accelerator._models[0])
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().numpy().tobytes())
        with open(f"{prefix}.rank{accelerator.process_index}.json", "w", encoding="utf-8") as f:
            json.dump({"sha256": digest.hexdigest(), "num_processes": accelerator.num_processes}, f)
        return result

    wrap("accelerate.Accelerator.end_training", end_training)


def mark_at_exit(prefix: str) -> None:
    def write_mark():
        with open(f"{prefix}.rank{os.environ.get('RANK', '0')}", "w", encoding="utf-8") as f:
            f.write("the interpreter shut down\n")

    atexit.register(write_mark)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--kill-at")
    parser.add_argument("--signal", default="SIGKILL")
    parser.add_argument("--hash-weights")
    parser.add_argument("--mark-at-exit")
    parser.add_argument("script")
    options, script_args = parser.parse_known_args()
    if options.kill_at:
        kill_at(options.kill_at, signal.Signals[options.signal])
    if options.hash_weights:
        hash_weights(options.hash_weights)
    if options.mark_at_exit:
        mark_at_exit(options.mark_at_exit)
    # As `python script` would: the script's folder first on sys.path, not this helper's.
    sys.path[0] = os.path.dirname(os.path.abspath(options.script))
    sys.argv = [options.script, *script_args]
    runpy.run_path(options.script, run_name="__main__")
