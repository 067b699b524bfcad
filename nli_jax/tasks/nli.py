"""Natural language inference as sequence-pair classification, for every NLI corpus: each corpus is
one module of this package (nli_jax/tasks/indonli.py, ocnli.py, inferes.py,
indonli_translate_train.py) holding its `NLICorpus` spec (files, rows, label set, categories), its
options and its task, registered with `register_nli`.

`task_options.hypothesis_only` trains and evaluates on the hypothesis alone: the papers'
baseline for annotation artifacts. Reports: accuracy, by gold label, by every category the corpus has
(premise size, genre, difficulty level, creation strategy, topic) and by diagnostic tag.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from nli_jax.data import nli as nli_data
from nli_jax.metrics import accuracy, accuracy_by, accuracy_by_tag
from nli_jax.plan import DataPlan, TaskOptions, option
from nli_jax.tasks.base import pair_min_length, register, single_min_length
from nli_jax.tasks.common import ClassificationTask, encode_text


@dataclasses.dataclass(frozen=True)
class NLIOptions(TaskOptions):
    hypothesis_only: bool = option(False, model_input=True)  # the hypothesis alone: the artifacts baseline


class NLITask(ClassificationTask):
    """A corpus's task: its label set is the corpus's."""

    def __init__(self, corpus: nli_data.NLICorpus, data: DataPlan, options: NLIOptions, train_split: str = "train"):
        super().__init__(data, options)
        self.name = corpus.name
        self.corpus = corpus.name
        self.labels = corpus.labels
        self.train_split = train_split

    def result_fields(self):
        return {"hypothesis_only": self.options.hypothesis_only}

    def load(self, workdir=None):
        return nli_data.prepare(self.corpus, self.data.source or None, self.data.tfds_dir)

    def read_file(self, path, *, labelled=True):
        return nli_data.read_file(self.corpus, path, labelled=labelled)

    def possible_splits(self):
        return set(nli_data.CORPORA[self.corpus].splits)

    def min_seq_length(self, tokenizer):
        if self.options.hypothesis_only:
            n, _ = single_min_length(tokenizer)
            return n, "a hypothesis alone ([CLS] h [SEP])"
        n, _ = pair_min_length(tokenizer)
        return n, "a premise-hypothesis pair ([CLS] p [SEP] h [SEP])"

    def encoder(self, tokenizer):
        max_length, hypothesis_only = self.data.max_seq_length, self.options.hypothesis_only

        def encode(example):
            if hypothesis_only:
                features = encode_text(tokenizer, example["hypothesis"], None, max_length)
            else:
                # Long premises (IndoNLI paragraphs reach 200+ words) are cut first.
                features = encode_text(tokenizer, example["premise"], example["hypothesis"], max_length)
            return {**features, "label": np.int32(example["label"]), "idx": np.int32(example["idx"]),
                    "weight": np.float32(1.0)}
        return encode

    def report(self, split, examples, predictions):
        gold = [e["label"] for e in examples]
        pred = [int(p) for p in predictions["prediction"]]
        out = {"accuracy": accuracy(gold, pred), "count": len(gold),
               "by_label": {self.labels[int(k)]: v for k, v in accuracy_by(gold, pred, [str(g) for g in gold]).items()}}
        for name in sorted({k for e in examples for k in e["categories"]}):
            out[f"by_{name}"] = accuracy_by(gold, pred, [e["categories"].get(name, "unknown") for e in examples])
        if any(e["tags"] for e in examples):
            out["by_tag"] = accuracy_by_tag(gold, pred, [e["tags"] for e in examples])
        return out


def reindex(examples):
    return [dict(e, idx=i) for i, e in enumerate(examples)]


# {task: the corpus its training data comes from} (nli_jax.analysis.artifacts reads it), filled
# by register_nli.
TASK_CORPORA: dict[str, nli_data.NLICorpus] = {}


def register_nli(name: str, options: type[NLIOptions], *, corpus: nli_data.NLICorpus):
    """Registers an NLI task (nli_jax.tasks.base.register) whose training data is `corpus`, which
    the artifact analysis reads."""
    def wrap(factory):
        TASK_CORPORA[name] = corpus
        return register(name, options=options)(factory)
    return wrap
