"""hf_tinytx.interpret: attention maps, head-role search and the position checks."""

import json
import math
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from hf_tinytx.corpus import make_probes
from hf_tinytx.folders.location import local_folder_or_hub_id
from hf_tinytx.interpret import (
    attention_maps,
    coref_head_scores,
    eager_attention,
    find_heads,
    first_token_scores,
    induction_baseline,
    induction_scores,
    induction_targets,
    permutation_check,
    positional_head_scores,
    previous_token_scores,
    render_attention_map,
    rotary_separation_check,
    save_attention_maps,
    uniform_baseline,
)
from hf_tinytx.interpret.attention_maps import default_size_inches
from hf_tinytx.interpret.head_roles import locate_coref_probe
from tests.helpers.refusals import refused_in_process, snapshot
from tests.helpers.tiny import build_byte_bpe_tokenizer, build_tiny_model


TEXT = "The cat sat on the mat."
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention lets every position look back at the words before it.",
    "Rotary embeddings turn queries and keys by their position.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_bpe_tokenizer()


def test_attention_maps_are_causal_distributions_and_restore_the_backend(tokenizer):
    model = build_tiny_model(attn_implementation="sdpa", vocab_size=len(tokenizer))
    maps = attention_maps(model, tokenizer, TEXT)
    n = len(tokenizer(TEXT)["input_ids"])
    assert maps.weights.shape == (2, 4, n, n)
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(2, 4, n))
    assert torch.all(maps.weights.triu(1) == 0)  # nothing looks at its future
    assert "".join(maps.tokens).replace("␣", " ") == TEXT
    assert model.config._attn_implementation == "sdpa"  # the eager switch was undone


def test_heatmaps_have_labelled_axes_the_promised_pixel_size_and_leave_the_backend(
    tokenizer, tmp_path, monkeypatch
):
    import matplotlib
    from PIL import Image

    # a user's own choice, which drawing must not change
    monkeypatch.setitem(matplotlib.rcParams, "backend", "svg")
    model = build_tiny_model(vocab_size=len(tokenizer))
    maps = attention_maps(model, tokenizer, TEXT)
    fig = render_attention_map(maps.weights[1, 3], maps.tokens, "layer 1, head 3", size_inches=(5, 4), dpi=50)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == maps.tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == maps.tokens
    assert ax.get_title() == "layer 1, head 3"
    fig.savefig(tmp_path / "one.png", dpi=50)
    assert Image.open(tmp_path / "one.png").size == (250, 200)

    paths = save_attention_maps(maps, tmp_path / "all", dpi=40)
    assert sorted(p.name for p in paths) == sorted(
        f"layer{i}_head{h}.png" for i in range(2) for h in range(4)
    )
    width, height = default_size_inches(len(maps.tokens))
    assert Image.open(paths[0]).size == (round(width * 40), round(height * 40))
    assert matplotlib.rcParams["backend"] == "svg"


def test_heatmap_rejects_weights_of_the_wrong_size():
    with pytest.raises(ValueError, match=r"must be \(3, 3\)"):
        render_attention_map(torch.ones(2, 2), ["a", "b", "c"])


def test_missing_matplotlib_is_named_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ImportError, match="pip install matplotlib"):
        render_attention_map(torch.eye(2), ["a", "b"])


def test_positional_scores_on_hand_made_weights():
    n = 6
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    first = torch.zeros(n, n)
    first[:, 0] = 1
    even = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
    weights = torch.stack([previous, first, even])[None]  # (1 layer, 3 heads, n, n)
    torch.testing.assert_close(
        previous_token_scores(weights), torch.tensor([[1.0, 1 / (n - 1), uniform_baseline(n)]])
    )
    torch.testing.assert_close(
        first_token_scores(weights), torch.tensor([[1 / (n - 1), 1.0, uniform_baseline(n)]])
    )


def test_induction_targets_are_the_tokens_after_single_earlier_occurrences():
    queries, targets = induction_targets([5, 6, 7, 5, 6, 9, 5, 4, 4])
    # 5 at 3 and 6 at 4 were each seen once before; 5 at 6 twice (ambiguous); 4 at 8
    # just before (nothing between).
    assert queries.tolist() == [3, 4] and targets.tolist() == [1, 2]
    assert induction_baseline([5, 6, 7, 5, 6, 9, 5, 4, 4]) == pytest.approx((1 / 4 + 1 / 5) / 2)
    with pytest.raises(ValueError, match="occurs exactly twice"):
        induction_scores(torch.ones(1, 1, 3, 3), [1, 2, 3])


class HandBuiltAttention(torch.nn.Module):
    """A stand-in causal LM: 2 layers x 4 heads spreading evenly, except an induction head (layer 1 head 2)
    and a previous-token head (layer 0 head 1)."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(_attn_implementation="eager")
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device

    def forward(self, input_ids, output_attentions=True, use_cache=False):
        n = input_ids.shape[1]
        weights = (torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]).repeat(1, 2, 4, 1, 1)
        queries, targets = induction_targets(input_ids[0].tolist())
        weights[0, 1, 2, queries] = 0.0
        weights[0, 1, 2, queries, targets] = 1.0
        weights[0, 0, 1, 1:] = torch.eye(n)[:-1]
        return SimpleNamespace(attentions=[weights[:, layer] for layer in range(2)])


def test_head_search_ranks_a_hand_built_induction_head_first_on_token_ids():
    """Olsson et al.'s test: random tokens, then the same tokens again; no tokenizer needed for id lists."""
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randperm(50, generator=generator)[:20].tolist() * 2 for _ in range(3)]
    found = find_heads(HandBuiltAttention(), None, sequences, top=8)
    assert set(found) == {"previous_token", "first_token", "induction"}
    best = found["induction"]
    assert (best[0].layer, best[0].head) == (1, 2) and best[0].score == pytest.approx(1.0)
    # the even heads stay near even
    assert max(h.score for h in best[1:]) < 2 * induction_baseline(sequences[0])
    assert (found["previous_token"][0].layer, found["previous_token"][0].head) == (0, 1)
    no_repeats = find_heads(HandBuiltAttention(), None, [list(range(10))])
    assert "induction" not in no_repeats  # nothing to look up: the role is left out, not scored as zero
    with pytest.raises(ValueError, match="need a tokenizer"):
        find_heads(HandBuiltAttention(), None, ["a text"])


def plant_previous_token_head(model, layer: int, head: int, strength: float = 9.0) -> None:
    """Makes `head` of `layer` attend to position i-1 through rotary positions alone: every embedding gets a
    large constant in dimension 0 (about sqrt(width) after RMSNorm), which the head's query and key read; in
    pair j, q = (A, 0) and k = A (cos t_j, sin t_j), so the score between positions m and n is sum_j A^2
    cos((m - n - 1) t_j), largest at n = m - 1. Layers below write nothing into the residual stream."""
    config, inner = model.config, model.model
    head_dim = config.head_dim
    with torch.no_grad():
        inner.embed_tokens.weight[:, 0] = 10.0
        for below in inner.layers[:layer]:
            below.self_attn.o_proj.weight.zero_()
            below.mlp.down_proj.weight.zero_()
        angles = inner.rotary_emb.inv_freq  # one angle per position for each of the head_dim / 2 pairs
        q, k = torch.zeros(head_dim), torch.zeros(head_dim)
        half = head_dim // 2
        q[:half] = strength
        k[:half], k[half:] = strength * torch.cos(angles), strength * torch.sin(angles)
        normed_dim0 = math.sqrt(config.hidden_size)
        attention = inner.layers[layer].self_attn
        rows = slice(head * head_dim, (head + 1) * head_dim)
        attention.q_proj.weight[rows] = 0
        attention.k_proj.weight[rows] = 0
        attention.q_proj.weight[rows, 0] = q / normed_dim0
        attention.k_proj.weight[rows, 0] = k / normed_dim0


def test_head_search_finds_a_planted_previous_token_head(tokenizer):
    model = build_tiny_model(
        vocab_size=len(tokenizer), hidden_size=64, num_attention_heads=4, num_key_value_heads=4
    )
    untouched = positional_head_scores(model, tokenizer, TEXTS)["previous_token"]
    plant_previous_token_head(model, layer=1, head=2)

    scores = positional_head_scores(model, tokenizer, TEXTS)
    best = find_heads(model, tokenizer, TEXTS, top=8)["previous_token"]
    assert (best[0].layer, best[0].head) == (1, 2) and best[0].score > 0.9
    # random heads stay far below the planted one
    assert max(h.score for h in best[1:]) < 0.5 and untouched.max() < 0.5
    assert scores["first_token"][1, 2] < 0.1  # it looks one step back, not at the start


def test_coref_probe_locations_point_at_it_and_the_two_nouns(tokenizer):
    probe = next(p for p in make_probes(3, recall_distances=()) if p.kind == "coref")
    for query, expected in (("it", "it"), ("last", "The")):
        located = locate_coref_probe(tokenizer, probe, query)
        assert tokenizer.decode([located.input_ids[located.query]]).strip().endswith(expected)
    located = locate_coref_probe(tokenizer, probe, "adjective")
    assert probe.prompt.split(".")[0].endswith(tokenizer.decode([located.input_ids[located.query]]).strip())
    assert tokenizer.decode([located.input_ids[i] for i in located.referent]).strip() == probe.answer.strip()
    assert (
        tokenizer.decode([located.input_ids[i] for i in located.other]).strip()
        == probe.distractors[0].strip()
    )


def test_coref_head_scores_are_per_head_and_consistent(tokenizer):
    model = build_tiny_model(vocab_size=len(tokenizer))
    probes = make_probes(4, recall_distances=())
    scores = coref_head_scores(model, tokenizer, probes, query="last")
    for table in scores.values():
        assert table.shape == (2, 4)
    torch.testing.assert_close(scores["score"], scores["referent"] - scores["other"])
    assert torch.all(scores["referent"] + scores["other"] <= 1 + 1e-6)
    with pytest.raises(ValueError, match="query"):
        coref_head_scores(model, tokenizer, probes, query="nowhere")
    with pytest.raises(ValueError, match="No coref probes"):
        coref_head_scores(model, tokenizer, [p for p in probes if p.kind == "copy"])


def test_attention_without_positions_is_permutation_equivariant():
    check = permutation_check()
    assert check.max_error < 1e-5
    assert check.contrast > 1e-2  # with rotary positions on, the shuffle no longer commutes


def test_rotary_scores_depend_only_on_separation():
    check = rotary_separation_check()
    assert check.max_error < 1e-3  # float32 angles up to ~2000 radians
    assert check.contrast > 1000 * check.max_error  # moving one token alone does change the score


def test_eager_attention_context_restores_sdpa():
    model = build_tiny_model(attn_implementation="sdpa")
    with eager_attention(model):
        assert model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_command_line_writes_maps_and_head_scores(tokenizer, tmp_path, trust_remote_code, capsys):
    from hf_tinytx.interpret.__main__ import main

    model = build_tiny_model(vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    argv = [
        str(tmp_path / "model"), TEXT, "--out", str(tmp_path / "maps"), "--layers", "1",
        "--coref_probes", "2",
    ]
    assert main(argv + (["--trust_remote_code"] if trust_remote_code else [])) == 0
    assert sorted(p.name for p in (tmp_path / "maps").glob("*.png")) == [
        f"layer1_head{h}.png" for h in range(4)
    ]
    report = json.loads((tmp_path / "maps" / "heads.json").read_text())
    roles = {"previous_token", "first_token", "induction", "coref@it", "coref@adjective", "coref@last"}
    assert set(report["heads"]) == roles  # induction too: TEXT's tokenization repeats a token
    assert 0 < report["induction_baseline"] < 1
    # What it prints: the maps, both even-spread bars, then one line per role with
    # its three best heads, as saved.
    lines = capsys.readouterr().out.strip().splitlines()
    # From the first line of its own: an import may have printed before it (deepspeed
    # announces its CPU accelerator).
    lines = lines[next(i for i, line in enumerate(lines) if " attention maps of " in line):]
    assert lines[0] == f"4 attention maps of {len(report['tokens'])} tokens written to {tmp_path / 'maps'}"
    assert lines[1].endswith(f"an even spread scores {report['uniform_baseline']:.3f}")
    assert lines[2].endswith(f"(on induction an even spread scores {report['induction_baseline']:.3f})")
    printed = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines[3:]}
    assert printed == {role: ", ".join(f"{h['layer']}.{h['head']}: {h['score']:.3f}" for h in heads)
                       for role, heads in report["heads"].items()}
    assert all(len(heads) == 3 for heads in report["heads"].values())


# ---- bad input: one table, each case refused before the model loads, nothing written ----

TYPOS = ["out/tinytxx", "./tinytxx", "out/run1/final", "tiny model"]  # a space: no repo id
# case: (MODEL, the text, --out, words of the one line[, more flags]); {tmp} is the case's folder, the working
# folder
REFUSALS = {
    "a folder that holds no model": ("{tmp}/empty", TEXT, "{tmp}/maps", ["has no config.json"]),
    # Taken for a Hub id, such a path used to wait ~50 s on the network before failing.
    **{
        f"mistyped {typo}": (
            typo, TEXT, "{tmp}/maps",
            [f"no such folder: {typo}", "give the folder pretrain or finetune wrote"],
        )
        for typo in TYPOS
    },
    # The maps never land in (or around) the model they read (was a subprocess in test_destinations.py).
    "--out inside the model": ("model", TEXT, "model/maps", ["--out 'model/maps' is inside MODEL 'model'"]),
    # Before (issue 69): tracebacks once the model had loaded, and exit 1 for every refusal.
    "an empty text": ("model", " ", "maps", ["the text is empty", "in quotes"]),
    "--out under a file": (
        "model", TEXT, "notes.txt/maps", ["cannot be created", "notes.txt is not a folder"],
    ),
    "--dpi 0": ("model", TEXT, "maps", ["--dpi must be at least 1, got 0"], ["--dpi", "0"]),
    "--coref_probes -1": (
        "model", TEXT, "maps", ["--coref_probes must be 0 or more, got -1"], ["--coref_probes", "-1"],
    ),
    "pickled weights only": (
        "pickled", TEXT, "maps", ["only as a pickle (pytorch_model.bin)", "which tinytx never loads"],
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_input_is_refused_at_once_and_nothing_is_written(tokenizer, tmp_path, monkeypatch, capsys, case):
    """One line, exit status 2, before the model loads; nothing written."""
    from hf_tinytx.commands.flags import interpret_parser
    from hf_tinytx.interpret.__main__ import check_input

    model, text, out = (value.format(tmp=tmp_path) for value in REFUSALS[case][:3])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    build_tiny_model(vocab_size=len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    shutil.copytree(tmp_path / "model", tmp_path / "pickled")
    (tmp_path / "pickled" / "model.safetensors").rename(tmp_path / "pickled" / "pytorch_model.bin")
    before = snapshot(tmp_path)
    line = refused_in_process(
        capsys, monkeypatch, "python -m hf_tinytx.interpret",
        lambda argv: check_input(interpret_parser().parse_args(argv)),
        [model, text, "--out", out, *(REFUSALS[case][4] if len(REFUSALS[case]) > 4 else [])],
    )
    assert all(words in line for words in REFUSALS[case][3]), line
    assert snapshot(tmp_path) == before


def test_layers_and_heads_the_model_lacks_are_one_line_once_it_loads(tokenizer, tmp_path, capsys):
    """Before (issue 69): "ValueError: No layer 7 head 0 ... (unexpected ...)", exit 1."""
    from hf_tinytx.interpret.__main__ import main

    build_tiny_model(vocab_size=len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    for flags, line in (
        (["--layers", "1", "7"], "--layers 7: the model has 2 layers, numbered 0 to 1."),
        (["--heads", "4"], "--heads 4: the model has 4 heads a layer, numbered 0 to 3."),
    ):
        assert main([str(tmp_path / "model"), TEXT, "--out", str(tmp_path / "maps"), *flags]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last == f"python -m hf_tinytx.interpret: error: {line}"
    assert not (tmp_path / "maps").exists()


def test_the_command_line_refuses_with_the_same_line_and_status(tmp_path):
    """The real process: interpret's refusals exit 2, like every command's (they were exit 1)."""
    missing, out = tmp_path / "none", tmp_path / "o"
    result = subprocess.run(
        [sys.executable, "-m", "hf_tinytx.interpret", str(missing), TEXT, "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"python -m hf_tinytx.interpret: error: no such folder: {missing}; give the folder pretrain or "
        "finetune wrote (e.g. out/tinytx).\n"
    )
    assert not (tmp_path / "o").exists()


def test_hub_ids_and_existing_folders_pass_through(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    assert local_folder_or_hub_id("model") == "model"
    assert local_folder_or_hub_id(str(tmp_path / "model")) == str(tmp_path / "model")
    assert local_folder_or_hub_id("owner/name") == "owner/name"  # no ./owner folder here: a Hub id
    assert local_folder_or_hub_id("gpt2") == "gpt2"
    with pytest.raises(FileNotFoundError, match="no such folder: model/missing"):
        local_folder_or_hub_id("model/missing")  # ./model exists, so this is a path
