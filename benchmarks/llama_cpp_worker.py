"""Greedy decoding in llama.cpp, timed, for benchmarks/generate.py: a JSON request
a line on stdin, an answer a line.

Runs under the interpreter of .venv-llamacpp (llama-cpp-python and numpy, no torch). It drives
llama.cpp's own C API (through llama-cpp-python's bindings) rather than the `Llama` class, so that a
batch of B prompts decodes as B sequences of one context, one `llama_decode` call a step, which is
how llama.cpp's server batches requests.

    {"load": NAME, "gguf": PATH, "batch": B, "n_ctx": N, "threads": T}  -> {"loaded": NAME}
    {"run": NAME, "prompts": [[ID, ...], ...], "new_tokens": K}         -> {"seconds": S, "tokens": [[ID,
                                                                        ...], ...]}

A run decodes the prompts (one batch) and then K - 1 more steps, taking the arg-max token each time, never
stopping at an end-of-sequence token; the seconds cover all of it, as `generate`'s do on the other side.
"""

import ctypes
import json
import sys

import llama_cpp.llama_cpp as ll
import numpy as np


class Engine:
    def __init__(self, gguf: str, batch: int, n_ctx: int, threads: int):
        model_params = ll.llama_model_default_params()
        # No repacking for special CPU instructions: llama.cpp 0.3.36 crashes in
        # AMX's q8_0 path (see test_gguf.py).
        model_params.use_extra_bufts = False
        self.model = ll.llama_model_load_from_file(gguf.encode(), model_params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {gguf}")
        params = ll.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_seq_max = n_ctx * batch, n_ctx * batch, batch
        params.n_threads = params.n_threads_batch = threads
        # f32 keys and values (llama.cpp's default is f16), the cache transformers keeps for an f32 model.
        params.type_k = params.type_v = ll.GGML_TYPE_F32
        self.context = ll.llama_init_from_model(self.model, params)
        self.vocab_size = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.batch = ll.llama_batch_init(n_ctx * batch, 0, batch)

    def close(self) -> None:
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.context)
        ll.llama_model_free(self.model)

    def decode(self, tokens: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode over (token, position, sequence, wants logits) entries."""
        self.batch.n_tokens = len(tokens)
        for i, (token, position, sequence, logits) in enumerate(tokens):
            self.batch.token[i], self.batch.pos[i], self.batch.logits[i] = token, position, logits
            self.batch.n_seq_id[i], self.batch.seq_id[i][0] = 1, sequence
        if ll.llama_decode(self.context, self.batch) != 0:
            raise SystemExit("llama_decode failed")

    def argmax(self, index: int) -> int:
        logits = ctypes.cast(ll.llama_get_logits_ith(self.context, index), ctypes.POINTER(ctypes.c_float))
        return int(np.ctypeslib.as_array(logits, (self.vocab_size,)).argmax())

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        ll.llama_memory_clear(ll.llama_get_memory(self.context), True)
        entries = [(token, pos, seq, pos == len(prompt) - 1) for seq, prompt in enumerate(prompts)
                   for pos, token in enumerate(prompt)]
        self.decode(entries)
        last = [i for i, entry in enumerate(entries) if entry[3]]
        out = [[self.argmax(i)] for i in last]
        for step in range(new_tokens - 1):
            self.decode([(seq_out[-1], len(prompt) + step, seq, True)
                         for seq, (prompt, seq_out) in enumerate(zip(prompts, out))])
            for seq, seq_out in enumerate(out):
                seq_out.append(self.argmax(seq))
        return out


def main() -> None:
    from time import perf_counter

    engines = {}
    ll.llama_backend_init()
    for line in sys.stdin:
        request = json.loads(line)
        if "load" in request:
            if request["load"] in engines:  # the same model again, for another batch size
                engines.pop(request["load"]).close()
            engines[request["load"]] = Engine(
                request["gguf"], request["batch"], request["n_ctx"], request["threads"]
            )
            answer = {"loaded": request["load"]}
        else:
            start = perf_counter()
            tokens = engines[request["run"]].greedy(request["prompts"], request["new_tokens"])
            answer = {"seconds": perf_counter() - start, "tokens": tokens}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
