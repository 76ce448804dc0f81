"""Silences notices a user cannot act on, for the commands (the library itself never calls this):
DeepSpeed's "Setting accelerator to CPU" where torch sees no accelerator, and Accelerate's "Removed shared
tensor" at every save of a model with tied embeddings.
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
    """Installs the filters (once; before or after DeepSpeed is imported)."""
    import torch

    _drop("accelerate.utils.other", SHARED_TENSOR_NOTICE)
    # torch >= 2.6 knows CUDA, ROCm, XPU, MPS, ... in one place
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return
    _drop("DeepSpeed", DEEPSPEED_CPU_NOTICE)
