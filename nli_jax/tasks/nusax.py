"""NusaX-Senti (Winata et al., EACL 2023): 3-label sentiment (negative, neutral, positive) on the
same SmSA sentences translated into Indonesian's neighbours, in the official layout
`<data.source>/<language>/{train,valid,test}.csv` (`id,text,label`; test.csv optional; the
NusaX repository root, with `datasets/sentiment/` or `sentiment/` above the languages, works
too). Without data.source the files are downloaded from IndoNLP/nusax. Reported as the paper
does: macro-F1 over the three labels, with accuracy and each label's F1 beside it.

Transfer is configuration (task_options):
- `train_languages`: the languages trained on (comma-separated); their validation split drives
  early stopping and the best checkpoint, their train / validation / test splits are `train`,
  `validation`, `test`;
- `eval_languages`: languages also scored in the same run, each as `validation_<language>` and
  (when its test.csv is there) `test_<language>` ("all": the 12).
In-language: train_languages=javanese. Zero-shot from Indonesian: train_languages=indonesian,
eval_languages=all. Multi-source: every language but the target, eval_languages=<target>
(configs/nusax.py's lang=, transfer and target= variants).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from nli_jax import storage
from nli_jax.data import records
from nli_jax.data.readers import DataError, read_csv, require_text
from nli_jax.data.records import InMemorySource
from nli_jax.metrics import precision_recall_f1, precision_recall_f1_by_label
from nli_jax.plan import TaskOptions, option
from nli_jax.tasks.base import register, single_min_length
from nli_jax.tasks.common import ClassificationTask, encode_text

LANGUAGES = ("acehnese", "balinese", "banjarese", "buginese", "english", "indonesian", "javanese", "madurese",
             "minangkabau", "ngaju", "sundanese", "toba_batak")
LABELS = ("negative", "neutral", "positive")  # SmSA's, in the IndoNLU task's order
SPLIT_FILES = {"train": "train.csv", "validation": "valid.csv", "test": "test.csv"}
BASE_URL = "https://raw.githubusercontent.com/IndoNLP/nusax/main/datasets/sentiment/"


def parse_languages(value: str, what: str) -> tuple[str, ...]:
    """'javanese,sundanese' or 'all' -> the languages, each checked against LANGUAGES."""
    names = LANGUAGES if value.strip() == "all" else tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [n for n in names if n not in LANGUAGES]
    if unknown:
        raise ValueError(f"--config.task_options.{what}={value!r}: unknown language(s) {unknown}; "
                         f"NusaX has {', '.join(LANGUAGES)} (or 'all')")
    if len(set(names)) != len(names):
        raise ValueError(f"--config.task_options.{what}={value!r}: a language is listed twice")
    return names


@dataclasses.dataclass(frozen=True)
class NusaXOptions(TaskOptions):
    train_languages: str = option("indonesian")  # comma-separated, or "all"
    eval_languages: str = option("")  # also scored as validation_<language> / test_<language>; "all": the 12

    def problems(self):
        out = []
        for what in ("train_languages", "eval_languages"):
            try:
                names = parse_languages(getattr(self, what), what)
            except ValueError as e:
                out.append(str(e))
                continue
            if what == "train_languages" and not names:
                out.append("--config.task_options.train_languages='': name at least one language to train on")
        return out

    @property
    def trained(self) -> tuple[str, ...]:
        return parse_languages(self.train_languages, "train_languages")

    @property
    def evaluated(self) -> tuple[str, ...]:
        return parse_languages(self.eval_languages, "eval_languages")


def language_directory(source: str) -> str:
    """The folder holding one folder per language: `source` itself, or its sentiment/ or
    datasets/sentiment/ (the NusaX repository's root)."""
    for sub in ("sentiment", os.path.join("datasets", "sentiment")):
        if storage.isdir(os.path.join(source, sub)):
            return os.path.join(source, sub)
    return source


def read_file(path: str, *, labelled: bool = True, language: str = "") -> list[dict]:
    """One NusaX-Senti CSV file (`id,text,label`; `label` may be absent when unlabelled)."""
    if not storage.isfile(path):
        raise FileNotFoundError(f"NusaX: {path} not found")
    examples = []
    for number, row in read_csv(path, columns=3 if labelled else None):
        label = None
        if labelled:
            label = require_text(path, number, row, "label").strip()
            if label not in LABELS:
                raise DataError(f"{path}:{number}: unknown label {label!r}; expected one of {list(LABELS)}")
        examples.append({"idx": len(examples), "id": (row.get("id") or str(len(examples))).strip(), "line": number,
                         "text": require_text(path, number, row, "text"), "label": label, "language": language})
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def download(directory: str, languages, base_url: str = BASE_URL) -> str:
    """The official files of `languages` into <directory>/<language>/ (test.csv when published)."""
    for language in languages:
        files = {name: f"{base_url.rstrip('/')}/{language}/{name}" for name in SPLIT_FILES.values()}
        records.download_files(files, os.path.join(directory, language), required={"train.csv", "valid.csv"})
    return directory


def load_language(directory: str, language: str) -> dict[str, list[dict]]:
    """{split: examples} of one language; test only when its file is there."""
    folder = os.path.join(directory, language)
    if not storage.isdir(folder):
        raise FileNotFoundError(f"NusaX: no folder {folder} for language {language!r} (expected "
                                f"<data.source>/<language>/train.csv, valid.csv and optionally test.csv)")
    out = {}
    for split, name in SPLIT_FILES.items():
        path = os.path.join(folder, name)
        if storage.isfile(path):
            out[split] = read_file(path, language=language)
        elif split != "test":
            raise FileNotFoundError(f"NusaX: {path} not found (split {split!r} is required)")
    return out


def joined(parts: list[list[dict]]) -> list[dict]:
    """Several languages' examples as one split, renumbered (idx is the position in it)."""
    rows = [e for part in parts for e in part]
    return [dict(e, idx=i) for i, e in enumerate(rows)]


class NusaXSenti(ClassificationTask):
    name = "nusax"
    primary_metric = "f1"
    labels = LABELS

    def directory(self) -> str:
        if self.data.source:
            return language_directory(self.data.source)
        directory = os.path.join(os.path.expanduser(self.data.tfds_dir), "downloads", "nusax", "sentiment")
        return download(directory, dict.fromkeys(self.options.trained + self.options.evaluated))

    def load(self, workdir=None):
        directory = self.directory()
        languages = {lang: load_language(directory, lang)
                     for lang in dict.fromkeys(self.options.trained + self.options.evaluated)}
        splits = {}
        for split in SPLIT_FILES:
            present = [languages[lang][split] for lang in self.options.trained if split in languages[lang]]
            if present and (split != "test" or len(present) == len(self.options.trained)):
                splits[split] = InMemorySource(joined(present))
        for lang in self.options.evaluated:
            for split in ("validation", "test"):
                if split in languages[lang]:
                    splits[f"{split}_{lang}"] = InMemorySource(languages[lang][split])
        return splits

    def read_file(self, path, *, labelled=True):
        return read_file(path, labelled=labelled)

    def split_file(self, split):
        name, _, language = split.partition("_")
        if name not in SPLIT_FILES:
            return None
        directory = language_directory(self.data.source) if self.data.source else "<download>"
        languages = (language,) if language else self.options.trained
        return ", ".join(os.path.join(directory, lang, SPLIT_FILES[name]) for lang in languages)

    def possible_splits(self):
        return set(SPLIT_FILES) | {f"{split}_{lang}" for split in ("validation", "test") for lang in LANGUAGES}

    def min_seq_length(self, tokenizer):
        return single_min_length(tokenizer)

    def encoder(self, tokenizer):
        ids = {n: i for i, n in enumerate(self.labels)}

        def encode(example):
            label = -1 if example["label"] is None else ids[example["label"]]
            return {**encode_text(tokenizer, example["text"], None, self.data.max_seq_length),
                    "label": np.int32(label), "idx": np.int32(example["idx"]), "weight": np.float32(1.0)}
        return encode

    def report(self, split, examples, predictions):
        gold = [e["label"] for e in examples]
        pred = [self.labels[int(p)] for p in predictions["prediction"]]
        return {**precision_recall_f1(gold, pred), "count": len(gold),
                "by_label": precision_recall_f1_by_label(gold, pred, self.labels)}

    def result_fields(self):
        return {"train_languages": list(self.options.trained), "eval_languages": list(self.options.evaluated)}


# NusaX-Senti's sentences are SmSA's (Indonesian) and their translations.
register("nusax", options=NusaXOptions, texts_from=("smsa",))(lambda plan: NusaXSenti(plan.data, plan.task_options))
