"""The working directory must not stand in for the installed hf_tinytx.

A clone keeps git's default folder name, `hf_tinytx`. From the folder above it, `python -m ...` puts that folder first
on sys.path; the clone's top has no __init__.py, so Python takes it for a namespace package named hf_tinytx and stops
there (an editable install's finder is asked only after every sys.path entry). The commands here look past it.
"""

import os
import sys
from importlib.machinery import PathFinder


def look_past_a_clone_named_hf_tinytx() -> None:
    """Drops the working directory from sys.path when all it offers under the name hf_tinytx is a checkout's folder
    (a namespace package holding hf_tinytx/__init__.py); an installed or a real package found first is kept."""
    spec = PathFinder.find_spec("hf_tinytx")
    if spec is None or spec.origin not in (None, "namespace"):  # none, or a real package: nothing shadows it
        return
    here = os.path.realpath(os.getcwd())
    if not os.path.isfile(os.path.join(here, "hf_tinytx", "hf_tinytx", "__init__.py")):
        return
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or ".") != here]
    if getattr(sys.modules.get("hf_tinytx"), "__file__", True) is None:  # the namespace, already imported
        del sys.modules["hf_tinytx"]
