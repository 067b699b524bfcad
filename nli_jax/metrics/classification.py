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
