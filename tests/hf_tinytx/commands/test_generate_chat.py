"""`tinytx generate` and `tinytx chat` on a tiny saved folder: greedy output is the README's Python's (eager,
compiled, without the `train` extra); chat answers from the conversation, /reset, /exit; bad input is one line
and exit 2 before torch loads (a table, run in process; two of its cases and the refusals that need a fresh
process run `tinytx`). The three runs that load a model go in subprocesses side by side."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from transformers.utils import logging as transformers_logging

from hf_tinytx.commands import chat, generate
from hf_tinytx_training.sft.data import DEFAULT_CHAT_TEMPLATE
from tests.helpers.faults import relabel_dtype
from tests.helpers.refusals import refused_in_process, snapshot
from tests.helpers.tiny import TINY_SENTENCES, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env
from tests.test_wheel import HIDE_MODULES


PROMPT = "The cat sat"
NEW_TOKENS = 12
TINYTX = [sys.executable, "-m", "hf_tinytx_training"]  # what the `tinytx` console script runs
# One user turn a line, then a new conversation that starts as the first did; the
# line after /exit is never read.
CHAT_INPUT = ["The cat sat", "and the dog?", "/reset", "The cat sat", "/exit", "The quick brown fox"]


def trained_tiny(steps: int = 60):
    """A tiny TinyTx and its byte-level BPE, trained for a second: its greedy tokens win by wide margins, so
    that a compiled forward, which rounds differently, picks the same ones."""
    tokenizer = build_byte_bpe_tokenizer()
    model = build_tiny_model(vocab_size=len(tokenizer))
    batch = tokenizer([tokenizer.bos_token + s + tokenizer.eos_token for s in TINY_SENTENCES], padding=True,
                      return_tensors="pt", add_special_tokens=False)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{"model", "tokenizer", "plain": its folder without a chat template, "chat":
    with finetune's default one}."""
    model, tokenizer = trained_tiny()
    root = tmp_path_factory.mktemp("generate_chat")
    found = {
        "model": model, "tokenizer": tokenizer, "root": root, "plain": root / "plain", "chat": root / "chat",
    }
    model.save_pretrained(found["plain"])
    tokenizer.save_pretrained(found["plain"])
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    model.save_pretrained(found["chat"])
    tokenizer.save_pretrained(found["chat"])
    tokenizer.chat_template = None
    return found


@pytest.fixture(autouse=True)
def progress_bars_back():
    yield
    transformers_logging.enable_progress_bar()  # main() turns them off for its own output


def readme_text(tiny) -> str:
    """What the README's Python prints: greedy `generate` from the tokenized prompt, decoded whole."""
    output = tiny["model"].generate(
        **tiny["tokenizer"](PROMPT, return_tensors="pt"), max_new_tokens=NEW_TOKENS, do_sample=False
    )
    return tiny["tokenizer"].decode(output[0], skip_special_tokens=True) + "\n"


def chat_replies(model, tokenizer, conversations: list[list[str]], max_new_tokens: int) -> list[str]:
    """Greedy replies to each user turn, each conversation from the start."""
    replies = []
    for turns in conversations:
        messages = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            inputs = tokenizer.apply_chat_template(
                messages, chat_template=DEFAULT_CHAT_TEMPLATE, add_generation_prompt=True, return_dict=True,
                return_tensors="pt",
            )
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
            reply = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
            messages.append({"role": "assistant", "content": reply})
            replies.append(reply)
    return replies


@pytest.fixture(scope="module")
def runs(tiny):
    """The commands that load the model, in subprocesses side by side: {name: CompletedProcess}."""
    hide = tiny["root"] / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        HIDE_MODULES.format(hidden={"accelerate", "datasets", "matplotlib"})
    )
    env = pretrain_env(tiny["root"])
    greedy = [str(tiny["plain"]), PROMPT, "--max_new_tokens", str(NEW_TOKENS)]
    commands = {
        "compiled": ([*TINYTX, "generate", *greedy, "--compile"], env, None),
        "without_train_extra": ([*TINYTX, "generate", *greedy], {**env, "PYTHONPATH": str(hide)}, None),
        "chat": (
            [*TINYTX, "chat", str(tiny["chat"]), "--max_new_tokens", "10"], env, "\n".join(CHAT_INPUT) + "\n",
        ),
    }
    started = {  # the chat first: it waits for its turns, which communicate() writes
        name: subprocess.Popen(
            command, env=environment, cwd=tiny["root"], text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL if text is None else subprocess.PIPE,
        )
        for name, (command, environment, text) in sorted(commands.items(), key=lambda item: item[0] != "chat")
    }
    finished = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(commands[name][2], timeout=300)
        finished[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return finished


# ---- tinytx generate ----


def test_greedy_generate_gives_the_tokens_and_text_of_model_generate(tiny, capsys):
    model, tokenizer = tiny["model"], tiny["tokenizer"]
    flags = [str(tiny["plain"]), PROMPT, "--max_new_tokens", str(NEW_TOKENS)]
    settings = generate.generation_settings(generate.build_parser().parse_args(flags), model, 64)
    expected = model.generate(
        **tokenizer(PROMPT, return_tensors="pt"), max_new_tokens=NEW_TOKENS, do_sample=False
    )
    assert torch.equal(generate.continue_prompt(model, tokenizer, PROMPT, settings), expected)

    assert generate.main(flags) == 0
    assert capsys.readouterr().out == tokenizer.decode(expected[0], skip_special_tokens=True) + "\n"


@pytest.mark.deep
def test_compiled_generate_gives_the_eager_text(tiny, runs):
    result = runs["compiled"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == readme_text(tiny)


def test_generate_runs_without_the_train_extra(tiny, runs):
    result = runs["without_train_extra"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == readme_text(tiny)
    assert "Loading weights" not in result.stderr  # the progress bars are off


def test_a_seeded_sample_is_the_same_text_twice(tiny, capsys):
    def sample(seed):
        flags = [str(tiny["plain"]), PROMPT, "--max_new_tokens", "16", "--do_sample", "--temperature", "1.5"]
        assert generate.main([*flags, "--seed", str(seed)]) == 0
        return capsys.readouterr().out

    first = sample(7)
    assert first.startswith(PROMPT) and sample(7) == first
    assert len({first, *(sample(seed) for seed in (0, 1, 2))}) > 1  # and it does sample


# ---- tinytx chat ----


def test_chat_answers_each_turn_from_the_conversation_resets_and_exits(tiny, runs):
    result = runs["chat"]
    assert result.returncode == 0, result.stderr[-3000:]
    replies = chat_replies(
        tiny["model"], tiny["tokenizer"], [CHAT_INPUT[:2], CHAT_INPUT[3:4]], max_new_tokens=10
    )
    assert result.stdout == "".join(reply + "\n" for reply in replies)
    assert replies[2] == replies[0]  # after /reset the same first turn, the same reply
    alone = chat_replies(tiny["model"], tiny["tokenizer"], [CHAT_INPUT[1:2]], max_new_tokens=10)[0]
    assert alone != replies[1], "the second turn's reply should depend on the first exchange"
    assert "(a new conversation)" in result.stderr.splitlines()


def converse(tiny, settings: dict, turns: list[str]) -> None:
    """`chat.converse` with the fixture's model and its tokenizer, given
    finetune's chat template meanwhile."""
    tiny["tokenizer"].chat_template = DEFAULT_CHAT_TEMPLATE
    try:
        chat.converse(tiny["model"], tiny["tokenizer"], settings, turns)
    finally:
        tiny["tokenizer"].chat_template = None


def test_a_reply_stops_at_the_models_last_position_and_a_full_conversation_waits_for_reset(tiny, capsys):
    long_turn = " ".join(TINY_SENTENCES[:2])  # 84 of the model's 128 positions once templated
    converse(tiny, {"max_new_tokens": 100, "do_sample": False, "eos_token_id": None},
             [long_turn, "and on?", "/reset", "Hello"])
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "(the reply stopped at the 128 positions the model reads: /reset starts a new conversation)",
        err.splitlines()[1],
        "(a new conversation)",
    ]
    assert err.splitlines()[1].startswith("(the conversation with this turn is ")  # "and on?" finds no room
    assert len(out.splitlines()) >= 2  # the long turn's reply, then Hello's


def test_an_empty_reply_is_said(tiny, capsys):
    tokenizer = tiny["tokenizer"]
    everything_but_the_end = [i for i in range(len(tokenizer)) if i != tokenizer.eos_token_id]
    converse(tiny, {"max_new_tokens": 5, "do_sample": False, "suppress_tokens": everything_but_the_end},
             ["Hello", "/exit"])
    out, err = capsys.readouterr()
    assert out.strip() == ""
    assert err.splitlines() == [
        "(an empty reply: the model ended its turn without a word; try again, or --do_sample)"
    ]


# ---- refusals: one line, exit 2, before torch loads ----


def refusal(tiny, command: str, *args: str, hidden=()):
    """(the one error line, stderr's other lines) of `tinytx command args`,
    checked to exit 2 without torch."""
    env = pretrain_env(tiny["root"])
    if hidden:
        hide = tiny["root"] / ("hide-" + "-".join(hidden))
        hide.mkdir(exist_ok=True)
        (hide / "sitecustomize.py").write_text(HIDE_MODULES.format(hidden=set(hidden)))
        env["PYTHONPATH"] = str(hide)
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *TINYTX[1:], command, *args], cwd=tiny["root"], env=env,
        capture_output=True, text=True, timeout=120,
    )
    imported = {
        line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")
    }
    lines = [line for line in result.stderr.splitlines() if not line.startswith("import time")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "torch" not in imported and result.stdout == ""
    assert len(lines) == 1, lines
    return lines[0]


def test_chat_refuses_a_folder_without_a_chat_template(tiny):
    assert refusal(tiny, "chat", "plain") == f"tinytx chat: error: {chat.no_template('plain')}"
    assert "tinytx generate plain" in chat.no_template("plain") and "chat records" in chat.no_template(
        "plain"
    )


def test_chat_without_jinja2_says_so(tiny):
    line = refusal(tiny, "chat", "chat", hidden=("jinja2",))
    assert line == (
        "tinytx chat: error: chat templates are rendered by jinja2, which is not installed: pip install "
        "jinja2 (the `train` extra brings it)."
    )


# command, its arguments, words of the one line: each case in process; IN_A_PROCESS ones also as `tinytx`.
REFUSALS = [
    ("generate", ("missing", PROMPT), "no such folder: missing; give the folder pretrain or finetune wrote"),
    ("generate", ("plai", PROMPT), "no such folder: plai; did you mean 'plain'?"),
    ("chat", ("empty",), "empty has no config.json, so it holds no saved model"),
    (
        "generate", ("no-tokenizer", PROMPT),
        "no-tokenizer has no tokenizer (no tokenizer.json or tokenizer_config",
    ),
    ("generate", ("damaged", PROMPT), "damaged/model.safetensors is damaged or truncated"),
    ("chat", ("damaged",), "damaged/model.safetensors is damaged or truncated"),
    # Before: torch's own advice to unpickle with weights_only=False (issue 69).
    ("generate", ("pickled", PROMPT), "pickled holds its weights only as a pickle (pytorch_model.bin)"),
    ("generate", ("plain", PROMPT, "--max_new_tokens", "0"), "--max_new_tokens must be at least 1, got 0."),
    (
        "generate", ("plain", PROMPT, "--max_new_tokens", "many"),
        "argument --max_new_tokens: invalid int value",
    ),
    (
        "generate", ("plain", PROMPT, "--temperature", "0.7"),
        "--temperature applies only when sampling: add --do_",
    ),
    ("chat", ("chat", "--do_sample", "--top_p", "1.5"), "--top_p must lie in (0, 1], got 1.5."),
    # The words of pretrain and finetune (one OneLineParser): a flag called a flag, a stray word a value.
    (
        "generate", ("plain", PROMPT, "--max_new_token", "3"),
        "unknown flag --max_new_token; did you mean --max_new_tokens?",
    ),
    ("generate", ("plain", "The", "cat"), "unexpected value 'cat': text with spaces goes in quotes"),
    ("chat", ("chat", "hello"), "unexpected value 'hello': every value follows its flag (--name value)"),
    ("generate", ("plain", ""), "the prompt is empty: give some text to continue."),
    ("generate", ("plain", PROMPT, "--device", "GPU 0"), "--device 'GPU 0' is not a device name"),
    # Folders convert refuses in one line, refused alike (issue 57): before,
    # tracebacks or a silent wrong answer.
    (
        "generate", ("config-list", PROMPT),
        "config-list/config.json holds a JSON list, not an object of config",
    ),
    ("chat", ("config-list",), "config-list/config.json holds a JSON list, not an object of config"),
    ("generate", ("rope-5", PROMPT), 'rope-5/config.json has "rope_parameters": 5, which must be an object'),
    (
        "generate", ("big-tokenizer", PROMPT),
        "big-tokenizer's tokenizer has 300 tokens but the model's embedding only 200 rows",
    ),
    ("generate", ("i32-header", PROMPT), "i32-header/model.safetensors stores lm_head.weight (I32), "),
    (
        "chat", ("i32-header",),
        "as an integer type, but the weights of a model that is not quantized are floating",
    ),
]
IN_A_PROCESS = [REFUSALS[1], REFUSALS[-1]]  # the real command: the same line, and no torch in its import log


@pytest.mark.parametrize("command, args, expected", REFUSALS)
def test_bad_input_is_one_line_before_torch_loads(tiny, monkeypatch, capsys, command, args, expected):
    make_bad_folders(tiny)
    before = snapshot(tiny["root"])
    monkeypatch.chdir(tiny["root"])
    main = {"generate": generate.main, "chat": chat.main}[command]
    line = refused_in_process(capsys, monkeypatch, f"tinytx {command}", lambda argv: sys.exit(main(argv)),
                              [*args])
    assert line.startswith(f"tinytx {command}: error: ") and expected in line, line
    assert snapshot(tiny["root"]) == before


@pytest.mark.parametrize("command, args, expected", IN_A_PROCESS)
def test_the_command_prints_the_line_before_torch_loads(tiny, command, args, expected):
    make_bad_folders(tiny)
    before = snapshot(tiny["root"])
    line = refusal(tiny, command, *args)
    assert line.startswith(f"tinytx {command}: error: ") and expected in line, line
    assert snapshot(tiny["root"]) == before


def make_bad_folders(tiny) -> None:
    """The folders the refusals name, made once beside the good ones."""
    root = tiny["root"]
    if (root / "empty").exists():
        return
    (root / "empty").mkdir()
    shutil.copytree(tiny["plain"], root / "no-tokenizer",
                    ignore=lambda folder, names: [n for n in names if n.startswith("tokenizer")])
    shutil.copytree(tiny["plain"], root / "damaged")
    shutil.copytree(tiny["plain"], root / "pickled")
    (root / "pickled" / "model.safetensors").rename(root / "pickled" / "pytorch_model.bin")
    data = bytearray((root / "damaged" / "model.safetensors").read_bytes())
    data[8:40] = b"\x00\xff" * 16  # the header's JSON garbled
    (root / "damaged" / "model.safetensors").write_bytes(data)
    for name, change in (
        ("config-list", lambda config: [config]), ("rope-5", lambda c: {**c, "rope_parameters": 5}),
        ("wrong-shape", lambda config: {**config, "intermediate_size": 48}),
        ("one-layer-more", lambda config: {**config, "num_hidden_layers": 3}),
    ):
        shutil.copytree(tiny["chat"], root / name)
        config = json.loads((root / name / "config.json").read_text())
        (root / name / "config.json").write_text(json.dumps(change(config)))
    shutil.copytree(tiny["chat"], root / "i32-header")
    relabel_dtype(root / "i32-header" / "model.safetensors", "F32", "I32")
    build_tiny_model(vocab_size=200).save_pretrained(root / "big-tokenizer")
    tiny["tokenizer"].save_pretrained(root / "big-tokenizer")


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("folder, expected", [
    ("wrong-shape", "do not match its config.json — misshapen: "
                  "model.layers.0.mlp.down_proj.weight [32, 64] (expected [32, 48])"),
    ("one-layer-more", "do not match its config.json — missing: model.layers.2."),
])
def test_weights_that_do_not_match_the_config_are_one_line(tiny, command, folder, expected):
    """Found only once transformers reads the folder (torch loaded): a misshapen tensor was a RuntimeError
    traceback, and a layer the weights lack loaded as random values, generating without a word."""
    make_bad_folders(tiny)
    args = [str(tiny["root"] / folder)] + ([PROMPT] if command == "generate" else [])
    result = run_tinytx(tiny, command, *args, text=True)
    assert result.returncode == 2 and result.stdout == "", result.stderr[-3000:]
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]], result.stderr[-3000:]
    assert result.stderr.startswith(f"tinytx {command}: error: the weights in ") and expected in result.stderr


# ---- every other way a run ends: one line and the documented status (hf_tinytx/commands/exits.py) ----


def run_tinytx(tiny, *args, launcher=(), **options) -> subprocess.CompletedProcess:
    """`tinytx args` in the fixture's folder, its output captured (stdin empty
    unless `options` say otherwise)."""
    options = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **options}
    return subprocess.run(
        [*launcher, *TINYTX, *args], cwd=tiny["root"], env=pretrain_env(tiny["root"]), timeout=120, **options
    )


def test_prompts_and_turns_that_are_not_utf8_are_one_line(tiny):
    """Before: a `TextEncodeInput must be...` traceback from the tokenizer."""
    line = refusal(tiny, "generate", "plain", os.fsdecode(b"caf\xe9 au lait"))
    assert line == (
        "tinytx generate: error: the prompt is not UTF-8 text (byte 0xe9 at character 4); give it as UTF-8 "
        "(iconv -f latin1 -t utf-8 converts a Latin-1 text)."
    )
    process = run_tinytx(
        tiny, "chat", "chat", "--max_new_tokens", "3", stdin=None, input=b"The cat sat\ncaf\xe9\n"
    )
    err = process.stderr.decode().splitlines()
    assert process.returncode == 2 and "Traceback" not in process.stderr.decode(), err
    assert err[-1].startswith(
        "tinytx chat: error: line 2 of the input is not UTF-8 text (byte 0xe9 at character 4)"
    )
    assert process.stdout.decode().count("\n") == 1  # the first turn was answered


def test_chat_with_standard_input_closed_is_one_line(tiny):
    """`tinytx chat FOLDER <&-`: before, `'NoneType' object has no attribute 'isatty'`."""
    result = run_tinytx(tiny, "chat", "chat", text=True, launcher=["bash", "-c", 'exec "$@" <&-', "bash"])
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.startswith("tinytx chat: error: standard input is closed, so no turn can be read")
    assert len(result.stderr.splitlines()) == 1


def test_a_reader_that_closes_the_pipe_ends_generate_quietly(tiny):
    """`tinytx generate ... | head -c 10`: a reader that left ends the run as it ends `cat`
    (exit 141, no words), not with a BrokenPipeError. The pipe's read end is closed before
    generate starts, so its first write fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = run_tinytx(
            tiny, "generate", "plain", PROMPT, "--max_new_tokens", "8", stdout=write, text=True
        )
    finally:
        os.close(write)
    assert result.returncode == 141 and result.stderr == "", result.stderr


def test_sigterm_and_sigint_end_chat_and_generate_with_a_line(tiny):
    """Before: generate and chat died silently on SIGTERM (-15). Chat is signalled while it
    waits for a turn, once it said it is ready; generate while torch loads (its import of torch
    is under way: -X importtime's lines)."""
    import signal

    process = subprocess.Popen(
        [*TINYTX, "chat", "chat"], cwd=tiny["root"], env=pretrain_env(tiny["root"]), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert process.stderr.readline().startswith("Chatting with chat")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143 and err == "tinytx chat: stopped by SIGTERM\n", err

    process = subprocess.Popen([sys.executable, "-X", "importtime", *TINYTX[1:], "generate", "plain", PROMPT],
                               cwd=tiny["root"], env=pretrain_env(tiny["root"]), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "| torch." in line or "|   torch." in line or line.rstrip().endswith("torch"):
            break
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    lines = [line for line in err.splitlines() if not line.startswith("import time")]
    assert process.returncode == 130 and lines == ["tinytx generate: stopped by SIGINT"], err[-2000:]
