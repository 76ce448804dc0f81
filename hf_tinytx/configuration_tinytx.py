# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""TinyTx model configuration: `LlamaConfig`'s field names, plus `qk_norm` and `mlp_type`.

Every value is checked when the config is built, so a mistake is reported where it was made (with the fix),
not as a shape error inside the first forward pass.
"""

import math

from transformers.activations import ACT2FN
from transformers.configuration_utils import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


MLP_TYPES = ("gated", "plain")
# The largest RoPE scaling `factor`: models stretch their context 4x to 40x; this
# catches a rope_theta put there.
MAX_ROPE_FACTOR = 1024.0
# Every Auto class a saved folder opens with as remote code (`save_pretrained`
# writes only the saving model's class).
DEFAULT_AUTO_MAP = {
    "AutoConfig": "configuration_tinytx.TinyTxConfig",
    "AutoModel": "modeling_tinytx.TinyTxModel",
    "AutoModelForCausalLM": "modeling_tinytx.TinyTxForCausalLM",
    "AutoModelForSequenceClassification": "modeling_tinytx.TinyTxForSequenceClassification",
}

# The network's sizes: each one a positive integer.
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings")


class TinyTxConfig(PreTrainedConfig):
    r"""
    Configuration of a TinyTx model: a decoder-only ("writer stack") transformer with rotary positions. Fields
    as in `LlamaConfig`, each explained beside its default.

    ```python
    >>> from hf_tinytx import TinyTxConfig, TinyTxForCausalLM
    >>> config = TinyTxConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
    ...                       num_key_value_heads=2)
    >>> model = TinyTxForCausalLM(config)
    ```"""

    model_type = "tinytx"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    # Tensor-parallel plan: same module names as Llama, so the same plan shards it.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }

    vocab_size: int = 8192  # token ids the embedding table holds
    hidden_size: int = 256  # width of the residual stream
    intermediate_size: int = 688  # width of the position-wise MLP
    num_hidden_layers: int = 4  # residual blocks (attention + MLP)
    num_attention_heads: int = 4  # query heads side by side
    # grouped-query attention; None: num_attention_heads, 1: multi-query
    num_key_value_heads: int | None = None
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    hidden_act: str = "silu"  # any name in `transformers.activations`
    # "gated": Llama's down(act(gate(x)) * up(x)); "plain": down(act(up(x))), usually with "gelu" or "relu"
    mlp_type: str = "gated"
    max_position_embeddings: int = 2048  # longest sequence the model is meant to see
    # {"rope_type": ..., "rope_theta": ...} plus what the scaling type needs, exactly as in `LlamaConfig`
    rope_parameters: dict | None = None
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02  # std of the normal weight initialisation
    tie_word_embeddings: bool = False  # share the input embedding with the output head
    attention_bias: bool = False  # on the q/k/v/o projections
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before RoPE (no Llama twin)
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if (
            self.head_dim is None
            and _is_positive_int(self.num_attention_heads)
            and _is_positive_int(self.hidden_size)
        ):
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rope_parameters is None and "rope_scaling" not in kwargs:
            self.rope_parameters = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta", 10000.0)}
        self._validate_sizes()
        super().__post_init__(**kwargs)  # standardises rope_parameters (legacy `rope_scaling`, `rope_theta`)
        self._validate_rope()
        if getattr(self, "auto_map", None) is None:
            self.auto_map = dict(DEFAULT_AUTO_MAP)

    def _validate_sizes(self):
        # Not transformers' `validate_*` hooks: those run after __post_init__ and raise no ValueError.
        for name in SIZE_FIELDS:
            value = getattr(self, name)
            if not _is_positive_int(value):
                raise ValueError(f"TinyTxConfig: `{name}` must be a positive integer, got {value!r}.")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"TinyTxConfig: `num_attention_heads` ({self.num_attention_heads}) must divide "
                             f"`hidden_size` ({self.hidden_size}); pick a head count such as "
                             f"{_divisors_hint(self.hidden_size, self.num_attention_heads)}.")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"TinyTxConfig: `num_key_value_heads` ({self.num_key_value_heads}) must divide "
                f"`num_attention_heads` ({self.num_attention_heads}), since each key/value head serves a "
                "whole group of query heads; pick one of "
                f"{[d for d in range(1, self.num_attention_heads + 1) if self.num_attention_heads % d == 0]}."
            )
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"TinyTxConfig: `head_dim` ({self.head_dim}) must be even, because rotary embeddings rotate "
                "pairs of dimensions; change `hidden_size`/`num_attention_heads` or set an even `head_dim`."
            )
        if self.hidden_act not in ACT2FN:
            raise ValueError(
                f"TinyTxConfig: unknown `hidden_act` {self.hidden_act!r}; use one of {sorted(ACT2FN)} "
                "(`silu` for the gated MLP, `gelu` or `relu` for the plain one)."
            )
        if self.mlp_type not in MLP_TYPES:
            raise ValueError(f"TinyTxConfig: `mlp_type` must be one of {MLP_TYPES}, got {self.mlp_type!r}.")
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0):
            raise ValueError(
                f"TinyTxConfig: `rms_norm_eps` must be a positive number, got {self.rms_norm_eps!r}."
            )
        if not (isinstance(self.attention_dropout, (int, float)) and 0.0 <= self.attention_dropout < 1.0):
            raise ValueError(
                f"TinyTxConfig: `attention_dropout` must be in [0, 1), got {self.attention_dropout!r}."
            )
        if not (isinstance(self.initializer_range, (int, float)) and self.initializer_range >= 0):
            raise ValueError("TinyTxConfig: `initializer_range` must be a non-negative number, got "
                             f"{self.initializer_range!r}.")
        for name in ("pad_token_id", "bos_token_id"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 0 <= value < self.vocab_size):
                raise ValueError(f"TinyTxConfig: `{name}` ({value!r}) must be a token id in [0, "
                                 f"vocab_size={self.vocab_size}) or None.")

    def _validate_rope(self):
        params = self.rope_parameters
        if not isinstance(params, dict):
            raise ValueError(f"TinyTxConfig: `rope_parameters` must be a dict, got {type(params).__name__}.")
        rope_type = params.get("rope_type", "default")
        # transformers only warns about an unknown type, then fails with a bare
        # KeyError when the model is built.
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"TinyTxConfig: unknown RoPE type {rope_type!r} in `rope_parameters`; use one of "
                f"{['default', *ROPE_INIT_FUNCTIONS]}."
            )
        # transformers checks only the keys: a bad theta or factor would make every position alike, silently.
        theta = params.get("rope_theta")
        if not (_is_finite_number(theta) and theta > 1):
            raise ValueError(
                "TinyTxConfig: `rope_parameters['rope_theta']` must be a finite number > 1 (the base of the "
                f"rotary wavelengths, e.g. 10000.0 as in Llama 2 or 500000.0 as in Llama 3), got {theta!r}."
            )
        factor = params.get("factor")
        if factor is not None and not (_is_finite_number(factor) and 1.0 <= factor <= MAX_ROPE_FACTOR):
            raise ValueError(
                f"TinyTxConfig: `rope_parameters['factor']` must be a number in [1, {MAX_ROPE_FACTOR:g}] "
                f"(how many times longer than training the context may get), got {factor!r}."
            )
        partial = params.get("partial_rotary_factor")
        if partial is not None and (partial != 1.0 or isinstance(partial, bool)):
            # TinyTx rotates every dimension of a head: a fraction would be stored and silently ignored.
            raise ValueError(
                "TinyTxConfig: `partial_rotary_factor` must be 1.0 (RoPE on every dimension of a head), got "
                f"{partial!r}; TinyTx has no partial rotary embeddings, so remove the key."
            )
        try:
            self.validate_rope()  # transformers' own check of the keys each RoPE type needs
        except KeyError as error:
            raise ValueError(
                f"TinyTxConfig: {error.args[0]}; add the missing keys to `rope_parameters` (as for "
                "`LlamaConfig`)."
            ) from None


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _divisors_hint(width: int, heads: int) -> list[int]:
    """The four head counts nearest `heads` that divide `width` (the smaller first
    on a tie), in increasing order."""
    divisors = [d for d in range(1, width + 1) if width % d == 0]
    return sorted(sorted(divisors, key=lambda d: (abs(d - heads), d))[:4])


__all__ = ["TinyTxConfig"]
