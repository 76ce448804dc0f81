"""Model card templates (Jinja), installed as hf_tinytx_training.model_cards and rendered by training/cards.py."""
