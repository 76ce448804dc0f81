"""Silences notices a user cannot act on, for the commands (training, conversion, serving); the library itself never
calls this, so importing `hf_tinytx` changes no other package's logging.

- DeepSpeed, when installed, is imported by transformers as soon as a model is saved or loaded, and on a machine
  without an accelerator logs "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
  detect it." at every command. Where torch itself sees no accelerator that line says nothing; elsewhere it may be
  the one hint that a GPU went undetected, so it is kept.
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
