"""Silences notices a user cannot act on, for the commands; the library never calls this, so importing `hf_tinytx`
changes no other package's logging.

DeepSpeed, imported by transformers whenever a model is saved or loaded, logs "Setting accelerator to CPU. If you
have GPU ..." at every command. Where torch sees no accelerator that line says nothing, so it is dropped there.
Accelerate logs "Removed shared tensor {'lm_head.weight'} while saving" at every checkpoint of a model whose input
and output embeddings are one tensor (the default preset's): safetensors stores it once and loading ties it again.
"""

import logging


DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"
SHARED_TENSOR_NOTICE = "Removed shared tensor"


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("[RANK "):  # Accelerate's per-process prefix
            message = message.partition("] ")[2]
        return not message.startswith(self.start)


def _drop(logger_name: str, start: str) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _DropMessage) and f.start == start for f in logger.filters):
        logger.addFilter(_DropMessage(start))


def quiet_notices() -> None:
    """Installs the filters above (once; before or after DeepSpeed is imported: its logger is looked up by name)."""
    import torch

    _drop("accelerate.utils.other", SHARED_TENSOR_NOTICE)
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6 knows CUDA, ROCm, XPU, MPS, ... in one place
    if accelerator is not None and accelerator.is_available():
        return
    _drop("DeepSpeed", DEEPSPEED_CPU_NOTICE)
