"""The checks on a request that need its model: the prompt's length against the model's context, the room that
leaves for `max_tokens`, and whether the chat template can take the chat. Then the body transformers' server
gets: `max_tokens` set (the room, up to the cap, when the request names none) and `--max_request_seconds` as
the `max_time` of its `generation_config` field.

This process loads each model's config and tokenizer for these checks (transformers' server loads its own in
the model's process): light next to the model, and loaded once per model name.
"""

import functools
import json
import os
from dataclasses import dataclass

from hf_tinytx.serve.request_checks import Limits, RequestError, first_line, requested_tokens


NO_CHAT_TEMPLATE = (
    "{model} has no chat template, so its chat messages cannot be turned into a prompt: send plain text to "
    "/v1/completions instead, or give the tokenizer a template (tokenizer.chat_template = '...'; "
    "tokenizer.save_pretrained(folder)) and restart the server"
)


@dataclass(frozen=True)
class Model:
    name: str
    tokenizer: object
    context: int | None  # the longest a request may be, prompt and answer, in tokens

    def count(self, text: str) -> int:
        """The tokens of generated text (for a usage when the answer was cut short)."""
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def split_model_name(name: str) -> tuple[str, str | None, str | None]:
    """`repo[@revision][:file.gguf]`, the names `transformers serve` takes, as (repo, revision, GGUF file); an
    existing folder is the repo whole."""
    repo, colon, gguf_file = name.rpartition(":")
    if not colon or not gguf_file.endswith(".gguf"):
        repo, gguf_file = name, None
    if os.path.exists(repo):
        return repo, None, gguf_file
    repo, _, revision = repo.partition("@")
    return repo, revision or None, gguf_file


class Models:
    """The models' tokenizers and contexts, as the server's options shape them."""

    def __init__(self, serve_params: dict, chat_template_kwargs: dict):
        self.force_model = serve_params["force_model"]
        self.max_model_len = serve_params["max_model_len"]
        self.trust_remote_code = serve_params["trust_remote_code"]
        # `--chat-template-kwargs` and `--reasoning`, as parsed
        self.chat_template_kwargs = chat_template_kwargs

    @functools.lru_cache(maxsize=8)  # noqa: B019  (one Models per process)
    def load(self, name: str) -> Model:
        from transformers import AutoConfig, AutoTokenizer

        import hf_tinytx  # noqa: F401  (registers TinyTx with the Auto classes)

        repo, revision, gguf_file = split_model_name(name)
        kwargs = {"revision": revision, "trust_remote_code": self.trust_remote_code}
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        try:
            config = AutoConfig.from_pretrained(repo, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(repo, **kwargs)
        except Exception as error:  # OSError for a missing repo, ValueError for code it may not run, ...
            raise RequestError(f"cannot load model {name!r}: {first_line(error)}", "model", 404,
                               "model_not_found") from None
        context = self.max_model_len or getattr(config.get_text_config(), "max_position_embeddings", None)
        return Model(name, tokenizer, context)

    def fit(self, path: str, body: dict, limits: Limits) -> tuple[dict, int, Model]:
        """(the body transformers gets, the prompt's tokens, the model); RequestError
        if the request does not fit."""
        model = self.load(body.get("model") or self.force_model)
        if "prompt" in body:
            prompt_tokens = len(model.tokenizer(body["prompt"], verbose=False)["input_ids"])
        else:
            prompt_tokens = self.count_chat(model, body)
        tokens = room(model.context, prompt_tokens, body, limits)
        forwarded = {**body, "max_tokens": tokens}
        forwarded.pop("max_completion_tokens", None)  # transformers reads it before max_tokens
        forwarded["generation_config"] = with_time_limit(
            body.get("generation_config"), limits.max_request_seconds
        )
        return forwarded, prompt_tokens, model

    def count_chat(self, model: Model, body: dict) -> int:
        """The chat prompt's length, rendered as transformers' server renders a text model's chat."""
        template = getattr(model.tokenizer, "chat_template", None)
        if template is None:
            raise RequestError(NO_CHAT_TEMPLATE.format(model=model.name), "messages", code="no_chat_template")
        if body.get("tools") and "tools" not in str(template):
            raise RequestError(
                "tools: this model's chat template does not read tools, so the model would never see them "
                "and could call none: leave tools out",
                "tools",
                code="unsupported_field",
            )
        kwargs = {**self.chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}
        try:
            inputs = model.tokenizer.apply_chat_template(
                [template_message(message) for message in body["messages"]], add_generation_prompt=True,
                tools=body.get("tools"), tokenize=True, return_dict=True, **kwargs)
        # jinja2's TemplateError, a kwarg the template does not take, bad tool_calls
        except Exception as error:
            raise RequestError(
                f"the chat template cannot render these messages: {error}"[:300], "messages"
            ) from None
        return len(inputs["input_ids"])


def template_message(message: dict) -> dict:
    """An OpenAI message as a text model's chat template reads it: the text parts joined,
    tool calls' arguments as objects."""
    content = message.get("content") or ""
    if message.get("tool_calls"):
        content = ""  # the calls stand for the text
    if isinstance(content, list):
        content = " ".join(part["text"] for part in content)
    rendered = {"role": message["role"], "content": content}
    if message.get("tool_calls"):
        rendered["tool_calls"] = [decoded_arguments(call) for call in message["tool_calls"]]
    if "tool_call_id" in message:
        rendered["tool_call_id"] = message["tool_call_id"]
    return rendered


def decoded_arguments(call: dict) -> dict:
    function = call.get("function", call)
    if isinstance(function.get("arguments"), str):
        function = {**function, "arguments": json.loads(function["arguments"])}
    return {**call, "function": function} if "function" in call else function


def room(context: int | None, prompt_tokens: int, body: dict, limits: Limits) -> int:
    """The tokens this request may generate: what it asks for, else the room the
    context leaves, up to the cap."""
    room = limits.max_tokens_cap if context is None else min(limits.max_tokens_cap, context - prompt_tokens)
    if room < 1:
        raise RequestError(
            f"the prompt is {prompt_tokens} tokens, and the model's context is {context}: shorten the prompt",
            "prompt" if "prompt" in body else "messages", code="context_length_exceeded",
        )
    asked = requested_tokens(body)
    if asked is not None and asked[1] > room:
        name, tokens = asked
        raise RequestError(
            f"{name}={tokens} does not fit: the prompt is {prompt_tokens} tokens of the model's context of "
            f"{context}; ask for at most {room}",
            name,
            code="context_length_exceeded",
        )
    return room if asked is None else asked[1]


def with_time_limit(generation_config: str | None, seconds: float) -> str:
    """The request's `generation_config` (a JSON string, checked) with `max_time` at most `seconds`:
    transformers passes its fields to `generate`, which then stops and answers with the text it has."""
    config = json.loads(generation_config) if generation_config else {}
    config["max_time"] = min(config.get("max_time") or seconds, seconds)
    return json.dumps(config)
