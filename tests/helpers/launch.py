"""Runs a training script in this process with one library function wrapped, to act on it from outside the script.

    python tests/helpers/launch.py --kill-after accelerate.Accelerator.save_state:3 training/pretrain.py ARGS...
    python tests/helpers/launch.py --hash-weights PREFIX training/pretrain.py ARGS...   (works under torchrun too)

--kill-after MODULE.QUALNAME:N  SIGKILLs the process right after the Nth call of that function returns.
--hash-weights PREFIX           when Accelerator.end_training runs, writes PREFIX.rankR.json with a sha256 of the
                                weights this process holds (so a test can compare data-parallel ranks).
--mark-at-exit PREFIX           if the interpreter's shutdown runs (atexit handlers), writes PREFIX.rankR there.
The script itself knows nothing of this: it is run with runpy as `__main__`.
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


def wrap(target: str, after):
    """Replaces MODULE.CLASS.METHOD (or MODULE.FUNCTION) by a wrapper that calls `after(result_of_call, call_number)`."""
    module_name, _, qualname = target.rpartition(".")
    owner_path = []
    while True:
        try:
            owner = importlib.import_module(module_name)
            break
        except ModuleNotFoundError:
            module_name, _, attribute = module_name.rpartition(".")
            owner_path.insert(0, attribute)
    for attribute in owner_path:
        owner = getattr(owner, attribute)
    original = getattr(owner, qualname)
    calls = [0]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        calls[0] += 1
        after(args, calls[0])
        return result

    setattr(owner, qualname, wrapper)


def kill_after(spec: str) -> None:
    target, _, nth = spec.rpartition(":")

    def maybe_kill(args, call_number):
        if call_number == int(nth):
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    wrap(target, maybe_kill)


def hash_weights(prefix: str) -> None:
    def write_hash(args, call_number):
        accelerator = args[0]
        model = accelerator.unwrap_model(accelerator._models[0])
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().numpy().tobytes())
        with open(f"{prefix}.rank{accelerator.process_index}.json", "w", encoding="utf-8") as f:
            json.dump({"sha256": digest.hexdigest(), "num_processes": accelerator.num_processes}, f)

    wrap("accelerate.Accelerator.end_training", write_hash)


def mark_at_exit(prefix: str) -> None:
    def write_mark():
        with open(f"{prefix}.rank{os.environ.get('RANK', '0')}", "w", encoding="utf-8") as f:
            f.write("the interpreter shut down\n")

    atexit.register(write_mark)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--kill-after")
    parser.add_argument("--hash-weights")
    parser.add_argument("--mark-at-exit")
    parser.add_argument("script")
    options, script_args = parser.parse_known_args()
    if options.kill_after:
        kill_after(options.kill_after)
    if options.hash_weights:
        hash_weights(options.hash_weights)
    if options.mark_at_exit:
        mark_at_exit(options.mark_at_exit)
    sys.argv = [options.script, *script_args]
    runpy.run_path(options.script, run_name="__main__")
