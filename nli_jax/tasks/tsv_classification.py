"""Text classification from your own TSV files: `text<TAB>label` per line in train.tsv and dev.tsv
(test.tsv too, when present) in `data.source`, with the label names given by a label-mapping
file (`task_options.label_map`: `raw label<TAB>name` per line; several raw labels may share a
name, and the names in their first-appearance order are the model's classes). A raw label the
map does not name is refused with its file and line, as is an empty text (only whitespace or
invisible characters). Reported by accuracy and macro-F1.

    python -m finetune.main --config=configs/tsv_classification.py --workdir=runs/tsv \
        --config.data.source=/data/reviews --config.task_options.label_map=/data/reviews/labels.tsv
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from nli_jax import storage
from nli_jax.data.readers import DataError, is_blank, read_tsv
from nli_jax.data.records import InMemorySource
from nli_jax.errors import RunError
from nli_jax.metrics import precision_recall_f1
from nli_jax.plan import TaskOptions, option
from nli_jax.tasks.base import register, single_min_length
from nli_jax.tasks.common import ClassificationTask, encode_text

SPLIT_FILES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}


@dataclasses.dataclass(frozen=True)
class TSVOptions(TaskOptions):
    label_map: str = option("", path=True)  # raw label<TAB>label name, one per line

    def problems(self):
        return [] if self.label_map else ["--config.task_options.label_map='': the label-mapping file "
                                          "(raw label<TAB>name per line) is required"]


def read_label_map(path: str) -> dict[str, str]:
    if not storage.isfile(path):
        raise FileNotFoundError(f"--config.task_options.label_map={path!r}: no such file")
    mapping = {}
    for number, (raw, name) in read_tsv(path, columns=2):
        if raw in mapping and mapping[raw] != name:
            raise DataError(f"{path}:{number}: raw label {raw!r} mapped twice ({mapping[raw]!r}, {name!r})")
        mapping[raw] = name.strip()
    if len(set(mapping.values())) < 2:
        raise DataError(f"{path}: names fewer than two labels")
    return mapping


class TSVClassification(ClassificationTask):
    name = "tsv_classification"
    primary_metric = "f1"

    def labels_from(self, splits):
        return tuple(dict.fromkeys(read_label_map(self.options.label_map).values()))

    def read_file(self, path, *, labelled=True):
        mapping = read_label_map(self.options.label_map)
        names = list(dict.fromkeys(mapping.values()))
        examples = []
        for number, row in read_tsv(path, columns=2 if labelled else None):
            text, raw = row[0], (row[1] if len(row) > 1 else None)
            if is_blank(text) or (raw is not None and is_blank(raw)):  # as every reader (docs/errors.md §8)
                raise DataError(f"{path}:{number}: empty text or label")
            if raw is not None and raw not in mapping:
                raise DataError(f"{path}:{number}: label {raw!r} is not in {self.options.label_map} "
                                f"(it maps {sorted(mapping)})")
            examples.append({"idx": len(examples), "text": text,
                             "label": names.index(mapping[raw]) if raw is not None else -1})
        return examples

    def load(self, workdir=None):
        if not self.data.source:  # was the current directory ("dataset file train.tsv not found", or its train.tsv)
            raise RunError("--config.data.source='': the directory with your train.tsv and dev.tsv (test.tsv "
                           "optional) is required: task tsv_classification has no files of its own to download")
        files = {split: os.path.join(self.data.source, name) for split, name in SPLIT_FILES.items()}
        return {split: InMemorySource(self.read_file(path)) for split, path in files.items()
                if split != "test" or storage.isfile(path)}

    def possible_splits(self):
        return set(SPLIT_FILES)

    def min_seq_length(self, tokenizer):
        return single_min_length(tokenizer)

    def encoder(self, tokenizer):
        def encode(example):
            return {**encode_text(tokenizer, example["text"], None, self.data.max_seq_length),
                    "label": np.int32(example["label"]), "idx": np.int32(example["idx"]), "weight": np.float32(1.0)}
        return encode

    def report(self, split, examples, predictions):
        gold = [self.labels[e["label"]] for e in examples]
        pred = [self.labels[int(p)] for p in predictions["prediction"]]
        return {**precision_recall_f1(gold, pred), "count": len(gold)}


register("tsv_classification", options=TSVOptions)(lambda plan: TSVClassification(plan.data, plan.task_options))
