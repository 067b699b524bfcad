"""NLI corpora: file specs, validated parsing, and a tfds builder written as array_record.

Every NLI corpus becomes the same record: premise, hypothesis, label (fixed order
entailment / neutral / contradiction everywhere), an `id`, the `categories` a corpus reports
accuracy by (JSON text, e.g. {"sentence_size": "single"}) and multi-label `tags` (IndoNLI's
diagnostic phenomena). Adding a corpus is one `NLICorpus` entry.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import urllib.request
from typing import Callable

import numpy as np

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
    return {"id": str(row.get("pair_id", number)), "premise": premise, "hypothesis": hypothesis, "label": label,
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
    base_url="https://raw.githubusercontent.com/ir-nlp-csui/indonli/main/data/indonli/",
    description="IndoNLI (Mahendra et al., 2021): lay train/validation/test_lay, expert test_expert, diagnostic.",
)

CORPORA: dict[str, NLICorpus] = {"indonli": INDONLI}


def register_corpus(corpus: NLICorpus) -> NLICorpus:
    CORPORA[corpus.name] = corpus
    return corpus


# --- files ------------------------------------------------------------------------------------

def download_corpus(corpus: NLICorpus, destination: str, base_url: str | None = None) -> str:
    """Downloads the official files (those that exist) into `destination`; returns it."""
    base_url = base_url or corpus.base_url
    os.makedirs(destination, exist_ok=True)
    for split, spec in corpus.splits.items():
        target = os.path.join(destination, spec.filename)
        if os.path.isfile(target):
            continue
        url = base_url.rstrip("/") + "/" + spec.filename
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
        except OSError as e:
            if spec.required:
                raise DataError(f"could not download {url} ({e}); pass a local directory with data.source instead") from e
            log.info("%s: no %s split at %s (%s)", corpus.name, split, url, e)
            continue
        fd, tmp = tempfile.mkstemp(dir=destination)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)  # atomic: never a half-written file
    return destination


def split_files(corpus: NLICorpus, source: str) -> dict[str, str]:
    """The corpus files present in `source`; a missing required split is an error."""
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{corpus.name}: data directory {source} does not exist")
    files = {}
    for split, spec in corpus.splits.items():
        path = os.path.join(source, spec.filename)
        if os.path.isfile(path):
            files[split] = path
        elif spec.required:
            raise FileNotFoundError(f"{corpus.name}: {path} not found (split {split!r} is required)")
    return files


def load_examples(corpus: NLICorpus, source: str) -> dict[str, list[dict]]:
    """Every split present in `source`, parsed and validated (errors name file and line)."""
    out = {}
    for split, path in split_files(corpus, source).items():
        examples = read_validated(path, corpus.splits[split].reader, corpus.parse)
        for index, example in enumerate(examples):
            example["idx"] = index
        out[split] = examples
    return out


def fingerprint(paths: list[str]) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:12]


# --- tfds ---------------------------------------------------------------------------------------

def _builder_class():
    import tensorflow_datasets as tfds

    class NLIBuilder(tfds.core.GeneratorBasedBuilder):
        """Writes validated examples of one corpus as array_record; read with as_data_source."""
        VERSION = tfds.core.Version("1.0.0")

        def __init__(self, *, corpus: NLICorpus, examples: dict[str, list[dict]], **kwargs):
            self._corpus, self._examples = corpus, examples
            super().__init__(**kwargs)

        @property
        def name(self):  # one directory per corpus
            return self._corpus.name

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, description=self._corpus.description,
                features=tfds.features.FeaturesDict({
                    "idx": np.int64, "id": tfds.features.Text(), "premise": tfds.features.Text(),
                    "hypothesis": tfds.features.Text(), "label": tfds.features.ClassLabel(names=NLI_LABELS),
                    "categories": tfds.features.Text(), "tags": tfds.features.Sequence(tfds.features.Text())}))

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(split) for split in self._examples}

        def _generate_examples(self, split):
            for ex in self._examples[split]:
                yield ex["idx"], {**ex, "categories": json.dumps(ex["categories"], sort_keys=True)}

    return NLIBuilder


def prepare(corpus_name: str, source: str | None, data_dir: str, *, download_dir: str | None = None):
    """Validates the corpus files, writes them once as array_record under `data_dir` (keyed by
    a fingerprint of the files, so changed files are never served stale) and returns
    {split: random-access source of decoded examples}."""
    import tensorflow_datasets as tfds
    if corpus_name not in CORPORA:
        raise DataError(f"unknown NLI corpus {corpus_name!r}; known: {sorted(CORPORA)}")
    corpus = CORPORA[corpus_name]
    if not source:
        source = download_corpus(corpus, download_dir or os.path.join(data_dir, "downloads", corpus.name))
    examples = load_examples(corpus, source)
    key = fingerprint(list(split_files(corpus, source).values()))
    cls = _builder_class()
    config = tfds.core.BuilderConfig(name=f"files_{key}", description=f"from {source}")
    builder = cls(corpus=corpus, examples=examples, config=config, data_dir=data_dir, file_format="array_record")
    tfds.disable_progress_bar()
    import jax
    if jax.process_count() > 1:  # one writer; the others wait, then read what it wrote
        from jax.experimental import multihost_utils
        if jax.process_index() == 0:
            builder.download_and_prepare()
        multihost_utils.sync_global_devices(f"nli_jax prepare {corpus.name} {key}")
    builder.download_and_prepare()
    return {split: DecodedSource(builder.as_data_source(split=split)) for split in examples}


class DecodedSource:
    """A tfds array_record data source with text decoded and categories parsed.

    Records come back in tfds' write order (hashed keys); `idx` gives the file order.
    """

    def __init__(self, source):
        self._source = source

    def __len__(self):
        return len(self._source)

    def __getitem__(self, index):
        r = self._source[index]
        text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
        return {"idx": int(r["idx"]), "id": text(r["id"]), "premise": text(r["premise"]),
                "hypothesis": text(r["hypothesis"]), "label": int(r["label"]),
                "categories": json.loads(text(r["categories"])), "tags": [text(t) for t in r["tags"]]}
