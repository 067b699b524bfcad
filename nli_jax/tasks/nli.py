"""Natural language inference as sequence-pair classification (IndoNLI; other corpora are
one `NLICorpus` entry in nli_jax.data.nli plus one `register` line here).

`data.hypothesis_only` trains and evaluates on the hypothesis alone: the papers' baseline for
annotation artifacts.
"""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from nli_jax.data import nli as nli_data
from nli_jax.losses import weighted_accuracy, weighted_cross_entropy
from nli_jax.metrics import accuracy, accuracy_by, accuracy_by_tag
from nli_jax.models import ForSequenceClassification
from nli_jax.tasks.base import Task, register


class NLITask(Task):
    labels = nli_data.NLI_LABELS

    def __init__(self, corpus: str):
        self.name = corpus
        self.corpus = corpus

    def load(self, config):
        data = config.data
        tfds_dir = os.path.expanduser(data.get("tfds_dir") or "~/tensorflow_datasets/nli_jax")
        return nli_data.prepare(self.corpus, data.get("source") or None, tfds_dir)

    def model_class_and_kwargs(self, config):
        return ForSequenceClassification, {"num_labels": len(self.labels)}

    def encoder(self, config, tokenizer):
        max_length = int(config.data.max_seq_length)
        hypothesis_only = bool(config.data.get("hypothesis_only", False))

        def encode(example):
            if hypothesis_only:
                enc = tokenizer(example["hypothesis"], truncation=True, max_length=max_length)
            else:
                # Long paragraphs (IndoNLI premises reach 200+ words) are cut from the longer
                # text first, so the hypothesis survives.
                enc = tokenizer(example["premise"], example["hypothesis"], truncation="longest_first",
                                max_length=max_length)
            ids = np.asarray(enc["input_ids"], np.int32)
            types = np.asarray(enc.get("token_type_ids", np.zeros_like(ids)), np.int32)
            return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types,
                    "label": np.int32(example["label"]), "idx": np.int32(example["idx"]), "weight": np.float32(1.0)}
        return encode

    def loss(self, model, batch, deterministic):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic=deterministic)
        loss_sum, weight = weighted_cross_entropy(logits, batch["label"], batch["weight"])
        correct, _ = weighted_accuracy(logits, batch["label"], batch["weight"])
        return loss_sum, weight, {"correct": correct}

    def predict(self, model, batch):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic=True)
        return {"prediction": jnp.argmax(logits, -1), "probabilities": jax_softmax(logits)}

    def report(self, split, examples, predictions):
        gold = [e["label"] for e in examples]
        pred = predictions["prediction"]
        out = {"accuracy": accuracy(gold, pred), "count": len(gold),
               "by_label": {self.labels[int(k)]: v for k, v in accuracy_by(gold, pred, [str(g) for g in gold]).items()}}
        category_names = sorted({k for e in examples for k in e["categories"]})
        for name in category_names:
            out[f"by_{name}"] = accuracy_by(gold, pred, [e["categories"].get(name, "unknown") for e in examples])
        if any(e["tags"] for e in examples):
            out["by_tag"] = accuracy_by_tag(gold, pred, [e["tags"] for e in examples])
        return out

    def prediction_records(self, split, examples, predictions):
        return [{"split": split, "idx": e["idx"], "id": e["id"], "label": self.labels[e["label"]],
                 "prediction": self.labels[int(p)], "probabilities": [round(float(x), 6) for x in probs]}
                for e, p, probs in zip(examples, predictions["prediction"], predictions["probabilities"])]


def jax_softmax(logits):
    import jax
    return jax.nn.softmax(logits, axis=-1)


register("indonli")(lambda: NLITask("indonli"))
