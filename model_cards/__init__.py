"""Model card templates (Jinja), installed as hf_tinytx_training.model_cards.

Rendered by training/publish/cards.py.
"""
