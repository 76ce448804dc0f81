# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""TinyTx: a small rotary causal transformer, written as a native transformers model.

The network, bottom to top:

    token ids -> embedding -> N x [ RMSNorm -> self-attention -> +residual ; RMSNorm -> MLP -> +residual ]
              -> RMSNorm -> lm_head -> next-token logits

Self-attention lets every position look at every earlier position: each token's query is compared with every
key (a dot product), the scores are scaled by 1/sqrt(head_dim), future positions are masked out, a softmax
turns the scores into weights, and the output is the weighted average of the values. Several heads do this
side by side and their outputs are concatenated. Positions enter only by rotating queries and keys (RoPE), so
a score depends on how far apart two tokens are, not on where they sit.

It imports only torch, transformers and its configuration: checkpoints carry it as remote code.
"""

import dataclasses
import inspect
import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GenericForSequenceClassification, GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring, can_return_tuple, logging
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_tinytx import TinyTxConfig


logger = logging.get_logger(__name__)

# transformers 5.24 renamed `past_key_values` to `cache`; as remote code this
# file also runs on older releases.
_OUTPUT_FIELDS = {f.name for f in dataclasses.fields(BaseModelOutputWithPast)}
_CACHE_FIELD = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"
_MASK_CACHE_ARG = (
    "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
)


def _warn_on_the_old_cache_name(forward):
    """Where `cache` is the current name, `past_key_values=` warns (and is renamed) as in Llama."""
    if _CACHE_FIELD != "cache":
        return forward
    from transformers.utils.deprecation import deprecate_kwarg

    return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)


def _pop_cache(cache: Cache | None, kwargs: dict) -> Cache | None:
    """Older `generate` and user code pass the cache as `past_key_values=`."""
    legacy = kwargs.pop("past_key_values", None)
    return cache if cache is not None else legacy


class TinyTxRMSNorm(nn.Module):
    """Root-mean-square norm: rescale each vector to unit RMS, then by a learned gain (no mean, no bias)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype == self.weight.dtype == torch.float32:
            # One call: a decoding step is mostly per-op overhead.
            return nn.functional.rms_norm(
                hidden_states, self.weight.shape, self.weight, eps=self.variance_epsilon
            )
        # Half precision: the statistics in fp32 (a bf16 mean of squares loses too many bits), the gain after.
        input_dtype = hidden_states.dtype
        hidden_states = nn.functional.rms_norm(
            hidden_states.to(torch.float32), self.weight.shape, eps=self.variance_epsilon
        )
        return self.weight * hidden_states.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class TinyTxRotaryEmbedding(nn.Module):
    """Turns position ids into the cos/sin tables that rotate queries and keys (RoPE).

    Dimension i of a head is paired with dimension i + d/2, and each pair turns by its own angle. `sin`
    carries the rotation's sign (-sin on the first half, +sin on the second): see `apply_rotary_pos_emb`.
    """

    inv_freq: torch.Tensor

    def __init__(self, config: TinyTxConfig):
        super().__init__()
        self.config = config
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        self.rope_type = config.rope_parameters.get("rope_type", "default")
        default = self.rope_type == "default"
        rope_init_fn = (
            self.compute_default_rope_parameters if default else ROPE_INIT_FUNCTIONS[self.rope_type]
        )
        inv_freq, self.attention_scaling = rope_init_fn(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(config: TinyTxConfig, *args, **kwargs) -> tuple[torch.Tensor, float]:
        """Pair i of each head's dimensions turns at frequency theta^(-2i/d): fast
        pairs see near, slow pairs far."""
        base = config.rope_parameters["rope_theta"]
        dim = config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
        return inv_freq, 1.0

    @torch.no_grad()
    # only acts for the "dynamic" and "longrope" types, which change with sequence length
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # angle[b, t, i] = position[b, t] * inv_freq[i], computed in fp32: bf16 positions lose whole tokens.
        inv_freq = self.inv_freq.to(device=x.device, dtype=torch.float32)
        angles = position_ids[..., None].to(torch.float32) * inv_freq
        cos = torch.cat((angles, angles), dim=-1).cos() * self.attention_scaling
        sin = angles.sin() * self.attention_scaling
        signed_sin = torch.cat((-sin, sin), dim=-1)  # built once per forward, shared by every layer
        return cos.to(dtype=x.dtype), signed_sin.to(dtype=x.dtype)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates queries and keys by their position's angle, so that q_m . k_n depends only on m - n.

    Each pair (x1, x2) = (x[i], x[i + d/2]) turns into (x1 cos - x2 sin, x2 cos + x1 sin). Rolling x by d/2
    puts x2 where x1 was and x1 where x2 was; `signed_sin` = (-sin, +sin) supplies the signs. That is Llama's
    `x * cos + rotate_half(x) * sin`, bit for bit, with one op instead of three for the rotate-half.
    """
    cos = cos.unsqueeze(unsqueeze_dim)  # broadcast over the heads dimension
    signed_sin = signed_sin.unsqueeze(unsqueeze_dim)
    half = q.shape[-1] // 2
    q_rotated = (q * cos) + (q.roll(half, dims=-1) * signed_sin)
    k_rotated = (k * cos) + (k.roll(half, dims=-1) * signed_sin)
    return q_rotated, k_rotated


class TinyTxMLP(nn.Module):
    """The position-wise network: thinks inside one position, never mixes positions.

    `gated` (default): down(act(gate(x)) * up(x)), Llama's SwiGLU.
    `plain`: down(act(up(x))), the classic two-layer "mix-clip-mix".
    """

    def __init__(self, config: TinyTxConfig):
        super().__init__()
        self.gated = config.mlp_type == "gated"
        if self.gated:
            self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self.act_fn(self.up_proj(x)))


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Grouped-query attention: (batch, kv_heads, seq, d) -> (batch, kv_heads * n_rep, seq, d), each
    kv head shared by `n_rep` query heads."""
    if n_rep == 1:
        return hidden_states
    batch, num_key_value_heads, seq_len, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, seq_len, head_dim
    )
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, seq_len, head_dim)


def eager_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention step by step. Shapes: query (batch, heads, n_q, d), key/value (batch, kv_heads, n_k, d)."""
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)

    # 1. Every query meets every key: one dot product per pair of positions, an (n_q x n_k) table per head.
    #    Dividing by sqrt(d) keeps the scores from growing with the width and saturating the softmax.
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling

    # 2. The causal mask adds a huge negative number wherever a position would look at its future (or at
    #    padding), so those pairs get zero weight after the softmax.
    if attention_mask is not None:
        scores = scores + attention_mask

    # 3. Softmax turns each row of scores into positive weights that sum to one (in fp32, for stability).
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)

    # 4. Each position's output is the weighted average of the value vectors it looked at.
    output = torch.matmul(weights, value)
    return output.transpose(1, 2).contiguous(), weights


class TinyTxAttention(nn.Module):
    """Multi-head self-attention with rotary positions and grouped-query key/value heads."""

    def __init__(self, config: TinyTxConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True

        q_width, kv_width = (
            config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim,
        )
        self.q_proj = nn.Linear(config.hidden_size, q_width, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_width, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_width, config.hidden_size, bias=config.attention_bias)
        self.qk_norm = config.qk_norm  # read once: config lookups are slow
        if self.qk_norm:
            # Normalised queries and keys bound the scores, which steadies training at high learning rates.
            self.q_norm = TinyTxRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = TinyTxRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None, cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        # Queries ("what am I looking for"), keys ("what do I offer"), values ("what
        # I pass on"), split into heads.
        query_states = self.q_proj(hidden_states).view(hidden_shape)
        key_states = self.k_proj(hidden_states).view(hidden_shape)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if self.qk_norm:
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        query_states = query_states.transpose(1, 2)
        key_states = key_states.transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if cache is not None:
            # Append this step's keys/values and get back everything seen so far.
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        # The backend is called right here, in forward: vLLM's Transformers backend
        # finds it by reading this source.
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs,
        )

        # Concatenate the heads, then mix them back into the residual stream's width.
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class TinyTxDecoderLayer(GradientCheckpointingLayer):
    """One residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: TinyTxConfig, layer_idx: int):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = TinyTxAttention(config=config, layer_idx=layer_idx)
        self.mlp = TinyTxMLP(config)
        self.input_layernorm = TinyTxRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = TinyTxRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None, cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        # Mix across positions.
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states, position_embeddings=position_embeddings,
            attention_mask=attention_mask, cache=cache, **kwargs,
        )
        hidden_states = residual + hidden_states

        # Think inside each position.
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


@auto_docstring
class TinyTxPreTrainedModel(PreTrainedModel):
    config_class = TinyTxConfig
    config: TinyTxConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TinyTxDecoderLayer"]
    _skip_keys_device_placement = ["cache", "past_key_values"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": TinyTxDecoderLayer, "attentions": TinyTxAttention}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # Linear/embedding ~ N(0, initializer_range), norms to one, RoPE tables
        # recomputed (they are not saved).
        super()._init_weights(module)
        # GPT-2's residual scaling: the projections that write into the residual stream start
        # smaller by 1/sqrt(2 * layers), so the stream's variance does not grow with depth
        # (loaded weights stay untouched).
        if isinstance(module, (TinyTxAttention, TinyTxMLP)):
            projection = module.o_proj if isinstance(module, TinyTxAttention) else module.down_proj
            std = self.config.initializer_range / math.sqrt(2 * self.config.num_hidden_layers)
            init.normal_(projection.weight, mean=0.0, std=std)


# Tensor-parallel styles that split output features evenly over the ranks
# (`unit_colwise` shares heads instead).
EVEN_SPLITS = ("colwise", "colwise_rep", "colwise_gather_output")
HEAD_COUNTS = {
    "q_proj": "num_attention_heads", "k_proj": "num_key_value_heads", "v_proj": "num_key_value_heads",
}


def _check_tensor_parallel_heads(config: TinyTxConfig) -> None:
    """An even split of q/k/v over a rank count that does not divide their heads would fail in
    the first forward as a reshape error. The plan is the config's, under the
    `distributed_config`'s own `tp_plan` (empty: no TP)."""
    distributed = getattr(config, "distributed_config", None)
    tp_size = getattr(distributed, "tp_size", None) or 1
    override = getattr(distributed, "tp_plan", None)
    if tp_size == 1 or override == {}:
        return
    # The override names modules from the causal LM down ("model.layers.*..."),
    # the config from the base model.
    override = override.items() if isinstance(override, dict) else ()
    plan = {
        **(config.base_model_tp_plan or {}), **{key.removeprefix("model."): style for key, style in override},
    }
    for key, style in plan.items():
        projection = key.rsplit(".", 1)[-1]
        kind = HEAD_COUNTS.get(projection)
        if ".self_attn." in key and kind and style in EVEN_SPLITS and getattr(config, kind) % tp_size:
            raise ValueError(
                f"Tensor parallelism over {tp_size} processes with the {style!r} plan for {projection} needs "
                f"{kind} ({getattr(config, kind)}) to be divisible by {tp_size}; run on a process count that "
                "divides it (or 1 process), or shard the attention with 'unit_colwise'/'unit_rowwise', "
                "which share heads."
            )


@auto_docstring
class TinyTxModel(TinyTxPreTrainedModel):
    def __init__(self, config: TinyTxConfig):
        super().__init__(config)
        _check_tensor_parallel_heads(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size

        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [TinyTxDecoderLayer(config, idx) for idx in range(config.num_hidden_layers)]
        )
        self.norm = TinyTxRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = TinyTxRotaryEmbedding(config=config)
        self.gradient_checkpointing = False

        self.post_init()

    @_warn_on_the_old_cache_name
    @merge_with_config_defaults
    @capture_outputs
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None, cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None, use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPast:
        r"""
        cache (`Cache`, *optional*):
            Keys and values of the tokens already seen, extended in place
            (`past_key_values` before transformers 5.24).
        """
        cache = _pop_cache(cache, kwargs)
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("TinyTxModel: pass exactly one of `input_ids` or `inputs_embeds`.")

        self._check_shape(input_ids, inputs_embeds)
        if inputs_embeds is None:
            self._check_token_ids(input_ids)
            inputs_embeds = self.embed_tokens(input_ids)

        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)

        if position_ids is None:
            past_seen_tokens = cache.get_seq_length() if cache is not None else 0
            position_ids = (
                torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            )
            position_ids = position_ids.unsqueeze(0)
        self._warn_once_past_context(inputs_embeds.shape[1], cache)
        self._check_attention_mask(attention_mask, inputs_embeds, cache)

        causal_mask = create_causal_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
            position_ids=position_ids, **{_MASK_CACHE_ARG: cache},
        )

        hidden_states = inputs_embeds
        # One cos/sin table for the whole stack: every layer rotates by the same positions.
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)

        for decoder_layer in self.layers[: self.config.num_hidden_layers]:
            hidden_states = decoder_layer(
                hidden_states, position_embeddings=position_embeddings, attention_mask=causal_mask,
                position_ids=position_ids, cache=cache, **kwargs,
            )

        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, **{_CACHE_FIELD: cache})

    def _check_shape(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> None:
        # A single sequence's 1-D ids would fail below as a bare `IndexError: tuple index out of range`.
        if input_ids is not None and input_ids.dim() != 2:
            raise ValueError("TinyTxModel: `input_ids` must be 2-D (batch, sequence), got shape "
                             f"{tuple(input_ids.shape)}; add a batch dimension for a single sequence: "
                             "`input_ids[None]` (or `input_ids.unsqueeze(0)`).")
        if inputs_embeds is not None and inputs_embeds.dim() != 3:
            raise ValueError(
                "TinyTxModel: `inputs_embeds` must be 3-D (batch, sequence, hidden_size), got shape "
                f"{tuple(inputs_embeds.shape)}; add a batch dimension for a single sequence: "
                "`inputs_embeds[None]`."
            )
        inputs = input_ids if inputs_embeds is None else inputs_embeds
        # Zero tokens (e.g. an empty prompt tokenized without BOS) would fail deep in
        # attention with a reshape error.
        if inputs.shape[1] == 0:
            bos = self.config.bos_token_id
            example = f"`torch.tensor([[{bos}]])`" if bos is not None else "the tokenizer's BOS id"
            raise ValueError(
                f"TinyTxModel: `input_ids` is empty (shape {tuple(inputs.shape[:2])}), so there is nothing "
                f"to continue from; pass at least one token, e.g. the BOS id: {example}."
            )

    def _warn_once_past_context(self, new_tokens: int, cache: Cache | None) -> None:
        """Positions past `max_position_embeddings` were never trained on. Once per model, by a flag:
        `warning_once` would warn at every new token, as the message names the length."""
        if getattr(self, "_warned_past_context", False) or torch.compiler.is_compiling():
            return
        if self.rotary_emb.rope_type == "dynamic" or not (cache is None or hasattr(cache, "get_seq_length")):
            # "dynamic" RoPE rescales itself past the limit (what it is for); a paged cache has no length
            return
        limit = self.config.max_position_embeddings
        length = new_tokens + (int(cache.get_seq_length()) if cache is not None else 0)
        if length > limit:
            self._warned_past_context = True
            logger.warning(
                f"TinyTxModel: a sequence of {length} tokens is longer than max_position_embeddings={limit}, "
                f"the longest this model is configured for; positions past {limit} extrapolate RoPE and the "
                "outputs there may degrade (a RoPE scaling type in `rope_parameters` extends the context)."
            )

    def _check_token_ids(self, input_ids: torch.Tensor) -> None:
        # An out-of-range id is a bare IndexError on CPU. On an accelerator, reading the bounds back would
        # stall every step: there the embedding's own device-side assert catches it.
        if torch.compiler.is_compiling() or input_ids.numel() == 0 or input_ids.device.type != "cpu":
            return
        low, high = (int(bound) for bound in torch.aminmax(input_ids))  # one pass over the ids, not two
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"TinyTxModel: `input_ids` must lie in [0, vocab_size={self.config.vocab_size}), but they "
                f"span [{low}, {high}]. The tokenizer and the model disagree: use the tokenizer saved with "
                f"this model, or build the model with vocab_size >= {high + 1}."
            )

    @staticmethod
    def _check_attention_mask(attention_mask, inputs_embeds: torch.Tensor, cache: Cache | None) -> None:
        if (
            attention_mask is None
            or not isinstance(attention_mask, torch.Tensor)
            or attention_mask.dim() == 4
        ):
            return  # 4D masks and flex BlockMasks are the caller's own business
        batch_size, seq_len = inputs_embeds.shape[:2]
        if attention_mask.dim() != 2:
            raise ValueError(
                "TinyTxModel: `attention_mask` must be 2D (batch, tokens) with 1 for real tokens and 0 for "
                f"padding (or a prepared 4D mask), but it has shape {tuple(attention_mask.shape)}; a single "
                "sequence's 1D mask gets its batch dimension from `attention_mask[None]`."
            )
        # The cached length is unknown under torch.compile (a static cache's length is a tensor
        # there) and for paged caches (no `get_seq_length`; continuous batching passes no 2D mask
        # anyway): then check what shapes allow.
        past_seen_tokens = None
        if not torch.compiler.is_compiling() and (cache is None or hasattr(cache, "get_seq_length")):
            past_seen_tokens = cache.get_seq_length() if cache is not None else 0
        width = attention_mask.shape[1]
        length_ok = width >= seq_len if past_seen_tokens is None else width == past_seen_tokens + seq_len
        if attention_mask.shape[0] != batch_size or not length_ok:
            cached = "some" if past_seen_tokens is None else past_seen_tokens
            expected = "cached + new tokens" if past_seen_tokens is None else past_seen_tokens + seq_len
            raise ValueError(
                f"TinyTxModel: the 2D `attention_mask` has shape {tuple(attention_mask.shape)}, but the "
                f"input is batch {batch_size} x {seq_len} tokens (plus {cached} cached). It must be (batch, "
                f"cached + new tokens) = ({batch_size}, {expected}): pass the mask the tokenizer returned "
                "with these `input_ids`."
            )


@auto_docstring
class TinyTxForCausalLM(TinyTxPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: TinyTxConfig):
        super().__init__(config)
        self.model = TinyTxModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

        self.post_init()

    @_warn_on_the_old_cache_name
    @can_return_tuple
    @auto_docstring
    def forward(
        self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None, cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None, labels: torch.LongTensor | None = None,
        use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        r"""
        cache (`Cache`, *optional*):
            Keys and values of the tokens already seen, extended in place
            (`past_key_values` before transformers 5.24).

        Example:

        ```python
        >>> import hf_tinytx
        >>> from transformers import AutoModelForCausalLM, AutoTokenizer
        >>> model = AutoModelForCausalLM.from_pretrained("path/to/tinytx")
        >>> tokenizer = AutoTokenizer.from_pretrained("path/to/tinytx")
        >>> text = "The animal didn't cross the street because it was too tired."
        >>> inputs = tokenizer(text, return_tensors="pt")
        >>> output_ids = model.generate(**inputs, max_new_tokens=20)
        ```"""
        cache = _pop_cache(cache, kwargs)
        if use_cache is None and labels is not None and cache is None:
            # A forward that computes a loss reads no cache: building one would copy every layer's keys and
            # values for nothing (ask with `use_cache=True` to get one anyway).
            use_cache = False
        outputs: BaseModelOutputWithPast = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs,
        )

        hidden_states = outputs.last_hidden_state
        # Generation only needs the last position's logits: skip the (vocab x width) matmul for the rest.
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, slice_indices, :])

        loss = None
        if labels is not None:
            # Shifts labels, ignores -100 and divides by `num_items_in_batch` when given
            # (exact gradient accumulation).
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )

        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions,
            **{_CACHE_FIELD: getattr(outputs, _CACHE_FIELD)},
        )


class TinyTxForSequenceClassification(GenericForSequenceClassification, TinyTxPreTrainedModel):
    """TinyTx with a linear head on the last non-padding token's hidden state."""


__all__ = ["TinyTxPreTrainedModel", "TinyTxModel", "TinyTxForCausalLM", "TinyTxForSequenceClassification"]
