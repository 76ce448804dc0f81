"""Saved model folders, read and written with the standard library (no torch):

    safe.py       reading and writing safely: never through a link out, never half-written
    location.py   a local folder or a Hub id, and which files make a tokenizer
    config.py     what a folder's config.json says, and its vocabulary against the embedding
    weights.py    the tensors' names and shapes, from the safetensors headers
"""
