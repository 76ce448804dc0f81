"""Greedy decoding in vLLM, timed, for benchmarks/generate.py: a JSON request a
line on stdin, an answer a line.

Runs under the interpreter of .venv-vllm (vLLM with its own torch and transformers; hf_tinytx is not installed
there, a TinyTx folder loads through its remote code). Same protocol as llama_cpp_worker.py:

    {"load": NAME, "model": FOLDER, ...}                        -> {"loaded": NAME, "architecture": CLASS}
    {"run": NAME, "prompts": [[ID, ...], ...], "new_tokens": K} -> {"seconds": S, "tokens": [[ID, ...], ...]}

A run hands every prompt to the engine at once (vLLM batches them itself),
greedy, ignoring end-of-sequence tokens.
"""

import json
import os
import sys
import time

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM logs to stdout: that goes to stderr, stdout keeps only the answers
    engines = {}
    for line in sys.stdin:
        request = json.loads(line)
        if "load" in request:
            # float32 like the other engines (vLLM's "auto" would run a float32 checkpoint in half precision).
            llm = LLM(model=request["model"], trust_remote_code=True, dtype="float32", seed=0)
            engines[request["load"]] = llm
            answer = {"loaded": request["load"], "architecture": llm.model_config.architecture}
        else:
            greedy = SamplingParams(temperature=0.0, max_tokens=request["new_tokens"], ignore_eos=True)
            prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
            start = time.perf_counter()
            outputs = engines[request["run"]].generate(prompts, greedy, use_tqdm=False)
            answer = {"seconds": time.perf_counter() - start,
                      "tokens": [list(output.outputs[0].token_ids) for output in outputs]}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":  # vLLM starts its engine in a child process, which imports this file again
    main()
