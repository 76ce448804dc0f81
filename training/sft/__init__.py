"""Supervised fine-tuning's pieces for finetune.py: flags, records, rows, the base model and LoRA, callbacks."""
