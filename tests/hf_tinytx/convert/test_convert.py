"""Llama <-> TinyTx conversion: same logits, same greedy text, both ways; the folder-to-folder CLI,
--overwrite, faults. The command's refusals of bad input are one table: test_convert_args.py."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

import hf_tinytx
from hf_tinytx.convert import (
    convert_folder,
    llama_config_to_tinytx,
    llama_to_tinytx,
    tinytx_config_to_llama,
    tinytx_to_llama,
)
from hf_tinytx.convert.__main__ import main as convert_main
from tests.helpers.tiny import REPO_ROOT, build_tiny_config, greedy


VOCAB = 96
NEW_TOKENS = 16
# initializer_range 0.2: large weights give peaked logits, so greedy decoding has no near-ties
LLAMA_SETTINGS = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    max_position_embeddings=64, initializer_range=0.2, pad_token_id=0,
)
LLAMA_VARIANTS = {
    "mha-untied": {},
    "gqa-tied": {"num_key_value_heads": 2, "tie_word_embeddings": True},
    "mqa-biases-linear-rope": {
        "num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
    },
    "gqa-llama3-rope": {
        "num_key_value_heads": 2,
        "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
        },
    },
}


def tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**LLAMA_SETTINGS, **overrides})).eval()


def tiny_tinytx(seed: int = 0, **overrides) -> hf_tinytx.TinyTxForCausalLM:
    torch.manual_seed(seed)
    settings = {"vocab_size": VOCAB, "max_position_embeddings": 64, "initializer_range": 0.2, **overrides}
    return hf_tinytx.TinyTxForCausalLM(build_tiny_config(**settings)).eval()


def sample_inputs(seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


def logits_of(model) -> torch.Tensor:
    with torch.no_grad():
        return model(sample_inputs()).logits


def assert_same_logits(model, reference) -> None:
    torch.testing.assert_close(logits_of(model), logits_of(reference), rtol=0, atol=1e-5)


def assert_same_function(reference, converted) -> None:
    assert_same_logits(converted, reference)
    input_ids = sample_inputs()
    expected_tokens = greedy(reference, input_ids)
    assert expected_tokens.shape[1] == input_ids.shape[1] + NEW_TOKENS
    assert torch.equal(greedy(converted, input_ids), expected_tokens)


@pytest.mark.parametrize("variant", list(LLAMA_VARIANTS))
def test_llama_to_tinytx_and_back_compute_the_same(variant):
    llama = tiny_llama(**LLAMA_VARIANTS[variant])

    tinytx = llama_to_tinytx(llama)
    assert isinstance(tinytx, hf_tinytx.TinyTxForCausalLM)
    assert not tinytx.config.qk_norm and tinytx.config.mlp_type == "gated"
    assert tinytx.config.rope_parameters == llama.config.rope_parameters
    tied = llama.config.tie_word_embeddings
    assert (tinytx.lm_head.weight.data_ptr() == tinytx.model.embed_tokens.weight.data_ptr()) == tied
    assert_same_function(llama, tinytx)

    back = tinytx_to_llama(tinytx)
    assert type(back) is LlamaForCausalLM
    assert_same_function(llama, back)
    for name, tensor in llama.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    back_config = tinytx_config_to_llama(llama_config_to_tinytx(llama.config))
    for name in (
        "hidden_size", "num_key_value_heads", "head_dim", "rope_parameters", "rms_norm_eps", "eos_token_id",
    ):
        assert getattr(back_config, name) == getattr(llama.config, name), name
    with torch.no_grad():  # the weights were copied, not shared
        tinytx.model.embed_tokens.weight.zero_()
    assert llama.model.embed_tokens.weight.abs().sum() > 0


def test_tinytx_to_llama_computes_the_same():
    tinytx = tiny_tinytx(tie_word_embeddings=True)
    llama = tinytx_to_llama(tinytx)
    assert llama.config.num_key_value_heads == 2 and llama.config.tie_word_embeddings
    assert_same_function(tinytx, llama)


def test_conversion_keeps_dtype():
    llama = LlamaForCausalLM._from_config(tiny_llama().config, dtype=torch.bfloat16).eval()
    tinytx = llama_to_tinytx(llama)
    assert tinytx.dtype == torch.bfloat16 and tinytx.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(logits_of(tinytx), logits_of(llama))
    assert tinytx_to_llama(tinytx).dtype == torch.bfloat16


def test_llama_pad_token_minus_one_means_none():
    # Some Llama checkpoints store -1 for "no padding token"; TinyTx only accepts real token ids or None.
    assert llama_config_to_tinytx(LlamaConfig(**{**LLAMA_SETTINGS, "pad_token_id": -1})).pad_token_id is None


@pytest.mark.parametrize(
    "setting, field",
    [({"qk_norm": True}, "qk_norm"), ({"mlp_type": "plain", "hidden_act": "gelu"}, "mlp_type")],
)
def test_tinytx_only_features_are_refused(setting, field):
    model = tiny_tinytx(**setting)
    with pytest.raises(ValueError, match=f"`{field}.*no Llama equivalent"):
        tinytx_config_to_llama(model.config)
    with pytest.raises(ValueError, match=field):
        tinytx_to_llama(model)


def test_wrong_model_types_are_refused():
    with pytest.raises(ValueError, match="expected a 'llama' config"):
        llama_config_to_tinytx(tiny_tinytx().config)
    with pytest.raises(TypeError, match="expected a LlamaForCausalLM"):
        llama_to_tinytx(tiny_tinytx())
    with pytest.raises(TypeError, match="expected a TinyTxForCausalLM"):
        tinytx_to_llama(tiny_llama())


# ---------------------------------------------------------------- folders and the command line


def save_tiny_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(folder)
    return tokenizer


def save_llama(folder: Path, tokenizer: bool = False, **overrides) -> Path:
    tiny_llama(**overrides).save_pretrained(folder)
    if tokenizer:
        save_tiny_tokenizer(folder)
    return folder


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hf_tinytx.convert", *args], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=300,
    )


def names_in(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_cli_round_trip_llama_tinytx_llama(tmp_path):
    llama = tiny_llama(num_key_value_heads=2, tie_word_embeddings=True)
    llama.generation_config.max_new_tokens = 7  # a user setting that must survive both conversions
    llama_dir, tinytx_dir, back_dir = tmp_path / "llama", tmp_path / "tinytx", tmp_path / "llama-again"
    llama.save_pretrained(llama_dir)
    save_tiny_tokenizer(llama_dir)

    result = run_cli("--to", "tinytx", str(llama_dir), str(tinytx_dir))
    assert result.returncode == 0, result.stderr
    # A normal TinyTx folder: safetensors weights, and the code files plus
    # auto_map for trust_remote_code users.
    files = set(names_in(tinytx_dir))
    assert {"model.safetensors", "configuration_tinytx.py", "modeling_tinytx.py", "tokenizer.json"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    tinytx_config = json.loads((tinytx_dir / "config.json").read_text())
    assert tinytx_config["model_type"] == "tinytx"
    assert tinytx_config["auto_map"]["AutoModelForCausalLM"] == "modeling_tinytx.TinyTxForCausalLM"
    assert json.loads((tinytx_dir / "generation_config.json").read_text())["max_new_tokens"] == 7
    tinytx = AutoModelForCausalLM.from_pretrained(tinytx_dir).eval()
    assert isinstance(tinytx, hf_tinytx.TinyTxForCausalLM)
    assert_same_logits(tinytx, llama)

    result = run_cli("--to", "llama", str(tinytx_dir), str(back_dir))
    assert result.returncode == 0, result.stderr
    back_config = json.loads((back_dir / "config.json").read_text())
    assert back_config["model_type"] == "llama" and "auto_map" not in back_config
    assert not (back_dir / "modeling_tinytx.py").exists()
    back = LlamaForCausalLM.from_pretrained(back_dir).eval()
    assert_same_logits(back, llama)
    assert back.generation_config.max_new_tokens == 7
    text = "w5 w17 w42 w9"
    tokenized = [AutoTokenizer.from_pretrained(folder)(text)["input_ids"] for folder in (back_dir, llama_dir)]
    assert tokenized[0] == tokenized[1]
    assert names_in(tmp_path) == ["llama", "llama-again", "tinytx"]  # no staging folders left behind


def test_overwrite_into_the_users_own_folder_keeps_its_files(tmp_path):
    """Without --overwrite the folder is refused (test_convert_args.py); with it, the user's own file is not
    convert's to delete."""
    llama_dir, destination = save_llama(tmp_path / "llama"), tmp_path / "out"
    destination.mkdir()
    (destination / "notes.txt").write_text("keep me")
    assert convert_main(["--to", "tinytx", "--overwrite", str(llama_dir), str(destination)]) == 0
    assert (destination / "notes.txt").read_text() == "keep me" and (
        destination / "model.safetensors"
    ).is_file()
    assert names_in(tmp_path) == ["llama", "out"]


@pytest.mark.parametrize("leftover", [False, True], ids=["empty", "a-leftover-staging-folder"])
def test_an_empty_destination_folder_is_used(tmp_path, leftover):
    destination = tmp_path / "out"
    (destination / ".tinytx-staging" if leftover else destination).mkdir(parents=True)
    convert_folder(save_llama(tmp_path / "llama"), destination, to="tinytx")
    assert (destination / "model.safetensors").is_file() and not (destination / ".tinytx-staging").exists()


def test_convert_folder_raises_file_not_found_for_a_source_that_is_no_saved_folder(tmp_path):
    """The kinds of error the library raises; the command's lines for them: test_convert_args.py."""
    (tmp_path / "empty").mkdir()
    tiny_llama().config.save_pretrained(tmp_path / "pickled")
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"not loaded")
    for name, words in (("missing", "no such folder: .*missing"), ("empty", "no config.json"),
                        ("pickled", "pickled weights")):
        with pytest.raises(FileNotFoundError, match=words):
            convert_folder(tmp_path / name, tmp_path / "out", to="tinytx")
    with pytest.raises(ValueError, match="--to tinytx"):
        convert_folder(save_llama(tmp_path / "llama"), tmp_path / "out", to="llama")
    assert not (tmp_path / "out").exists()


def test_failure_while_saving_leaves_no_half_written_folder(tmp_path, monkeypatch):
    llama_dir = save_llama(tmp_path / "llama", tokenizer=True)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("hf_tinytx.convert.llama.shutil.copyfile", disk_full)
    with pytest.raises(OSError, match="No space left"):
        convert_folder(llama_dir, tmp_path / "out", to="tinytx")
    assert names_in(tmp_path) == ["llama"]


def test_a_link_inside_the_source_folder_is_followed(tmp_path):
    llama_dir, destination = save_llama(tmp_path / "llama"), tmp_path / "out"
    save_tiny_tokenizer(llama_dir / "shared")
    (llama_dir / "tokenizer.json").symlink_to(llama_dir / "shared" / "tokenizer.json")

    convert_folder(llama_dir, destination, to="tinytx")
    copied = destination / "tokenizer.json"
    assert (
        not copied.is_symlink()
        and copied.read_bytes() == (llama_dir / "shared" / "tokenizer.json").read_bytes()
    )


def test_overwrite_keeps_the_destination_folder_itself(tmp_path):
    """The folder is never renamed or removed, only its files replaced: so a mount
    point works as the destination."""
    llama_dir, destination = save_llama(tmp_path / "llama"), tmp_path / "out"
    convert_folder(llama_dir, destination, to="tinytx")
    (destination / ".tinytx-staging").mkdir()  # what a killed conversion leaves behind
    inode = destination.stat().st_ino

    convert_folder(llama_dir, destination, to="tinytx", overwrite=True)
    assert destination.stat().st_ino == inode
    assert names_in(destination) == [
        ".tinytx-written.json", "config.json", "configuration_tinytx.py", "generation_config.json",
        "model.safetensors", "modeling_tinytx.py",
    ]


def test_writing_into_publishes_at_the_end_and_leaves_nothing_when_the_block_fails(tmp_path):
    from hf_tinytx.folders.safe import STAGING_NAME, writing_into

    destination = tmp_path / "out"
    with writing_into(destination) as staged:
        (staged / "config.json").write_text("{}")
        assert not (destination / "config.json").exists()  # nothing in place before the block ends
    assert (destination / "config.json").read_text() == "{}"
    with pytest.raises(RuntimeError), writing_into(destination) as staged:
        (staged / "config.json").write_text('{"half": true}')
        raise RuntimeError("disk full")
    assert (destination / "config.json").read_text() == "{}" and not (destination / STAGING_NAME).exists()


# ---------------------------------------------------------------- the source is
# sacred; --overwrite; faults (issue 31)


def snapshot(folder: Path) -> dict:
    """Every file under `folder` (links not followed) with its bytes: what must not change."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The error line of a run (it may print progress bars before it); no traceback anywhere."""
    assert "Traceback" not in result.stderr, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("python -m hf_tinytx.convert: error: "), result.stderr
    return message


def test_overwrite_replaces_only_what_convert_wrote(tmp_path):
    first, destination = save_llama(tmp_path / "first", tokenizer=True), tmp_path / "out"
    # no tokenizer: the first conversion's tokenizer files must go
    second = save_llama(tmp_path / "second", seed=1)
    assert convert_main(["--to", "tinytx", str(first), str(destination)]) == 0
    assert (destination / "tokenizer.json").is_file()
    (destination / "notes.txt").write_text("keep me")
    (destination / "runs").mkdir()
    (destination / "runs" / "log.txt").write_text("mine too")

    assert convert_main(["--to", "tinytx", "--overwrite", str(second), str(destination)]) == 0
    assert (destination / "notes.txt").read_text() == "keep me"
    assert (destination / "runs" / "log.txt").read_text() == "mine too"
    assert not (destination / "tokenizer.json").exists()  # written by the first conversion only
    record = json.loads((destination / ".tinytx-written.json").read_text())
    assert record["files"] == sorted(path.name for path in destination.iterdir() if path.is_file()
                                     and path.name not in ("notes.txt", ".tinytx-written.json"))
    assert_same_logits(AutoModelForCausalLM.from_pretrained(destination).eval(), tiny_llama(seed=1))


CONVERT_SCRIPT = "import sys\nfrom hf_tinytx.convert.__main__ import main\nsys.exit(main())\n"


@pytest.mark.deep
@pytest.mark.parametrize(
    "kill", [("before", 1), ("before", 3), ("after", "last")], ids=["first", "third", "config"]
)
def test_a_killed_overwrite_leaves_the_old_or_the_new_model_and_the_users_files(tmp_path, kill):
    """Killed at a move out of the staging folder: the folder loads as the old model or the new one
    (`publish` moves the config last and deletes nothing before its replacement is in), the user's
    file is intact, and the same command, run again, completes the new model and removes the old
    one's leftovers (the record lists them)."""
    from tests.helpers.faults import KILLED, run_killed_at

    old, new, destination = save_llama(tmp_path / "old", tokenizer=True), tmp_path / "new", tmp_path / "out"
    save_llama(new, seed=1)
    assert convert_main(["--to", "tinytx", str(old), str(destination)]) == 0
    (destination / "notes.txt").write_text("keep me")
    convert_folder(new, tmp_path / "reference", to="tinytx")
    # every file but the record moves out of staging
    moves = len(list((tmp_path / "reference").iterdir())) - 1
    when, nth = kill
    script = tmp_path / "convert_cli.py"
    script.write_text(CONVERT_SCRIPT)

    args = ["--to", "tinytx", "--overwrite", str(new), str(destination)]
    killed = run_killed_at(args, cwd=REPO_ROOT, script=script, function="os.replace", match=".tinytx-staging",
                           when=when, nth=moves if nth == "last" else nth, timeout=300)
    assert killed.returncode == KILLED, killed.stderr[-2000:]
    assert (destination / "notes.txt").read_text() == "keep me"
    loaded = logits_of(AutoModelForCausalLM.from_pretrained(destination).eval())
    candidates = [logits_of(tiny_llama(seed=seed)) for seed in (0, 1)]
    assert any(torch.allclose(loaded, logits, rtol=0, atol=1e-5) for logits in candidates)

    assert convert_main(args) == 0
    assert (destination / "notes.txt").read_text() == "keep me"
    assert snapshot(destination).keys() - {"notes.txt"} == snapshot(tmp_path / "reference").keys()
    assert_same_logits(AutoModelForCausalLM.from_pretrained(destination).eval(), tiny_llama(seed=1))


def edit_config(folder: Path, **changes) -> Path:
    """Edits the folder's config.json: weights and config no longer agree."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_sharded_tied_weights_convert(tmp_path):
    """Tied (no lm_head stored) and sharded weights pass the check against the config; what it refuses in
    sharded weights: test_convert_args.py."""
    source = tmp_path / "llama"
    tiny_llama(tie_word_embeddings=True).save_pretrained(source, max_shard_size="20KB")
    assert (source / "model.safetensors.index.json").is_file()
    assert convert_main(["--to", "tinytx", str(source), str(tmp_path / "out")]) == 0


@pytest.mark.deep
def test_a_full_disk_is_one_line_and_the_earlier_conversion_stays(tmp_path, mounted):
    small = save_llama(tmp_path / "small", hidden_size=8, intermediate_size=16, num_attention_heads=2)
    # ~0.4 MB of weights: cannot fit
    large = save_llama(tmp_path / "large", hidden_size=64, intermediate_size=128)
    with mounted(tmp_path / "disk", "160k") as disk:
        destination = disk / "out"
        assert run_cli("--to", "tinytx", str(small), str(destination)).returncode == 0
        (destination / "notes.txt").write_text("keep me")
        before = snapshot(destination)

        result = run_cli("--to", "tinytx", "--overwrite", str(large), str(destination))
        message = one_line_error(result)
        assert result.returncode == 1 and "disk is full" in message and str(destination) in message
        assert "nothing in it was changed" in message
        assert snapshot(destination) == before and not (destination / ".tinytx-staging").exists()
        assert_same_logits(AutoModelForCausalLM.from_pretrained(destination).eval(),
                           LlamaForCausalLM.from_pretrained(small).eval())

        fresh = disk / "fresh"
        result = run_cli("--to", "tinytx", str(large), str(fresh))
        assert result.returncode == 1 and "disk is full" in one_line_error(result)
        assert not fresh.exists() and names_in(disk) == ["out"]


def test_a_tied_head_stored_alongside_its_embedding_passes_when_equal(tmp_path):
    source = tmp_path / "llama"
    llama = tiny_llama()
    with torch.no_grad():
        llama.lm_head.weight.copy_(llama.model.embed_tokens.weight)
    llama.save_pretrained(source)  # untied: both tensors stored, with equal values
    convert_folder(edit_config(source, tie_word_embeddings=True), tmp_path / "out", to="tinytx")
    assert_same_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval(), llama)


def test_a_record_naming_files_outside_the_destination_deletes_nothing_there(tmp_path):
    llama_dir, destination = save_llama(tmp_path / "llama"), tmp_path / "out"
    convert_folder(llama_dir, destination, to="tinytx")
    outside = tmp_path / "outside.txt"
    outside.write_text("not convert's")
    record = destination / ".tinytx-written.json"
    values = json.loads(record.read_text())
    values["files"] += ["../outside.txt", str(outside)]
    record.write_text(json.dumps(values))
    convert_folder(llama_dir, destination, to="tinytx", overwrite=True)
    assert outside.read_text() == "not convert's"


def test_every_file_of_a_converted_folder_has_the_mode_a_new_file_gets(tmp_path):
    """safetensors writes model.safetensors 0600 through a temporary file; a published
    folder gives it the mode of the other files (0644 under umask 022), so another user who
    can read the folder can load the model."""
    destination = tmp_path / "out"
    convert_folder(save_llama(tmp_path / "llama", tokenizer=True), destination, to="tinytx")
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in destination.iterdir() if path.is_file()}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


CONVERT_SHIM = "import runpy\nrunpy.run_module('hf_tinytx.convert', run_name='__main__', alter_sys=True)\n"


@pytest.mark.deep
@pytest.mark.parametrize("signum, function, nth", [
    (signal.SIGINT, "safetensors.torch.save_file", 1),  # the weights written into the staging folder
    (signal.SIGTERM, ("os.replace", "os.rename"), 1),  # the first file moved into the destination
], ids=["SIGINT-staged", "SIGTERM-publishing"])
def test_a_stop_signal_ends_convert_with_a_line_and_the_same_command_finishes(
    tmp_path, signum, function, nth
):
    """Ctrl-C or SIGTERM during `convert --to llama` into a folder whose parents do not exist yet:
    128 + the signal, one line; stopped before the publish nothing is left, stopped in it the same
    command (no --overwrite) finishes it."""
    from tests.helpers.faults import run_killed_at

    source, destination = tmp_path / "tinytx", tmp_path / "new" / "parents" / "llama"
    tiny_tinytx().save_pretrained(source)
    save_tiny_tokenizer(source)
    (tmp_path / "shim.py").write_text(CONVERT_SHIM)
    args = ["--to", "llama", source, destination]
    stopped = run_killed_at(
        args, cwd=REPO_ROOT, function=function, match=".tinytx-staging", nth=nth, when="after",
        script=tmp_path / "shim.py", signum=signum,
    )
    lines = [line for line in stopped.stderr.splitlines()
             if line.strip() and not line.startswith("[launch]") and "%|" not in line]  # no progress bars
    assert stopped.returncode == 128 + signum and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert lines == [
        f"python -m hf_tinytx.convert: stopped by {signal.Signals(signum).name}; run the same command again "
        "(what it had half written is removed, or finished by the rerun)"
    ], lines
    if signum == signal.SIGINT:
        assert names_in(tmp_path) == ["shim.py", "tinytx"]
    again = run_cli(*map(str, args))
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_logits(LlamaForCausalLM.from_pretrained(destination).eval(),
                       AutoModelForCausalLM.from_pretrained(source).eval())
    assert not (destination / ".tinytx-staging").exists()
