"""Runs a script with library functions counted, as tests/helpers/launch.py --kill-at counts them (the same
`wrap`), so that a trial can be killed right before or after any one of the calls a reference run made.

    python tests/kill_campaign/call_tracer.py --calls OUT.json --count
    LABEL=FUNCTION[,...]:TEXT ... SCRIPT ARGS

Each process writes OUT.rankR.json, {label: [the calls' path arguments, in order]}, after every counted call:
a process that leaves with os._exit still leaves its counts.
"""

import argparse
import json
import os
import runpy
import sys
import threading


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)  # the repository root, for tests.helpers
    from tests.helpers.launch import _texts, wrap

    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--calls", required=True)
    parser.add_argument("--count", action="append", default=[])
    parser.add_argument("script")
    options, script_args = parser.parse_known_args()

    path = f"{options.calls}.rank{os.environ.get('RANK', '0')}.json"
    calls, lock, replace = {}, threading.Lock(), os.replace  # the unwrapped os.replace, for this file only

    def write():
        with open(f"{path}.new", "w", encoding="utf-8") as f:
            json.dump(calls, f)
        replace(f"{path}.new", path)

    def counting(label, text):
        def around(original, args, kwargs):
            texts = list(_texts(args, kwargs))
            # counted before the call, as --kill-at counts
            if not text or any(text in value for value in texts):
                with lock:
                    calls[label].append(" -> ".join(texts))
                    write()
            return original(*args, **kwargs)
        return around

    for spec in options.count:
        label, rest = spec.split("=", 1)
        functions, text = (rest.split(":", 1) + [""])[:2]
        calls[label] = []
        for function in functions.split(","):
            wrap(function, counting(label, text))
    with lock:
        write()
    sys.path[0] = os.path.dirname(os.path.abspath(options.script))  # as `python script` would
    sys.argv = [options.script, *script_args]
    runpy.run_path(options.script, run_name="__main__")


if __name__ == "__main__":
    main()
