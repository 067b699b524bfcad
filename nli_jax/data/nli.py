"""NLI corpora: file specs and validated parsing; written as array_record by data.records.

Every NLI corpus becomes the same record: premise, hypothesis, label (fixed order
entailment / neutral / contradiction everywhere), an `id`, the `categories` a corpus reports
accuracy by (JSON text, e.g. {"sentence_size": "single"}) and multi-label `tags` (IndoNLI's
diagnostic phenomena). Adding a corpus is one `NLICorpus` entry.
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
    name: str
    splits: dict[str, SplitFile]
    parse: Callable[[str, int, dict], dict | None]  # (file, line, row) -> example or None (drop)
    base_url: str = ""  # official download location of the files (for real users)
    description: str = ""
    # Unlabelled input (predict): the gold field is set to this valid value for `parse`, and
    # the example's label to -1.
    label_field: str = "label"
    placeholder_label: str = "entailment"
    id_field: str = "id"  # the rows' id (absent or null: the line number, logged)
    dropped_rows: str = ""  # the rows `parse` drops on purpose, as the log line names them


def _id(value) -> str | None:
    """A row's id as text; None when absent or null (read_validated then uses the line number)."""
    return None if value is None else str(value)


def _indonli_parse(path: str, number: int, row: dict) -> dict:
    labels = {"e": 0, "n": 1, "c": 2, "entailment": 0, "neutral": 1, "contradiction": 2}
    premise = require_text(path, number, row, "premise")
    hypothesis = require_text(path, number, row, "hypothesis")
    if "label" not in row:
        raise DataError(f"{path}:{number}: missing field 'label'")
    label = map_label(path, number, row["label"], labels)
    categories = {k: str(row[k]) for k in ("sentence_size", "annotator_type") if row.get(k) is not None}
    tags = row.get("inference_phenomena") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise DataError(f"{path}:{number}: 'inference_phenomena' must be a list of strings")
    return {"id": _id(row.get("pair_id")), "premise": premise, "hypothesis": hypothesis, "label": label,
            "categories": categories, "tags": [t.strip() for t in tags if t.strip()]}


INDONLI = NLICorpus(
    name="indonli",
    splits={
        "train": SplitFile("train.jsonl", required=True),
        "validation": SplitFile("val.jsonl", required=True),
        "test_lay": SplitFile("test_lay.jsonl"),
        "test_expert": SplitFile("test_expert.jsonl"),
        # One JSON array of 650 objects despite the .jsonl name; read_json_records takes both.
        "diagnostic": SplitFile("diagnostic.jsonl", reader=read_json_records),
    },
    parse=_indonli_parse,
    placeholder_label="e",
    id_field="pair_id",
    base_url="https://raw.githubusercontent.com/ir-nlp-csui/indonli/main/data/indonli/",
    description="IndoNLI (Mahendra et al., 2021): lay train/validation/test_lay, expert test_expert, diagnostic.",
)



def _ocnli_parse(path: str, number: int, row: dict) -> dict | None:
    label = row.get("label")
    if label == "-":  # no majority label: excluded, as in the OCNLI paper
        return None
    return {"id": _id(row.get("id")), "premise": require_text(path, number, row, "sentence1"),
            "hypothesis": require_text(path, number, row, "sentence2"),
            "label": map_label(path, number, label, {"entailment": 0, "neutral": 1, "contradiction": 2}),
            "categories": {k: str(row[k]) for k in ("genre", "level") if row.get(k) is not None}, "tags": []}


OCNLI = NLICorpus(
    name="ocnli",
    splits={"train_50k": SplitFile("train.50k.json"), "train_30k": SplitFile("train.30k.json"),
            "train_10k": SplitFile("train.10k.json"), "train_3k": SplitFile("train.3k.json"),
            "validation": SplitFile("dev.json", required=True)},
    parse=_ocnli_parse,
    dropped_rows="label '-' (no majority label: excluded, as in the OCNLI paper)",
    base_url="https://raw.githubusercontent.com/CLUEbenchmark/OCNLI/main/data/ocnli/",
    description="OCNLI (Hu et al., 2020), Chinese; dev is the evaluation split; label '-' dropped.",
)


def _inferes_parse(path: str, number: int, row: dict) -> dict:
    label = map_label(path, number, row.get("Label"), {"ent": 0, "neutral": 1, "cnt": 2}, field="Label")
    return {"id": _id(row.get("ID")), "premise": require_text(path, number, row, "Premise"),
            "hypothesis": require_text(path, number, row, "Hypothesis"), "label": label,
            "categories": {"anno_type": row.get("Anno_Type", "").strip() or "unknown",
                           "topic": row.get("Topic", "").strip() or "unknown"}, "tags": []}


def _read_inferes(path):
    from nli_jax.data.readers import read_csv
    yield from read_csv(path, columns=7)


INFERES = NLICorpus(
    name="inferes",
    splits={"train": SplitFile("inferes_train.csv", reader=_read_inferes, required=True),
            "test": SplitFile("inferes_test.csv", reader=_read_inferes)},
    parse=_inferes_parse,
    label_field="Label",
    placeholder_label="ent",
    id_field="ID",
    base_url="https://raw.githubusercontent.com/venelink/inferes/main/corpus/",
    description="InferES (Kovatchev & Taule, 2022), Spanish; categories: creation strategy (Anno_Type), topic.",
)


def _translate_train_parse(path: str, number: int, row: dict) -> dict | None:
    if row.get("gold_label") == "-":  # MNLI: no gold label
        return None
    return {"id": _id(row.get("pairid")), "premise": require_text(path, number, row, "sentence1"),
            "hypothesis": require_text(path, number, row, "sentence2"),
            "label": map_label(path, number, row.get("gold_label"), {"entailment": 0, "neutral": 1, "contradiction": 2},
                               field="gold_label"),
            "categories": {"genre": str(row["genre"])} if row.get("genre") else {}, "tags": []}


TRANSLATE_TRAIN_SMALL = NLICorpus(
    name="indonli_translate_train_small",
    splits={"train": SplitFile("train.jsonl", required=True), "validation": SplitFile("dev.jsonl")},
    parse=_translate_train_parse,
    label_field="gold_label",
    id_field="pairid",
    dropped_rows="gold_label '-' (no gold label, as MNLI marks them)",
    description="MNLI machine-translated to Indonesian, the IndoNLI paper's translate-train-small sample "
                "(data/translate_train_small.tar.gz in the IndoNLI repository; extract it and pass the folder).",
)

CORPORA: dict[str, NLICorpus] = {c.name: c for c in (INDONLI, OCNLI, INFERES, TRANSLATE_TRAIN_SMALL)}


def register_corpus(corpus: NLICorpus) -> NLICorpus:
    CORPORA[corpus.name] = corpus
    return corpus


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
    if corpus_name not in CORPORA:
        raise DataError(f"unknown NLI corpus {corpus_name!r}; known: {sorted(CORPORA)}")
    corpus = CORPORA[corpus_name]
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
    if corpus_name not in CORPORA:
        raise DataError(f"unknown NLI corpus {corpus_name!r}; known: {sorted(CORPORA)}")
    corpus = CORPORA[corpus_name]
    if not source:
        source = download_corpus(corpus, download_dir or os.path.join(data_dir, "downloads", corpus.name))
    examples = load_examples(corpus, source)
    return records.prepare_records(corpus.name, examples, list(split_files(corpus, source).values()), data_dir,
                                   corpus.description)
