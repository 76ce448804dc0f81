"""Fine-tuning's pieces for finetune.py: flags, the run, records, rows, the base model and LoRA, callbacks."""
