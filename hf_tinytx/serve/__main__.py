"""`python -m hf_tinytx.serve`: transformers' OpenAI-compatible server
(`transformers serve`), safe to leave running.

    python -m hf_tinytx.serve out/tinytx --port 8000    # a folder or a Hub id; any `transformers serve`
                                                        # option

Two servers, through transformers' public interface only: transformers' own `Serve` (backend.py) on a
loopback port, and, on --host and --port, our ASGI app in front of it (front.py), which checks every
request (HTTP 400 in OpenAI's error shape) and forwards the good ones. The command line is checked
first: a bad flag, port or model argument is one line, exit 2. On SIGINT or SIGTERM the answers in flight
end with the text they have and the process exits 128 + the signal's number.
"""

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from hf_tinytx.commands.signals import Recorder, record
from hf_tinytx.folders.location import local_folder_or_hub_id
from hf_tinytx.serve.model_checks import split_model_name
from hf_tinytx.serve.request_checks import REFUSED_PATHS


PROG = "python -m hf_tinytx.serve"
DEFAULT_MAX_TOKENS_CAP = 1024  # transformers serve's own default for a request that names no max_tokens
DEFAULT_MAX_REQUEST_SECONDS = 60.0
SHUTDOWN_S = 3.0  # what a stop signal leaves the cut answers to go out
BACKEND_STOP_S = 5.0  # then transformers' server's own graceful stop, before it is killed


def model_argument_error(model: str | None) -> str | None:
    """Why `model` cannot be served, in one line; None for no model, a model folder
    or a Hub id (`repo[@revision][:file.gguf]`)."""
    if model is None:
        return None
    if "://" in model:
        return (
            f"{model} is a URL: pass a local model folder or a Hub id (org/name); to serve files from a URL, "
            "download them into a folder first"
        )
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return (
                f"{model} is not a model folder (no config.json in it): pass the folder pretrain or finetune "
                "wrote, e.g. out/tinytx"
            )
        return folder_error(path)
    if path.exists():
        return (
            f"{model} is a file, not a model folder: pass the folder that holds config.json and the weights"
        )
    try:  # the rule every command has for a path that is missing or a Hub id (models/typo is a path)
        local_folder_or_hub_id(split_model_name(model)[0])
    except FileNotFoundError as error:
        return str(error)
    return None


def port_error(port: int) -> str | None:
    """uvicorn takes any number and says it runs there: 99999 listened on another port."""
    if 1 <= port <= 65535:
        return None
    return f"--port {port} is not a port: give one from 1 to 65535, e.g. --port 8000"


def folder_error(path: Path) -> str | None:
    """What generate and convert refuse in a model folder, read without torch."""
    from hf_tinytx.folders import config as folder_config  # light: no torch
    from hf_tinytx.folders import weights as stored_weights

    try:
        config = folder_config.read_config_json(path, None)
        folder_config.check_vocabulary_fits(path, config, None)
        stored_weights.check_weights(path, str(path), "MODEL")
    except ValueError as error:
        return str(error)
    return None


def usage_error(message: str):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_backend(serve_params: dict) -> tuple[subprocess.Popen, int]:
    """transformers' server (backend.py) in a process of its own group, so that a terminal's
    Ctrl+C reaches this launcher only, which stops it once the answers in flight have ended;
    and the read end of its report pipe."""
    report_read, report_write = os.pipe()
    # it cleans up after the model process's exit
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    env = {**os.environ, "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), quiet]))}
    backend = subprocess.Popen(
        [sys.executable, "-m", "hf_tinytx.serve.backend", json.dumps(serve_params), str(report_write)],
        stdin=subprocess.PIPE, pass_fds=(report_write,), process_group=0, env=env)
    os.close(report_write)
    os.set_blocking(report_read, False)
    return backend, report_read


def backend_report(report_read: int) -> str:
    """The one line the backend wrote on its way out (why transformers' server stopped), or ""."""
    try:
        return os.read(report_read, 4096).decode(errors="replace").strip()
    except BlockingIOError:
        return ""


def stop_backend(backend: subprocess.Popen) -> None:
    if backend.poll() is None:
        backend.terminate()  # uvicorn's graceful shutdown: the model's process exits with it
        try:
            backend.wait(BACKEND_STOP_S)
        except subprocess.TimeoutExpired:
            backend.kill()
            backend.wait()


def backend_is_healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def wait_for_backend(backend: subprocess.Popen, port: int, signals: Recorder) -> str:
    """"ready" once transformers' server answers /health (a model on the command line is
    loaded by then), "exited", or "signal"."""
    while signals.first is None:
        if backend.poll() is not None:
            return "exited"
        if backend_is_healthy(port):
            return "ready"
        time.sleep(0.2)
    return "signal"


def start_front(front, host: str, port: int):
    """Our ASGI app on the user's host and port, served by uvicorn in a thread; (thread, its event loop)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(front, host=host, port=port, lifespan="off", ws="none"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(),), name="front", daemon=True
    )
    thread.start()
    return thread, loop


def serve_until_stopped(serve_params: dict, limits, template_kwargs: dict, signals: Recorder) -> int:
    """Runs both servers until a stop signal or the end of one; returns the exit status."""
    from hf_tinytx.serve.front import Front
    from hf_tinytx.serve.model_checks import Models
    from hf_tinytx.serve.request_checks import RequestError

    port = free_loopback_port()
    backend, report = start_backend({**serve_params, "host": "127.0.0.1", "port": port})
    models = Models(serve_params, template_kwargs)
    # its tokenizer, for the checks, while transformers loads the model
    if serve_params["force_model"] is not None:
        try:
            models.load(serve_params["force_model"])
        except RequestError as error:
            stop_backend(backend)
            usage_error(str(error))
    state = wait_for_backend(backend, port, signals)
    if state == "signal":
        print(
            f"{PROG}: {signal.Signals(signals.first).name}: stopped before the server started",
            file=sys.stderr,
        )
        stop_backend(backend)
        return 128 + signals.first
    if state == "exited":
        reason, model = backend_report(report), serve_params["force_model"]
        if reason:
            usage_error(f"cannot load {model}: {reason}" if model else reason)
        print(f"{PROG}: the server stopped (see the lines above)", file=sys.stderr)
        return 1
    front = Front(f"http://127.0.0.1:{port}", limits, models)
    thread, loop = start_front(front, serve_params["host"], serve_params["port"])
    while thread.is_alive() and backend.poll() is None and signals.first is None:
        time.sleep(0.1)
    if signals.first is not None:
        return stop(signals.first, front, loop, backend)
    reason = backend_report(report) if backend.poll() is not None else ""
    stop_backend(backend)
    print(f"{PROG}: the server stopped ({reason or 'see the lines above'})", file=sys.stderr)
    return 1


def stop(signum: int, front, loop, backend: subprocess.Popen) -> int:
    """Cuts the answers in flight (each client gets the text so far), gives them SHUTDOWN_S to go
    out, then stops transformers' server."""

    async def cut() -> int:
        return front.cut_all()

    cut_short = asyncio.run_coroutine_threadsafe(cut(), loop).result(timeout=5)
    name = signal.Signals(signum).name
    print(f"{PROG}: {name}: stopping ({cut_short} request(s) in flight cancelled)", file=sys.stderr)
    deadline = time.monotonic() + SHUTDOWN_S
    while front.answering and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_backend(backend)
    return 128 + signum


def with_limit_options(Serve, signals: Recorder):
    """A command taking `Serve`'s options plus this launcher's own (so `--help` lists them
    all); typer reads its signature."""
    import inspect
    from typing import Annotated

    import typer

    def serve_command(max_tokens_cap: int, max_request_seconds: float, **serve_params):
        error = port_error(serve_params["port"]) or model_argument_error(serve_params["force_model"])
        if error:
            usage_error(error)
        try:  # `--chat-template-kwargs` and `--reasoning`, as transformers reads them
            template_kwargs = Serve.parse_chat_template_kwargs(serve_params["chat_template_kwargs"],
                                                               serve_params["reasoning"])
        except (ValueError, typer.BadParameter) as bad:
            usage_error(
                f"--chat-template-kwargs must be a JSON object, e.g. '{{\"enable_thinking\": true}}' ({bad})"
            )
        from hf_tinytx.serve.request_checks import Limits

        limits = Limits(max_tokens_cap, max_request_seconds, serve_params["force_model"])
        status = serve_until_stopped(serve_params, limits, template_kwargs, signals)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # uvicorn's thread is not done; it must not hold the exit

    ours = {
        "max_tokens_cap": (
            int,
            DEFAULT_MAX_TOKENS_CAP,
            typer.Option(
                "--max_tokens_cap", "--max-tokens-cap", min=1,
                help="Most tokens one request may generate; the model's context (minus the prompt) also "
                     "bounds it.",
            ),
        ),
        "max_request_seconds": (
            float,
            DEFAULT_MAX_REQUEST_SECONDS,
            typer.Option(
                "--max_request_seconds", "--max-request-seconds", min=0.001,
                help="Longest one generation may run; it then returns the text it has.",
            ),
        ),
    }
    serve_signature = inspect.signature(Serve)
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(name, keyword, default=default, annotation=Annotated[kind, option])
              for name, (kind, default, option) in ours.items()]
    params += [p.replace(kind=keyword) for p in serve_signature.parameters.values()]
    serve_command.__signature__ = serve_signature.replace(parameters=params)
    serve_command.__annotations__ = {p.name: p.annotation for p in params}
    serve_command.__doc__ = served_endpoints_only(Serve.__doc__ or "") + (
        "\n\b\nThis launcher serves /v1/completions and /v1/chat/completions with every field checked (HTTP "
        "400), max_tokens bounded by the context and --max_tokens_cap, and refuses "
        f"{', '.join(REFUSED_PATHS)} (docs/serving.md)."
    )
    return serve_command


def served_endpoints_only(doc: str) -> str:
    """transformers' help text without the endpoints this launcher refuses (an
    entry may wrap onto more lines)."""
    kept, skipping = [], False
    for line in doc.splitlines():
        entry = re.match(r"\s+(GET|POST|DELETE|PUT)\s+(\S+)", line)
        if entry:
            skipping = entry.group(2) in REFUSED_PATHS
        elif not line.startswith("        "):  # a line that does not continue an entry
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept) + "\n"


def serve_import_error(error: ImportError):
    import transformers

    sys.exit(
        f"this transformers ({transformers.__version__}) lacks the `serve` this launcher wraps ({error}): "
        'pip install -U "hf_tinytx[serving]" (transformers >= 5.25)'
    )


def main(argv: list[str] | None = None) -> None:
    try:
        from transformers.cli.serve import Serve
        from transformers.utils.import_utils import is_serve_available
    except ImportError as error:  # a transformers without the serve command
        serve_import_error(error)
    if not is_serve_available():
        sys.exit('transformers serve needs FastAPI, uvicorn and openai: pip install "hf_tinytx[serving]"')
    import typer

    signals = record(exit_on_second=True)  # uvicorn, in its own thread, leaves them alone
    app = typer.Typer(add_completion=False)
    # the only command, so it is the program itself: no "serve" word
    app.command()(with_limit_options(Serve, signals))
    # The parser's errors as ours, in one line, not typer's box of several. Its click is its own copy
    # (typer >= 0.2x) or click itself: the class its BadParameter comes from.
    click_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        status = app(args=sys.argv[1:] if argv is None else argv, prog_name=PROG, standalone_mode=False)
    except click_error as error:
        usage_error(f"{error.format_message().rstrip('.')}; {PROG} --help lists the options")
    sys.exit(status)  # --help's 0; a served model ends the process itself


if __name__ == "__main__":
    main()
