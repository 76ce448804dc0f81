"""hf_tinytx/sources.py, folders.py, stored_weights.py and command_flags.py for the checks the scripts run before
torch loads: the library's own definitions, read early.

`import hf_tinytx.sources` runs hf_tinytx/__init__.py first, which registers the model with transformers and so loads
torch (~7 s), and the scripts refuse bad input before that. None of these modules needs them, so each is loaded from its
file on its own; once hf_tinytx has been imported, its copy is used instead.
"""

import importlib.util
import os
import sys


def load(name: str):
    if f"hf_tinytx.{name}" in sys.modules:
        return sys.modules[f"hf_tinytx.{name}"]
    package = importlib.util.find_spec("hf_tinytx")  # a top-level package is found without being imported
    path = os.path.join(package.submodule_search_locations[0], f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{__package__}._hf_tinytx_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sources = load("sources")
folders = load("folders")  # the folder rules the output folder's checks share with convert
stored_weights = load("stored_weights")  # the safetensors headers' check convert runs on its source folder
command_flags = load("command_flags")  # the flags of convert and interpret, for `tinytx` to parse first
