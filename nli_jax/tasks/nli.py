"""Natural language inference as sequence-pair classification: IndoNLI, OCNLI, InferES and
IndoNLI translate-train. A new NLI corpus is one `NLICorpus` entry in nli_jax.data.nli plus
one `register` line here.

`data.hypothesis_only` trains and evaluates on the hypothesis alone: the papers' baseline for
annotation artifacts. Reports: accuracy, by gold label, by every category the corpus has
(premise size, genre, difficulty level, creation strategy, topic) and by diagnostic tag.
"""
from __future__ import annotations

import numpy as np

from nli_jax.data import nli as nli_data
from nli_jax.data.records import InMemorySource
from nli_jax.metrics import accuracy, accuracy_by, accuracy_by_tag
from nli_jax.errors import RunError
from nli_jax.plan import DataPlan
from nli_jax.tasks.base import pair_min_length, register, single_min_length
from nli_jax.tasks.common import ClassificationTask, encode_text


class NLITask(ClassificationTask):
    labels = nli_data.NLI_LABELS

    def __init__(self, corpus: str, data: DataPlan, train_split: str = "train"):
        super().__init__(data)
        self.name = corpus
        self.corpus = corpus
        self.train_split = train_split

    def load(self, workdir=None):
        return nli_data.prepare(self.corpus, self.data.source or None, self.data.tfds_dir)

    def read_file(self, path, *, labelled=True):
        return nli_data.read_file(self.corpus, path, labelled=labelled)

    def possible_splits(self):
        return set(nli_data.CORPORA[self.corpus].splits)

    def min_seq_length(self, tokenizer):
        if self.data.hypothesis_only:
            n, _ = single_min_length(tokenizer)
            return n, "a hypothesis alone ([CLS] h [SEP])"
        n, _ = pair_min_length(tokenizer)
        return n, "a premise-hypothesis pair ([CLS] p [SEP] h [SEP])"

    def encoder(self, tokenizer):
        max_length, hypothesis_only = self.data.max_seq_length, self.data.hypothesis_only

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


class OCNLITask(NLITask):
    """OCNLI: train on `data.train_size` (50k / 30k / 10k / 3k, whichever file exists), evaluate on dev."""

    def __init__(self, data: DataPlan):
        super().__init__("ocnli", data)

    def load(self, workdir=None):
        splits = super().load()
        size = self.data.train_size
        candidates = [f"train_{size}"] if size else ["train_50k", "train_30k", "train_10k", "train_3k"]
        for name in candidates:
            if name in splits:
                self.train_split = name
                return splits
        raise FileNotFoundError(f"ocnli: no training file for train_size={size!r} in {self.data.source} "
                                f"(have {sorted(s for s in splits if s.startswith('train'))})")


class InferESTask(NLITask):
    """InferES: official train/test; a validation split carved from train (`data.validation_fraction`,
    seeded); `data.holdout_topic=N` trains on the other five topics and adds split `topic_ood`
    (topic N from train and test) for the topic out-of-distribution setting."""

    def __init__(self, data: DataPlan):
        super().__init__("inferes", data)

    def possible_splits(self):
        return {"train", "validation", "test", "topic_ood"}

    def load(self, workdir=None):
        splits = super().load()
        train = [splits["train"][i] for i in range(len(splits["train"]))]
        train.sort(key=lambda e: e["idx"])
        holdout = self.data.holdout_topic
        out = {}
        if holdout:
            topics = {e["categories"]["topic"] for e in train}
            if holdout not in topics:
                raise RunError(f"data.holdout_topic={holdout!r} is not a topic of InferES train ({sorted(topics)})")
            ood = [e for e in train if e["categories"]["topic"] == holdout]
            if "test" in splits:
                ood += [e for e in (splits["test"][i] for i in range(len(splits["test"])))
                        if e["categories"]["topic"] == holdout]
            out["topic_ood"] = InMemorySource(_reindex(ood))
            train = [e for e in train if e["categories"]["topic"] != holdout]
        order = np.random.default_rng(self.data.validation_seed).permutation(len(train))
        n_val = int(round(self.data.validation_fraction * len(train)))
        out["validation"] = InMemorySource(_reindex([train[i] for i in sorted(order[:n_val])]))
        out["train"] = InMemorySource(_reindex([train[i] for i in sorted(order[n_val:])]))
        if "test" in splits:
            test = [splits["test"][i] for i in range(len(splits["test"]))]
            if holdout:
                test = [e for e in test if e["categories"]["topic"] != holdout]
            out["test"] = InMemorySource(_reindex(sorted(test, key=lambda e: e["idx"])))
        return out


class TranslateTrainTask(NLITask):
    """IndoNLI's translate-train rows: train on machine-translated MNLI (`data.translate_train_source`),
    optionally mixed with IndoNLI train (`data.mix_indonli_train`), evaluate on IndoNLI."""

    def __init__(self, data: DataPlan):
        super().__init__("indonli", data)
        self.name = "indonli_translate_train"

    def load(self, workdir=None):
        indonli = super().load()
        source = self.data.translate_train_source
        if not source:
            raise RunError("data.translate_train_source: the folder of the extracted translate_train_small.tar.gz")
        mt = nli_data.prepare("indonli_translate_train_small", source, self.data.tfds_dir)["train"]
        train = [dict(mt[i], origin="translate_train") for i in range(len(mt))]
        if self.data.mix_indonli_train:
            train += [dict(indonli["train"][i], origin="indonli") for i in range(len(indonli["train"]))]
        return dict(indonli, train=InMemorySource(_reindex(sorted(train, key=lambda e: (e["origin"], e["idx"])))))


def _reindex(examples):
    return [dict(e, idx=i) for i, e in enumerate(examples)]


# {task: the corpus its training data comes from} (nli_jax.analysis.artifacts reads it).
TASK_CORPORA = {"indonli": "indonli", "ocnli": "ocnli", "inferes": "inferes",
                "indonli_translate_train": nli_data.TRANSLATE_TRAIN_SMALL.name}
register("indonli")(lambda plan: NLITask("indonli", plan.data))
register("ocnli")(lambda plan: OCNLITask(plan.data))
register("inferes")(lambda plan: InferESTask(plan.data))
register("indonli_translate_train")(lambda plan: TranslateTrainTask(plan.data))
