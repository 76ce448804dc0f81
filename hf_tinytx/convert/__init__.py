"""Conversion of saved folders (`python -m hf_tinytx.convert`, `tinytx convert`):

    llama.py          Llama <-> TinyTx, in memory or folder to folder (config translation; weights as they
                      are)
    gguf.py           a TinyTx folder as one GGUF file, model and tokenizer, for llama.cpp
    saved_folder.py   what a converter checks in a source folder before it writes anything
    __main__.py       the command: flags, one line and an exit status at the end
"""

from hf_tinytx.convert.llama import (
    convert_folder,
    llama_config_to_tinytx,
    llama_to_tinytx,
    tinytx_config_to_llama,
    tinytx_to_llama,
)


__all__ = [
    "convert_folder", "llama_config_to_tinytx", "llama_to_tinytx", "tinytx_config_to_llama",
    "tinytx_to_llama",
]
