"""One answer as transformers' server streams it (server-sent events of OpenAI's chunks), gathered as it
comes, so that the front can end it early (a stop signal) and still answer: a streamed answer with a closing
chunk, any other with OpenAI's whole-answer JSON built from the chunks.

The front asks transformers for a stream even when its client did not: a stream is what can be cut and still
hold the text so far. A stream that runs to its end carries transformers' own usage
(`stream_options.include_usage`); a cut one counts its tokens with the model's tokenizer.
"""

import time


class Answer:
    """The chunks of one streamed answer, to /v1/completions (`chat` False) or /v1/chat/completions."""

    def __init__(self, chat: bool, prompt_tokens: int):
        self.chat, self.prompt_tokens = chat, prompt_tokens
        self.last: dict | None = None  # the latest chunk with a choice: its id, model, created
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list[dict] = []
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.error: str | None = None  # transformers' error event
        self.started = False  # whether transformers began to answer (its response's head came)

    def add(self, chunk: dict) -> None:
        if "error" in chunk:
            self.error = str(chunk["error"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            self.last = chunk
            part = (choice.get("delta") or {}) if self.chat else choice
            self.text.append(part.get("content" if self.chat else "text") or "")
            self.reasoning.append(part.get("reasoning_content") or "")
            for call in part.get("tool_calls") or []:
                self.tool_calls.append({key: value for key, value in call.items() if key != "index"})
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def closing_chunk(self) -> dict:
        """The chunk that ends a stream cut short: no new text, finish_reason "stop" (transformers reports an
        early stop, by its max_time, the same way; OpenAI's clients take no other word for it)."""
        choice = {"index": 0, "delta": {}} if self.chat else {"index": 0, "text": ""}
        return {**self.envelope(), "choices": [{**choice, "finish_reason": "stop"}]}

    def cut_usage(self, count) -> dict:
        """The usage of an answer cut short, its tokens counted with `count(text)`."""
        completion = count("".join(self.text) + "".join(self.reasoning))
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def whole(self, count) -> dict:
        """The answer as transformers answers a request that does not stream."""
        usage = self.usage or self.cut_usage(count)
        text = "".join(self.text)
        if self.chat:
            message = {"role": "assistant", "content": text}
            if self.tool_calls:
                message["tool_calls"] = self.tool_calls
            if any(self.reasoning):
                message["reasoning_content"] = "".join(self.reasoning)
            choice = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": text}
        return {**self.envelope(), "object": "chat.completion" if self.chat else "text_completion",
                "choices": [{**choice, "finish_reason": self.finish_reason or "stop"}], "usage": usage}

    def envelope(self) -> dict:
        """The fields every chunk of the answer shares."""
        last = self.last or {}
        default_object = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": last.get("id", ""), "object": last.get("object", default_object),
                "created": last.get("created", int(time.time())), "model": last.get("model", "")}
