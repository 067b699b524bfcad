"""Calibration metrics against references: scikit-learn's brier_score_loss and log_loss, and the
expected calibration error computed directly from its definition (Guo et al., 2017); the fitted
temperature is the NLL's minimum."""
import numpy as np
import pytest

from nli_jax import storage
from nli_jax.metrics import calibration


def _logits(n=500, k=3, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) + scale * np.eye(k)[labels] * rng.random((n, 1))
    return logits, labels


def test_brier_and_nll_equal_scikit_learn():
    from sklearn.metrics import brier_score_loss, log_loss
    logits, labels = _logits()
    for temperature in (0.5, 1.0, 2.0):
        p = calibration.softmax(logits, temperature)
        report = calibration.report(logits, labels, temperature)
        assert report["brier"] == pytest.approx(brier_score_loss(labels, p, labels=[0, 1, 2]), abs=1e-12)
        assert report["nll"] == pytest.approx(log_loss(labels, p, labels=[0, 1, 2]), abs=1e-9)


def test_ece_and_mce_equal_a_direct_computation():
    logits, labels = _logits(n=997, seed=3)
    p = calibration.softmax(logits)
    confidence, correct = p.max(1), (p.argmax(1) == labels)
    ece, gaps = 0.0, []
    for b in range(15):  # equal-width bins (b/15, (b+1)/15], as Guo et al.; 1.0 in the last
        lo, hi = b / 15, (b + 1) / 15
        members = (confidence >= lo) & ((confidence < hi) if b < 14 else (confidence <= hi))
        if members.any():
            gap = abs(correct[members].mean() - confidence[members].mean())
            ece += members.mean() * gap
            gaps.append(gap)
    report = calibration.report(logits, labels)
    assert report["ece"] == pytest.approx(ece, abs=1e-12) and report["mce"] == pytest.approx(max(gaps), abs=1e-12)
    assert sum(b["count"] for b in report["bins"]) == len(labels)


def test_a_perfectly_calibrated_predictor_has_no_calibration_error():
    rng = np.random.default_rng(0)
    confidence = rng.choice([0.4, 0.7, 0.9], size=30000)
    correct = rng.random(30000) < confidence  # right as often as it is confident
    p = np.stack([confidence, (1 - confidence) / 2, (1 - confidence) / 2], 1)
    labels = np.where(correct, 0, rng.integers(1, 3, 30000))
    ece, _ = calibration.calibration_errors(p, labels)
    assert ece < 0.01


def test_fitted_temperature_minimises_the_nll_and_undoes_overconfidence():
    logits, labels = _logits(n=2000, seed=1)
    calibrated_t = calibration.fit_temperature(logits, labels)
    overconfident = logits * 4.0  # the same predictor, four times too sharp
    t = calibration.fit_temperature(overconfident, labels)
    assert t == pytest.approx(4.0 * calibrated_t, rel=1e-4)
    best = calibration.negative_log_likelihood(overconfident, labels, t)
    for other in (t * 0.9, t * 1.1, 1.0):
        assert calibration.negative_log_likelihood(overconfident, labels, other) > best
    before = calibration.report(overconfident, labels)
    after = calibration.report(overconfident, labels, t)
    assert after["ece"] < before["ece"] and after["nll"] < before["nll"]


def test_reliability_diagram_is_a_png(tmp_path):
    logits, labels = _logits()
    path = calibration.plot_reliability({"raw": calibration.report(logits, labels)}, storage.under(tmp_path, "r.png"), "t")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
