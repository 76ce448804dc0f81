"""transformers' own server (`transformers.cli.serve.Serve`, what `transformers serve` runs),
started by the launcher as `python -m hf_tinytx.serve.backend PARAMS_JSON REPORT_FD` on a
loopback port, behind the checks of front.py.

transformers serve 5.25 finds a model's class with `getattr(transformers, config.architectures[0])`, even with
`--trust-remote-code` (measured: "module transformers has no attribute TinyTxForCausalLM"). So this module
names TinyTx's classes there when it is imported. The model's process, which transformers starts with
multiprocessing's "spawn", imports the main module again, this one, and so gets them too.
"""

import json
import os
import sys
import threading

import hf_tinytx
from hf_tinytx.serve.request_checks import first_line


def expose_tinytx_classes() -> None:
    classes = {name: getattr(hf_tinytx, name) for name in hf_tinytx.__all__ if name.startswith("TinyTx")}
    import transformers  # only now: loading the classes can put a new `transformers` module in sys.modules

    for name, model_class in classes.items():
        setattr(transformers, name, model_class)


expose_tinytx_classes()  # at import: in this process and in every model process it spawns


def exit_with_the_launcher() -> None:
    """The launcher holds our stdin open and never writes: end of file means it
    is gone, whatever killed it."""
    while os.read(sys.stdin.fileno(), 4096):  # unbuffered: a daemon thread must hold no lock at exit
        pass
    os._exit(1)


def main() -> None:
    from transformers.cli.serve import Serve

    params, report_fd = json.loads(sys.argv[1]), int(sys.argv[2])
    threading.Thread(target=exit_with_the_launcher, name="launcher-watch", daemon=True).start()
    try:
        Serve(**params)
    except (OSError, ValueError, RuntimeError) as error:  # a model that does not load; an engine that died
        os.write(report_fd, first_line(error).encode(errors="replace"))
        sys.exit(1)


if __name__ == "__main__":
    main()
