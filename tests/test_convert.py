"""Llama <-> TinyTx conversion: same logits, same greedy text, both ways; refusals; the folder-to-folder CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers.tiny import build_tiny_config
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import hf_tinytx
from hf_tinytx.convert import (
    convert_folder,
    llama_config_to_tinytx,
    llama_to_tinytx,
    tinytx_config_to_llama,
    tinytx_to_llama,
)
from hf_tinytx.convert import main as convert_main


REPO_ROOT = Path(__file__).resolve().parents[1]
VOCAB = 96
NEW_TOKENS = 16

LLAMA_VARIANTS = {
    "mha-untied": {},
    "gqa-tied": {"num_key_value_heads": 2, "tie_word_embeddings": True},
    "mqa-biases-linear-rope": {
        "num_key_value_heads": 1,
        "attention_bias": True,
        "mlp_bias": True,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
    },
    "gqa-llama3-rope": {
        "num_key_value_heads": 2,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
}


def tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        initializer_range=0.2,  # large weights give peaked logits, so greedy decoding has no near-ties
        pad_token_id=0,
    )
    settings.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**settings)).eval()


def tiny_tinytx(seed: int = 0, **overrides) -> hf_tinytx.TinyTxForCausalLM:
    torch.manual_seed(seed)
    # initializer_range 0.2: large weights give peaked logits, so greedy decoding has no near-ties
    settings = dict(vocab_size=VOCAB, max_position_embeddings=64, initializer_range=0.2)
    settings.update(overrides)
    return hf_tinytx.TinyTxForCausalLM(build_tiny_config(**settings)).eval()


def sample_inputs(seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (2, 12), generator=generator)


def greedy(model, input_ids: torch.Tensor) -> torch.Tensor:
    return model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
    )


def assert_same_function(reference, converted) -> None:
    input_ids = sample_inputs()
    with torch.no_grad():
        expected = reference(input_ids).logits
        actual = converted(input_ids).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
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


def test_tinytx_to_llama_computes_the_same():
    tinytx = tiny_tinytx(tie_word_embeddings=True)
    llama = tinytx_to_llama(tinytx)
    assert llama.config.num_key_value_heads == 2 and llama.config.tie_word_embeddings
    assert_same_function(tinytx, llama)


def test_conversion_copies_weights_instead_of_sharing_them():
    llama = tiny_llama()
    tinytx = llama_to_tinytx(llama)
    with torch.no_grad():
        tinytx.model.embed_tokens.weight.zero_()
    assert llama.model.embed_tokens.weight.abs().sum() > 0


def test_conversion_keeps_dtype():
    llama = LlamaForCausalLM._from_config(tiny_llama().config, dtype=torch.bfloat16).eval()
    tinytx = llama_to_tinytx(llama)
    assert tinytx.dtype == torch.bfloat16 and tinytx.lm_head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(tinytx(sample_inputs()).logits, llama(sample_inputs()).logits)
    assert tinytx_to_llama(tinytx).dtype == torch.bfloat16


def test_config_translation_round_trips():
    llama_config = tiny_llama(**LLAMA_VARIANTS["gqa-llama3-rope"]).config
    back = tinytx_config_to_llama(llama_config_to_tinytx(llama_config))
    for name in ("hidden_size", "num_key_value_heads", "head_dim", "rope_parameters", "rms_norm_eps", "eos_token_id"):
        assert getattr(back, name) == getattr(llama_config, name), name


def test_llama_pad_token_minus_one_means_none():
    # Some Llama checkpoints store -1 for "no padding token"; TinyTx only accepts real token ids or None.
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, pad_token_id=-1)
    assert llama_config_to_tinytx(config).pad_token_id is None


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


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hf_tinytx.convert", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def logits_of(model) -> torch.Tensor:
    with torch.no_grad():
        return model(sample_inputs()).logits


def test_cli_round_trip_llama_tinytx_llama(tmp_path):
    llama = tiny_llama(num_key_value_heads=2, tie_word_embeddings=True)
    llama.generation_config.max_new_tokens = 7  # a user setting that must survive both conversions
    llama_dir, tinytx_dir, back_dir = tmp_path / "llama", tmp_path / "tinytx", tmp_path / "llama-again"
    llama.save_pretrained(llama_dir)
    save_tiny_tokenizer(llama_dir)

    result = run_cli("--to", "tinytx", str(llama_dir), str(tinytx_dir))
    assert result.returncode == 0, result.stderr
    # A normal TinyTx folder: safetensors weights, and the code files plus auto_map for trust_remote_code users.
    files = {path.name for path in tinytx_dir.iterdir()}
    assert {"model.safetensors", "configuration_tinytx.py", "modeling_tinytx.py", "tokenizer.json"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    tinytx_config = json.loads((tinytx_dir / "config.json").read_text())
    assert tinytx_config["model_type"] == "tinytx"
    assert tinytx_config["auto_map"]["AutoModelForCausalLM"] == "modeling_tinytx.TinyTxForCausalLM"
    assert json.loads((tinytx_dir / "generation_config.json").read_text())["max_new_tokens"] == 7
    tinytx = AutoModelForCausalLM.from_pretrained(tinytx_dir).eval()
    assert isinstance(tinytx, hf_tinytx.TinyTxForCausalLM)
    torch.testing.assert_close(logits_of(tinytx), logits_of(llama), rtol=0, atol=1e-5)

    result = run_cli("--to", "llama", str(tinytx_dir), str(back_dir))
    assert result.returncode == 0, result.stderr
    back_config = json.loads((back_dir / "config.json").read_text())
    assert back_config["model_type"] == "llama" and "auto_map" not in back_config
    assert not (back_dir / "modeling_tinytx.py").exists()
    back = LlamaForCausalLM.from_pretrained(back_dir).eval()
    torch.testing.assert_close(logits_of(back), logits_of(llama), rtol=0, atol=1e-5)
    assert back.generation_config.max_new_tokens == 7
    text = "w5 w17 w42 w9"
    assert AutoTokenizer.from_pretrained(back_dir)(text)["input_ids"] == AutoTokenizer.from_pretrained(llama_dir)(
        text
    )["input_ids"]

    # Only the three folders: no staging folders left behind.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["llama", "llama-again", "tinytx"]


def test_cli_refuses_to_overwrite_without_flag(tmp_path, capsys):
    llama_dir, destination = tmp_path / "llama", tmp_path / "out"
    tiny_llama().save_pretrained(llama_dir)
    destination.mkdir()
    (destination / "notes.txt").write_text("keep me")

    assert convert_main(["--to", "tinytx", str(llama_dir), str(destination)]) != 0
    message = capsys.readouterr().err
    assert "not empty" in message and "--overwrite" in message
    assert [path.name for path in destination.iterdir()] == ["notes.txt"]

    assert convert_main(["--to", "tinytx", "--overwrite", str(llama_dir), str(destination)]) == 0
    assert not (destination / "notes.txt").exists() and (destination / "model.safetensors").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["llama", "out"]


def test_an_empty_destination_folder_is_used(tmp_path):
    llama_dir, destination = tmp_path / "llama", tmp_path / "out"
    tiny_llama().save_pretrained(llama_dir)
    destination.mkdir()
    convert_folder(llama_dir, destination, to="tinytx")
    assert (destination / "model.safetensors").is_file()


def test_source_folder_problems_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder: .*missing"):
        convert_folder(tmp_path / "missing", tmp_path / "out", to="tinytx")

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        convert_folder(empty, tmp_path / "out", to="tinytx")

    pickled = tmp_path / "pickled"
    tiny_llama().config.save_pretrained(pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="pickled weights"):
        convert_folder(pickled, tmp_path / "out", to="tinytx")

    llama_dir = tmp_path / "llama"
    tiny_llama().save_pretrained(llama_dir)
    with pytest.raises(ValueError, match="--to tinytx"):
        convert_folder(llama_dir, tmp_path / "out", to="llama")
    assert not (tmp_path / "out").exists()


def test_refused_conversion_writes_nothing(tmp_path, capsys):
    source = tmp_path / "qknorm"
    tiny_tinytx(qk_norm=True).save_pretrained(source)
    assert convert_main(["--to", "llama", str(source), str(tmp_path / "out")]) != 0
    assert "qk_norm" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["qknorm"]


def test_failure_while_saving_leaves_no_half_written_folder(tmp_path, monkeypatch):
    llama_dir = tmp_path / "llama"
    tiny_llama().save_pretrained(llama_dir)
    save_tiny_tokenizer(llama_dir)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("hf_tinytx.convert.shutil.copyfile", disk_full)
    with pytest.raises(OSError, match="No space left"):
        convert_folder(llama_dir, tmp_path / "out", to="tinytx")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["llama"]


def test_a_link_out_of_the_source_folder_is_refused_before_anything_is_written(tmp_path, capsys):
    llama_dir, destination = tmp_path / "llama", tmp_path / "out"
    tiny_llama().save_pretrained(llama_dir)
    secret = tmp_path / "secret.json"
    secret.write_text('{"not": "a tokenizer"}')
    (llama_dir / "tokenizer.json").symlink_to(secret)
    capsys.readouterr()  # drop what saving printed

    assert convert_main(["--to", "tinytx", str(llama_dir), str(destination)]) == 1
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and str(llama_dir / "tokenizer.json") in message and "outside" in message
    assert not destination.exists()


def test_a_link_inside_the_source_folder_is_followed(tmp_path):
    llama_dir, destination = tmp_path / "llama", tmp_path / "out"
    tiny_llama().save_pretrained(llama_dir)
    save_tiny_tokenizer(llama_dir / "shared")
    (llama_dir / "tokenizer.json").symlink_to(llama_dir / "shared" / "tokenizer.json")

    convert_folder(llama_dir, destination, to="tinytx")
    copied = destination / "tokenizer.json"
    assert not copied.is_symlink() and copied.read_bytes() == (llama_dir / "shared" / "tokenizer.json").read_bytes()


def test_overwrite_keeps_the_destination_folder_itself(tmp_path):
    """The folder is never renamed or removed, only its files replaced: so a mount point works as the destination."""
    llama_dir, destination = tmp_path / "llama", tmp_path / "out"
    tiny_llama().save_pretrained(llama_dir)
    destination.mkdir()
    (destination / "old-model.safetensors").write_text("old")
    (destination / ".tinytx-staging").mkdir()  # what a killed conversion leaves behind
    inode = destination.stat().st_ino

    convert_folder(llama_dir, destination, to="tinytx", overwrite=True)
    assert destination.stat().st_ino == inode
    assert sorted(path.name for path in destination.iterdir()) == [
        "config.json", "configuration_tinytx.py", "generation_config.json", "model.safetensors", "modeling_tinytx.py",
    ]  # fmt: skip


def test_a_leftover_staging_folder_does_not_count_as_content(tmp_path):
    llama_dir, destination = tmp_path / "llama", tmp_path / "out"
    tiny_llama().save_pretrained(llama_dir)
    (destination / ".tinytx-staging").mkdir(parents=True)
    convert_folder(llama_dir, destination, to="tinytx")
    assert (destination / "model.safetensors").is_file() and not (destination / ".tinytx-staging").exists()


def test_writing_into_publishes_at_the_end_and_leaves_nothing_when_the_block_fails(tmp_path):
    from hf_tinytx.folders import STAGING_NAME, writing_into

    destination = tmp_path / "out"
    with writing_into(destination) as staged:
        (staged / "config.json").write_text("{}")
        assert not (destination / "config.json").exists()  # nothing in place before the block ends
    assert (destination / "config.json").read_text() == "{}"
    with pytest.raises(RuntimeError), writing_into(destination) as staged:
        (staged / "config.json").write_text('{"half": true}')
        raise RuntimeError("disk full")
    assert (destination / "config.json").read_text() == "{}" and not (destination / STAGING_NAME).exists()
