"""CoNLL-style chunk evaluation, as the IndoNLU framework scores every word-level task.

Chunks follow the conlleval rules (B/I/E/S/O prefixes, a type change starts a new chunk, an
I- after O starts one). A chunk is correct when its start, end and type all match. The reported
F1 is the *macro average over chunk types* (types seen in gold or predictions) of each type's
F1, which is the IndoNLU benchmark's number; micro F1 is reported beside it.

Token accuracy follows the framework too: sentences are scored as one stream with a boundary
'O'/'O' token after each sentence, counted as a correct token (so it is slightly above the
plain per-word accuracy, also reported).
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence


def _split(tag: str) -> tuple[str, str]:
    prefix, sep, kind = tag.partition("-")
    return (prefix, kind) if sep else (tag, "")


def _starts(prev: str, prev_type: str, tag: str, tag_type: str) -> bool:
    if tag in ("B", "S", "[", "]"):
        return True
    if tag in ("E", "I") and prev in ("E", "S", "O"):
        return True
    return tag not in ("O", ".") and prev_type != tag_type


def _ends(prev: str, prev_type: str, tag: str, tag_type: str) -> bool:
    if prev in ("E", "S", "[", "]"):
        return True
    if prev in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev not in ("O", ".") and prev_type != tag_type


def chunks(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """{(start, end inclusive, type)} of one sentence."""
    out, start, start_type = set(), None, ""
    prev, prev_type = "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        t, kind = _split(tag)
        if start is not None and _ends(prev, prev_type, t, kind):
            out.add((start, i - 1, start_type))
            start = None
        if _starts(prev, prev_type, t, kind):
            start, start_type = i, kind
        prev, prev_type = t, kind
    return out


def conll_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold vs {len(predicted)} predicted sentences")
    correct, found_gold, found_pred = Counter(), Counter(), Counter()
    correct_tokens = tokens = 0
    for g, p in zip(gold, predicted):
        if len(g) != len(p):
            raise ValueError(f"sentence with {len(g)} gold tags but {len(p)} predicted")
        gc, pc = chunks(g), chunks(p)
        for c in gc:
            found_gold[c[2]] += 1
        for c in pc:
            found_pred[c[2]] += 1
        for c in gc & pc:
            correct[c[2]] += 1
        correct_tokens += sum(a == b for a, b in zip(g, p))
        tokens += len(g)

    def prf(tp, n_pred, n_gold):
        p = tp / n_pred if n_pred else 0.0
        r = tp / n_gold if n_gold else 0.0
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)

    types = sorted(set(found_gold) | set(found_pred))
    by_type = {t: dict(zip(("precision", "recall", "f1"), prf(correct[t], found_pred[t], found_gold[t])),
                       count=found_gold[t]) for t in types}
    micro = prf(sum(correct.values()), sum(found_pred.values()), sum(found_gold.values()))
    n = max(len(types), 1)
    return {
        "f1": sum(v["f1"] for v in by_type.values()) / n,
        "precision": sum(v["precision"] for v in by_type.values()) / n,
        "recall": sum(v["recall"] for v in by_type.values()) / n,
        "micro_f1": micro[2],
        # The framework's stream counts one boundary O per sentence as a correct token.
        "token_accuracy": (correct_tokens + len(gold)) / (tokens + len(gold)) if tokens else 0.0,
        "word_accuracy": correct_tokens / tokens if tokens else 0.0,
        "by_type": by_type,
    }
