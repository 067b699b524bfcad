"""InferES (Kovatchev & Taule, 2022), Spanish NLI: the corpus (official train and test files;
accuracy by creation strategy, `Anno_Type`, and by topic) and its task (a validation split carved
from train; `task_options.holdout_topic` for the topic out-of-distribution split), in one module.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np

from nli_jax.data.nli import NLICorpus, SplitFile, register_corpus, row_id
from nli_jax.data.readers import map_label, read_csv, require_text
from nli_jax.data.records import InMemorySource
from nli_jax.errors import RunError
from nli_jax.plan import DataPlan, option
from nli_jax.tasks.nli import NLIOptions, NLITask, register_nli, reindex

log = logging.getLogger("nli_jax")
NO_TOPIC = "unknown"  # the topic of a row whose Topic is empty


def _inferes_parse(path: str, number: int, row: dict) -> dict:
    label = map_label(path, number, row.get("Label"), {"ent": 0, "neutral": 1, "cnt": 2}, field="Label")
    return {"id": row_id(row.get("ID")), "premise": require_text(path, number, row, "Premise"),
            "hypothesis": require_text(path, number, row, "Hypothesis"), "label": label,
            "categories": {"anno_type": row.get("Anno_Type", "").strip() or "unknown",
                           "topic": row.get("Topic", "").strip() or NO_TOPIC}, "tags": []}


def _read_inferes(path):
    yield from read_csv(path, columns=7)


INFERES = register_corpus(NLICorpus(
    name="inferes",
    categories=("anno_type", "topic"),
    splits={"train": SplitFile("inferes_train.csv", reader=_read_inferes, required=True),
            "test": SplitFile("inferes_test.csv", reader=_read_inferes)},
    parse=_inferes_parse,
    label_field="Label",
    placeholder_label="ent",
    id_field="ID",
    base_url="https://raw.githubusercontent.com/venelink/inferes/main/corpus/",
    description="InferES (Kovatchev & Taule, 2022), Spanish; categories: creation strategy (Anno_Type), topic.",
))


@dataclasses.dataclass(frozen=True)
class InferESOptions(NLIOptions):
    holdout_topic: str = option("")  # a topic trained on by none: split topic_ood (out of distribution)
    validation_fraction: float = option(0.1, low=0.0, high=1.0, low_open=True, high_open=True)  # carved from train
    validation_seed: int = option(0, low=0)  # which examples the validation split takes


class InferESTask(NLITask):
    """InferES: official train/test; a validation split carved from train
    (`task_options.validation_fraction`, seeded); `task_options.holdout_topic=N` trains on the other five topics and adds split `topic_ood`
    (topic N from train and test) for the topic out-of-distribution setting."""

    def __init__(self, data: DataPlan, options: InferESOptions):
        super().__init__(INFERES, data, options)

    def possible_splits(self):
        return {"train", "validation", "test", "topic_ood"}

    def load(self, workdir=None):
        splits = super().load()
        train = [splits["train"][i] for i in range(len(splits["train"]))]
        train.sort(key=lambda e: e["idx"])
        test = sorted((splits["test"][i] for i in range(len(splits["test"]))), key=lambda e: e["idx"]) \
            if "test" in splits else None
        holdout = self.options.holdout_topic
        train, test = _without_topic(train, "train", holdout), test and _without_topic(test, "test", holdout)
        out = {}
        if holdout:
            topics = {e["categories"]["topic"] for e in train}
            if holdout not in topics:
                raise RunError(f"--config.task_options.holdout_topic={holdout!r} is not a topic of InferES train ({sorted(topics)})")
            ood = [e for e in train if e["categories"]["topic"] == holdout]
            if test is not None:
                ood += [e for e in test if e["categories"]["topic"] == holdout]
            out["topic_ood"] = InMemorySource(reindex(ood))
            train = [e for e in train if e["categories"]["topic"] != holdout]
        order = np.random.default_rng(self.options.validation_seed).permutation(len(train))
        n_val = int(round(self.options.validation_fraction * len(train)))
        out["validation"] = InMemorySource(reindex([train[i] for i in sorted(order[:n_val])]))
        out["train"] = InMemorySource(reindex([train[i] for i in sorted(order[n_val:])]))
        if test is not None:
            out["test"] = InMemorySource(reindex([e for e in test if e["categories"]["topic"] != holdout]))
        return out


def _without_topic(examples: list[dict], split: str, holdout: str) -> list[dict]:
    """Rows whose Topic is empty, counted in the log. Under `holdout_topic` they are left out of
    every split: the topic hold-out trains on five topics and tests on the sixth (Kovatchev &
    Taule, 2022), and a row of no known topic could be the held-out one (kept, it leaked into
    training as topic "unknown"). Otherwise they stay, reported as topic "unknown"."""
    missing = [e for e in examples if e["categories"]["topic"] == NO_TOPIC]
    if not missing:
        return examples
    where = f"InferES {split} ({INFERES.splits[split].filename}): {len(missing)} of {len(examples)} row(s) have an " \
            f"empty Topic (e.g. ID {missing[0]['id']})"
    if not holdout:
        log.warning("%s: reported under topic %r", where, NO_TOPIC)
        return examples
    log.warning("%s: left out of every split under task_options.holdout_topic=%s (a row of no known topic could be "
                "the held-out one)", where, holdout)
    return [e for e in examples if e["categories"]["topic"] != NO_TOPIC]


register_nli("inferes", InferESOptions, corpus=INFERES)(lambda plan: InferESTask(plan.data, plan.task_options))
