"""`python -m hf_tinytx.serve`: transformers' OpenAI-compatible server (`transformers serve`), safe to leave running.

    python -m hf_tinytx.serve out/tinytx --port 8000    # a folder or a Hub id; any `transformers serve` option

`transformers serve` finds a model's class with `getattr(transformers, config.architectures[0])`, which misses TinyTx.
This launcher puts TinyTx's classes there and runs transformers' own `Serve`. It checks the model argument first
(one line, exit 2) and every request (request_checks.py, guard.py: HTTP 400 in OpenAI's error shape). On SIGINT or
SIGTERM the generations in flight end at their next token and the process exits 128 + the signal's number.
"""

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import transformers  # lazy: it loads torch only when a model class is touched

from hf_tinytx.serve.request_checks import REFUSED_PATHS


PROG = "python -m hf_tinytx.serve"
DEFAULT_MAX_TOKENS_CAP = 1024  # transformers serve's own default for a request that names no max_tokens
DEFAULT_MAX_REQUEST_SECONDS = 60.0
SHUTDOWN_S = 3.0  # what a stop signal leaves the cancelled requests to answer with the text they have
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?(@[\w./-]+)?(:[\w.-]+\.gguf)?$")


def model_argument_error(model: str | None) -> str | None:
    """Why `model` cannot be served, in one line; None for no model, a model folder or a name shaped like a Hub id."""
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
        return folder_error(path)
    if path.exists():
        return f"{model} is a file, not a model folder: pass the folder that holds config.json and the weights"
    if not HUB_ID.match(model) or model.startswith((".", "~")) or os.path.isabs(model):
        return f"no such folder: {model} (pass a model folder, e.g. out/tinytx, or a Hub id such as org/name)"
    return None


def folder_error(path: Path) -> str | None:
    """What generate and convert refuse in a model folder, read without torch."""
    from hf_tinytx.folders import config as folder_config  # light: no torch
    from hf_tinytx.folders import weights as stored_weights

    try:
        config = folder_config.read_config_json(path, None)
        folder_config.check_vocabulary_fits(path, config, None)
        if stored_weights.has_safetensors(path):
            stored_weights.stored_shapes(path, "MODEL")
    except ValueError as error:
        return str(error)
    return None


def usage_error(message: str):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


class StopSignals:
    """Records SIGINT or SIGTERM for the main thread to poll (uvicorn, in its own thread, leaves signals alone). A
    second signal exits at once."""

    def __init__(self):
        self.received: int | None = None

    def __call__(self, signum, frame):
        if self.received is not None:
            os._exit(128 + signum)
        self.received = signum


def load_error(error: BaseException) -> str | None:
    """The first line of why the model did not load, or None for another failure (a port in use is uvicorn's)."""
    if not isinstance(error, (OSError, ValueError, RuntimeError)):
        return None
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker warns that it cleaned up after the model process's `os._exit`."""
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), quiet]))


def serve_until_stopped(Serve, serve_params: dict, signals: StopSignals) -> int:
    """Runs `Serve` in a thread until a stop signal or its end; returns the exit status."""
    from hf_tinytx.serve.guard import cancel_all, in_flight, started

    failure: list[BaseException] = []

    def run():
        try:
            Serve(**serve_params)
        except BaseException as error:  # uvicorn's sys.exit too: reported by the main thread
            failure.append(error)

    thread = threading.Thread(target=run, name="server", daemon=True)
    thread.start()
    while thread.is_alive() and signals.received is None:
        time.sleep(0.1)
    if signals.received is None:
        reason = load_error(failure[0]) if failure and not started() else None
        if reason is not None:
            usage_error(f"cannot load {serve_params['force_model']}: {reason}")
        print(f"{PROG}: the server stopped (see the lines above)", file=sys.stderr)
        return 1
    name = signal.Signals(signals.received).name
    if not started():
        print(f"{PROG}: {name}: stopped before the server started", file=sys.stderr)
        return 128 + signals.received
    print(f"{PROG}: {name}: stopping ({cancel_all()} request(s) in flight cancelled)", file=sys.stderr)
    deadline = time.monotonic() + SHUTDOWN_S  # for the cancelled requests to send what they have
    while in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    return 128 + signals.received


def with_limit_options(Serve, signals: StopSignals):
    """A command taking `Serve`'s options plus this launcher's own (so `--help` lists them all); typer reads its
    signature."""
    import inspect
    from typing import Annotated

    import typer

    def serve_command(max_tokens_cap: int, max_request_seconds: float, **serve_params):
        error = model_argument_error(serve_params["force_model"])
        if error:
            usage_error(error)
        check_serving_layout()
        from hf_tinytx.commands.quiet import quiet_notices
        from hf_tinytx.serve.guard import expose_tinytx_classes, install
        from hf_tinytx.serve.request_checks import Limits

        quiet_notices()
        expose_tinytx_classes()
        install(Limits(max_tokens_cap, max_request_seconds, serve_params["force_model"]))
        quiet_resource_tracker()
        status = serve_until_stopped(Serve, serve_params, signals)
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
    serve_command.__doc__ = served_endpoints_only(Serve.__doc__ or "") + (
        "\n\b\nThis launcher serves /v1/completions and /v1/chat/completions with every field checked (HTTP 400), "
        f"max_tokens bounded by the context and --max_tokens_cap, and refuses {', '.join(REFUSED_PATHS)} "
        "(docs/serving.md)."
    )
    return serve_command


def served_endpoints_only(doc: str) -> str:
    """transformers' help text without the endpoints this launcher refuses (an entry may wrap onto more lines)."""
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
    sys.exit(f"this transformers ({transformers.__version__}) lacks the `serve` this launcher wraps ({error}): "
             'pip install -U "hf_tinytx[serving]" (transformers >= 5.25)')


def check_serving_layout() -> None:
    """Imports the server modules that serve_guard patches (they load torch, so not for --help)."""
    try:
        from transformers.cli.serving import chat_completion, completion, server  # noqa: F401
        from transformers.cli.serving.model_manager import ModelLoader  # noqa: F401  (5.25's layout)
    except ImportError as error:  # a transformers with another layout of the server
        serve_import_error(error)


def main(argv: list[str] | None = None) -> None:
    try:
        from transformers.cli.serve import Serve
        from transformers.utils.import_utils import is_serve_available
    except ImportError as error:  # a transformers without the serve command
        serve_import_error(error)
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
