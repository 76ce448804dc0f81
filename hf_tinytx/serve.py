"""Serve TinyTx with transformers' OpenAI-compatible server: `python -m hf_tinytx.serve` is `transformers serve`,
made safe to leave running.

    python -m hf_tinytx.serve out/tinytx --port 8000    # a folder or a Hub id; any `transformers serve` option

Plain `transformers serve out/tinytx` stops at start-up with "module transformers has no attribute
TinyTxForCausalLM", with or without `--trust-remote-code`: the server finds a model's class with
`getattr(transformers, config.architectures[0])`, which sees only the classes built into transformers, not the Auto
registry nor a checkpoint's `auto_map`. This launcher runs transformers' own `serve` command
(`transformers.cli.serve.Serve`, the one behind `transformers serve`) with the arguments it was given, and:

1. puts TinyTx's classes where that lookup looks (`transformers.TinyTxForCausalLM`, ...);
2. checks the model argument first: a URL, a missing path or a folder that is not a model is one line, exit 2;
3. checks every request (`hf_tinytx.serve_requests`, `hf_tinytx.serve_guard`): a bad field, a chat without a chat
   template, `max_tokens` over the cap (`--max_tokens_cap`) or over the context left by the prompt are HTTP 400 with
   a one-line reason in OpenAI's error shape; a generation stops when its client disconnects and after
   `--max_request_seconds`;
4. owns SIGINT and SIGTERM: in-flight generations are cancelled, the server is given SHUTDOWN_S to close, and the
   process exits 128 + the signal's number (130, 143), whatever is still running; a second signal exits at once.

It needs the `serving` extra (`pip install "hf_tinytx[serving]"`: FastAPI, uvicorn and the `openai` types).
"""

import os
import re
import signal
import sys
import time
from pathlib import Path

import transformers

import hf_tinytx
from hf_tinytx.quiet import quiet_notices
from hf_tinytx.serve_requests import Limits


PROG = "python -m hf_tinytx.serve"
DEFAULT_MAX_TOKENS_CAP = 1024  # transformers serve's own default for a request that names no max_tokens
DEFAULT_MAX_REQUEST_SECONDS = 60.0
SHUTDOWN_S = 3.0  # what uvicorn waits for open requests after a stop signal, then cancels them
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?(@[\w./-]+)?(:[\w.-]+\.gguf)?$")


class Stop(BaseException):
    """A stop signal, raised in the main thread wherever it is (loading the model, or waiting for the server)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def expose_tinytx_classes() -> None:
    """Makes `getattr(transformers, "TinyTxForCausalLM")` (and the other TinyTx classes) what `hf_tinytx` defines,
    which is how `transformers serve` turns `config.architectures[0]` into a class."""
    for name in hf_tinytx.__all__:
        if name.startswith("TinyTx"):
            setattr(transformers, name, getattr(hf_tinytx, name))


def model_argument_error(model: str | None) -> str | None:
    """Why `model` cannot be served, in one line, or None (no model, a model folder, or a name shaped like a Hub id,
    which only loading can check)."""
    if model is None:
        return None
    if "://" in model:
        return (f"{model} is a URL: pass a local model folder or a Hub id (org/name); to serve files from a URL, "
                "download them into a folder first")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return (f"{model} is not a model folder (no config.json in it): pass the folder pretrain or finetune "
                    "wrote, e.g. out/tinytx")
        return None
    if path.exists():
        return f"{model} is a file, not a model folder: pass the folder that holds config.json and the weights"
    if not HUB_ID.match(model) or model.startswith((".", "~")) or os.path.isabs(model):
        return f"no such folder: {model} (pass a model folder, e.g. out/tinytx, or a Hub id such as org/name)"
    return None


def usage_error(message: str):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


class StopSignals:
    """The handler of SIGINT and SIGTERM. Before the server runs it raises Stop (a model that loads is interrupted);
    once it runs, it only records the signal, which the main thread polls: an exception raised inside
    `Thread.join` would leave the thread marked as stopped while it still runs. A second signal exits at once."""

    def __init__(self):
        self.received: int | None = None
        self.serving = False

    def __call__(self, signum, frame):
        if self.received is not None:
            os._exit(128 + signum)
        self.received = signum
        if not self.serving:
            raise Stop(signum)


def serve_until_stopped(Serve, serve_params: dict, signals: StopSignals) -> int:
    """Starts `Serve` (the model loads in this thread, uvicorn runs in its own) and waits for a stop signal or for
    the server to end; returns the exit status."""
    from hf_tinytx.serve_guard import cancel_all

    model = serve_params["force_model"]
    try:
        serve = Serve(**{**serve_params, "non_blocking": True})
    except (OSError, ValueError) as error:  # the model named on the command line does not load
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        usage_error(f"cannot load {model}: {reason}")
    serve.server.config.timeout_graceful_shutdown = SHUTDOWN_S  # read by uvicorn when it shuts down
    signals.serving = True
    while serve._thread.is_alive() and signals.received is None:
        time.sleep(0.1)
    if signals.received is None:
        print(f"{PROG}: the server stopped (see the lines above)", file=sys.stderr)
        return 1
    name = signal.Signals(signals.received).name
    print(f"{PROG}: {name}: stopping ({cancel_all()} request(s) in flight cancelled)", file=sys.stderr)
    serve.server.should_exit = True
    serve._thread.join(timeout=SHUTDOWN_S + 2)
    return 128 + signals.received


def with_limit_options(Serve, signals: StopSignals):
    """A function that takes `Serve`'s options plus this launcher's own (so `--help` lists them all) and runs the
    server with them; typer reads its signature as it reads `Serve`'s."""
    import inspect
    from typing import Annotated

    import typer

    def serve_command(max_tokens_cap: int, max_request_seconds: float, **serve_params):
        try:
            error = model_argument_error(serve_params["force_model"])
            if error:
                usage_error(error)
            from hf_tinytx.serve_guard import install

            quiet_notices()
            expose_tinytx_classes()
            install(Limits(max_tokens_cap, max_request_seconds, serve_params["force_model"]))
            status = serve_until_stopped(Serve, serve_params, signals)
        except Stop as stop:  # before the server started (while the model loads)
            print(f"{PROG}: {signal.Signals(stop.signum).name}: stopped before the server started", file=sys.stderr)
            status = 128 + stop.signum
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # uvicorn's thread is not a daemon; an unfinished one must not hold the exit

    ours = {
        "max_tokens_cap": (int, DEFAULT_MAX_TOKENS_CAP, typer.Option(
            "--max_tokens_cap", "--max-tokens-cap", min=1,
            help="Most tokens one request may generate; the model's context (minus the prompt) also bounds it.")),
        "max_request_seconds": (float, DEFAULT_MAX_REQUEST_SECONDS, typer.Option(
            "--max_request_seconds", "--max-request-seconds", min=0.001,
            help="Longest one generation may run; it then returns the text it has.")),
    }
    serve_signature = inspect.signature(Serve)
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(name, keyword, default=default, annotation=Annotated[kind, option])
              for name, (kind, default, option) in ours.items()]
    params += [p.replace(kind=keyword) for p in serve_signature.parameters.values()]
    serve_command.__signature__ = serve_signature.replace(parameters=params)
    serve_command.__annotations__ = {p.name: p.annotation for p in params}
    serve_command.__doc__ = (Serve.__doc__ or "") + (
        "\n\b\nThis launcher serves /v1/completions and /v1/chat/completions with every field checked (HTTP 400), "
        "max_tokens bounded by the context and --max_tokens_cap, and refuses /v1/responses, /v1/systemone, "
        "/v1/audio/transcriptions and /reset (docs/serving.md)."
    )
    return serve_command


def main(argv: list[str] | None = None) -> None:
    try:
        from transformers.cli.serve import Serve
        from transformers.cli.serving import chat_completion, completion, server, utils  # noqa: F401
        from transformers.utils.import_utils import is_serve_available
    except ImportError as error:  # a transformers without the serve command, or with another layout of it
        sys.exit(f"this transformers ({transformers.__version__}) lacks the `serve` this launcher wraps: {error}")
    if not is_serve_available():
        sys.exit('transformers serve needs FastAPI, uvicorn and openai: pip install "hf_tinytx[serving]"')
    import typer

    signals = StopSignals()
    signal.signal(signal.SIGINT, signals)
    signal.signal(signal.SIGTERM, signals)
    app = typer.Typer(add_completion=False)
    app.command()(with_limit_options(Serve, signals))  # the only command, so it is the program itself: no "serve" word
    app(args=sys.argv[1:] if argv is None else argv, prog_name=PROG)


if __name__ == "__main__":
    main()
