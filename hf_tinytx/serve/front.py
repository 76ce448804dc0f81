"""The ASGI app `tinytx serve` answers clients with, in front of transformers'
server (backend.py, on a loopback port).

A request to /v1/completions or /v1/chat/completions is checked first (request_checks.py, model_checks.py): a
bad one gets its HTTP 400 here and never reaches transformers. A good one is forwarded as a stream, relayed to
its client as it comes (or gathered into one answer: answers.py), and ends early when its client leaves (the
forwarded connection closes, which stops transformers' generation) or when a stop signal cuts it (`cut_all`).
Any other endpoint is forwarded as it is, but for those request_checks.py refuses.
"""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from hf_tinytx.serve.answers import Answer
from hf_tinytx.serve.model_checks import Models
from hf_tinytx.serve.request_checks import (
    CHAT,
    COMPLETIONS,
    REFUSED_PATHS,
    Limits,
    RequestError,
    parse_request,
)


MAX_BODY_BYTES = 4 << 20
HOP_BY_HOP = {b"host", b"connection", b"keep-alive", b"content-length", b"transfer-encoding"}


def stopping_error() -> RequestError:
    return RequestError(
        "the server is stopping: send the request again once it is back", None, 503, "stopping"
    )


class Front:
    """The app; `cut_all` and `answering` are for the launcher's thread."""

    def __init__(self, upstream: str, limits: Limits, models: Models):
        self.upstream, self.limits, self.models = upstream, limits, models
        self.relays: set[asyncio.Task] = set()  # the answers being relayed, which a stop signal cuts
        self.checking: set[asyncio.Future] = set()  # model checks under way, which it ends too
        self.answering = 0  # checked requests between their check and their last byte
        self.stopping = False
        self.client: httpx.AsyncClient | None = None  # made on the server's event loop
        # tokenizers load and run off the loop
        self.checks = ThreadPoolExecutor(1, thread_name_prefix="checks")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # uvicorn runs with lifespan and websockets off
            return
        path = scope["path"].rstrip("/")
        if path in REFUSED_PATHS:
            return await send_json(send, RequestError(
                f"{path} is not served by tinytx serve: use {COMPLETIONS} or {CHAT}", None, 404, "not_found"))
        try:
            raw = await read_body(receive)
        except RequestError as error:
            return await send_json(send, error)
        if raw is None:  # the client left
            return
        if path in (COMPLETIONS, CHAT) and scope["method"] == "POST":
            self.answering += 1
            try:
                return await self.checked(path, raw, scope, receive, send)
            finally:
                self.answering -= 1
        return await self.pass_through(scope, raw, send)

    def http(self) -> httpx.AsyncClient:
        if self.client is None:  # no proxy from the environment: the upstream is on loopback
            self.client = httpx.AsyncClient(
                base_url=self.upstream, timeout=httpx.Timeout(None, connect=10), trust_env=False,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
        return self.client

    def cut_all(self) -> int:
        """Ends every answer being relayed with the text it has; returns how many
        there were. On the event loop."""
        self.stopping = True
        for task in (*self.relays, *self.checking):
            task.cancel()
        return len(self.relays)

    async def checked(self, path: str, raw: bytes, scope, receive, send) -> None:
        try:
            body = parse_request(path, raw, self.limits)
            forwarded, prompt_tokens, model = await self.model_checks(path, body)
        except RequestError as error:
            return await send_json(send, error)
        if self.stopping:
            return await send_json(send, stopping_error())
        streaming = bool(body.get("stream"))
        if not streaming:  # a stream can be cut and still hold the text so far
            forwarded = {**forwarded, "stream": True, "stream_options": {"include_usage": True}}
        request_id = [(name, value) for name, value in scope["headers"] if name == b"x-request-id"]
        answer = Answer(path == CHAT, prompt_tokens)
        relay = asyncio.create_task(
            self.relay(path, forwarded, request_id, answer, send if streaming else None)
        )
        outcome = await self.follow(relay, receive)
        if outcome == "left":
            return
        problem = None if outcome == "cut" else relay.result()
        if streaming:
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await end_stream(send, answer, outcome == "cut", problem, model.count if usage else None)
        if problem is None and answer.error is not None:  # transformers' error event, mid-answer
            problem = server_error(answer.error)
        if problem is None and not answer.started:
            problem = stopping_error()
        if problem is not None:
            return await send_json(send, problem)
        await send_json(send, answer.whole(model.count), 200)

    async def model_checks(self, path: str, body: dict):
        """`Models.fit` off the event loop (it may load a model's tokenizer); a stop signal ends the wait."""
        check = asyncio.get_running_loop().run_in_executor(
            self.checks, self.models.fit, path, body, self.limits
        )
        self.checking.add(check)
        try:
            return await check
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            raise stopping_error() from None
        finally:
            self.checking.discard(check)

    async def follow(self, relay: asyncio.Task, receive) -> str:
        """"done", "cut" (by `cut_all`) or "left": the client went, and the relay is cancelled, which closes
        the forwarded connection, which stops transformers' generation."""
        watcher = asyncio.create_task(client_leaves(receive))
        self.relays.add(relay)
        try:
            done, _ = await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # this server stops
            relay.cancel()
            raise
        finally:
            self.relays.discard(relay)
            watcher.cancel()
        if relay in done:
            return "cut" if relay.cancelled() else "done"
        relay.cancel()
        await asyncio.wait({relay})
        return "left"

    async def relay(self, path: str, body: dict, headers: list, answer: Answer, send) -> RequestError | None:
        """Forwards `body`; each chunk goes into `answer`, and to `send` when given. Returns what went wrong,
        in OpenAI's error shape: transformers' refusal of the request, or its server gone."""
        try:
            async with self.http().stream("POST", path, json=body, headers=headers) as response:
                if response.status_code != 200:
                    return upstream_refusal(response.status_code, await response.aread())
                answer.started = True
                if send is not None:
                    await send(
                        {"type": "http.response.start", "status": 200, "headers": kept_headers(response)}
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line != "data: [DONE]":
                        answer.add(json.loads(line[len("data: "):]))
                    if send is not None:
                        await send(
                            {"type": "http.response.body", "body": f"{line}\n\n".encode(), "more_body": True}
                        )
        except httpx.HTTPError as error:  # transformers' server went away
            return server_error(
                f"transformers' server did not answer: {type(error).__name__} {error}".strip(), 502
            )
        return None

    async def pass_through(self, scope, raw: bytes, send) -> None:
        """Forwards a request these checks do not cover (GET /health, /v1/models,
        ...), and its answer, as they are."""
        query = scope.get("query_string", b"").decode("latin-1")
        url = scope["path"] + (f"?{query}" if query else "")
        headers = [(name, value) for name, value in scope["headers"] if name.lower() not in HOP_BY_HOP]
        request = self.http().build_request(scope["method"], url, headers=headers, content=raw)
        try:
            response = await self.http().send(request, stream=True)
        except httpx.HTTPError as error:
            return await send_json(send, server_error(f"transformers' server did not answer: {error}", 502))
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": kept_headers(response)})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


async def end_stream(send, answer: Answer, cut: bool, problem: RequestError | None, count) -> None:
    """The end of a streamed answer: a closing chunk if it was cut (and its usage, when the
    client asked, counted with `count`). What went wrong before the stream began is a JSON
    error instead, after it an error event."""
    if not answer.started:
        return await send_json(send, problem or stopping_error())
    events = []
    if problem is not None:
        events.append({"error": str(problem)})  # as transformers reports an error mid-stream
    elif cut and answer.finish_reason is None:
        events.append(answer.closing_chunk())
        if count is not None:
            events.append({**answer.envelope(), "choices": [], "usage": answer.cut_usage(count)})
    tail = "".join(f"data: {json.dumps(event, ensure_ascii=False)}\n\n" for event in events)
    await send({"type": "http.response.body", "body": tail.encode()})


def server_error(message: str, status: int = 500) -> RequestError:
    return RequestError(message, None, status, "server_error")


def upstream_refusal(status: int, raw: bytes) -> RequestError:
    """transformers' own refusal ({"detail": ...} or {"error": ...}) as one line in OpenAI's error shape."""
    try:
        reply = json.loads(raw)
    except ValueError:
        reply = raw.decode(errors="replace")
    detail = reply.get("detail", reply.get("error", reply)) if isinstance(reply, dict) else reply
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):
        detail = detail["message"]
    message = detail if isinstance(detail, str) else json.dumps(detail)
    message = message.strip().splitlines()[0][:300] if message.strip() else f"HTTP {status}"
    return RequestError(message, None, status, "invalid_request" if status < 500 else "server_error")


def kept_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    """transformers' answer headers (content type, request id), but for those of its own connection."""
    return [(name, value) for name, value in response.headers.raw if name.lower() not in HOP_BY_HOP]


async def send_json(send, reply, status: int | None = None) -> None:
    """`reply` (a dict, or a RequestError as its OpenAI-shaped body) as a whole JSON answer."""
    if isinstance(reply, RequestError):
        reply, status = reply.body(), reply.status
    body = json.dumps(reply, ensure_ascii=False).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
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
            raise RequestError(
                f"the request body is over {MAX_BODY_BYTES >> 20} MiB: send a shorter one", None, 413
            )
        if not message.get("more_body"):
            return b"".join(chunks)


async def client_leaves(receive) -> None:
    """Returns when the client disconnects (its request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
