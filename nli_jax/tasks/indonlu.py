"""The 12 IndoNLU tasks with the benchmark's metrics (as the IndoNLU framework computes them):
macro-F1 for EmoT, SmSA, WReTE; macro-F1 over all (example, aspect) labels flattened for CASA
and HoASA; CoNLL chunk F1 macro-averaged over chunk types (plus token accuracy) for POSP,
BaPOS, TermA, KEPS, NERGrit, NERP and FacQA."""
from __future__ import annotations

import itertools
import logging

import numpy as np

from nli_jax.data import indonlu as data
from nli_jax.metrics import conll_scores, precision_recall_f1
from nli_jax.plan import DataPlan, NoOptions
from nli_jax.tasks.base import pair_min_length, register, single_min_length
from nli_jax.tasks.common import ClassificationTask, MultiAspectTask, TaggingOptions, TaggingTask, encode_text

log = logging.getLogger("nli_jax")


class _IndoNLUData:
    primary_metric = "f1"
    spec: data.IndoNLUTask
    data: DataPlan

    def __init__(self, name: str, data_plan: DataPlan, options=NoOptions()):
        self.name, self.spec, self.data, self.options = name, data.TASKS[name], data_plan, options
        self.labels = tuple(self.spec.labels)  # the benchmark's label (or tag) set, whatever the files hold

    def load(self, workdir=None):
        splits, _ = data.prepare(self.spec.name, self.data.source or None, self.data.tfds_dir)
        return splits

    def read_file(self, path, *, labelled=True):
        return data.read_file(self.spec, path, labelled=labelled)

    def possible_splits(self):
        return set(data.SPLIT_PREFIX)

    def min_seq_length(self, tokenizer):
        if self.spec.kind in ("pair", "qa"):
            return pair_min_length(tokenizer)
        return single_min_length(tokenizer)


class SentenceTask(_IndoNLUData, ClassificationTask):
    def encoder(self, tokenizer):
        max_length, ids = self.data.max_seq_length, {n: i for i, n in enumerate(self.labels)}
        pair = self.spec.kind == "pair"

        def encode(example):
            features = (encode_text(tokenizer, example["text_a"], example["text_b"], max_length) if pair
                        else encode_text(tokenizer, example["text"], None, max_length))
            label = -1 if example["label"] is None else ids[example["label"]]  # None: input to predict
            return {**features, "label": np.int32(label), "idx": np.int32(example["idx"]),
                    "weight": np.float32(1.0)}
        return encode

    def report(self, split, examples, predictions):
        gold = [e["label"] for e in examples]
        pred = [self.labels[int(p)] for p in predictions["prediction"]]
        out = {**precision_recall_f1(gold, pred), "count": len(gold)}
        if self.spec.kind == "pair":
            categories = sorted({e["category"] for e in examples})
            out["by_category"] = {c: {**precision_recall_f1([g for g, e in zip(gold, examples) if e["category"] == c],
                                                            [p for p, e in zip(pred, examples) if e["category"] == c]),
                                      "count": sum(e["category"] == c for e in examples)} for c in categories}
        return out


class AspectTask(_IndoNLUData, MultiAspectTask):
    def __init__(self, name: str, data_plan: DataPlan, options=NoOptions()):
        super().__init__(name, data_plan, options)
        self.aspects = self.spec.aspects

    def encoder(self, tokenizer):
        max_length, ids = self.data.max_seq_length, {n: i for i, n in enumerate(self.labels)}

        def encode(example):
            return {**encode_text(tokenizer, example["text"], None, max_length),
                    "labels": np.asarray([ids[l] for l in example["labels"]] if example["labels"] is not None
                                         else [-1] * len(self.aspects), np.int32),
                    "idx": np.int32(example["idx"]), "weight": np.float32(1.0)}
        return encode

    def report(self, split, examples, predictions):
        gold = list(itertools.chain.from_iterable(e["labels"] for e in examples))
        pred = [self.labels[int(p)] for row in predictions["prediction"] for p in row]
        out = {**precision_recall_f1(gold, pred), "count": len(examples)}
        out["by_aspect"] = {a: precision_recall_f1([e["labels"][i] for e in examples],
                                                   [self.labels[int(r[i])] for r in predictions["prediction"]])
                            for i, a in enumerate(self.aspects)}
        return out

    def prediction_records(self, split, examples, predictions):
        return [{"split": split, "idx": e["idx"],
                 "labels": dict(zip(self.aspects, e["labels"])) if e["labels"] is not None else None,
                 "prediction": {a: self.labels[int(p)] for a, p in zip(self.aspects, row)}}
                for e, row in zip(examples, predictions["prediction"])]


class WordTask(_IndoNLUData, TaggingTask):
    def __init__(self, name: str, data_plan: DataPlan, options: TaggingOptions):
        super().__init__(name, data_plan, options)
        self.question_field = "question" if self.spec.kind == "qa" else None

    def report(self, split, examples, predictions):
        gold = [e["tags"] for e in examples]
        pred = [self.predicted_tags(e, p, m) for e, p, m in
                zip(examples, predictions["prediction"], predictions["word_mask"])]
        unseen, words = self.unseen_words(examples, predictions)
        if unseen:
            log.warning("%s %s: %d of %d words (%.1f%%) are past data.max_seq_length=%d tokens (or have no "
                        "sub-token) and are scored as predicted 'O'", self.name, split, unseen, words,
                        100 * unseen / words, self.data.max_seq_length)
        return {**conll_scores(gold, pred), "count": len(examples), "words": words, "words_not_seen": unseen}


_CLASSES = {"single": SentenceTask, "pair": SentenceTask, "aspects": AspectTask, "tagging": WordTask, "qa": WordTask}
for _name, _spec in data.TASKS.items():
    register(_name, options=TaggingOptions if _CLASSES[_spec.kind] is WordTask else NoOptions)(
        lambda plan, n=_name, cls=_CLASSES[_spec.kind]: cls(n, plan.data, plan.task_options))
