"""The checks `python -m hf_tinytx.serve` makes on a request body before transformers' server sees
it: every field has a type and a range, and a body that breaks one gets HTTP 400 in OpenAI's error
shape, one line naming the field and the fix. Plain Python, no FastAPI; what needs the model (the
prompt's length) is checked in model_checks.py.
"""

import json
import math
from dataclasses import dataclass


COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# transformers' other endpoints take fields these checks do not cover (max_output_tokens, audio), or let any
# client load and unload models; the front refuses them rather than serve them unchecked.
REFUSED_PATHS = ("/v1/responses", "/v1/systemone", "/v1/audio/transcriptions", "/reset")
MAX_STOP_STRINGS = 4  # OpenAI's limit
# objects and lists inside one another: a request needs 5; Python's parser recurses per level
MAX_JSON_DEPTH = 32
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.manual_seed takes


def first_line(error: BaseException) -> str:
    """The first line of an error's message, or its name if it has none: what a one-line answer quotes."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class RequestError(ValueError):
    """A request the server refuses: the one-line message, the field (`param`), the HTTP status."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str = "invalid_request"
    ):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        """OpenAI's error shape, so that the `openai` client puts the message into its exception."""
        error_type = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": error_type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """The server-wide limits the command line sets."""

    max_tokens_cap: int
    max_request_seconds: float
    force_model: str | None = None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Each factory below returns the check of one field: check(value, limits) raises RequestError or returns.
def number(name: str, low: float, high: float, low_open: bool = False):
    def check(value, limits):
        if not _number(value) or value > high or (value <= low if low_open else value < low):
            bracket = "(" if low_open else "["
            raise RequestError(f"{name} must be a number in {bracket}{low}, {high}], not {value!r}", name)

    return check


def typed(name: str, ok, what: str):
    def check(value, limits):
        if not ok(value):
            raise RequestError(f"{name} must be {what}, not {value!r}"[:300], name)

    return check


def string(name: str, empty_ok: bool = True):
    def check(value, limits):
        if not isinstance(value, str):
            raise RequestError(f"{name} must be a string, not {type(value).__name__} {value!r}"[:300], name)
        if not empty_ok and not value.strip():
            raise RequestError(f"{name} is empty: send the text the model should continue", name)

    return check


def token_count(name: str):
    def check(value, limits):
        if not _integer(value) or value < 1:
            raise RequestError(f"{name} must be a whole number of tokens, 1 or more, not {value!r}", name)
        if value > limits.max_tokens_cap:
            cap = limits.max_tokens_cap
            raise RequestError(
                f"{name}={value} is over this server's cap of {cap} tokens: ask for at most {cap} (the "
                "server's --max_tokens_cap flag sets the cap)",
                name,
                code="max_tokens_cap",
            )

    return check


def neutral(name: str, neutral_value):
    """A field transformers' server ignores: accepted only at the value that ignoring it gives."""

    def check(value, limits):
        if value != neutral_value and not (neutral_value is None and value is False):
            raise RequestError(
                f"{name}={json.dumps(value)[:80]} is not supported by this server: leave it out (or send "
                f"{json.dumps(neutral_value)})",
                name,
            )

    return check


def check_stop(value, limits) -> None:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOP_STRINGS:
        raise RequestError(
            f"stop must be a string or a list of 1 to {MAX_STOP_STRINGS} strings, not {value!r}", "stop"
        )
    for stop in stops:
        if not isinstance(stop, str) or not stop:
            raise RequestError(f"stop must hold non-empty strings, not {stop!r}", "stop")


def check_suffix(value, limits) -> None:
    """transformers pastes a suffix after the answer, which the model never saw: no fill-in-the-middle."""
    if value != "":
        raise RequestError(
            "suffix is not supported by this server: the model cannot fill in the middle, and the suffix "
            "would only be pasted after its answer; leave it out",
            "suffix",
            code="unsupported_field",
        )


def check_tools(value, limits) -> None:
    """OpenAI's function tools, well formed (whether the chat template reads them
    is asked in model_checks.py)."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise RequestError("tools must be a list of JSON objects", "tools")
    for index, tool in enumerate(value):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(
                function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., "
                               f"'parameters': {{...}}}}}}, not {str(tool)[:80]}", f"tools[{index}]")


def count(name: str):
    """A GenerationConfig count: a whole number, 0 or more."""
    return typed(name, lambda value: _integer(value) and value >= 0, "a whole number, 0 or more")


# GenerationConfig fields a request may set, checked: how the one answer is drawn.
GENERATION_FIELDS = {
    "max_new_tokens": token_count,
    "min_new_tokens": count,
    "do_sample": lambda name: typed(name, lambda value: isinstance(value, bool), "true or false"),
    "temperature": lambda name: number(name, 0, 100, low_open=True),
    "top_k": count,
    "top_p": lambda name: number(name, 0, 1, low_open=True),
    "min_p": lambda name: number(name, 0, 1),
    "typical_p": lambda name: number(name, 0, 1, low_open=True),
    "repetition_penalty": lambda name: number(name, 0, 100, low_open=True),
    "no_repeat_ngram_size": count,
    # the server's --max_request_seconds bounds it
    "max_time": lambda name: number(name, 0, 1e9, low_open=True),
}
# GenerationConfig fields that ask for what one answer per request has no place for (several answers, beams,
# scores): taken only at the value that asks for nothing more.
ONE_ANSWER = {"num_return_sequences": 1, "num_beams": 1, "num_beam_groups": 1, "output_scores": False,
              "output_logits": False, "output_attentions": False, "output_hidden_states": False,
              "return_dict_in_generate": False}


def check_stream_options(value, limits) -> None:
    """OpenAI's one stream option, include_usage: true or false. "yes" was taken as true."""
    typed("stream_options", lambda options: isinstance(options, dict), "a JSON object")(value, limits)
    for key, setting in value.items():
        name = f"stream_options.{key}"
        if key != "include_usage":
            raise RequestError(
                f"{name} is not a stream option of this server: leave it out (include_usage is)", name,
                code="unknown_field",
            )
        typed(name, lambda flag: isinstance(flag, bool), "true or false")(setting, limits)


def check_generation_config(value, limits) -> None:
    """transformers' own field: a GenerationConfig as a JSON string (`transformers
    chat` sends its whole config)."""
    from transformers import GenerationConfig  # loaded in the server by now

    string("generation_config")(value, limits)
    try:
        config = json.loads(value)
    except (json.JSONDecodeError, RecursionError) as error:
        reason = error if isinstance(error, ValueError) else "nested too deep"
        raise RequestError(
            f"generation_config is not JSON ({reason}): send a GenerationConfig's to_json_string()",
            "generation_config",
        ) from None
    if not isinstance(config, dict):
        raise RequestError("generation_config must be a JSON object (a GenerationConfig's fields)",
                           "generation_config")
    known = GenerationConfig().to_dict()
    for key, setting in config.items():
        name = f"generation_config.{key}"
        if key not in known:
            raise RequestError(
                f"{name} is not a GenerationConfig field: leave it out", name, code="unknown_field"
            )
        if key in ONE_ANSWER and setting is not None:
            neutral(name, ONE_ANSWER[key])(setting, limits)
        if key in GENERATION_FIELDS and setting is not None:
            GENERATION_FIELDS[key](name)(setting, limits)


def check_model(value, limits) -> None:
    string("model", empty_ok=False)(value, limits)
    if limits.force_model is not None and value != limits.force_model:
        raise RequestError(
            f"this server serves only {limits.force_model!r}, not {value!r}: leave model out or name "
            f"{limits.force_model!r}",
            "model",
            code="model_not_found",
        )


def check_messages(value, limits) -> None:
    if not isinstance(value, list) or not value:
        raise RequestError(
            "messages must be a non-empty list of {'role': ..., 'content': ...} objects", "messages"
        )
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not message["role"]:
            raise RequestError(f"{where} must be an object with a 'role' string and a 'content'", where)
        content = message.get("content")
        if content is None and message.get("tool_calls"):
            continue
        if isinstance(content, list):
            for part in content:
                if (
                    not isinstance(part, dict)
                    or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                ):
                    raise RequestError(
                        f"{where}.content holds {str(part)[:80]}: this model reads text only, send parts of "
                        "the form {'type': 'text', 'text': '...'}",
                        where,
                    )
        elif not isinstance(content, str):
            raise RequestError(
                f"{where}.content must be a string or a list of text parts, not {content!r}"[:300], where
            )


# field -> its check; a field absent here is refused by name (transformers' server refuses it too, with a 422)
COMMON = {
    "model": check_model,
    "max_tokens": token_count("max_tokens"),
    "temperature": number("temperature", 0, 2),
    "top_p": number("top_p", 0, 1, low_open=True),
    # repetition_penalty 1 + it, above 0
    "frequency_penalty": number("frequency_penalty", -1, 2, low_open=True),
    "presence_penalty": neutral("presence_penalty", 0),
    "stream": typed("stream", lambda value: isinstance(value, bool), "true or false"),
    "stream_options": check_stream_options,
    "seed": typed("seed", lambda value: _integer(value) and SEED_RANGE[0] <= value <= SEED_RANGE[1],
                  f"a whole number in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]"),
    "stop": check_stop,
    "n": neutral("n", 1),
    "logprobs": neutral("logprobs", None),
    "user": string("user"),
    "generation_config": check_generation_config,
}
FIELDS = {
    COMPLETIONS: {
        **COMMON,
        "prompt": string("prompt", empty_ok=False),
        "suffix": check_suffix,
        "echo": neutral("echo", False),
        "best_of": neutral("best_of", 1),
    },
    CHAT: {
        **COMMON,
        "messages": check_messages,
        "max_completion_tokens": token_count("max_completion_tokens"),
        "chat_template_kwargs": typed(
            "chat_template_kwargs", lambda value: isinstance(value, dict), "a JSON object"
        ),
        "tools": check_tools,
    },
}
REQUIRED = {COMPLETIONS: "prompt", CHAT: "messages"}


def parse_request(path: str, raw: bytes, limits: Limits) -> dict:
    """The body of a request to `path` (COMPLETIONS or CHAT) as a dict, every
    field checked; else RequestError."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"the request body is not JSON ({error}): send a JSON object") from None
    except RecursionError:
        raise RequestError(
            f"the request body nests objects and lists more than {MAX_JSON_DEPTH} deep: send a request's "
            "fields"
        ) from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, not {type(body).__name__}")
    check_nesting_and_text(body)
    fields, required = FIELDS[path], REQUIRED[path]
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r} for {path}: this server accepts {', '.join(sorted(fields))}",
            unknown[0], code="unknown_field",
        )
    if body.get(required) is None:
        raise RequestError(f"{required} is missing: {path} needs one", required)
    if body.get("model") is None and limits.force_model is None:
        raise RequestError("model is missing: this server loads the model each request names", "model")
    for name, value in body.items():
        if value is not None:
            fields[name](value, limits)
    return body


def check_nesting_and_text(body: dict) -> None:
    """Every field nests at most MAX_JSON_DEPTH levels, and its text is valid Unicode: JSON's "\\ud800" (a
    lone surrogate) would make the tokenizer fail with HTTP 500."""
    for field, value in body.items():
        pending = [(value, 1)]
        while pending:
            item, depth = pending.pop()
            if depth > MAX_JSON_DEPTH:
                raise RequestError(f"{field} nests objects and lists more than {MAX_JSON_DEPTH} deep", field)
            if isinstance(item, dict):
                pending += [(key, depth + 1) for key in item] + [
                    (member, depth + 1) for member in item.values()
                ]
            elif isinstance(item, list):
                pending += [(member, depth + 1) for member in item]
            elif isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as error:
                    raise RequestError(
                        f"{field} holds {item[error.start]!r}, half of a UTF-16 surrogate pair, which is no "
                        "character: send valid Unicode text",
                        field,
                    ) from None


def requested_tokens(body: dict) -> tuple[str, int] | None:
    """(field, tokens) the request asks for, in the order transformers' server reads them, or None."""
    config = json.loads(body["generation_config"]) if body.get("generation_config") else {}
    for name, value in (("max_completion_tokens", body.get("max_completion_tokens")),
                        ("max_tokens", body.get("max_tokens")),
                        ("generation_config.max_new_tokens", config.get("max_new_tokens"))):
        if value is not None:
            return name, value
    return None
