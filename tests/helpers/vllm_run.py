"""Runs model folders in vLLM's offline engine (`vllm.LLM`) and prints what it generated, as JSON.

Run with the interpreter of .venv-vllm (vLLM and its own torch and transformers; hf_tinytx is not installed
there: a TinyTx folder loads through its remote code): test_vllm.py sends the cases on stdin and compares the
answer with transformers' greedy `generate`. Input:

    {"cases": [{"model": PATH, "prompts": [STR, ...], "messages": [{"role":
    ..., "content": ...}, ...] or null,
                "max_tokens": K}, ...]}

Output, one entry a case: {"architecture": the model class vLLM resolved ("TransformersForCausalLM" for
its Transformers modeling backend), "prompt_ids": [...] and "token_ids": [...] (each text prompt's
tokens and its greedy continuation), and, when the case has messages, "chat_prompt_ids" and
"chat_token_ids" (the same for `LLM.chat`)}.

vLLM starts its engine in a child process, which needs the `__main__` guard below.
"""

import gc
import json
import os
import sys

from vllm import LLM, SamplingParams


def run_case(case: dict) -> dict:
    # float32, as transformers computes in the test (vLLM's "auto" runs a float32 checkpoint in half
    # precision). Eager: the test's server and README snippet run the compiled path; compiling here
    # again would check nothing new. A 1 GiB key/value cache, as the README's commands ask (vLLM's
    # default: 92% of the machine's memory).
    llm = LLM(model=case["model"], trust_remote_code=True, dtype="float32", seed=0, enforce_eager=True,
              kv_cache_memory_bytes=1 << 30)
    greedy = SamplingParams(temperature=0.0, max_tokens=case["max_tokens"])
    outputs = llm.generate(case["prompts"], greedy, use_tqdm=False)
    result = {
        "architecture": llm.model_config.architecture,
        "prompt_ids": [list(output.prompt_token_ids) for output in outputs],
        "token_ids": [list(output.outputs[0].token_ids) for output in outputs],
    }
    if case.get("messages"):
        (chat,) = llm.chat(case["messages"], greedy, use_tqdm=False)
        result.update(
            chat_prompt_ids=list(chat.prompt_token_ids), chat_token_ids=list(chat.outputs[0].token_ids)
        )
    del llm
    gc.collect()  # shuts the engine's child process down before the next case starts one
    return result


def main() -> None:
    cases = json.load(sys.stdin)["cases"]
    answer = os.fdopen(os.dup(1), "w")
    # vLLM and its engine process log to stdout: that goes to stderr, stdout keeps only the answer
    os.dup2(2, 1)
    json.dump([run_case(case) for case in cases], answer)
    answer.close()


if __name__ == "__main__":
    main()
