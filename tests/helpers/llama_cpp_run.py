"""Runs GGUF files in llama.cpp (through llama-cpp-python) and prints what it computed, as JSON.

Run with the interpreter of .venv-llamacpp (llama-cpp-python and numpy; no torch, no hf_tinytx): test_gguf.py
sends the cases on stdin and compares the answer with transformers. Input:

    {"cases": [{"gguf": PATH, "n_ctx": N, "texts": [STR, ...], "prompts": [[ID, ...], ...],
                "greedy_prompts": [[ID, ...], ...], "new_tokens": K}, ...]}

Output, one entry a case: {"ids": [...] (each text tokenized, no BOS, special tokens not parsed), "logits":
[...] (each prompt's logits at every position), "greedy": [...] (each greedy prompt's first K tokens from
llama.cpp's own greedy sampler, temperature 0 and no penalties, stopping after the end-of-sequence token)}.
"""

import json
import sys

import llama_cpp.llama_cpp as llama_cpp_c
from llama_cpp import Llama


def without_weight_repacking():
    """llama.cpp's defaults without repacking (its --no-repack): on a CPU with Intel AMX it repacks q8_0
    matrices and segfaults in the matmul (llama-cpp-python 0.3.36;
    github.com/ggml-org/llama.cpp/issues/20824)."""
    params = default_model_params()
    params.use_extra_bufts = False
    return params


default_model_params = llama_cpp_c.llama_model_default_params
# what Llama() builds its model parameters from
llama_cpp_c.llama_model_default_params = without_weight_repacking


def run_case(case: dict) -> dict:
    # An f32 key/value cache (llama.cpp's default is f16), so that what is
    # compared is the file, not the cache.
    llm = Llama(
        model_path=case["gguf"], n_ctx=case["n_ctx"], n_batch=case["n_ctx"], logits_all=True, seed=0,
        type_k=llama_cpp_c.GGML_TYPE_F32, type_v=llama_cpp_c.GGML_TYPE_F32, n_threads=2, verbose=False,
    )
    ids = [llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) for text in case["texts"]]
    logits, greedy = [], []
    for prompt in case["prompts"]:
        llm.reset()
        llm.eval(prompt)
        logits.append(llm.scores[: len(prompt)].tolist())
    for prompt in case["greedy_prompts"]:
        llm.reset()
        tokens = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            tokens.append(int(token))
            if llm.token_eos() == token or len(tokens) == case["new_tokens"]:
                break
        greedy.append(tokens)
    llm.close()
    return {"ids": ids, "logits": logits, "greedy": greedy}


def main() -> None:
    cases = json.load(sys.stdin)["cases"]
    json.dump([run_case(case) for case in cases], sys.stdout)


if __name__ == "__main__":
    main()
