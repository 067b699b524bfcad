"""Metrics against hand-computed cases and against sklearn / seqeval on the same predictions."""
import numpy as np
import pytest

from nli_jax.metrics import chunks, conll_scores, precision_recall_f1


def test_macro_f1_by_hand():
    gold = ["a", "a", "b", "c"]
    pred = ["a", "b", "b", "b"]
    # a: p 1, r .5, f 2/3; b: p 1/3, r 1, f .5; c: 0
    assert precision_recall_f1(gold, pred)["f1"] == pytest.approx((2 / 3 + 0.5 + 0) / 3)


def test_macro_f1_matches_sklearn_on_random_labels():
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score
    rng = np.random.default_rng(0)
    for _ in range(20):
        gold = list(rng.choice(["neg", "neut", "pos", "neg_pos"], 200, p=[0.1, 0.6, 0.25, 0.05]))
        pred = list(rng.choice(["neg", "neut", "pos"], 200))
        ours = precision_recall_f1(gold, pred)
        assert ours["f1"] == pytest.approx(f1_score(gold, pred, average="macro", zero_division=0))
        assert ours["precision"] == pytest.approx(precision_score(gold, pred, average="macro", zero_division=0))
        assert ours["recall"] == pytest.approx(recall_score(gold, pred, average="macro", zero_division=0))
        assert ours["accuracy"] == pytest.approx(accuracy_score(gold, pred))


def test_chunks_follow_conlleval_rules():
    assert chunks(["B-PER", "I-PER", "O", "B-LOC"]) == {(0, 1, "PER"), (3, 3, "LOC")}
    assert chunks(["I-PER", "I-PER", "B-PER"]) == {(0, 1, "PER"), (2, 2, "PER")}  # I after O starts a chunk
    assert chunks(["B-PER", "I-LOC"]) == {(0, 0, "PER"), (1, 1, "LOC")}  # type change
    assert chunks(["B", "I", "O", "B", "B"]) == {(0, 1, ""), (3, 3, ""), (4, 4, "")}  # untyped (KEPS, FacQA)


def test_conll_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-PER"], ["B-LOC", "O"]]
    s = conll_scores(gold, pred)
    # PER: 1 correct of 2 predicted, 1 gold -> p .5 r 1 f 2/3; LOC: 1 correct of 1 predicted, 2 gold -> f 2/3
    assert s["by_type"]["PER"]["f1"] == pytest.approx(2 / 3) and s["by_type"]["LOC"]["f1"] == pytest.approx(2 / 3)
    assert s["f1"] == pytest.approx(2 / 3)
    assert s["word_accuracy"] == pytest.approx(5 / 6)
    assert s["token_accuracy"] == pytest.approx(7 / 8)  # + one correct boundary per sentence


def _random_bio(rng, types, n):
    out, inside = [], None
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            out.append("O")
            inside = None
        elif r < 0.8 or inside is None:
            inside = rng.choice(types)
            out.append(f"B-{inside}")
        else:
            out.append(f"I-{inside}" if rng.random() < 0.8 else f"I-{rng.choice(types)}")
    return out


def test_conll_f1_matches_seqeval_macro_average():
    from seqeval.metrics import classification_report, f1_score
    rng = np.random.default_rng(1)
    types = ["PER", "LOC", "ORG", "EVT"]
    for _ in range(10):
        gold = [_random_bio(rng, types, rng.integers(3, 20)) for _ in range(40)]
        pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-LOC", "B-ORG"]) for t in g] for g in gold]
        ours = conll_scores(gold, pred)
        report = classification_report(gold, pred, output_dict=True, zero_division=0)
        assert ours["micro_f1"] == pytest.approx(f1_score(gold, pred))
        # seqeval averages over the types in gold; ours over gold or predicted, as conlleval does.
        gold_types = sorted({c[2] for g in gold for c in chunks(g)})
        seqeval_macro = np.mean([report[t]["f1-score"] for t in gold_types])
        ours_over_gold = np.mean([ours["by_type"][t]["f1"] for t in gold_types])
        assert ours_over_gold == pytest.approx(seqeval_macro)
        if set(ours["by_type"]) == set(gold_types):
            assert ours["f1"] == pytest.approx(report["macro avg"]["f1-score"])
