"""GGUF export (`python -m hf_tinytx.convert --to gguf`): llama.cpp itself tokenizes like our tokenizer and
computes what the model computes; the file says what the config says. llama.cpp runs in .venv-llamacpp
(tests/helpers/engines.py), in a subprocess (tests marked `engine`). What the export refuses (configs and
tokenizers llama.cpp cannot take, damaged weights, destinations) is convert's table: test_convert_args.py."""

import ast
import contextlib
import copy
import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_tinytx
from hf_tinytx.convert.__main__ import main as convert_main
from hf_tinytx.convert.gguf import rotate_half_to_interleaved, write_gguf
from hf_tinytx.folders.safe import STAGING_NAME
from tests.helpers.engines import LLAMA_CPP_PYTHON, require_llama_cpp
from tests.helpers.tiny import REPO_ROOT, TINY_SENTENCES, build_byte_bpe_tokenizer, build_tiny_config


NEW_TOKENS = 32
N_CTX = 256
# The tiny model of every test; the llama.cpp comparisons use it trained for a few seconds
# (see `trained_weights`). vocab_size 320 > the tokenizer's 300 tokens: the unused
# embedding rows are written as [PAD] tokens.
MODEL = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=N_CTX,
)
# Every model feature the export maps onto llama.cpp, each a model of its own (written as f32), all with the
# trained weights except "head-dim-32", whose shapes differ: it gets large random weights (peaked logits,
# position-dependent attention), so a wrong RoPE layout or scaling shows in the logits either way.
VARIANTS = {
    "gqa": {},
    "tied": {"tie_word_embeddings": True},
    "biases": {"attention_bias": True, "mlp_bias": True},
    "head-dim-32": {"head_dim": 32, "initializer_range": 0.3},
    "rope-linear": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    "rope-llama3": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16}},
    "rope-yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 64}},
}
GREEDY_PROMPTS = ["The quick brown", "Attention lets every", "Hello world! Numbers", "Rotary embeddings turn"]
LONG_PROMPT = " ".join(TINY_SENTENCES[:3])  # ~100 tokens: far past the RoPE variants' original context
TRICKY_TEXTS = [
    *TINY_SENTENCES,
    "  two leading spaces, three trailing   ",
    "tabs\tand\nnew\n\nlines \t\n  mixed\r\n",
    "Unicode: café, naïve — 日本語 🦙🚀 ½ Ünïcödé",
    "I've said 'RE you sure? He'll, we'd, 3.14 1234567 ...!!! ?? ```code```",
]
# Largest |llama.cpp logit - transformers logit| allowed, as a fraction of the largest |logit|.
LOGIT_TOLERANCE = {"f32": 1e-4, "f16": 1e-2, "q8_0": 1e-1}
# How many greedy tokens must agree: all of them in f32. The trained model is sure of its first tokens (the
# sentence it learnt: top-2 logit gaps ~7), less so of what it makes up after the sentence ends (gaps down to
# ~0.03), where the rounding of f16 and q8_0 may flip a near-tie.
GREEDY_AGREEMENT = {"f32": NEW_TOKENS, "f16": 16, "q8_0": 8}


def save_model(folder, tokenizer, weights=None, seed=0, **overrides):
    """Saves a model with `weights` (a state dict; missing biases drawn at random) or
    random ones, and the tokenizer."""
    torch.manual_seed(seed)
    model = hf_tinytx.TinyTxForCausalLM(build_tiny_config(**{**MODEL, **overrides})).eval()
    if weights is not None:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and all(name.endswith(".bias") for name in missing), (missing, unexpected)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):  # zero at initialisation, which would hide a wrongly permuted q/k bias
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@contextlib.contextmanager
def one_thread():
    """This small model trains and generates several times faster on one thread than on busy shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_tiny(tokenizer, steps=100) -> dict:
    """About a second of training: the model learns TINY_SENTENCES by heart, so its
    logits are confident (no ties)."""
    torch.manual_seed(0)
    model = hf_tinytx.TinyTxForCausalLM(build_tiny_config(**MODEL)).train()
    batch = tokenizer(TINY_SENTENCES, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with one_thread():
        for _ in range(steps):
            model(**batch, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.state_dict()


def reference(folder, tokenizer, greedy: bool) -> dict:
    """Transformers' logits at every position of each prompt, and (if `greedy`) its greedy continuations."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    prompts = [tokenizer(text)["input_ids"] for text in [LONG_PROMPT, *GREEDY_PROMPTS]]
    greedy_prompts = prompts[1:] if greedy else []
    with torch.no_grad(), one_thread():
        logits = [model(torch.tensor([prompt])).logits[0].numpy() for prompt in prompts]
        continuations = [
            model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS)[
                0, len(prompt) :
            ]
            for prompt in greedy_prompts
        ]
    greedy = [tokens.tolist() for tokens in continuations]
    return {"prompts": prompts, "logits": logits, "greedy_prompts": greedy_prompts, "greedy": greedy}


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_bpe_tokenizer(vocab_size=300)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tokenizer):
    """{case: (GGUF path, outtype, transformers' reference)} for every variant (f32), the plain model in f16
    and q8_0, and a negative control: the plain model written without the q/k permutation."""
    root = tmp_path_factory.mktemp("gguf")
    weights = train_tiny(tokenizer)
    cases = {}
    for name, overrides in VARIANTS.items():
        folder = save_model(root / name, tokenizer, None if "head_dim" in overrides else weights, **overrides)
        expected = reference(folder, tokenizer, greedy=name == "gqa")
        outtypes = ("f32", "f16", "q8_0") if name == "gqa" else ("f32",)
        for outtype in outtypes:
            path = write_gguf(folder, root / f"{name}-{outtype}.gguf", outtype)
            cases[f"{name}-{outtype}"] = (path, outtype, expected)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("hf_tinytx.convert.gguf.rotate_half_to_interleaved", lambda weight, num_heads: weight)
        unpermuted = write_gguf(root / "gqa", root / "unpermuted.gguf")
    cases["unpermuted-f32"] = (unpermuted, "f32", cases["gqa-f32"][2])
    return cases


@pytest.fixture(scope="module")
def llama_cpp(exports):
    """{case: what llama.cpp computed}, from one subprocess in .venv-llamacpp."""
    require_llama_cpp("llama.cpp is needed to check the GGUF export")
    request = {"cases": [
        {"gguf": str(path), "n_ctx": N_CTX, "texts": TRICKY_TEXTS, "prompts": expected["prompts"],
         "greedy_prompts": expected["greedy_prompts"], "new_tokens": NEW_TOKENS}
        for path, _, expected in exports.values()
    ]}
    result = subprocess.run(
        [str(LLAMA_CPP_PYTHON), str(REPO_ROOT / "tests" / "helpers" / "llama_cpp_run.py")],
        input=json.dumps(request), capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, f"llama.cpp failed ({result.returncode}):\n{result.stderr[-5000:]}"
    return dict(zip(exports, json.loads(result.stdout)))


def relative_logit_error(actual, expected) -> float:
    return max(float(np.abs(np.asarray(a) - e).max() / np.abs(e).max()) for a, e in zip(actual, expected))


# ---- llama.cpp runs the file ----


@pytest.mark.engine
def test_llama_cpp_tokenizes_exactly_like_our_tokenizer(llama_cpp, tokenizer):
    expected = [tokenizer(text)["input_ids"] for text in TRICKY_TEXTS]
    assert all(len(ids) > 0 for ids in expected)
    for case, computed in llama_cpp.items():
        assert computed["ids"] == expected, case


@pytest.mark.engine
@pytest.mark.parametrize("case", [f"{name}-f32" for name in VARIANTS] + ["gqa-f16", "gqa-q8_0"])
def test_llama_cpp_computes_the_models_logits(llama_cpp, exports, case):
    _, outtype, expected = exports[case]
    error = relative_logit_error(llama_cpp[case]["logits"], expected["logits"])
    assert error < LOGIT_TOLERANCE[outtype], f"{case}: logits differ by {error:.2e} of their range"


@pytest.mark.engine
@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_llama_cpp_greedy_tokens_equal_generate(llama_cpp, exports, outtype):
    _, _, expected = exports[f"gqa-{outtype}"]
    computed = llama_cpp[f"gqa-{outtype}"]["greedy"]
    agree = GREEDY_AGREEMENT[outtype]
    assert len(computed) == len(expected["greedy"]) == len(GREEDY_PROMPTS)
    for prompt, tokens, want in zip(expected["greedy_prompts"], computed, expected["greedy"]):
        assert len(want) == NEW_TOKENS  # the trained model does not stop early: all 32 tokens are compared
        assert tokens[:agree] == want[:agree], f"{outtype}: greedy tokens differ after prompt {prompt}"


@pytest.mark.engine
def test_the_qk_permutation_is_what_makes_llama_cpp_agree(llama_cpp, exports):
    """Negative control: without the rotate-half -> interleaved permutation the logits
    are far outside the tolerance."""
    _, _, expected = exports["unpermuted-f32"]
    error = relative_logit_error(llama_cpp["unpermuted-f32"]["logits"], expected["logits"])
    assert error > 100 * LOGIT_TOLERANCE["f32"]


# ---- the file itself (gguf package only) ----


def test_rotate_half_to_interleaved_keeps_attention_scores():
    """Hugging Face's rotation (pairs i, i + d/2) and llama.cpp's after the permutation (pairs 2i, 2i + 1)
    give the same dot products at every pair of positions."""
    torch.manual_seed(0)
    heads, head_dim, hidden, positions = 3, 8, 12, 7
    q_weight, k_weight = torch.randn(heads * head_dim, hidden), torch.randn(heads * head_dim, hidden)
    x = torch.randn(positions, hidden)
    angles = torch.arange(positions)[:, None] * 10000.0 ** (-torch.arange(0, head_dim, 2) / head_dim)
    cos, sin = angles.cos(), angles.sin()

    def rotate_half(v):  # (positions, heads, head_dim)
        first, second = v[..., : head_dim // 2], v[..., head_dim // 2:]
        c, s = cos[:, None], sin[:, None]
        return torch.cat((first * c - second * s, second * c + first * s), dim=-1)

    def interleaved(v):
        even, odd = v[..., 0::2], v[..., 1::2]
        c, s = cos[:, None], sin[:, None]
        return torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)

    def scores(rope, wq, wk):
        q, k = (x @ wq.T).view(positions, heads, head_dim), (x @ wk.T).view(positions, heads, head_dim)
        return torch.einsum("phd,qhd->hpq", rope(q), rope(k))

    expected = scores(rotate_half, q_weight, k_weight)
    permuted = [rotate_half_to_interleaved(w, heads) for w in (q_weight, k_weight)]
    torch.testing.assert_close(scores(interleaved, *permuted), expected)
    # the permutation matters
    assert not torch.allclose(scores(interleaved, q_weight, k_weight), expected, atol=1e-3)


@pytest.fixture
def folder(tmp_path, tokenizer):
    return lambda **overrides: save_model(tmp_path / "model", tokenizer, **overrides)


def read_fields(path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    return fields, {tensor.name: tensor for tensor in reader.tensors}


def test_metadata_describes_the_model_and_its_tokenizer(folder, tokenizer, tmp_path):
    source = folder(num_key_value_heads=1, rms_norm_eps=1e-5)
    assert convert_main(["--to", "gguf", str(source), str(tmp_path / "m.gguf")]) == 0
    fields, tensors = read_fields(tmp_path / "m.gguf")
    expected = {
        "general.architecture": "llama", "general.file_type": gguf.LlamaFileType.ALL_F32,
        "llama.vocab_size": 320, "llama.context_length": N_CTX, "llama.embedding_length": 64,
        "llama.block_count": 2, "llama.feed_forward_length": 128, "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 1, "llama.attention.key_length": 16,
        "llama.attention.value_length": 16, "llama.rope.dimension_count": 16, "llama.rope.freq_base": 10000.0,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": False,
    }
    assert {name: fields[name] for name in expected} == expected
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert "llama.rope.scaling.type" not in fields

    vocab = tokenizer.get_vocab()
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == 320 and all(tokens[i] == token for token, i in vocab.items())
    assert tokens[300:] == [f"[PAD{i}]" for i in range(300, 320)]
    types = fields["tokenizer.ggml.token_type"]
    assert types[:3] == [gguf.TokenType.CONTROL] * 3 and set(types[3:300]) == {gguf.TokenType.NORMAL}
    assert set(types[300:]) == {gguf.TokenType.UNUSED}
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    assert fields["tokenizer.ggml.merges"] == [" ".join(pair) for pair in merges]
    assert "output.weight" in tensors and "rope_freqs.weight" not in tensors


def test_a_chat_template_travels_in_the_file(tokenizer, tmp_path):
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for message in messages %}{{ message['content'] }}{{ eos_token }}{% endfor %}"
    write_gguf(save_model(tmp_path / "model", chat), tmp_path / "chat.gguf")
    fields, _ = read_fields(tmp_path / "chat.gguf")
    assert fields["tokenizer.chat_template"] == chat.chat_template


def test_tied_embeddings_are_written_once(folder, tmp_path):
    write_gguf(folder(tie_word_embeddings=True), tmp_path / "tied.gguf")
    _, tensors = read_fields(tmp_path / "tied.gguf")
    assert "token_embd.weight" in tensors and "output.weight" not in tensors  # llama.cpp reuses token_embd


@pytest.mark.parametrize(
    "outtype, file_type, matrix_type",
    [
        ("f32", gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
        ("f16", gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
        ("q8_0", gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
    ],
    ids=["f32", "f16", "q8_0"],
)
def test_outtype_sets_how_matrices_are_stored(folder, tmp_path, outtype, file_type, matrix_type):
    destination = tmp_path / f"m-{outtype}.gguf"
    assert convert_main(["--to", "gguf", str(folder()), str(destination), "--outtype", outtype]) == 0
    fields, tensors = read_fields(destination)
    assert fields["general.file_type"] == file_type
    assert len(tensors) == 1 + 2 * 9 + 2  # token_embd, 9 a layer, output_norm, output
    for name, tensor in tensors.items():
        expected = gguf.GGMLQuantizationType.F32 if len(tensor.shape) == 1 else matrix_type
        assert tensor.tensor_type == expected, name


def test_q8_0_falls_back_to_f16_for_rows_that_do_not_fill_its_blocks(folder, tmp_path):
    write_gguf(folder(intermediate_size=48), tmp_path / "m.gguf", outtype="q8_0")  # down_proj rows: 48 values
    _, tensors = read_fields(tmp_path / "m.gguf")
    assert tensors["blk.0.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0


def test_rope_scaling_is_written_the_way_llama_cpp_reads_it(folder, tmp_path):
    write_gguf(folder(**VARIANTS["rope-yarn"]), tmp_path / "yarn.gguf")
    fields, _ = read_fields(tmp_path / "yarn.gguf")
    assert fields["llama.rope.scaling.type"] == "yarn" and fields["llama.rope.scaling.factor"] == 4.0
    assert fields["llama.rope.scaling.original_context_length"] == 64

    write_gguf(folder(**VARIANTS["rope-llama3"]), tmp_path / "llama3.gguf")
    fields, tensors = read_fields(tmp_path / "llama3.gguf")
    assert "llama.rope.scaling.type" not in fields
    # Llama 3's rule, written out: short wavelengths keep their speed, long ones
    # turn 8x slower, a blend between.
    expected = []
    for i in range(8):
        wavelength = 2 * np.pi * 10000.0 ** (2 * i / 16)
        blend = (16 / wavelength - 1.0) / (4.0 - 1.0)
        expected.append(
            1.0 if wavelength < 16 / 4 else 8.0 if wavelength > 16 else 1 / ((1 - blend) / 8 + blend)
        )
    np.testing.assert_allclose(tensors["rope_freqs.weight"].data, expected, rtol=1e-5)


def test_overwrite_replaces_an_earlier_file(folder, tmp_path):
    """Without --overwrite the file is refused (test_convert_args.py)."""
    old = tmp_path / "m.gguf"
    old.write_bytes(b"old")
    assert convert_main(["--to", "gguf", str(folder()), str(old), "--overwrite"]) == 0
    assert old.read_bytes()[:4] == b"GGUF"


def test_failure_while_writing_keeps_the_old_file_and_leaves_no_staging_file(folder, tmp_path, monkeypatch):
    source, destination = folder(), tmp_path / "m.gguf"
    destination.write_bytes(b"old")

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_gguf(source, destination, overwrite=True)
    assert destination.read_bytes() == b"old"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.gguf", "model"]
    assert not destination.with_name(f".m.gguf{STAGING_NAME}").exists()


def test_the_library_does_not_need_gguf():
    """The GGUF writer is an optional extra, and the model files ship as remote code: none of these imports
    `gguf` or the writer when it is imported (convert/__main__.py does only inside `main`, for --to gguf)."""
    for name in ("__init__.py", "configuration_tinytx.py", "modeling_tinytx.py", "convert/__init__.py",
                 "convert/llama.py", "convert/__main__.py"):
        tree = ast.parse((REPO_ROOT / "hf_tinytx" / name).read_text())
        imported = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
        imported += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert not [module for module in imported if "gguf" in module], name


# ---- issue 31: a full disk ----


@pytest.mark.deep
def test_a_full_disk_is_one_line_and_the_old_file_stays(folder, tmp_path, mounted):
    source = folder()  # ~0.6 MB of f32 weights; the disk holds 64 KiB
    with mounted(tmp_path / "disk", "64k") as disk:
        destination = disk / "m.gguf"
        destination.write_bytes(b"old")
        result = subprocess.run(
            [
                sys.executable, "-m", "hf_tinytx.convert", "--to", "gguf", "--overwrite", str(source),
                str(destination),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        message = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert message.startswith(
            "python -m hf_tinytx.convert: error: gguf: the disk is full while writing " + str(destination)
        )
        assert "nothing was changed" in message
        assert destination.read_bytes() == b"old" and [path.name for path in disk.iterdir()] == ["m.gguf"]
