"""Silences notices a user cannot act on, for the commands; the library never calls this, so importing `hf_tinytx`
changes no other package's logging.

DeepSpeed, imported by transformers whenever a model is saved or loaded, logs "Setting accelerator to CPU. If you
have GPU ..." at every command. Where torch sees no accelerator that line says nothing, so it is dropped there.
"""

import logging


DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def quiet_notices() -> None:
    """Installs the filters above (once; before or after DeepSpeed is imported: its logger is looked up by name)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6 knows CUDA, ROCm, XPU, MPS, ... in one place
    if accelerator is not None and accelerator.is_available():
        return
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DropMessage) for f in logger.filters):
        logger.addFilter(_DropMessage(DEEPSPEED_CPU_NOTICE))
