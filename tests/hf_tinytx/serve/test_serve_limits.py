"""`python -m hf_tinytx.serve` left running for others: bad requests, long requests, clients that
leave, many clients and stop signals, tried from outside on real servers (the `openai` client, raw HTTP,
sockets). Clock-reading checks compare with a baseline taken on the same server in the same test, with wide
margins. A bad command line is refused before a server starts: test_serve_args.py."""

import concurrent.futures
import http.client
import json
import os
import signal
import socket
import time

import openai
import pytest

from tests.helpers.processes import alive, descendants
from tests.helpers.tiny import build_tiny_model, pretrain_env
from tests.hf_tinytx.serve.test_serve import (
    COMPLETION_PROMPT,
    LAUNCHER,
    MAX_TOKENS,
    READY_TIMEOUT_S,
    Server,
    ask,
    greedy_text,
    train_tiny_chat_model,
)


pytestmark = pytest.mark.deep


CAP = 50_000  # the "any" server's --max_tokens_cap
TIME_LIMIT_S = 3  # the "any" server's --max_request_seconds
LONG_TOKENS = 40_000  # a request that, unbounded, generates for minutes on the long model
CONTEXT = 128  # the chat folder's max_position_embeddings (tests/helpers/tiny.py)


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    model, tokenizer = train_tiny_chat_model()
    folder = tmp_path_factory.mktemp("serve_limits_models") / "tinytx-chat"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def long_folder(chat_folder, tmp_path_factory):
    """A model that never stops by itself: random weights, no EOS, a context of
    65536, the chat folder's tokenizer."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("serve_long") / "tinytx-long"
    tokenizer = AutoTokenizer.from_pretrained(chat_folder)
    model = build_tiny_model(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                             max_position_embeddings=1 << 16, eos_token_id=None)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def servers(long_folder, tmp_path_factory):
    """"any": no model on the command line, a cap and a time limit; "long": the long
    model, a cap that lets it run."""
    root = tmp_path_factory.mktemp("serve_limits_run")
    env = pretrain_env(root, OMP_NUM_THREADS="1")
    started = {}
    try:
        started["any"] = Server(
            [*LAUNCHER, "--max_tokens_cap", str(CAP), "--max_request_seconds", str(TIME_LIMIT_S)],
            root / "any.log", env,
        )
        started["long"] = Server(
            [*LAUNCHER, str(long_folder), "--max_tokens_cap", "60000"], root / "long.log", env
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        for server in started.values():
            server.wait_ready(deadline)
        yield started
    finally:
        for server in started.values():
            server.stop()


# ---- raw HTTP ----


def post(server, path: str, body, timeout: float = 120) -> tuple[int, dict]:
    """(status, JSON reply) of a POST whose body is `body` as JSON (bytes are sent as they are)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", path, raw, {"Content-Type": "application/json"})
    response = connection.getresponse()
    status, text = response.status, response.read()
    connection.close()
    return status, json.loads(text)


def short_request_seconds(server, model: str | None = None) -> float:
    body = {"prompt": COMPLETION_PROMPT, "max_tokens": 8, **({"model": model} if model else {})}
    start = time.monotonic()
    status, reply = post(server, "/v1/completions", body)
    assert status == 200, reply
    return time.monotonic() - start


def cpu_seconds(pid: int) -> float:
    """CPU-seconds used so far by `pid` and the processes below it (the model runs
    in a process the server spawns)."""
    total = 0.0
    for process in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{process}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def cpu_rate(pid: int, seconds: float = 2.0) -> float:
    used, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - used) / (time.monotonic() - start)


def open_long_request(server, stream: bool) -> socket.socket:
    """A socket that sent a request for LONG_TOKENS tokens and waits; for a
    stream, the first bytes were read."""
    body = json.dumps({"prompt": COMPLETION_PROMPT, "max_tokens": LONG_TOKENS, "stream": stream}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    if stream:
        assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "the stream did not start"
    return sock


# ---- bad requests: 400, one line, OpenAI's shape, no traceback ----


BAD_COMPLETIONS = {
    "max_tokens 0": ({"max_tokens": 0}, "max_tokens"),
    "max_tokens -5": ({"max_tokens": -5}, "max_tokens"),
    "max_tokens 'abc'": ({"max_tokens": "abc"}, "max_tokens"),
    "max_tokens 2.5": ({"max_tokens": 2.5}, "max_tokens"),
    "max_tokens true": ({"max_tokens": True}, "max_tokens"),
    "max_tokens over the cap": ({"max_tokens": CAP + 1}, "max_tokens"),
    "max_tokens over the context": ({"max_tokens": CONTEXT}, "max_tokens"),
    "empty prompt": ({"prompt": ""}, "prompt"),
    "missing prompt": ({"prompt": None}, "prompt"),
    "prompt a list": ({"prompt": ["a", "b"]}, "prompt"),
    "prompt over the context": ({"prompt": "word " * 400}, "prompt"),
    "temperature -1": ({"temperature": -1}, "temperature"),
    "temperature 'hot'": ({"temperature": "hot"}, "temperature"),
    "top_p 0": ({"top_p": 0}, "top_p"),
    "stream 'yes'": ({"stream": "yes"}, "stream"),
    # Issue 69: taken as true.
    "include_usage 'yes'": (
        {"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage",
    ),
    "an unknown stream option": ({"stream": True, "stream_options": {"chunk": 3}}, "stream_options.chunk"),
    "n 2": ({"n": 2}, "n"),
    "stop 5 strings": ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "seed 'x'": ({"seed": "x"}, "seed"),
    "unknown field": ({"max_new_tokens": 5}, "max_new_tokens"),
    "generation_config not JSON": ({"generation_config": "{"}, "generation_config"),
    "generation_config over the cap": (
        {"generation_config": json.dumps({"max_new_tokens": 10**9})}, "generation_config.max_new_tokens",
    ),
    # Issue 57: fields the server took and ignored, or answered with a 500 or transformers' {"detail": ...}.
    "suffix": ({"suffix": " THE END"}, "suffix"),
    "generation_config num_return_sequences 3": (
        {"generation_config": json.dumps({"num_return_sequences": 3})},
        "generation_config.num_return_sequences",
    ),
    "generation_config top_k -1": (
        {"generation_config": json.dumps({"top_k": -1})}, "generation_config.top_k",
    ),
    "frequency_penalty -1": ({"frequency_penalty": -1}, "frequency_penalty"),
    "seed 2**70": ({"seed": 2**70}, "seed"),
    "a lone surrogate in the prompt": ({"prompt": "Attention \ud800"}, "prompt"),
    "user nested 40 deep": ({"user": json.loads("[" * 40 + '"x"' + "]" * 40)}, "user"),
}


def assert_openai_400(status: int, reply: dict, param: str | None) -> str:
    assert status == 400, reply
    message = reply["error"]["message"]
    assert "\n" not in message and "Traceback" not in message and len(message) < 400, message
    assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["param"] == param, reply
    return message


@pytest.mark.parametrize("case", BAD_COMPLETIONS, ids=list(BAD_COMPLETIONS))
def test_a_bad_completion_request_is_a_400_naming_the_field(servers, chat_folder, case):
    fields, param = BAD_COMPLETIONS[case]
    body = {k: v for k, v in {"model": str(chat_folder), "prompt": COMPLETION_PROMPT, **fields}.items()
            if v is not None}
    message = assert_openai_400(*post(servers["any"], "/v1/completions", body), param)
    if case == "max_tokens over the context":
        assert f"context of {CONTEXT}" in message and "ask for at most" in message, message
    if case == "max_tokens over the cap":
        assert f"cap of {CAP}" in message and "--max_tokens_cap" in message, message


BAD_CHATS = {
    "no messages": ({"messages": []}, "messages"),
    "a message without a role": ({"messages": [{"content": "hi"}]}, "messages[0]"),
    "an image part": (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0]",
    ),
    "max_completion_tokens 0": ({"max_completion_tokens": 0}, "max_completion_tokens"),
    "max_tokens over the context": ({"max_tokens": CONTEXT}, "max_tokens"),
    "tools that are not tools": ({"tools": [{"x": 1}]}, "tools[0]"),
    "tools the template does not read": (
        {"tools": [{"type": "function", "function": {"name": "now"}}]}, "tools",
    ),
    "a lone surrogate in a message": ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages"),
}


@pytest.mark.parametrize("case", BAD_CHATS, ids=list(BAD_CHATS))
def test_a_bad_chat_request_is_a_400_naming_the_field(servers, chat_folder, case):
    fields, param = BAD_CHATS[case]
    body = {"model": str(chat_folder), "messages": [{"role": "user", "content": "Attention lets"}], **fields}
    assert_openai_400(*post(servers["any"], "/v1/chat/completions", body), param)


def test_bodies_that_are_not_requests_and_unknown_models(servers, chat_folder, tmp_path):
    server = servers["any"]
    assert_openai_400(*post(server, "/v1/completions", b"{not json"), None)
    # before: a RecursionError, HTTP 500
    deep = b'{"prompt": "a", "user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert "nests objects and lists more than 32 deep" in assert_openai_400(
        *post(server, "/v1/completions", deep), None
    )
    assert_openai_400(*post(server, "/v1/completions", [1, 2]), None)
    assert_openai_400(*post(server, "/v1/completions", {"prompt": COMPLETION_PROMPT}), "model")
    status, reply = post(server, "/v1/completions", {"model": str(tmp_path / "absent"), "prompt": "a"})
    assert status == 404 and "cannot load model" in reply["error"]["message"], reply
    status, reply = post(server, "/v1/responses", {"model": str(chat_folder), "input": "a"})
    assert status == 404 and "/v1/completions" in reply["error"]["message"], reply
    # the openai client turns the 400 into BadRequestError with the one-line message
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().completions.create(model=str(chat_folder), prompt=COMPLETION_PROMPT, max_tokens=-5)
    assert "max_tokens must be a whole number of tokens" in str(raised.value)
    # and a good request still answers as `generate` does
    assert post(server, "/v1/completions", {"model": str(chat_folder), "prompt": COMPLETION_PROMPT,
                                            "max_tokens": MAX_TOKENS, "temperature": 0})[0] == 200
    assert "Traceback" not in server.output(), server.output()[-5000:]


# ---- long requests, clients that leave, many clients ----


def test_max_request_seconds_ends_a_long_request(servers, long_folder):
    """A request for LONG_TOKENS tokens (minutes, unbounded) returns after about --max_request_seconds."""
    server = servers["any"]
    start = time.monotonic()
    status, reply = post(server, "/v1/completions",
                         {"model": str(long_folder), "prompt": COMPLETION_PROMPT, "max_tokens": LONG_TOKENS})
    elapsed = time.monotonic() - start
    assert status == 200, reply
    assert 0 < reply["usage"]["completion_tokens"] < LONG_TOKENS
    # 30 s: loading the model, a loaded machine
    assert TIME_LIMIT_S * 0.9 <= elapsed < TIME_LIMIT_S + 30, elapsed


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_client_that_leaves_stops_its_generation(servers, stream):
    """Raw socket: a request for LONG_TOKENS tokens, the socket closed mid-generation; the
    server's CPU use falls to a fraction of what it was while generating, and the next request
    answers in about its normal time."""
    server = servers["long"]
    pid = server.process.pid
    short_request_seconds(server)  # warm
    baseline = short_request_seconds(server)
    sock = open_long_request(server, stream)
    time.sleep(0.5)
    busy = cpu_rate(pid)
    # A busy machine gives the server a small share of a core; what counts is the fall once the client leaves.
    assert (
        busy > 0.05
    ), f"the long request does not seem to generate ({busy:.2f} CPU-s/s): the test proves nothing"
    sock.close()
    time.sleep(1.0)
    after = cpu_rate(pid)
    assert after < busy / 3, f"still {after:.2f} CPU-s/s after the client left (generating: {busy:.2f})"
    # unbounded, the abandoned request would hold the model for up to the 60 s of --max_request_seconds
    next_request = short_request_seconds(server)
    print(
        f"\n{'stream' if stream else 'json'}: generating {busy:.2f} CPU-s/s, after the client left "
        f"{after:.2f}; next request {next_request:.2f} s (before: {baseline:.2f} s)"
    )
    assert next_request < max(10 * baseline, baseline + 10), (next_request, baseline)


def test_16_concurrent_requests_all_answer_as_generate_does(servers, chat_folder):
    """16 clients at once (completions and chats, streamed or not): every answer is greedy `generate`'s text,
    and bad requests among them are still 400s."""
    client, model = servers["any"].client(), str(chat_folder)

    def one(index: int):
        kind = "completion" if index % 4 < 2 else "chat"
        return kind, ask(client, model, chat=kind == "chat", stream=index % 2 == 1)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(16)))
        bad = list(pool.map(lambda _: post(servers["any"], "/v1/completions", {"model": model, "prompt": ""}),
                            range(4)))
    expected = {kind: greedy_text(chat_folder, chat=kind == "chat") for kind in ("completion", "chat")}
    assert [text for _, text in answers] == [expected[kind] for kind, _ in answers]
    assert [status for status, _ in bad] == [400] * 4


# ---- stop signals ----


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_the_server_within_seconds_mid_generation(long_folder, tmp_path, signum):
    """Mid-generation: the request gets what was generated, the server exits 128 + the signal within
    seconds, with one line and no traceback."""
    server = Server([*LAUNCHER, str(long_folder), "--max_tokens_cap", "60000"], tmp_path / "server.log",
                    pretrain_env(tmp_path, OMP_NUM_THREADS="1"))
    try:
        server.wait_ready(time.monotonic() + READY_TIMEOUT_S)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            idle = cpu_seconds(server.process.pid)
            pending = pool.submit(post, server, "/v1/completions",
                                  {"prompt": COMPLETION_PROMPT, "max_tokens": LONG_TOKENS}, 60)
            # Mid-generation is a second of CPU spent on the request (about a second idle):
            # counted in CPU time, which a busy machine only stretches, rather than as a rate
            # over a fixed window, which it lowers.
            deadline = time.monotonic() + 60
            while cpu_seconds(server.process.pid) - idle < 1.0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert cpu_seconds(server.process.pid) - idle >= 1.0, "the request does not seem to generate"
            children = descendants(server.process.pid)  # the model's process, transformers' resource tracker
            start = time.monotonic()
            server.process.send_signal(signum)
            status, reply = pending.result(timeout=30)
            exit_status = server.process.wait(timeout=30)
            stopped_in = time.monotonic() - start
            deadline = time.monotonic() + 10
            while any(alive(child) for child in children) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        server.stop()
    print(f"\n{signal.Signals(signum).name}: exit {exit_status} {stopped_in:.2f} s after the signal")
    assert children and not any(alive(child) for child in children), "the model's process outlived the server"
    assert status == 200 and 0 < reply["usage"]["completion_tokens"] < LONG_TOKENS, reply
    assert exit_status == 128 + signum, server.output()[-3000:]
    assert stopped_in < 10, stopped_in  # measured: 0.6 s on an idle machine
    assert f"{signal.Signals(signum).name}: stopping (1 request(s) in flight cancelled)" in server.output()
    assert "Traceback" not in server.output() and "leaked" not in server.output(), server.output()[-3000:]


def test_a_stream_cancelled_by_a_stop_signal_says_so(long_folder, tmp_path):
    """A stream cut by SIGTERM ends with one finish_reason ("cancelled" broke the non-streamed answer:
    transformers' response models take OpenAI's only), and the server's log says the request was cancelled."""
    server = Server([*LAUNCHER, str(long_folder), "--max_tokens_cap", "60000"], tmp_path / "server.log",
                    pretrain_env(tmp_path, OMP_NUM_THREADS="1"))
    try:
        server.wait_ready(time.monotonic() + READY_TIMEOUT_S)
        sock = open_long_request(server, stream=True)
        received = b""
        while received.count(b"data: ") < 3:  # a few tokens came: it generates
            received += sock.recv(4096)
        server.process.send_signal(signal.SIGTERM)
        sock.settimeout(30)
        while chunk := sock.recv(65536):
            received += chunk
        sock.close()
        assert server.process.wait(timeout=30) == 143, server.output()[-3000:]
    finally:
        server.stop()
    events = [json.loads(line[len("data: "):]) for line in received.decode(errors="replace").splitlines()
              if line.startswith("data: {")]
    reasons = [event["choices"][0].get("finish_reason") for event in events if event.get("choices")]
    assert [reason for reason in reasons if reason] == ["stop"], reasons[-5:]
    assert "SIGTERM: stopping (1 request(s) in flight cancelled)" in server.output()
