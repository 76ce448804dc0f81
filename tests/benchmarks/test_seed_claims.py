"""benchmarks/seed_claims/: the lookup task and its curriculum, the cross-over, --quick
end to end, and the LSTM baseline."""

import json
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from benchmarks.seed_claims import __main__ as seed_claims
from benchmarks.seed_claims import lookup_task
from benchmarks.seed_claims.lstm_baseline import LSTMLanguageModel, lstm_matching, lstm_parameters
from hf_tinytx.corpus import make_probes
from hf_tinytx.probes import candidate_log_probs, score_probes
from tests.helpers.tiny import REPO_ROOT, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env


BENCHMARKS = REPO_ROOT / "benchmarks"
TASK = lookup_task.LookupTask(num_pairs=6, num_keys=10, num_values=10, num_fillers=4)


def answers_with_their_questions(ids: torch.Tensor, labels: torch.Tensor):
    """(row, position of the question, key asked, value expected) for every labelled token."""
    for row, position in torch.nonzero(labels != -100).tolist():
        yield row, position - 1, int(ids[row, position - 1]), int(labels[row, position])


def pair_position(ids_row: torch.Tensor, key: int) -> int:
    return int(torch.nonzero(ids_row[: TASK.pairs_end] == key).flatten()[0])


def test_lookup_batch_asks_every_key_once_after_the_pairs_and_labels_only_its_value():
    ids, labels = lookup_task.lookup_batch(TASK, 5, 40, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (5, 40) and int(ids.max()) < TASK.vocab_size
    asked = list(answers_with_their_questions(ids, labels))
    assert len(asked) == 5 * TASK.num_pairs
    for row, question, key, value in asked:
        assert question >= TASK.pairs_end
        assert int(ids[row, pair_position(ids[row], key) + 1]) == value  # the value paired with that key
    for row in range(5):
        assert sorted(k for r, _, k, _ in asked if r == row) == sorted(
            ids[row, 1 : TASK.pairs_end : 2].tolist()
        )
    with pytest.raises(ValueError, match="no room"):
        lookup_task.lookup_batch(TASK, 1, TASK.pairs_end + 4, torch.Generator())


@pytest.mark.parametrize("distance", [4, 9, 30])
def test_lookup_probes_put_every_question_exactly_distance_after_its_key(distance):
    ids, labels = lookup_task.lookup_probes(TASK, 3, distance, torch.Generator().manual_seed(1))
    asked = list(answers_with_their_questions(ids, labels))
    assert asked
    for row, question, key, value in asked:
        assert question - pair_position(ids[row], key) == distance and question >= TASK.pairs_end
        assert int(ids[row, pair_position(ids[row], key) + 1]) == value
        assert (ids[row, TASK.pairs_end : question] != key).all()  # no nearer copy of the key to cheat from


def test_copy_batches_and_probes_repeat_the_list_and_label_the_repeat():
    ids, labels = lookup_task.copy_batch(TASK, 4, 40, torch.Generator().manual_seed(2))
    lists = ids[:, 1 : 1 + TASK.num_pairs]
    for row in range(4):
        repeat = labels[row][labels[row] != -100]
        assert repeat.tolist() == lists[row, 1:].tolist()
    ids, labels = lookup_task.copy_probes(TASK, 2, 20, torch.Generator().manual_seed(3), list_length=5)
    assert ids.shape[1] == 1 + 20 + 5
    assert torch.equal(ids[:, 1:6], ids[:, 21:26]) and torch.equal(labels[:, 22:], ids[:, 22:])
    with pytest.raises(ValueError, match="overlap"):
        lookup_task.copy_probes(TASK, 1, 5, torch.Generator(), list_length=5)


class LookupOracle(torch.nn.Module):
    """Predicts, at each token seen before, the token that followed it: the perfect lookup head, by hand."""

    def forward(self, input_ids, labels=None):
        logits = torch.zeros(*input_ids.shape, TASK.vocab_size)
        for row, ids in enumerate(input_ids.tolist()):
            for i, token in enumerate(ids):
                earlier = [j for j in range(i) if ids[j] == token]
                if earlier:
                    logits[row, i, ids[earlier[0] + 1]] = 1.0
        return SimpleNamespace(logits=logits)


def test_probe_accuracy_scores_a_perfect_lookup_one_and_a_blind_model_near_chance():
    generator = torch.Generator().manual_seed(4)
    for probes in (
        lookup_task.lookup_probes(TASK, 8, 25, generator), lookup_task.copy_probes(TASK, 8, 25, generator),
    ):
        assert seed_claims.probe_accuracy(LookupOracle(), *probes) == 1.0
    ids, labels = lookup_task.lookup_probes(TASK, 64, 25, generator)
    def constant(input_ids):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, TASK.vocab_size))

    constant.eval = lambda: None
    assert seed_claims.probe_accuracy(constant, ids, labels) < 0.3  # always the same id: right only by luck


def test_curriculum_moves_up_on_mastery_and_anyway_as_the_budget_runs():
    stages = (("copy", 8), ("copy+lookup", 8), ("copy+lookup", 16), ("copy+lookup", 32))
    earned = lookup_task.Curriculum(stages)
    for _ in range(20):
        earned.record(0.95, fraction_done=0.01)
    assert earned.stage(0.01) == 1  # 20 steps above 90%: next stage
    for _ in range(10):
        earned.record(0.95, fraction_done=0.02)
    assert earned.stage(0.02) == 1  # the count starts again after each move
    forced = lookup_task.Curriculum(stages)
    for _ in range(40):
        forced.record(0.0, fraction_done=0.1)
    assert forced.stage(0.1) == 0 and forced.stage(0.5) == 1 and forced.stage(0.7) == len(stages) - 1


def test_lookup_feed_follows_its_curriculum_and_logs_where_each_stage_began():
    feed = lookup_task.LookupFeed(TASK, (("copy", 30), ("copy+lookup", 40)), batch_size=4, seed=0)
    ids, labels = feed.batch(0.0)
    assert ids.shape == (4, 30) and ((labels != -100).sum(1) == TASK.num_pairs - 1).all()  # copies only
    for _ in range(20):
        feed.record(1.0)
    ids, labels = feed.batch(0.05)
    assert ids.shape == (4, 40)
    assert ((labels[2:] != -100).sum(1) == TASK.num_pairs).all()  # the second half: lookups, every key asked
    assert feed.log == [(0, 0), (1, 1)]


def test_crossover_is_where_tinytx_stays_ahead():
    def row(threads, length, tinytx, lstm):
        return {
            "threads": threads, "length": length, "tinytx_tokens_per_s": tinytx, "lstm_tokens_per_s": lstm,
        }

    rows = [row(1, 64, 1, 2), row(1, 128, 3, 2), row(1, 256, 1, 2), row(2, 64, 1, 2), row(2, 128, 3, 2),
            row(2, 256, 4, 2)]
    assert seed_claims.crossover_lengths(rows) == {1: None, 2: 128}


def test_budget_in_steps_or_seconds():
    assert seed_claims.Budget(steps=10).fraction(5, 99.0) == 0.5
    assert seed_claims.Budget(seconds=10.0).fraction(99, 2.5) == 0.25
    assert seed_claims.Budget(steps=10).describe() == "10 steps"


def test_lstm_parameter_count_formula_and_matching():
    model = LSTMLanguageModel(vocab_size=300, hidden_size=24, num_layers=2)
    assert sum(p.numel() for p in model.parameters()) == lstm_parameters(300, 24, 2)
    target = sum(p.numel() for p in build_tiny_model(vocab_size=300).parameters())
    matched = lstm_matching(target, vocab_size=300)
    assert abs(sum(p.numel() for p in matched.parameters()) - target) / target < 0.05


def test_lstm_is_scored_by_score_probes_like_a_causal_lm():
    tokenizer = build_byte_bpe_tokenizer()
    torch.manual_seed(0)
    model = LSTMLanguageModel(len(tokenizer), 16)
    probes = make_probes(2, recall_distances=(10,))
    results = score_probes(model, tokenizer, probes)
    assert {"coref", "coref_new_nouns", "copy", "recall@10"} <= set(results)
    # Right padding must not change a left-to-right reader's scores: a probe
    # alone scores as it does in a batch.
    alone = candidate_log_probs(model, tokenizer, probes[:1], batch_size=1)[0]
    batched = candidate_log_probs(model, tokenizer, probes, batch_size=8)[0]
    assert alone == pytest.approx(batched, abs=1e-4)
    batch = torch.randint(0, len(tokenizer), (2, 7))
    assert model(input_ids=batch, labels=batch).loss.ndim == 0
    with pytest.raises(ValueError, match="tokenizer and model disagree"):
        model(input_ids=torch.tensor([[len(tokenizer)]]))


def test_quick_run_writes_a_report_with_every_claim_measured(tmp_path):
    # No --out: a quick run writes into the scratch folder git ignores, never over the committed report.
    out, committed = BENCHMARKS / "results" / "quick" / "seed_claims", BENCHMARKS / "results" / "seed_claims"
    before = {path: path.read_bytes() for path in committed.rglob("*") if path.is_file()}
    shutil.rmtree(out, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.seed_claims", "--quick", "--lookup_steps", "30"],
        env=pretrain_env(tmp_path), cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert before and {path: path.read_bytes() for path in committed.rglob("*") if path.is_file()} == before
    assert (
        subprocess.run(["git", "check-ignore", "-q", str(out / "REPORT.md")], cwd=BENCHMARKS).returncode == 0
    )

    report = (out / "REPORT.md").read_text()
    claim_rows = [line for line in report.splitlines() if re.match(r"\| [1-6]\. ", line)]
    assert [row[2] for row in claim_rows] == list("123456")
    for row in claim_rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 3 and all(cells), row
        # a measured number in each row
        assert re.search(r"\d", cells[2]) and "nan" not in cells[2].lower(), row
    for png in ("step_time.png", "lookup_by_distance.png", "lookup_head.png", "coref_head_it.png",
                "coref_head_last.png"):
        assert (out / png).stat().st_size > 0
        assert f"]({png})" in report
    assert "load average" in report

    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "seed_claims" and figures["mode"] == "quick"
    assert figures["quadratic"]["flop_growth_when_n_doubles"] == pytest.approx(4.0)
    assert figures["positions"]["permutation_max_error_without_rope"] < 1e-5
    single = figures["sequential"]["single_sequence"]
    assert {(row["threads"], row["length"]) for row in single["rows"]} >= {(1, 32), (1, 64)}
    assert all(row["tinytx_tokens_per_s"] > 0 and row["lstm_tokens_per_s"] > 0 for row in single["rows"])
    lookup = figures["lookup"]
    assert lookup["budget"] == "30 steps"
    assert lookup["training"]["tinytx"]["steps"] == 30 and lookup["training"]["lstm"]["steps"] == 30
    assert [row["distance"] for row in lookup["rows"]] == [12, 25, 50, 100, 200, 400]
    assert all(0 <= row[key] <= 1 for row in lookup["rows"] for key in row if key != "distance")
    roles = {row["role"] for row in figures["lookup_head"]["rows"]}
    # the lookup head is ranked among all roles
    assert roles == {"previous_token", "first_token", "induction"}
    assert json.loads((out / "results.json").read_text())["mode"] == "quick"

    # Claim 4 on a corpus model per seed (quick: seeds 0 and 1), trained for the
    # budget in steps, each seed a row.
    coref = figures["coref"]
    assert [row["seed"] for row in coref["rows"]] == [0, 1] and all(
        row["steps"] == 40 for row in coref["rows"]
    )
    for row in coref["rows"]:
        assert 0 <= row["coref"] <= 1 and 0 <= row["coref_new_nouns"] <= 1 and row["seconds"] > 0
        for head in row["heads"].values():
            assert all(
                0 <= head[key] <= 1
                for key in (
                    "referent_weight", "other_weight", "unseen_referent_weight", "unseen_other_weight",
                )
            )
    assert (
        coref["coref_new_nouns"]["min"] <= coref["coref_new_nouns"]["mean"] <= coref["coref_new_nouns"]["max"]
    )
    section = report[report.index("## 4. Resolving"):]
    assert [line.split("|")[1].strip() for line in section.splitlines() if re.match(r"\| [01] \|", line)] == [
        "0", "1",
    ]


def test_seed_flags_pick_the_claim_4_seeds_and_refuse_repeats_before_torch_loads(capsys):
    args, settings, _, corpus = seed_claims.parse_arguments(["--seed", "7"])
    assert args.seeds == [7] and args.seed == 7 and corpus.steps == settings["train_steps"]
    args, *_ = seed_claims.parse_arguments(["--seeds", "3", "4", "--train_seconds", "5"])
    assert args.seeds == [3, 4] and args.seed == 3
    assert seed_claims.parse_arguments([])[0].seeds == list(seed_claims.SETTINGS["full"]["seeds"])
    for argv, message in (
        (["--seeds", "1", "1"], "repeats a seed"), (["--seed", "1", "--seeds", "2"], "not both"),
    ):
        with pytest.raises(SystemExit):
            seed_claims.parse_arguments(argv)
        assert message in capsys.readouterr().err


def test_rule_ablation_scores_seen_unseen_and_made_up_nouns_along_the_way(tmp_path):
    """rule_ablation.py: claim 4's model on a mix set by flags, its three "it"
    accuracies every --every steps."""
    out, elsewhere = tmp_path / "ablation.json", tmp_path / "elsewhere.json"
    elsewhere.write_text("keep")
    out.symlink_to(elsewhere)  # a link planted at --out is replaced, never written through
    result = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.seed_claims.rule_ablation", "--quick", "--steps", "6",
            "--every", "4", "--probes", "4", "--made_up", "1.0", "--kind_weights", "1", "0", "0",
            "--layers", "1", "--documents", "200", "--out", str(out),
        ],
        env=pretrain_env(tmp_path),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures == json.loads(out.read_text()) and not out.is_symlink() and elsewhere.read_text() == "keep"
    assert figures["command"].startswith("python -m benchmarks.seed_claims.rule_ablation --quick --steps 6 ")
    assert figures["mix"] == {"kind_weights": [1.0, 0.0, 0.0], "made_up_share": 1.0, "copy_max_gap": None,
                              "shared_onset_share": 0.0}
    assert figures["model"]["num_hidden_layers"] == 1 and figures["probes_per_kind"] == 4
    assert figures["num_documents"] == 200
    assert [row["step"] for row in figures["curve"]] == [4, 6]  # every 4 steps, and the last
    for row in figures["curve"]:
        assert all(
            row[kind] in (0, 0.25, 0.5, 0.75, 1) for kind in ("coref", "coref_new_nouns", "coref_made_up")
        )
        assert row["loss"] > 0 and row["seconds"] >= 0
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split("|")[1].strip() for row in rows] == ["4", "6"]


@pytest.mark.parametrize(
    "argv, message",
    [(["--made_up", "1.5"], "--made_up"), (["--kind_weights", "0", "0", "0"], "--kind_weights"),
     (["--steps", "0"], "--steps"), (["--documents", "0"], "--documents"),
     (["--out", "/nonexistent/folder/ablation.json"], "--out"),
     (["--out", "."], "--out")],
)
def test_rule_ablation_refuses_bad_flags_by_name(argv, message, capsys):
    from benchmarks.seed_claims import rule_ablation

    with pytest.raises(SystemExit):
        rule_ablation.parse_arguments(argv)
    assert message in capsys.readouterr().err
    settings = rule_ablation.settings_for(rule_ablation.parse_arguments(["--hidden", "96", "--vocab", "300"]))
    assert settings["model"]["hidden_size"] == 96 and settings["model"]["intermediate_size"] == 288
    # a copy
    assert settings["vocab_size"] == 300 and seed_claims.SETTINGS["full"]["model"]["hidden_size"] == 64
