"""NLI corpora: file specs and validated parsing; written as array_record by data.records.

Every NLI corpus becomes the same record: premise, hypothesis, label (fixed order
entailment / neutral / contradiction everywhere), an `id`, the `categories` a corpus reports
accuracy by (JSON text, e.g. {"sentence_size": "single"}) and multi-label `tags` (IndoNLI's
diagnostic phenomena). A corpus is one module of nli_jax/tasks/ (its `NLICorpus` spec, registered
with `register_corpus`, and its task); this module reads any of them.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable

from nli_jax import storage
from nli_jax.data import records
from nli_jax.data.readers import DataError, map_label, read_json_records, read_jsonl, read_validated, require_text

log = logging.getLogger(__name__)

NLI_LABELS = ("entailment", "neutral", "contradiction")


@dataclasses.dataclass(frozen=True)
class SplitFile:
    filename: str
    reader: Callable = read_jsonl
    required: bool = False  # train/validation must exist; held-out splits are optional


@dataclasses.dataclass(frozen=True)
class NLICorpus:
    """An NLI corpus: its files, how a row becomes an example, its label set (the names of the
    examples' label indices, read by its task, the reports and every analysis), the categories it
    reports accuracy by, and how the artifact analysis splits its text into tokens."""
    name: str
    splits: dict[str, SplitFile]
    parse: Callable[[str, int, dict], dict | None]  # (file, line, row) -> example or None (drop)
    base_url: str = ""  # official download location of the files (for real users)
    description: str = ""
    labels: tuple[str, ...] = NLI_LABELS
    categories: tuple[str, ...] = ()  # the example fields accuracy is broken down by (`categories` of each example)
    analysis_tokenization: str = "words"  # nli_jax.analysis.artifacts: "words" or "chinese_characters"
    # Unlabelled input (predict): the gold field is set to this valid value for `parse`, and
    # the example's label to -1.
    label_field: str = "label"
    placeholder_label: str = "entailment"
    id_field: str = "id"  # the rows' id (absent or null: the line number, logged)
    dropped_rows: str = ""  # the rows `parse` drops on purpose, as the log line names them


def row_id(value) -> str | None:
    """A row's id as text; None when absent or null (read_validated then uses the line number)."""
    return None if value is None else str(value)


# Every corpus registers its spec here (register_corpus) from its own module, nli_jax/tasks/<corpus>.py,
# which holds the spec (files, reader, labels, categories), its task and options in one place.
CORPORA: dict[str, NLICorpus] = {}


def register_corpus(corpus: NLICorpus) -> NLICorpus:
    if corpus.name in CORPORA:
        raise ValueError(f"NLI corpus {corpus.name!r} registered twice")
    CORPORA[corpus.name] = corpus
    return corpus


def get_corpus(name: str) -> NLICorpus:
    """The registered corpus `name` (registered when its module, one of nli_jax.tasks', is imported:
    the task registry imports them all); a DataError naming the registered ones otherwise."""
    if name not in CORPORA:
        raise DataError(f"unknown NLI corpus {name!r}; known: {sorted(CORPORA)}")
    return CORPORA[name]


# --- files ------------------------------------------------------------------------------------

def download_corpus(corpus: NLICorpus, destination: str, base_url: str | None = None) -> str:
    """Downloads the official files (those that exist) into `destination`; returns it."""
    base_url = (base_url or corpus.base_url).rstrip("/") + "/"
    files = {spec.filename: base_url + spec.filename for spec in corpus.splits.values()}
    required = {spec.filename for spec in corpus.splits.values() if spec.required}
    return records.download_files(files, destination, required)


def split_files(corpus: NLICorpus, source: str) -> dict[str, str]:
    """The corpus files present in `source`; a missing required split is an error."""
    if not storage.isdir(source):
        raise FileNotFoundError(f"{corpus.name}: data directory {source} does not exist")
    files = {}
    present = set(storage.listdir(source))  # one listing, not a request per file on gs://
    for split, spec in corpus.splits.items():
        path = os.path.join(source, spec.filename)
        if spec.filename in present and storage.isfile(path):
            files[split] = path
        elif spec.required:
            raise FileNotFoundError(f"{corpus.name}: {path} not found (split {split!r} is required)")
    return files


def load_examples(corpus: NLICorpus, source: str) -> dict[str, list[dict]]:
    """Every split present in `source`, parsed and validated (errors name file and line)."""
    out = {}
    for split, path in split_files(corpus, source).items():
        examples = read_validated(path, corpus.splits[split].reader, corpus.parse, dropped=corpus.dropped_rows,
                                  id_field=corpus.id_field)
        for index, example in enumerate(examples):
            example["idx"] = index
        out[split] = examples
    return out


def read_file(corpus_name: str, path: str, *, labelled: bool = True) -> list[dict]:
    """One file in the corpus's format, validated like the official splits (e.g. a held-out
    test file, or unlabelled pairs to predict: then every label is -1 and no row is dropped)."""
    corpus = get_corpus(corpus_name)
    if not storage.isfile(path):
        raise FileNotFoundError(f"{corpus.name}: {path} not found")
    by_name = {spec.filename: spec.reader for spec in corpus.splits.values()}
    csv_readers = [spec.reader for spec in corpus.splits.values() if spec.filename.endswith(".csv")]
    reader = by_name.get(os.path.basename(path)) or (
        csv_readers[0] if path.endswith(".csv") and csv_readers else read_json_records)
    parse = corpus.parse
    if not labelled:
        def parse(p, number, row):
            if not isinstance(row, dict):
                raise DataError(f"{p}:{number}: expected a JSON object")
            example = corpus.parse(p, number, {**row, corpus.label_field: corpus.placeholder_label})
            return dict(example, label=-1)
    examples = read_validated(path, reader, parse, dropped=corpus.dropped_rows, id_field=corpus.id_field)
    for index, example in enumerate(examples):
        example["idx"] = index
    return examples


def prepare(corpus_name: str, source: str | None, data_dir: str, *, download_dir: str | None = None):
    """Validates the corpus files, writes them once as array_record under `data_dir` (keyed by
    a fingerprint of the files, so changed files are never served stale) and returns
    {split: random-access source of decoded examples}."""
    corpus = get_corpus(corpus_name)
    if not source:
        source = download_corpus(corpus, download_dir or os.path.join(data_dir, "downloads", corpus.name))
    examples = load_examples(corpus, source)
    return records.prepare_records(corpus.name, examples, list(split_files(corpus, source).values()), data_dir,
                                   corpus.description)
