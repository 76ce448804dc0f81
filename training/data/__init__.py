"""The data a pre-training run reads: files found and checked, a tokenizer, token blocks packed and fitted."""
