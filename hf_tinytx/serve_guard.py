"""What `python -m hf_tinytx.serve` puts around transformers' server (`transformers.cli.serving`, 5.24), through the
names `Serve` looks up when it starts: the app factory, the two text handlers and the generation manager.

- `RequestGuard`, an ASGI layer in front of the app: reads the body of `/v1/completions` and `/v1/chat/completions`,
  answers a bad one with 400 (`hf_tinytx.serve_requests`), and gives each request a cancel event that is set when its
  client disconnects, when it ends, or when the server stops. It refuses the endpoints these checks do not cover.
- The handlers bound `max_tokens` by the model's context (max_position_embeddings minus the prompt) and by the cap,
  and stop generation after `--max_request_seconds` (GenerationConfig.max_time).
- The generation manager passes `generate` a stopping criterion that reads the request's cancel event, so a request
  whose client left stops within one token, streamed or not; the next request then starts.
"""

import asyncio
import contextvars
import threading

from hf_tinytx.serve_requests import CHAT, COMPLETIONS, Limits, RequestError, parse_request, requested_tokens


MAX_BODY_BYTES = 4 << 20
# transformers' other endpoints take fields these checks do not cover (max_output_tokens, audio), or let any client
# load and unload models; the guard refuses them rather than serve them unchecked.
REFUSED_PATHS = ("/v1/responses", "/v1/systemone", "/v1/audio/transcriptions", "/reset")
_CANCEL = contextvars.ContextVar("tinytx_cancel", default=None)  # the current request's threading.Event
_IN_FLIGHT: set[threading.Event] = set()  # every request's cancel event, for `cancel_all` when the server stops


def cancel_all() -> int:
    """Stops every generation in flight (each at its next token); returns how many there were."""
    events = list(_IN_FLIGHT)
    for event in events:
        event.set()
    return len(events)


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
    """The ASGI layer in front of transformers' app (see the module's docstring)."""

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
        await self.run_cancellable(scope, receive, send, raw)

    async def run_cancellable(self, scope, receive, send, raw: bytes):
        """Runs the app on the request; its cancel event is set when the client leaves or the request ends."""
        cancel, client_gone = threading.Event(), asyncio.Event()

        async def watch_disconnect():
            while (await receive())["type"] != "http.disconnect":
                pass
            cancel.set()
            client_gone.set()

        replayed = False

        async def replay():  # the body once, then what the watcher sees: the app's own disconnect checks still work
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await client_gone.wait()
            return {"type": "http.disconnect"}

        _IN_FLIGHT.add(cancel)
        token = _CANCEL.set(cancel)
        watcher = asyncio.create_task(watch_disconnect())
        try:
            await self.app(scope, replay, send)
        finally:
            cancel.set()  # a generation never outlives its request (an error, uvicorn cancelling the task)
            watcher.cancel()
            _IN_FLIGHT.discard(cancel)
            _CANCEL.reset(token)


def stop_on_cancel(inputs: dict) -> dict:
    """`generate`'s keyword arguments `inputs` plus a stopping criterion that ends it once the request is cancelled."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    cancel = _CANCEL.get()
    if cancel is None:
        return inputs

    class StopWhenCancelled(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

    return {**inputs, "stopping_criteria": StoppingCriteriaList([StopWhenCancelled()])}


def prompt_room(model, prompt_tokens: int, body: dict, limits: Limits) -> int:
    """The tokens this request may generate: what it asks for (checked against the context), else all the room the
    context leaves, up to the cap; RequestError when it asks for more than the context holds."""
    context = getattr(model.config, "max_position_embeddings", None)
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


NO_CHAT_TEMPLATE = (
    "{model} has no chat template, so its chat messages cannot be turned into a prompt: send plain text to "
    "/v1/completions instead, or give the tokenizer a template (tokenizer.chat_template = '...'; "
    "tokenizer.save_pretrained(folder)) and restart the server"
)


def error_response(error: RequestError):
    from fastapi.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


def bounded(handler_class, count_prompt, limits: Limits):
    """`handler_class` (transformers' CompletionHandler or ChatCompletionHandler) that loads the model, measures the
    prompt with `count_prompt(handler, body, model, processor)`, fixes the request's token count by `prompt_room`,
    and passes the request on; RequestError becomes its 400."""

    class BoundedHandler(handler_class):
        async def handle_request(self, body: dict, request_id: str):
            try:
                _, model, processor = self.load(body)  # loads the model once; the server reuses it
                tokens = prompt_room(model, count_prompt(self, body, model, processor), body, limits)
            except RequestError as error:
                return error_response(error)
            body = {**body, "max_tokens": tokens}
            body.pop("max_completion_tokens", None)  # transformers reads it before max_tokens
            return await super().handle_request(body, request_id)

        def load(self, body: dict):
            try:
                return self._resolve_model(dict(body))
            except (OSError, ValueError) as error:  # a name that is neither a model folder nor a Hub model
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise RequestError(f"cannot load model {body.get('model')!r}: {reason}", "model", 404,
                                   "model_not_found") from None

        def _build_generation_config(self, body, model_generation_config, use_cb=False):
            config = super()._build_generation_config(body, model_generation_config, use_cb=use_cb)
            config.max_new_tokens = body["max_tokens"]  # also over a generation_config field's max_new_tokens
            config.max_time = limits.max_request_seconds
            return config

    BoundedHandler.__name__ = BoundedHandler.__qualname__ = handler_class.__name__
    return BoundedHandler


def count_completion_prompt(handler, body: dict, model, processor) -> int:
    tokenizer = getattr(processor, "tokenizer", processor)
    return len(tokenizer(body["prompt"])["input_ids"])


def count_chat_prompt(handler, body: dict, model, processor) -> int:
    """The chat prompt's length, rendered as transformers' handler renders it; RequestError without a template or
    when the template refuses the messages."""
    if getattr(processor, "chat_template", None) is None:
        model_name = handler.model_manager.force_model or body.get("model")  # as named, without a revision
        raise RequestError(NO_CHAT_TEMPLATE.format(model=model_name), "messages", code="no_chat_template")
    modality = handler.model_manager.get_model_modality(model, processor=processor)
    messages = handler.get_processor_inputs_from_messages(body["messages"], modality)
    kwargs = {**handler.chat_template_kwargs, **body.get("chat_template_kwargs", {})}
    try:
        rendered = processor.apply_chat_template(
            messages, add_generation_prompt=True, tools=body.get("tools"), tokenize=True, return_dict=True, **kwargs
        )
    except Exception as error:  # jinja2's TemplateError, or a kwarg the template does not take
        raise RequestError(f"the chat template cannot render these messages: {error}", "messages") from None
    return len(rendered["input_ids"])


def install(limits: Limits) -> None:
    """Puts the guard, the bounded handlers and the cancellable generation manager where `Serve` looks them up when
    it starts (module attributes of `transformers.cli.serving`)."""
    from transformers.cli.serving import chat_completion, completion, server, utils

    class CancellableGenerateManager(utils.GenerateManager):
        # the rest of the arguments passed on as they come: 5.10 and 5.24 differ after `request_id`
        def generate_streaming(self, model, processor, inputs, *args, **kwargs):
            return super().generate_streaming(model, processor, stop_on_cancel(inputs), *args, **kwargs)

        async def generate_non_streaming(self, model, processor, inputs, *args, **kwargs):
            return await super().generate_non_streaming(model, processor, stop_on_cancel(inputs), *args, **kwargs)

    build_server = server.build_server

    def guarded_server(*args, **kwargs):
        from fastapi.exceptions import RequestValidationError
        from starlette.exceptions import HTTPException

        app = build_server(*args, **kwargs)
        app.add_middleware(RequestGuard, limits=limits)

        @app.exception_handler(HTTPException)  # transformers' own refusals, in OpenAI's shape too
        async def http_error(request, error):
            return error_response(RequestError(str(error.detail), None, error.status_code, "invalid_request"))

        @app.exception_handler(RequestValidationError)
        async def invalid_body(request, error):
            return error_response(RequestError("the request body must be a JSON object"))

        return app

    utils.GenerateManager = CancellableGenerateManager
    completion.CompletionHandler = bounded(completion.CompletionHandler, count_completion_prompt, limits)
    chat_completion.ChatCompletionHandler = bounded(chat_completion.ChatCompletionHandler, count_chat_prompt, limits)
    server.build_server = guarded_server
