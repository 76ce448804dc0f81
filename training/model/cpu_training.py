"""Two speed paths for training TinyTx on a CPU, put in by `speed_up_cpu_training(model)` (not in the model
file, which every checkpoint copies). Figures: docs/performance.md.

- RMSNorm with its backward written out (torch has no fused CPU kernel): `CpuTrainingRMSNorm`, same parameter.
- Under bf16 autocast, attention in fp32 (torch's CPU flash attention is far slower backwards in bf16).
"""

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hf_tinytx.modeling_tinytx import TinyTxRMSNorm


FP32_SDPA = "sdpa_fp32_under_cpu_autocast"


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) * w, with its gradient written out."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # 1 / rms(x) per row: one reduction (the row's vector norm), then arithmetic on one number per row.
        inv_rms = (
            torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        )
        ctx.save_for_backward(x, weight, inv_rms)
        return torch.mul(x, inv_rms).mul_(weight)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        # y = n * w with n = x / rms(x). With h = g * w (the gradient reaching n):
        #   dL/dx = (h - n * mean(h * n)) / rms(x)   (rescaling x does not change n: that direction is
        #                                            projected out)
        #   dL/dw = the sum over rows of g * n
        x, weight, inv_rms = ctx.saved_tensors
        normed = x * inv_rms
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_normed = grad_output * weight
            mean_dot = torch.linalg.vecdot(grad_normed, normed).unsqueeze(-1).div_(x.shape[-1])
            grad_x = torch.addcmul(grad_normed, normed, mean_dot, value=-1).mul_(inv_rms)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_output * normed).reshape(-1, weight.shape[0]).sum(0)
        return grad_x, grad_weight, None


class CpuTrainingRMSNorm(TinyTxRMSNorm):
    """TinyTx's RMSNorm, with `_RMSNormFunction` where it pays: fp32 on a CPU under autograd, not compiled."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if (hidden_states.device.type == "cpu" and hidden_states.dtype == self.weight.dtype == torch.float32
                and torch.is_grad_enabled() and (hidden_states.requires_grad or self.weight.requires_grad)
                and not torch.compiler.is_compiling()):
            return _RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon)
        return super().forward(hidden_states)


def fp32_sdpa_under_cpu_autocast(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """sdpa, run in fp32 with autocast off when a CPU autocast is on; plain sdpa otherwise."""
    if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)
    with torch.autocast("cpu", enabled=False):
        return sdpa_attention_forward(module, query.float(), key.float(), value.float(), *args, **kwargs)


AttentionInterface.register(FP32_SDPA, fp32_sdpa_under_cpu_autocast)
AttentionMaskInterface.register(FP32_SDPA, sdpa_mask)  # the same boolean mask sdpa takes


def speed_up_cpu_training(model: nn.Module) -> nn.Module:
    """Puts both speed paths into a TinyTx model (or one wrapped by PEFT) in place; returns it. What
    `save_pretrained` writes stays the same (the attention backend is not saved)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base.config.model_type != "tinytx":
        return model
    for module in model.modules():
        if type(module) is TinyTxRMSNorm:
            module.__class__ = CpuTrainingRMSNorm  # same parameters and hooks; only forward differs
    if base.config._attn_implementation == "sdpa":
        base.set_attn_implementation(FP32_SDPA)
    return model
