"""hf_tinytx: a small, fast, readable rotary causal transformer for the Hugging Face ecosystem.

Importing the package registers the "tinytx" model type with transformers' Auto classes, so
`AutoConfig.for_model("tinytx", ...)` and `AutoModelForCausalLM.from_pretrained(folder)` work natively.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .configuration_tinytx import TinyTxConfig
from .modeling_tinytx import TinyTxForCausalLM, TinyTxForSequenceClassification, TinyTxModel, TinyTxPreTrainedModel


__version__ = "0.1.0"

AutoConfig.register(TinyTxConfig.model_type, TinyTxConfig, exist_ok=True)
AutoModel.register(TinyTxConfig, TinyTxModel, exist_ok=True)
AutoModelForCausalLM.register(TinyTxConfig, TinyTxForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(TinyTxConfig, TinyTxForSequenceClassification, exist_ok=True)

# `save_pretrained` then writes `auto_map` into config.json and copies the two code files next to the weights, so
# the folder also loads with `trust_remote_code=True` where this package is not installed.
TinyTxConfig.register_for_auto_class()
TinyTxModel.register_for_auto_class("AutoModel")
TinyTxForCausalLM.register_for_auto_class("AutoModelForCausalLM")
TinyTxForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = [
    "TinyTxConfig",
    "TinyTxPreTrainedModel",
    "TinyTxModel",
    "TinyTxForCausalLM",
    "TinyTxForSequenceClassification",
    "__version__",
]
