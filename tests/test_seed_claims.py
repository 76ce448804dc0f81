"""benchmarks/seed_claims.py end to end (--quick), and the LSTM baseline it compares against."""

import json
import re
import subprocess
import sys

import pytest
import torch

from tests.helpers.tiny import REPO_ROOT, build_byte_bpe_tokenizer, build_tiny_model, pretrain_env


from benchmarks.lstm_baseline import LSTMLanguageModel, lstm_matching, lstm_parameters
from hf_tinytx.corpus import make_probes
from hf_tinytx.probes import candidate_log_probs, score_probes


BENCHMARKS = REPO_ROOT / "benchmarks"


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
    # Right padding must not change a left-to-right reader's scores: a probe alone scores as it does in a batch.
    alone = candidate_log_probs(model, tokenizer, probes[:1], batch_size=1)[0]
    batched = candidate_log_probs(model, tokenizer, probes, batch_size=8)[0]
    assert alone == pytest.approx(batched, abs=1e-4)
    batch = torch.randint(0, len(tokenizer), (2, 7))
    assert model(input_ids=batch, labels=batch).loss.ndim == 0
    with pytest.raises(ValueError, match="tokenizer and model disagree"):
        model(input_ids=torch.tensor([[len(tokenizer)]]))


@pytest.mark.slow
def test_quick_run_writes_a_report_with_every_claim_measured(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "seed_claims.py"), "--quick", "--out", str(out)],
        env=pretrain_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]

    report = (out / "REPORT.md").read_text()
    claim_rows = [line for line in report.splitlines() if re.match(r"\| [1-6]\. ", line)]
    assert [row[2] for row in claim_rows] == list("123456")
    for row in claim_rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 3 and all(cells), row
        assert re.search(r"\d", cells[2]) and "nan" not in cells[2].lower(), row  # a measured number in each row
    for png in ("step_time.png", "recall_by_distance.png", "coref_head_it.png", "coref_head_last.png"):
        assert (out / png).stat().st_size > 0
        assert f"]({png})" in report

    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "seed_claims" and figures["mode"] == "quick"
    assert figures["quadratic"]["flop_growth_when_n_doubles"] == pytest.approx(4.0)
    assert figures["positions"]["permutation_max_error_without_rope"] < 1e-5
    single = figures["sequential"]["single_sequence"]
    assert set(single["speedup_from_all_cores"]) == {"tinytx", "lstm"}
    assert all(speedup > 0 for speedup in single["speedup_from_all_cores"].values())
    training = figures["distance"]["training"]
    assert training["tinytx"]["steps"] > 0 and training["lstm"]["steps"] > 0
    assert {row["distance"] for row in figures["distance"]["rows"]} == {10, 50, 200, 400}
    assert json.loads((out / "results.json").read_text())["mode"] == "quick"

