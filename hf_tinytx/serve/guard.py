"""What `python -m hf_tinytx.serve` puts around transformers' server (>= 5.25), where `Serve` looks names up: a model
loader that exposes TinyTx's classes in the model's process, an ASGI guard that checks each request body
(request_checks.py) and refuses the endpoints those checks do not cover, and handlers that bound `max_tokens` by the
context and the cap and stop a generation after its max_time.
"""

import transformers
from transformers.cli.serving import chat_completion, completion, model_manager, server
from transformers.cli.serving.utils import prompt_length

import hf_tinytx
from hf_tinytx.serve.request_checks import (
    CHAT,
    COMPLETIONS,
    REFUSED_PATHS,
    Limits,
    RequestError,
    parse_request,
    requested_tokens,
)


MAX_BODY_BYTES = 4 << 20
_IN_FLIGHT: set[object] = set()  # a token per checked request being answered
_MANAGERS: list = []  # the server's ModelManager, once the server has started
NO_CHAT_TEMPLATE = ("{model} has no chat template, so its chat messages cannot be turned into a prompt: send plain "
                    "text to /v1/completions instead, or give the tokenizer a template (tokenizer.chat_template = "
                    "'...'; tokenizer.save_pretrained(folder)) and restart the server")


def expose_tinytx_classes() -> None:
    """`transformers serve` turns `config.architectures[0]` into a class with `getattr(transformers, ...)`."""
    for name in hf_tinytx.__all__:
        if name.startswith("TinyTx"):
            setattr(transformers, name, getattr(hf_tinytx, name))


class TinyTxModelLoader(model_manager.ModelLoader):
    """transformers' loader, exposing TinyTx's classes in the model's own process first."""

    def load_model_and_processor(self, model_id: str, on_progress=None):
        expose_tinytx_classes()
        return super().load_model_and_processor(model_id, on_progress)


def started() -> bool:
    return bool(_MANAGERS)


def in_flight() -> int:
    return len(_IN_FLIGHT)


def cancel_all() -> int:
    """Ends every generation in flight at its next token (its client gets what was generated); returns how many
    requests were in flight. The answers say "stop": transformers' response models take OpenAI's reasons only."""
    for manager in _MANAGERS:
        for engine in list(manager.engines.values()):
            if engine.requests_queue is not None:
                for request_id in list(engine.pending_requests):
                    engine.requests_queue.put(("cancel", request_id))  # what transformers sends when a client leaves
    return in_flight()


async def send_error(send, error: RequestError) -> None:
    import json

    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive) -> bytes | None:
    """The whole request body, or None if the client left first; RequestError past MAX_BODY_BYTES."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY_BYTES:
            raise RequestError(f"the request body is over {MAX_BODY_BYTES >> 20} MiB: send a shorter one", None, 413)
        if not message.get("more_body"):
            return b"".join(chunks)


class RequestGuard:
    """The ASGI layer in front of transformers' app; it also counts the requests in flight."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"].rstrip("/")
        if path in REFUSED_PATHS:
            return await send_error(send, RequestError(
                f"{path} is not served by tinytx serve: use {COMPLETIONS} or {CHAT}", None, 404, "not_found"))
        if path not in (COMPLETIONS, CHAT) or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        try:
            raw = await read_body(receive)
            if raw is None:
                return
            parse_request(path, raw, self.limits)
        except RequestError as error:
            return await send_error(send, error)
        token = object()
        _IN_FLIGHT.add(token)
        try:
            await self.app(scope, replaying(raw, receive), send)
        finally:
            _IN_FLIGHT.discard(token)


def replaying(raw: bytes, receive):
    """The `receive` of a request whose body was read already: the body once, then the client's own messages."""
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


def prompt_room(model_config, prompt_tokens: int, body: dict, limits: Limits) -> int:
    """The tokens this request may generate: what it asks for, else the room the context leaves, up to the cap."""
    context = getattr(model_config, "max_position_embeddings", None)
    room = limits.max_tokens_cap if context is None else min(limits.max_tokens_cap, context - prompt_tokens)
    if room < 1:
        raise RequestError(f"the prompt is {prompt_tokens} tokens, and the model's context is {context}: shorten the "
                           "prompt", "prompt" if "prompt" in body else "messages", code="context_length_exceeded")
    asked = requested_tokens(body)
    if asked is not None and asked[1] > room:
        name, tokens = asked
        raise RequestError(f"{name}={tokens} does not fit: the prompt is {prompt_tokens} tokens of the model's "
                           f"context of {context}; ask for at most {room}", name, code="context_length_exceeded")
    return room if asked is None else asked[1]


def error_response(error: RequestError):
    from fastapi.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


def bounded(handler_class, count_prompt, limits: Limits):
    """`handler_class` (transformers' completion or chat handler) with the request's token count fixed by
    `prompt_room` on the prompt `count_prompt(handler, engine, body)` measures; RequestError becomes its 400."""

    class BoundedHandler(handler_class):
        async def handle_request(self, body: dict, request_id: str):
            try:
                engine = self.engine(body)
                prompt_tokens = await self.run_in_thread(count_prompt, self, engine, body)
                tokens = prompt_room(engine.model_config, prompt_tokens, body, limits)
            except RequestError as error:
                return error_response(error)
            body = {**body, "max_tokens": tokens}
            body.pop("max_completion_tokens", None)  # transformers reads it before max_tokens
            return await super().handle_request(body, request_id)

        def engine(self, body: dict):
            try:
                return self.model_manager.get_engine(body.get("model"))
            except (OSError, ValueError) as error:  # a name that is neither a model folder nor a Hub model
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise RequestError(f"cannot load model {body.get('model')!r}: {reason}", "model", 404,
                                   "model_not_found") from None

        def _build_generation_kwargs(self, body: dict, model_generation_config) -> dict:
            kwargs = super()._build_generation_kwargs(body, model_generation_config)
            kwargs["max_new_tokens"] = body["max_tokens"]  # also over a generation_config field's max_new_tokens
            kwargs["max_time"] = limits.max_request_seconds
            return kwargs

    BoundedHandler.__name__ = BoundedHandler.__qualname__ = handler_class.__name__
    return BoundedHandler


def count_completion_prompt(handler, engine, body: dict) -> int:
    tokenizer = getattr(engine.processor, "tokenizer", engine.processor)
    return len(tokenizer(body["prompt"])["input_ids"])


def count_chat_prompt(handler, engine, body: dict) -> int:
    """The chat prompt's length, rendered as transformers' handler renders it."""
    template = getattr(engine.processor, "chat_template", None)
    if template is None:
        model_name = handler.model_manager.force_model or body.get("model")  # as named, without a revision
        raise RequestError(NO_CHAT_TEMPLATE.format(model=model_name), "messages", code="no_chat_template")
    if body.get("tools") and "tools" not in str(template):
        raise RequestError("tools: this model's chat template does not read tools, so the model would never see them "
                           "and could call none: leave tools out", "tools", code="unsupported_field")
    try:
        return prompt_length(handler.render_messages(engine, body["messages"], body))
    except Exception as error:  # jinja2's TemplateError, or a kwarg the template does not take
        raise RequestError(f"the chat template cannot render these messages: {error}", "messages") from None


def install(limits: Limits) -> None:
    """Puts the loader, the guard and the bounded handlers where `Serve` looks them up when it starts."""
    build_server = server.build_server

    def guarded_server(manager, *args, **kwargs):
        from fastapi.exceptions import RequestValidationError
        from starlette.exceptions import HTTPException

        app = build_server(manager, *args, **kwargs)
        app.add_middleware(RequestGuard, limits=limits)

        @app.exception_handler(HTTPException)  # transformers' own refusals, in OpenAI's shape too
        async def http_error(request, error):
            return error_response(RequestError(str(error.detail), None, error.status_code, "invalid_request"))

        @app.exception_handler(RequestValidationError)
        async def invalid_body(request, error):
            return error_response(RequestError("the request body must be a JSON object"))

        _MANAGERS.append(manager)
        return app

    model_manager.ModelLoader = TinyTxModelLoader
    completion.CompletionHandler = bounded(completion.CompletionHandler, count_completion_prompt, limits)
    chat_completion.ChatCompletionHandler = bounded(chat_completion.ChatCompletionHandler, count_chat_prompt, limits)
    server.build_server = guarded_server
