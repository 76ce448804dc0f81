"""Serve TinyTx with transformers' OpenAI-compatible server: `python -m hf_tinytx.serve` is `transformers serve`.

    python -m hf_tinytx.serve out/tinytx --port 8000    # a folder or a Hub id; any `transformers serve` option

Plain `transformers serve out/tinytx` stops at start-up with "module transformers has no attribute
TinyTxForCausalLM", with or without `--trust-remote-code`: the server finds a model's class with
`getattr(transformers, config.architectures[0])`, which sees only the classes built into transformers, not the Auto
registry nor a checkpoint's `auto_map`. This launcher changes two things, then runs transformers' own `serve`
command (`transformers.cli.serve.Serve`, the one behind `transformers serve`) with the arguments it was given:

1. TinyTx's classes are put where that lookup looks (`transformers.TinyTxForCausalLM`, ...);
2. `/v1/chat/completions` for a model whose tokenizer has no chat template answers HTTP 400 with a message that
   names the fix, where the server would fail inside `apply_chat_template` and answer 500.

It needs the `serving` extra (`pip install "hf_tinytx[serving]"`: FastAPI, uvicorn and the `openai` types).
"""

import sys

import transformers

import hf_tinytx
from hf_tinytx.quiet import quiet_notices


NO_CHAT_TEMPLATE = (
    "{model} has no chat template, so its chat messages cannot be turned into a prompt: send plain text to "
    "/v1/completions instead, or give the tokenizer a template (tokenizer.chat_template = '...'; "
    "tokenizer.save_pretrained(folder)) and restart the server"
)


def expose_tinytx_classes() -> None:
    """Makes `getattr(transformers, "TinyTxForCausalLM")` (and the other TinyTx classes) what `hf_tinytx` defines,
    which is how `transformers serve` turns `config.architectures[0]` into a class."""
    for name in hf_tinytx.__all__:
        if name.startswith("TinyTx"):
            setattr(transformers, name, getattr(hf_tinytx, name))


def require_chat_template() -> None:
    """Puts a chat handler that first checks for a chat template where `transformers serve` takes its handler from
    (`Serve` imports `ChatCompletionHandler` from this module when it starts)."""
    from fastapi.responses import JSONResponse
    from transformers.cli.serving import chat_completion

    class ChatCompletionHandler(chat_completion.ChatCompletionHandler):
        async def handle_request(self, body: dict, request_id: str):
            self._validate_request(body)  # the server's own 422 for unknown fields comes first
            _, _, processor = self._resolve_model(dict(body))  # loads the model once; the server reuses it
            if getattr(processor, "chat_template", None) is None:
                model = self.model_manager.force_model or body.get("model")  # as named, without a revision
                # OpenAI's error shape, so the `openai` client puts the message in its exception
                error = {"message": NO_CHAT_TEMPLATE.format(model=model), "type": "invalid_request_error",
                         "param": "messages", "code": "no_chat_template"}
                return JSONResponse({"error": error}, status_code=400)
            return await super().handle_request(body, request_id)

    chat_completion.ChatCompletionHandler = ChatCompletionHandler


def main(argv: list[str] | None = None) -> None:
    try:
        from transformers.cli.serve import Serve
        from transformers.utils.import_utils import is_serve_available
    except ImportError as error:  # a transformers without the serve command
        sys.exit(f"this transformers ({transformers.__version__}) has no `serve` command ({error})")
    if not is_serve_available():
        sys.exit('transformers serve needs FastAPI, uvicorn and openai: pip install "hf_tinytx[serving]"')
    import typer

    quiet_notices()
    expose_tinytx_classes()
    require_chat_template()
    app = typer.Typer(add_completion=False)
    app.command()(Serve)  # the only command, so it is the program itself: no "serve" word in front of the arguments
    app(args=sys.argv[1:] if argv is None else argv, prog_name="python -m hf_tinytx.serve")


if __name__ == "__main__":
    main()
