"""Sharded training: what the launch asked for (`accelerate launch` passes its config through the
environment), and torch's FSDP2 where Accelerate would silently train unsharded (on CPUs): `fully_shard`
on each decoder layer and the root over gloo, Accelerate's optimizer and scheduler wrappers, and a full
state dict gathered on rank 0 for the export.
"""

import contextlib
import os
import warnings

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.scheduler import AcceleratedScheduler
from accelerate.utils import DistributedType

from hf_tinytx_training.distributed.cluster import process_group_kwargs
from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.pretrain_args import env_flag


def asked_sharding() -> str | None:
    """"fsdp2", "deepspeed" or None, from Accelerate's launch environment; a config
    this script cannot run stops."""
    if env_flag("ACCELERATE_USE_FSDP"):
        version = os.environ.get("FSDP_VERSION", "1")
        if version != "2":
            raise UserInputError(
                f"The Accelerate config asks for FSDP version {version}; this script trains with FSDP2 only: "
                "set fsdp_version: 2 (see training/configs/accelerate-fsdp2.yaml)."
            )
        return "fsdp2"
    if env_flag("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    return None


def gpu_config_without_gpus() -> bool:
    """Whether `accelerate launch` ran a plain multi-GPU config without GPUs (it
    then trains on CPUs over gloo)."""
    launched_for_gpus = "ACCELERATE_MIXED_PRECISION" in os.environ and "ACCELERATE_USE_CPU" not in os.environ
    plain_gpu_config = not (env_flag("ACCELERATE_USE_FSDP") or env_flag("ACCELERATE_USE_DEEPSPEED"))
    return launched_for_gpus and plain_gpu_config and not has_gpu()


def has_gpu() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def cpu_runs_bf16_fast() -> bool:
    """Whether this CPU has oneDNN's bf16 kernels (AVX-512 or AMX); without them
    bf16 runs many times slower."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def slow_bf16(flag: str) -> str:
    return (
        f"{flag}: this CPU has no bf16 matrix instructions (AVX-512 or AMX), so bf16 matmuls run many times "
        f"slower than fp32 here; training without {flag} will be faster."
    )


def device_options(sharding: str | None, ddp_timeout: float) -> dict:
    """Accelerator arguments for the device and the process group (collectives wait at most
    `ddp_timeout` s). Without a GPU `cpu=True`, but for DeepSpeed, which it turns off: that runs on
    DeepSpeed's CPU accelerator over gloo."""
    if sharding == "deepspeed":
        # ZeRO calls collectives torch deprecates: a FutureWarning on every call, which no user can act on.
        warnings.filterwarnings(
            "ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning
        )
    if has_gpu():
        return {"kwargs_handlers": [process_group_kwargs(ddp_timeout)]}
    if sharding == "deepspeed":
        # DeepSpeed's CPU accelerator would JIT-build a shared-memory all-reduce
        # (minutes) that gloo never uses.
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        return {"kwargs_handlers": [process_group_kwargs(ddp_timeout, backend="gloo")]}
    return {"cpu": True, "kwargs_handlers": [process_group_kwargs(ddp_timeout)]}


def apply_flags_to_deepspeed_config(accelerator: Accelerator, train_args) -> None:
    """DeepSpeed's config takes the flags' accumulation and clipping where it says
    "auto" or nothing, else refuses."""
    if zero_stage(accelerator) is None:
        return
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    for key, flag, value in (("gradient_accumulation_steps", "--gradient_accumulation_steps",
                              train_args.gradient_accumulation_steps),
                             ("gradient_clipping", "--max_grad_norm", train_args.max_grad_norm)):
        setting = config.get(key, "auto")
        if setting == "auto":
            config[key] = value
        elif float(setting) != value:
            raise UserInputError(
                f"The DeepSpeed config sets {key}: {setting} but this run has {flag} {value}; remove it from "
                f"the Accelerate config (the flag decides) or pass {flag} {setting}."
            )


def zero_stage(accelerator: Accelerator) -> int | None:
    """The DeepSpeed ZeRO stage of this run, None without DeepSpeed."""
    plugin = (
        accelerator.state.deepspeed_plugin
        if accelerator.distributed_type == DistributedType.DEEPSPEED
        else None
    )
    return plugin.zero_stage if plugin is not None else None


@contextlib.contextmanager
def building_model(accelerator: Accelerator):
    """Where the model is built. Under ZeRO-3 with zero3_init_flag false transformers would still
    build it partitioned (other weights from the same seed): it is built whole here, as on 1
    process, and partitioned in `prepare`."""
    plugin = accelerator.state.deepspeed_plugin if zero_stage(accelerator) == 3 else None
    if plugin is None or plugin.zero3_init_flag:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()  # generate and save_pretrained look for it


def full_shape(parameter: torch.Tensor) -> torch.Size:
    """A parameter's shape, also under ZeRO-3's zero3_init_flag (an empty tensor, the shape in ds_shape)."""
    return getattr(parameter, "ds_shape", parameter.shape)


def shards_itself(accelerator: Accelerator, sharding: str | None) -> bool:
    """Whether this module, not Accelerate, shards the model: FSDP2 asked for
    where Accelerate fell back to DDP."""
    asked = sharding == "fsdp2" and accelerator.num_processes > 1  # one process has nothing to share
    return asked and accelerator.distributed_type != DistributedType.FSDP


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """torch's FSDP2 on every decoder layer, then the root; call before the optimizer is built."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    reshard = env_flag("FSDP_RESHARD_AFTER_FORWARD") if "FSDP_RESHARD_AFTER_FORWARD" in os.environ else True
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def prepare(accelerator: Accelerator, own_fsdp2: bool, model, optimizer, train_dataloader, eval_dataloader,
            lr_scheduler):
    """`accelerator.prepare` for all five, or, for a model sharded here, for the
    loaders only (see the docstring)."""
    if not own_fsdp2:
        return accelerator.prepare(model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)
    train_dataloader, eval_dataloader = accelerator.prepare(train_dataloader, eval_dataloader)
    optimizer = AcceleratedOptimizer(optimizer, device_placement=False)
    lr_scheduler = AcceleratedScheduler(
        lr_scheduler, optimizer, step_with_optimizer=True, split_batches=False
    )
    return model, optimizer, train_dataloader, eval_dataloader, lr_scheduler


def local_and_full(tensors) -> tuple[int, int, int]:
    """(values held by this process, values in all, bytes held by this process)
    of (possibly sharded) tensors."""
    local = full = size = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            continue  # AdamW's step counters
        if hasattr(tensor, "to_local"):  # an FSDP2 DTensor
            shard, numel = tensor.to_local(), tensor.numel()
        elif hasattr(tensor, "ds_tensor"):  # a ZeRO-3 parameter's partition
            shard, numel = tensor.ds_tensor, tensor.ds_numel
        else:
            shard, numel = tensor, tensor.numel()
        local, full, size = local + shard.numel(), full + numel, size + shard.numel() * shard.element_size()
    return local, full, size


def shard_report(model, optimizer, accelerator: Accelerator) -> str:
    """One line: what this process holds of the parameters and of the optimizer state; every process must call
    it (DeepSpeed's flat state partitions do not know the whole, hence the sum over ranks)."""
    # Accelerate's wrapper, then DeepSpeed's ZeRO optimizer, then AdamW
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    p_local, p_full, p_bytes = local_and_full(model.parameters())
    states = [value for state in optimizer.state.values() for value in state.values()]
    s_local, _, s_bytes = local_and_full(states)
    s_full = int(accelerator.reduce(torch.tensor(s_local, device=accelerator.device), reduction="sum").item())
    return (
        f"rank {accelerator.process_index} of {accelerator.num_processes} holds {p_local:,} of {p_full:,} "
        f"parameters ({p_local / max(p_full, 1):.1%}, {p_bytes:,} bytes) and {s_local:,} of {s_full:,} "
        f"optimizer-state values ({s_local / max(s_full, 1):.1%}, {s_bytes:,} bytes)"
    )


def model_and_weights_to_save(model, state_dict: dict) -> tuple[torch.nn.Module, dict]:
    """(model, state dict) for `save_pretrained`; an FSDP model (torch's subclass)
    becomes a plain one, tied again."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return model, without_tied_copies(model, state_dict)
    original = next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))
    with torch.device("meta"):
        plain = original(model.config)
    plain.load_state_dict(state_dict, assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval(), plain.state_dict()


def without_tied_copies(model, state_dict: dict) -> dict:
    """DeepSpeed's gathered state dict clones every tensor: a tied head is left
    out, as save_pretrained would."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return state_dict
    tied = {target for target, source in (getattr(model, "_tied_weights_keys", None) or {}).items()
            if target in state_dict and source in state_dict}
    return {name: tensor for name, tensor in state_dict.items() if name not in tied}


def full_state_dict(model) -> dict:
    """The whole model's state dict on rank 0 (an empty dict elsewhere); every process must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def gather_for_saving(
    accelerator: Accelerator, model, own_fsdp2: bool
) -> tuple[torch.nn.Module, dict] | None:
    """(model, full state dict) for `save_pretrained` on the main process, None
    elsewhere; every process takes part."""
    state_dict = full_state_dict(model) if own_fsdp2 else accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return None
    return model_and_weights_to_save(accelerator.unwrap_model(model), state_dict)


def peak_gpu_memory(accelerator) -> dict:
    """This process's peak of allocated CUDA memory, for the record (a host-side counter)."""
    if accelerator.device.type != "cuda":
        return {}
    return {"peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated(accelerator.device) / 2**30, 3)}
