"""Accuracy and its breakdowns (by gold label, by a category, by multi-label tags)."""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np


def accuracy(gold: Sequence[int], predicted: Sequence[int]) -> float:
    gold, predicted = np.asarray(gold), np.asarray(predicted)
    if len(gold) == 0:
        raise ValueError("accuracy of an empty split")
    return float(np.mean(gold == predicted))


def accuracy_by(gold: Sequence[int], predicted: Sequence[int], groups: Sequence[str]) -> dict[str, dict]:
    """{group: {"accuracy", "count"}} for each distinct group value (sorted)."""
    members = defaultdict(list)
    for i, g in enumerate(groups):
        members[str(g)].append(i)
    gold, predicted = np.asarray(gold), np.asarray(predicted)
    return {g: {"accuracy": float(np.mean(gold[idx] == predicted[idx])), "count": len(idx)}
            for g, idx in sorted(members.items())}


def accuracy_by_tag(gold: Sequence[int], predicted: Sequence[int], tags: Sequence[Sequence[str]]) -> dict[str, dict]:
    """Multi-label breakdown: an example counts towards every tag it carries."""
    members = defaultdict(list)
    for i, example_tags in enumerate(tags):
        for t in set(example_tags):
            members[t].append(i)
    gold, predicted = np.asarray(gold), np.asarray(predicted)
    return {t: {"accuracy": float(np.mean(gold[idx] == predicted[idx])), "count": len(idx)}
            for t, idx in sorted(members.items())}


def precision_recall_f1(gold: Sequence, predicted: Sequence, average: str = "macro") -> dict[str, float]:
    """Macro-averaged precision, recall and F1 over the labels that occur in gold or predicted
    (sklearn's average='macro' with zero for undefined ratios), plus accuracy."""
    gold, predicted = list(gold), list(predicted)
    if len(gold) != len(predicted) or not gold:
        raise ValueError(f"{len(gold)} gold vs {len(predicted)} predicted labels")
    labels = sorted(set(gold) | set(predicted), key=str)
    scores = list(precision_recall_f1_by_label(gold, predicted, labels).values())
    return {"accuracy": float(np.mean([g == p for g, p in zip(gold, predicted)])),
            "precision": float(np.mean([s["precision"] for s in scores])),
            "recall": float(np.mean([s["recall"] for s in scores])), "f1": float(np.mean([s["f1"] for s in scores]))}


def precision_recall_f1_by_label(gold: Sequence, predicted: Sequence, labels: Sequence) -> dict:
    """{label: precision, recall, F1 (that label against the rest; 0 for undefined ratios, as
    sklearn's average=None, zero_division=0) and its gold count} for each of `labels`."""
    out = {}
    for label in labels:
        tp = sum(1 for g, p in zip(gold, predicted) if g == label and p == label)
        n_pred = sum(1 for p in predicted if p == label)
        n_gold = sum(1 for g in gold if g == label)
        p = tp / n_pred if n_pred else 0.0
        r = tp / n_gold if n_gold else 0.0
        out[label] = {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0, "count": n_gold}
    return out
