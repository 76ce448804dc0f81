"""hf_tinytx: a small, fast, readable rotary causal transformer for the Hugging Face ecosystem.

Importing it registers "tinytx" with transformers' Auto classes, lightly: neither torch nor
transformers loads until a class is touched or transformers loads its Auto classes
(auto_registration.py), so the commands' checks are quick.
"""

import importlib

from .auto_registration import register_when_transformers_loads


__version__ = "0.1.0"

# Each public class and the module that defines it, imported on first use (PEP 562).
_CLASSES = {"TinyTxConfig": "configuration_tinytx", "TinyTxPreTrainedModel": "modeling_tinytx",
            "TinyTxModel": "modeling_tinytx", "TinyTxForCausalLM": "modeling_tinytx",
            "TinyTxForSequenceClassification": "modeling_tinytx"}

__all__ = [*_CLASSES, "__version__"]


def __getattr__(name: str):
    if name not in _CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_CLASSES[name]}", __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_CLASSES})


register_when_transformers_loads()
