"""Calibration of predicted probabilities (Guo et al., ICML 2017; Desai & Durrett, EMNLP 2020):

- expected calibration error: predictions binned by confidence (the top probability) into
  `bins` equal-width bins of [0, 1]; ECE = sum over bins of (bin size / N) x |accuracy - mean
  confidence| of the bin; maximum calibration error (MCE) = the largest such gap over the
  non-empty bins;
- Brier score: mean over examples of sum over classes of (p_k - 1[k = gold])^2 (Brier's
  multi-class form; scikit-learn's brier_score_loss with labels);
- negative log-likelihood: mean of -log p_gold;
- temperature scaling: one T > 0 for all logits, fitted to minimise the NLL of softmax(z / T)
  on held-out data (validation). The NLL is convex in 1 / T, so Newton's method on 1 / T finds
  the minimum exactly. T is kept in [MIN_TEMPERATURE, MAX_TEMPERATURE]: on data the model
  separates perfectly the NLL keeps falling as T -> 0, and the bound says when that happened.
"""
from __future__ import annotations

import io

import numpy as np

from nli_jax import storage

BINS = 15
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.05, 20.0


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, np.float64) / float(temperature)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, np.float64) / float(temperature)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def reliability_bins(probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS) -> list[dict]:
    """Per equal-width confidence bin: [lower, upper), count, accuracy, mean confidence (the
    last bin includes 1.0)."""
    probabilities, labels = np.asarray(probabilities, np.float64), np.asarray(labels)
    confidence = probabilities.max(axis=-1)
    correct = (probabilities.argmax(axis=-1) == labels).astype(np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, bins - 1)
    out = []
    for b in range(bins):
        members = index == b
        n = int(members.sum())
        out.append({"lower": float(edges[b]), "upper": float(edges[b + 1]), "count": n,
                    "accuracy": float(correct[members].mean()) if n else None,
                    "confidence": float(confidence[members].mean()) if n else None})
    return out


def calibration_errors(probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS) -> tuple[float, float]:
    """(expected, maximum) calibration error over `bins` equal-width confidence bins."""
    table = reliability_bins(probabilities, labels, bins)
    n = sum(b["count"] for b in table)
    gaps = [(b["count"], abs(b["accuracy"] - b["confidence"])) for b in table if b["count"]]
    return float(sum(c * g for c, g in gaps) / max(n, 1)), float(max((g for _, g in gaps), default=0.0))


def brier_score(probabilities: np.ndarray, labels: np.ndarray) -> float:
    probabilities = np.asarray(probabilities, np.float64)
    onehot = np.eye(probabilities.shape[-1])[np.asarray(labels)]
    return float(np.mean(np.sum((probabilities - onehot) ** 2, axis=-1)))


def negative_log_likelihood(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    logp = log_softmax(logits, temperature)
    return max(0.0, float(-np.mean(np.take_along_axis(logp, np.asarray(labels)[:, None], axis=-1))))


def report(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0, bins: int = BINS) -> dict:
    """ECE, MCE, Brier score and NLL of softmax(logits / temperature), with the bins."""
    probabilities = softmax(logits, temperature)
    ece, mce = calibration_errors(probabilities, labels, bins)
    return {"ece": ece, "mce": mce, "brier": brier_score(probabilities, labels),
            "nll": negative_log_likelihood(logits, labels, temperature), "count": int(len(labels)),
            "bins": reliability_bins(probabilities, labels, bins)}


def fit_temperature(logits: np.ndarray, labels: np.ndarray, *, iterations: int = 100) -> float:
    """The temperature T minimising the NLL of softmax(logits / T): Newton's method on b = 1 / T
    (NLL(b) is convex: its second derivative is the mean variance of z under softmax(b z))."""
    z = np.asarray(logits, np.float64)
    labels = np.asarray(labels)
    if len(z) == 0:
        raise ValueError("no examples to fit a temperature on")
    gold = np.take_along_axis(z, labels[:, None], axis=-1)[:, 0]

    def nll(b):
        return float(np.mean(-b * gold + np.log(np.exp(b * z - (b * z).max(-1, keepdims=True)).sum(-1))
                             + (b * z).max(-1)))

    b, b_max, b_min = 1.0, 1.0 / MIN_TEMPERATURE, 1.0 / MAX_TEMPERATURE
    for _ in range(iterations):
        p = softmax(z * b)
        mean_z = (p * z).sum(-1)
        gradient = float(np.mean(mean_z - gold))
        curvature = float(np.mean((p * z * z).sum(-1) - mean_z ** 2))
        if curvature <= 1e-12:
            break
        step = gradient / curvature
        current = nll(b)
        while b - step <= 0 or nll(b - step) > current + 1e-12:  # keep b > 0, never worsen
            step /= 2
            if abs(step) < 1e-12:
                break
        b = min(max(b - step, b_min), b_max)
        if abs(step) < 1e-10 or b in (b_min, b_max):
            break
    temperature = 1.0 / b
    if not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"fitted temperature {temperature} is not a positive number")
    return float(temperature)


def plot_reliability(reports: dict[str, dict], path: str, title: str) -> str:
    """A reliability diagram (accuracy against confidence per bin, the diagonal for perfect
    calibration, bin counts below) for each of `reports` ({name: report()}), one PNG."""
    import matplotlib  # late: plots only; a command that draws none does not pay for matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # late: after matplotlib.use("Agg")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 5.6), dpi=120, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    for name, r in reports.items():
        filled = [b for b in r["bins"] if b["count"]]
        centres = [(b["lower"] + b["upper"]) / 2 for b in filled]
        top.plot([b["confidence"] for b in filled], [b["accuracy"] for b in filled], marker="o",
                 label=f"{name}: ECE {100 * r['ece']:.1f}%")
        bottom.bar(centres, [b["count"] for b in filled], width=1 / len(r["bins"]), alpha=0.5, label=name)
    top.set_ylabel("accuracy")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.legend(fontsize=7, loc="upper left")
    top.set_title(title, fontsize=9)
    bottom.set_xlabel("confidence (top probability)")
    bottom.set_ylabel("examples")
    fig.tight_layout()

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    storage.write_bytes(path, buffer.getvalue())
    return path
