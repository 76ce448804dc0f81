"""The law (training/plan/law.py): repeated text counts less, the fit recovers a law it is given, and where
the sweep measured a size the prediction is the measurement."""

import math

import pytest

from hf_tinytx_training.plan import law


LAW = {"E": 1.5, "A": 30.0, "alpha": 0.3, "B": 25.0, "beta": 0.2}


def test_repeated_text_counts_less():
    assert law.effective_tokens(1e5, 2e5) == 1e5
    assert law.effective_tokens(1e5, None) == 1e5
    assert 2e5 < law.effective_tokens(4e5, 2e5) < 4e5
    # past many passes, reading more adds nothing
    assert law.effective_tokens(1e9, 2e5) == pytest.approx(2e5 * (1 + law.REPEATS))


def test_the_fit_recovers_the_law_that_made_the_points():
    points = [(n, d, law.law_loss(n, d, law.SWEEP_UNIQUE, LAW)) for n in (2e5, 5e5, 1e6, 2e6, 4e6)
              for d in (2.5e5, 5e5, 1e6, 2e6)]
    fitted = law.fit(points, law.SWEEP_UNIQUE)
    assert fitted["rms"] < 1e-3
    assert (fitted["alpha"], fitted["beta"]) == (pytest.approx(0.3, abs=0.02), pytest.approx(0.2, abs=0.02))


def test_a_measured_size_is_predicted_as_measured_and_in_between_on_the_log_scale():
    measured = {"96x3": ((250_000, 4.3), (1_000_000, 3.7))}
    at = lambda tokens: law.predicted_loss("96x3", 5e5, tokens, law.SWEEP_UNIQUE, LAW, measured)  # noqa: E731
    assert at(250_000) == pytest.approx(4.3) and at(1_000_000) == pytest.approx(3.7)
    middle = math.sqrt(250_000 * 1_000_000)  # halfway in log tokens: halfway between the two errors
    errors = [loss - law.law_loss(5e5, tokens, law.SWEEP_UNIQUE, LAW) for tokens, loss in measured["96x3"]]
    assert at(middle) == pytest.approx(law.law_loss(5e5, middle, law.SWEEP_UNIQUE, LAW) + sum(errors) / 2)
    # a size the sweep did not measure: the law alone
    assert law.predicted_loss("512x8", 2.6e7, 1e6, None, LAW, measured) == law.law_loss(2.6e7, 1e6, None, LAW)
