"""`python -m hf_tinytx.convert`'s bad input, one table (--to tinytx, llama and gguf): each case runs
convert's `main` in process and must end with exit status 2, one line on stderr that names the problem and its
fix, and nothing written or changed in the folder it ran in. One case also runs the real command, which must
print the same line. What a row cannot say (a full disk, a kill, an --overwrite that keeps the user's files)
is tested in test_convert.py and test_gguf.py."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_tinytx.convert.__main__ import main
from tests.helpers.faults import relabel_dtype
from tests.helpers.refusals import refused_in_process, snapshot
from tests.helpers.tiny import build_byte_bpe_tokenizer, pretrain_env
from tests.hf_tinytx.convert.test_convert import (
    VOCAB,
    edit_config,
    save_llama,
    save_tiny_tokenizer,
    tiny_llama,
    tiny_tinytx,
)


PROGRAM = "python -m hf_tinytx.convert"
START = f"{PROGRAM}: error: "  # the parser's lines and convert's own refusals alike
# A model llama.cpp can run: 320 rows hold the 300-token byte-level BPE; head_dim 16 (longrope's 8 factors).
GGUF_MODEL = dict(vocab_size=320, num_attention_heads=2, max_position_embeddings=256)
BOTH_WAYS = {"tinytx": "llama", "llama": "tinytx"}  # --to -> the model type the source holds
# --to gguf sources llama.cpp cannot run: the config's change, the problem, the fix
LLAMA_CPP_CANNOT = {
    "qk-norm": ({"qk_norm": True}, "`qk_norm=True` has no Llama equivalent", "built with qk_norm=False"),
    "plain-mlp": (
        {"mlp_type": "plain", "hidden_act": "gelu"}, "`mlp_type='plain'` has no Llama equivalent",
        "built with mlp_type='gated'",
    ),
    "gelu": ({"hidden_act": "gelu"}, "`hidden_act='gelu'` has no llama.cpp", "built with hidden_act='silu'"),
    "rope-dynamic": (
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
        "RoPE type 'dynamic' has no llama.cpp", "'default', 'linear', 'llama3' and 'yarn' convert",
    ),
    "rope-longrope": (
        {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                             "long_factor": [2.0] * 8, "original_max_position_embeddings": 32}},
        "RoPE type 'longrope' has no llama.cpp", "'default', 'linear', 'llama3' and 'yarn' convert",
    ),
    "yarn-attention-factor": (
        {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
                             "original_max_position_embeddings": 32, "attention_factor": 1.5}},
        "YaRN with ['attention_factor'] has no llama.cpp setting", "drop those keys",
    ),
}
# llama sources whose config.json no longer describes their weights: the change, what the line names
MISMATCHED = {
    "one-layer-short": ({"num_hidden_layers": 3}, "missing: model.layers.2."),
    "one-layer-more": ({"num_hidden_layers": 1}, "unexpected: model.layers.1."),
    "shapes": ({"intermediate_size": 48},
               "misshapen: model.layers.0.mlp.gate_proj.weight [64, 32] (expected [48, 32])"),
    "tied-with-a-head": ({"tie_word_embeddings": True},
                         "not tied: lm_head.weight (differs from model.embed_tokens.weight"),
}
# A source damaged one way (`damage`): what the line says of its file, and the fix; both ways of conversion.
# Before: a header that says I32 for F32 data of the same size converted, exit 0, into weights ~1e9.
DAMAGED = {
    "truncated-weights": ("{folder}/model.safetensors is damaged or truncated", "copy or save it again"),
    "not-json": ("{folder}/config.json is not valid JSON (line 3", "fix that line"),
    "json-list": ("{folder}/config.json holds a JSON list", "save the model again"),
    "rope-string": ('{folder}/config.json has "rope_parameters": "default", which must be an', "fix it"),
    "rope-number": ('{folder}/config.json has "rope_parameters": 5, which must be an object', "fix it"),
    "no-model-type": (
        "{folder}/config.json has no \"model_type\"; this conversion reads a '{model}' model",
        "add \"model_type\": \"{model}\"",
    ),
    "i32-header": ("{folder}/model.safetensors stores ", "copy or save it again"),
    "f16-header": ("{folder}/model.safetensors is damaged or truncated", "copy or save it again"),
}
LINK_NOWHERE = {
    "loop": "is a loop of links (following them leads back to the start)",
    "dangling": "is a link to {root}/gone, which does not exist",
}
OVERLAP = "--to llama --overwrite runs/tinytx "  # a training run's folder converted where it lies
OUTSIDE = "never writes where it reads, --overwrite included: choose a destination outside source"
# case -> (the command line, run in the folders `root` makes; what the one line says: a string is the whole
# line, a list the words it holds, a word beginning START its start). {root}: that folder.
CASES = {
    "a destination that is not empty": (
        "--to tinytx llama notes", ["'notes' is not empty", "pass --overwrite"],
    ),
    "a missing source": (
        "--to tinytx {root}/missing out", ["no such folder: {root}/missing", "check the path"],
    ),
    # A bare name is taken for a Hub id first: the line said only "does not exist" (issue 69).
    "a missing source named bare": (
        "--to tinytx missing out", ["source folder 'missing' does not exist", "download it first"],
    ),
    "a source with no config.json": (
        "--to tinytx empty out", ["'empty' has no config.json", "pass the folder that `save_pretrained`"],
    ),
    "pickled weights only": (
        "--to tinytx pickled out",
        ["only has pickled weights (pytorch_model.bin)", "re-save it with `save_pretrained`"],
    ),
    "the wrong direction": ("--to llama llama out", ["holds a 'llama' model", "use `--to tinytx`"]),
    "a tinytx-only feature": (
        "--to llama qk-norm out", ["`qk_norm=True` has no Llama equivalent", "built with qk_norm=False"],
    ),
    "a link out of the source": (
        "--to tinytx linked-out out",
        ["{root}/linked-out/tokenizer.json is a link to {root}/secret.json, outside", "copy the file into"],
    ),
    # The source is never written, --overwrite or not; a link is not followed into it (issue 31).
    "the source as the destination": (
        OVERLAP + "runs/tinytx", ["destination 'runs/tinytx' is the same folder as source", OUTSIDE],
    ),
    "a destination inside the source": (
        OVERLAP + "runs/tinytx/llama", ["destination 'runs/tinytx/llama' is inside source", OUTSIDE],
    ),
    "a destination holding the source": (OVERLAP + "runs", ["destination 'runs' holds source", OUTSIDE]),
    "a link as the destination": (
        OVERLAP + "link-elsewhere",
        ["destination 'link-elsewhere' is a link (to '{root}/elsewhere')", "name the real path"],
    ),
    "the source through a link": (
        OVERLAP + "link-runs/tinytx",
        ["'link-runs/tinytx' is the same folder as source 'runs/tinytx'", OUTSIDE],
    ),
    "a training run as the destination": (
        "--to tinytx --overwrite llama runs/tinytx",
        ["did not write (config.json, model.safetensors", "move those files away"],
    ),
    **{f"weights and config disagree: {name}": (
        f"--to tinytx {name} out", [words, "do not match its config.json", "fix config.json"],
    ) for name, (_, words) in MISMATCHED.items()},
    "sharded, one layer short": ("--to tinytx sharded-short out", ["missing: model.layers.2.", "fix config"]),
    "sharded, a shard missing": (
        "--to tinytx sharded-gone out",
        ["index.json names the shard model-00001-of-", ".safetensors, which is missing; copy it in"],
    ),
    **{f"damaged, {kind}, to {to}": (f"--to {to} {kind}-to-{to} out", [
        word.format(folder=f"{kind}-to-{to}", model=BOTH_WAYS[to]) for word in words
    ]) for kind, words in DAMAGED.items() for to in BOTH_WAYS},
    # Before: --to llama copied a 96-token tokenizer beside an 80-row embedding, exit 0.
    **{f"a tokenizer larger than the embedding, to {to}": (f"--to {to} big-tokenizer-to-{to} out", [
        f"tokenizer has {VOCAB} tokens but the model's embedding only {VOCAB - 16} rows", "save the tokenizer"
    ]) for to in BOTH_WAYS},
    # Before: a loop passed for a missing folder or a Hub id (a traceback from the Hub lookup).
    **{f"a {kind} link as the source, to {to}": (
        f"--to {to} {kind} {destination}", f"{START}{kind} {words}: point the link at a real folder",
    ) for kind, words in LINK_NOWHERE.items() for to, destination in (("llama", "out"), ("gguf", "m.gguf"))},
    **{f"gguf: {name}": (f"--to gguf gguf-{name} new/m.gguf", [f"{START}gguf: ", problem, fix])
       for name, (_, problem, fix) in LLAMA_CPP_CANNOT.items()},
    "gguf: a tokenizer llama.cpp splits otherwise": (
        "--to gguf gguf-wordlevel m.gguf",
        ["not a byte-level BPE", "'WordLevel', not BPE", "only tokenizers like those hf_tinytx.tokenization"],
    ),
    "gguf: no tokenizer.json": (
        "--to gguf gguf-no-tokenizer m.gguf", ["has no tokenizer.json", "save it into the folder first"],
    ),
    "gguf: one layer short": (
        "--to gguf gguf-one-layer-short m.gguf", [f"{START}gguf: ", "missing: model.layers.2.", "fix config"],
    ),
    # Before: exported, exit 0, with weights ~1.2e9 where they were 0.1 (the same bytes read as integers).
    "gguf: a header calling F32 weights I32": (
        "--to gguf gguf-i32-header m.gguf",
        [f"{START}gguf: gguf-i32-header/model.safetensors stores ", "as an integer type", "copy or save it"],
    ),
    "gguf: a file there already": (
        "--to gguf gguf-model old.gguf", ["destination 'old.gguf' exists", "pass --overwrite"],
    ),
    "gguf: no .gguf ending": ("--to gguf gguf-model out", ["must be a file name ending in .gguf, got 'out'"]),
    "gguf: inside the source": (
        "--to gguf --overwrite runs/tinytx runs/tinytx/m.gguf",
        ["destination 'runs/tinytx/m.gguf' is inside source 'runs/tinytx'", OUTSIDE],
    ),
    "gguf: a link as the file": (
        "--to gguf --overwrite runs/tinytx link.gguf",
        ["destination 'link.gguf' is a link (to '{root}/kept.gguf')", "name the real path"],
    ),
    # --overwrite replaces a file, never a folder
    "gguf: a folder": (
        "--to gguf --overwrite runs/tinytx folder.gguf", ["'folder.gguf' is a folder; name a file ending in"],
    ),
    "--outtype without gguf": (
        "--to llama tinytx out --outtype f16",
        f"{PROGRAM}: error: --outtype applies to --to gguf only (--help lists the flags)",
    ),
    "--outtype unknown": (
        "--to gguf gguf-model m.gguf --outtype q4_0",
        [f"{PROGRAM}: error: argument --outtype: invalid choice: 'q4_0'", "--help lists the flags"],
    ),
}
IN_A_PROCESS = "a destination that is not empty"  # the real command too: the same line and status
HAS_GGUF = importlib.util.find_spec("gguf") is not None  # the optional extra --to gguf needs


def tinytx_run_folder(folder: Path) -> Path:
    """A folder as training/pretrain.py leaves it: the model, checkpoints, metrics, a card, notes."""
    tiny_tinytx().save_pretrained(folder)
    (folder / "checkpoints" / "step_4").mkdir(parents=True)
    (folder / "checkpoints" / "step_4" / "optimizer.pt").write_bytes(b"optimizer state")
    (folder / "metrics.jsonl").write_text('{"step": 4, "loss": 3.2}\n')
    (folder / "README.md").write_text("# a model card\n")
    (folder / "notes.txt").write_text("the user's own notes")
    return folder


def damage(folder: Path, kind: str) -> None:
    """Damages the saved folder one of DAMAGED's ways."""
    config, weights = folder / "config.json", folder / "model.safetensors"
    values = json.loads(config.read_text())
    if kind == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "not-json":
        config.write_text('{\n  "model_type": "llama",\n  "hidden_size": 32,,\n}\n')
    elif kind == "json-list":
        config.write_text("[1, 2, 3]")
    elif kind in ("i32-header", "f16-header"):
        relabel_dtype(weights, "F32", kind[:3].upper())
    elif kind in ("rope-string", "rope-number"):
        values["rope_parameters"] = "default" if kind == "rope-string" else 5
        config.write_text(json.dumps(values))
    else:
        del values["model_type"]
        config.write_text(json.dumps(values))


def make_llama_and_tinytx_sources(root: Path) -> None:
    save_llama(root / "llama")
    tiny_tinytx().save_pretrained(root / "tinytx")
    tiny_tinytx(qk_norm=True).save_pretrained(root / "qk-norm")
    (root / "empty").mkdir()
    tiny_llama().config.save_pretrained(root / "pickled")
    (root / "pickled" / "pytorch_model.bin").write_bytes(b"not loaded")
    (root / "secret.json").write_text('{"not": "a tokenizer"}')
    (save_llama(root / "linked-out") / "tokenizer.json").symlink_to(root / "secret.json")
    for name, (changes, _) in MISMATCHED.items():
        edit_config(save_llama(root / name), **changes)
    for name in ("sharded-short", "sharded-gone"):
        tiny_llama(tie_word_embeddings=True).save_pretrained(root / name, max_shard_size="20KB")
    edit_config(root / "sharded-short", num_hidden_layers=3)
    sorted((root / "sharded-gone").glob("model-*.safetensors"))[0].unlink()
    for to, model_type in BOTH_WAYS.items():
        make = tiny_llama if model_type == "llama" else tiny_tinytx
        for kind in DAMAGED:
            make().save_pretrained(root / f"{kind}-to-{to}")
            damage(root / f"{kind}-to-{to}", kind)
        make(vocab_size=VOCAB - 16).save_pretrained(root / f"big-tokenizer-to-{to}")
        save_tiny_tokenizer(root / f"big-tokenizer-to-{to}")


def save_gguf_source(folder: Path, tokenizer, **overrides) -> Path:
    tiny_tinytx(**GGUF_MODEL, **overrides).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def word_level_tokenizer() -> PreTrainedTokenizerFast:
    """Splits on whitespace: llama.cpp's byte-level BPE would split text otherwise."""
    backend = Tokenizer(models.WordLevel({"<pad>": 0, "<s>": 1, "</s>": 2, "hello": 3}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def make_gguf_sources(root: Path) -> None:
    tokenizer = build_byte_bpe_tokenizer(vocab_size=300)
    for name, (overrides, _, _) in LLAMA_CPP_CANNOT.items():
        save_gguf_source(root / f"gguf-{name}", tokenizer, **overrides)
    save_gguf_source(root / "gguf-model", tokenizer)
    edit_config(save_gguf_source(root / "gguf-one-layer-short", tokenizer), num_hidden_layers=3)
    relabel_dtype(save_gguf_source(root / "gguf-i32-header", tokenizer) / "model.safetensors", "F32", "I32")
    save_gguf_source(root / "gguf-wordlevel", word_level_tokenizer())
    save_gguf_source(root / "gguf-no-tokenizer", word_level_tokenizer())
    (root / "gguf-no-tokenizer" / "tokenizer.json").unlink()


def make_destinations(root: Path) -> None:
    """What a destination must not be: the user's folder or file, a link, a training run, a folder."""
    (root / "notes").mkdir()
    (root / "notes" / "notes.txt").write_text("keep me")
    tinytx_run_folder(root / "runs" / "tinytx")
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "precious.txt").write_text("not convert's")
    (root / "link-elsewhere").symlink_to(root / "elsewhere", target_is_directory=True)
    (root / "link-runs").symlink_to(root / "runs", target_is_directory=True)
    (root / "kept.gguf").write_bytes(b"someone else's file")
    (root / "link.gguf").symlink_to(root / "kept.gguf")
    (root / "folder.gguf").mkdir()
    (root / "old.gguf").write_bytes(b"old")
    (root / "loop").symlink_to(root / "loop")
    (root / "dangling").symlink_to(root / "gone")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Every folder and file CASES names, made once: no case may write or change any of them."""
    root = tmp_path_factory.mktemp("convert_inputs")
    make_llama_and_tinytx_sources(root)
    make_destinations(root)
    if HAS_GGUF:
        make_gguf_sources(root)
    return root


def argv_of(root: Path, case: str) -> list[str]:
    return CASES[case][0].format(root=root).split()


def refusal(root: Path, case: str, capsys, monkeypatch) -> str:
    """The one line convert's `main` ends `case` with, in `root`, exit status 2 (tests/helpers/refusals.py);
    torch may load: convert imports it."""
    monkeypatch.chdir(root)
    return refused_in_process(capsys, monkeypatch, PROGRAM, lambda argv: sys.exit(main(argv)),
                              argv_of(root, case), heavy=())


def assert_says(line: str, root: Path, case: str) -> None:
    said = CASES[case][1]
    if isinstance(said, str):
        assert line == said.format(root=root), line
        return
    for word in (word.format(root=root) for word in said):
        assert word in line, line
        assert not word.startswith(START) or line.startswith(word), line


@pytest.mark.parametrize("case", [
    pytest.param(case, marks=pytest.mark.skipif(not HAS_GGUF, reason="needs the gguf extra"))
    if "--to gguf" in argv else case for case, (argv, _) in CASES.items()
])
def test_bad_input_is_one_line_exit_2_and_nothing_is_written(root, monkeypatch, capsys, case):
    before = snapshot(root)
    assert_says(refusal(root, case, capsys, monkeypatch), root, case)
    assert snapshot(root) == before


def test_the_command_prints_the_same_line_and_status(root, tmp_path, monkeypatch, capsys):
    before = snapshot(root)
    command = [sys.executable, "-m", "hf_tinytx.convert", *argv_of(root, IN_A_PROCESS)]
    result = subprocess.run(command, cwd=root, env=pretrain_env(tmp_path), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2 and result.stdout == "", result.stderr[-3000:]
    assert result.stderr == refusal(root, IN_A_PROCESS, capsys, monkeypatch) + "\n"
    assert_says(result.stderr.strip(), root, IN_A_PROCESS)
    assert snapshot(root) == before
