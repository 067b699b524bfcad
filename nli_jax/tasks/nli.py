"""Natural language inference as sequence-pair classification: IndoNLI, OCNLI, InferES and
IndoNLI translate-train. A new NLI corpus is one `NLICorpus` entry in nli_jax.data.nli plus
one `register` line here.

`task_options.hypothesis_only` trains and evaluates on the hypothesis alone: the papers'
baseline for annotation artifacts. Reports: accuracy, by gold label, by every category the corpus has
(premise size, genre, difficulty level, creation strategy, topic) and by diagnostic tag.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from nli_jax.data import nli as nli_data
from nli_jax.data.records import InMemorySource
from nli_jax.metrics import accuracy, accuracy_by, accuracy_by_tag
from nli_jax.errors import RunError
from nli_jax.plan import DataPlan, TaskOptions, option
from nli_jax.tasks.base import pair_min_length, register, single_min_length
from nli_jax.tasks.common import ClassificationTask, encode_text


@dataclasses.dataclass(frozen=True)
class NLIOptions(TaskOptions):
    hypothesis_only: bool = option(False, model_input=True)  # the hypothesis alone: the artifacts baseline


@dataclasses.dataclass(frozen=True)
class OCNLIOptions(NLIOptions):
    train_size: str = option("50k", choices=("50k", "30k", "10k", "3k"))  # OCNLI's training file


@dataclasses.dataclass(frozen=True)
class InferESOptions(NLIOptions):
    holdout_topic: str = option("")  # a topic trained on by none: split topic_ood (out of distribution)
    validation_fraction: float = option(0.1, low=0.0, high=1.0, low_open=True, high_open=True)  # carved from train
    validation_seed: int = option(0, low=0)  # which examples the validation split takes


@dataclasses.dataclass(frozen=True)
class TranslateTrainOptions(NLIOptions):
    translate_train_source: str = option("", path=True)  # the extracted translate_train_small folder
    mix_indonli_train: bool = option(False)  # IndoNLI's own training examples too


class NLITask(ClassificationTask):
    labels = nli_data.NLI_LABELS

    def __init__(self, corpus: str, data: DataPlan, options: NLIOptions, train_split: str = "train"):
        super().__init__(data, options)
        self.name = corpus
        self.corpus = corpus
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


class OCNLITask(NLITask):
    """OCNLI: train on `task_options.train_size` (50k / 30k / 10k / 3k), evaluate on dev."""

    def __init__(self, data: DataPlan, options: OCNLIOptions):
        super().__init__("ocnli", data, options, train_split=f"train_{options.train_size}")

    def load(self, workdir=None):
        splits = super().load()
        if self.train_split not in splits:
            raise FileNotFoundError(f"ocnli: no training file for train_size={self.options.train_size!r} in "
                                    f"{self.data.source} (have {sorted(s for s in splits if s.startswith('train'))})")
        return splits


class InferESTask(NLITask):
    """InferES: official train/test; a validation split carved from train
    (`task_options.validation_fraction`, seeded); `task_options.holdout_topic=N` trains on the other five topics and adds split `topic_ood`
    (topic N from train and test) for the topic out-of-distribution setting."""

    def __init__(self, data: DataPlan, options: InferESOptions):
        super().__init__("inferes", data, options)

    def possible_splits(self):
        return {"train", "validation", "test", "topic_ood"}

    def load(self, workdir=None):
        splits = super().load()
        train = [splits["train"][i] for i in range(len(splits["train"]))]
        train.sort(key=lambda e: e["idx"])
        holdout = self.options.holdout_topic
        out = {}
        if holdout:
            topics = {e["categories"]["topic"] for e in train}
            if holdout not in topics:
                raise RunError(f"--config.task_options.holdout_topic={holdout!r} is not a topic of InferES train ({sorted(topics)})")
            ood = [e for e in train if e["categories"]["topic"] == holdout]
            if "test" in splits:
                ood += [e for e in (splits["test"][i] for i in range(len(splits["test"])))
                        if e["categories"]["topic"] == holdout]
            out["topic_ood"] = InMemorySource(_reindex(ood))
            train = [e for e in train if e["categories"]["topic"] != holdout]
        order = np.random.default_rng(self.options.validation_seed).permutation(len(train))
        n_val = int(round(self.options.validation_fraction * len(train)))
        out["validation"] = InMemorySource(_reindex([train[i] for i in sorted(order[:n_val])]))
        out["train"] = InMemorySource(_reindex([train[i] for i in sorted(order[n_val:])]))
        if "test" in splits:
            test = [splits["test"][i] for i in range(len(splits["test"]))]
            if holdout:
                test = [e for e in test if e["categories"]["topic"] != holdout]
            out["test"] = InMemorySource(_reindex(sorted(test, key=lambda e: e["idx"])))
        return out


class TranslateTrainTask(NLITask):
    """IndoNLI's translate-train rows: train on machine-translated MNLI
    (`task_options.translate_train_source`), optionally mixed with IndoNLI train
    (`task_options.mix_indonli_train`), evaluate on IndoNLI."""

    def __init__(self, data: DataPlan, options: TranslateTrainOptions):
        super().__init__("indonli", data, options)
        self.name = "indonli_translate_train"

    def load(self, workdir=None):
        indonli = super().load()
        source = self.options.translate_train_source
        if not source:
            raise RunError("--config.task_options.translate_train_source='': the folder of the extracted translate_train_small.tar.gz")
        mt = nli_data.prepare("indonli_translate_train_small", source, self.data.tfds_dir)["train"]
        train = [dict(mt[i], origin="translate_train") for i in range(len(mt))]
        if self.options.mix_indonli_train:
            train += [dict(indonli["train"][i], origin="indonli") for i in range(len(indonli["train"]))]
        return dict(indonli, train=InMemorySource(_reindex(sorted(train, key=lambda e: (e["origin"], e["idx"])))))


def _reindex(examples):
    return [dict(e, idx=i) for i, e in enumerate(examples)]


# {task: the corpus its training data comes from} (nli_jax.analysis.artifacts reads it), filled
# by register_nli.
TASK_CORPORA: dict[str, str] = {}


def register_nli(name: str, options: type[NLIOptions], *, corpus: str):
    """Registers an NLI task (nli_jax.tasks.base.register) whose training data is `corpus` (an
    NLICorpus of nli_jax.data.nli), which the artifact analysis reads."""
    def wrap(factory):
        TASK_CORPORA[name] = corpus
        return register(name, options=options)(factory)
    return wrap


register_nli("indonli", NLIOptions, corpus="indonli")(lambda plan: NLITask("indonli", plan.data, plan.task_options))
register_nli("ocnli", OCNLIOptions, corpus="ocnli")(lambda plan: OCNLITask(plan.data, plan.task_options))
register_nli("inferes", InferESOptions, corpus="inferes")(lambda plan: InferESTask(plan.data, plan.task_options))
register_nli("indonli_translate_train", TranslateTrainOptions, corpus=nli_data.TRANSLATE_TRAIN_SMALL.name)(
    lambda plan: TranslateTrainTask(plan.data, plan.task_options))
