""""tinytx" registered with transformers' Auto classes without loading torch at `import hf_tinytx`.

Registering loads torch (seconds), so `import hf_tinytx` only asks to be told when transformers' Auto modules
or ours finish loading: the first of a pair to load does the registering. Torch is loaded by then anyway.
"""

import importlib
import importlib.abc
import sys


CONFIG_AUTO = "transformers.models.auto.configuration_auto"
MODELING_AUTO = "transformers.models.auto.modeling_auto"
OUR_CONFIG = f"{__package__}.configuration_tinytx"
OUR_MODELING = f"{__package__}.modeling_tinytx"

_loading: set[str] = set()  # our modules between the start and the end of their import
_registered: set[str] = set()


def _loaded(name: str) -> bool:
    return name in sys.modules and name not in _loading


def register_config() -> None:
    """AutoConfig learns "tinytx" as soon as either side has loaded (the other loads
    then: torch is loaded by now)."""
    if "config" in _registered or OUR_CONFIG in _loading or not (_loaded(CONFIG_AUTO) or _loaded(OUR_CONFIG)):
        return
    _registered.add("config")
    from transformers import AutoConfig

    from .configuration_tinytx import TinyTxConfig

    AutoConfig.register(TinyTxConfig.model_type, TinyTxConfig, exist_ok=True)
    # save_pretrained then copies the code files beside the weights: the folder loads as remote code too.
    TinyTxConfig.register_for_auto_class()


def register_models() -> None:
    """The Auto model classes learn TinyTx's as soon as either modeling module has loaded."""
    if (
        "models" in _registered
        or OUR_MODELING in _loading
        or not (_loaded(MODELING_AUTO) or _loaded(OUR_MODELING))
    ):
        return
    _registered.add("models")
    register_config()
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    from .configuration_tinytx import TinyTxConfig
    from .modeling_tinytx import TinyTxForCausalLM, TinyTxForSequenceClassification, TinyTxModel

    for auto, model in ((AutoModel, TinyTxModel), (AutoModelForCausalLM, TinyTxForCausalLM),
                        (AutoModelForSequenceClassification, TinyTxForSequenceClassification)):
        auto.register(TinyTxConfig, model, exist_ok=True)
        model.register_for_auto_class(auto.__name__)


HOOKS = {CONFIG_AUTO: register_config, OUR_CONFIG: register_config,
         MODELING_AUTO: register_models, OUR_MODELING: register_models}


class _ThenRegister(importlib.abc.Loader):
    """Loads a module as its own loader does, then runs its registration step."""

    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def __getattr__(self, name):  # get_source, get_filename, is_package...: the module's own loader answers
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        _loading.add(self.name)
        try:
            self.loader.exec_module(module)
        finally:
            _loading.discard(self.name)
        HOOKS[self.name]()


class _Watch(importlib.abc.MetaPathFinder):
    """Finds the four modules as the other finders do, and hands each to `_ThenRegister`."""

    def find_spec(self, name, path, target=None):
        if name not in HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenRegister(spec.loader, name)
                return spec
        return None


def register_when_transformers_loads() -> None:
    if not any(isinstance(finder, _Watch) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watch())
    register_config()  # at once where transformers' Auto modules (and so torch) are loaded already
    register_models()
