"""The 12 IndoNLU tasks' official files (IndoNLP/indonlu, dataset/<folder>/{train,valid,test}_preprocess.*).

Formats (see ../shared/data/README.md): EmoT `label,tweet`; SmSA `text<TAB>label`, no header;
CASA/HoASA one column per aspect; WReTE `sent_A,sent_B,category,label`; the word-level tasks
`token<TAB>tag` per line with blank lines between sentences (split on the tab only: tokens can
contain spaces); FacQA columns of Python-literal lists, parsed with ast.literal_eval (never eval).
Label and tag sets are the benchmark's (the IndoNLU framework's LABEL2INDEX; tags sorted as the
model's classes): a label or tag outside them is refused with its file and line, never added as
a class (a tag seen only in validation became one silently).
"""
from __future__ import annotations

import ast
import dataclasses
import os
import re
from typing import Callable

from nli_jax import storage
from nli_jax.data import records
from nli_jax.data.readers import DataError, _open_text, is_blank, is_whitespace, read_csv, read_tsv, require_text, text_lines

BASE_URL = "https://raw.githubusercontent.com/IndoNLP/indonlu/master/dataset/"
SPLIT_PREFIX = {"train": "train_preprocess", "validation": "valid_preprocess", "test": "test_preprocess"}


@dataclasses.dataclass(frozen=True)
class IndoNLUTask:
    name: str
    folder: str
    extension: str
    kind: str  # "single", "pair", "aspects", "tagging", "qa"
    parse_file: Callable[[str], list[dict]]
    title: str  # as the IndoNLU paper's tables name it
    aspects: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()  # the benchmark's label (or tag) set

    def filename(self, split: str) -> str:
        return f"{SPLIT_PREFIX[split]}.{self.extension}"

    @property
    def is_classification(self) -> bool:
        """One of the five classification tasks (the rest label words)."""
        return self.kind in ("single", "pair", "aspects")


# --- parsers: file -> list of examples ------------------------------------------------------------

# `labelled=False` reads input to predict: gold columns may be absent (or hold the masked
# placeholders of the public test files); labels come back as None.

def _single_csv(text_field: str, label_field: str):
    def parse(path, labelled=True):
        out = []
        for number, row in read_csv(path, columns=2 if labelled else None):
            out.append({"line": number, "text": require_text(path, number, row, text_field),
                        "label": require_text(path, number, row, label_field).strip() if labelled else None})
        return out
    return parse


def _smsa(path, labelled=True):
    out = []
    # Plain tab-separated text: a '"' is part of the text (never CSV quoting that merges rows).
    for number, row in read_tsv(path, columns=2 if labelled else None):
        if labelled:
            text, label = row
            if is_blank(text) or is_blank(label):
                raise DataError(f"{path}:{number}: empty text or label")
        else:
            text, label = row[0], None
            if len(row) > 2 or is_blank(text):
                raise DataError(f"{path}:{number}: expected 'text' or 'text<TAB>label', got {len(row)} columns")
        out.append({"line": number, "text": text, "label": label.strip() if labelled else None})
    return out


def _wrete(path, labelled=True):
    out = []
    for number, row in read_csv(path, columns=4 if labelled else None):
        out.append({"line": number, "text_a": require_text(path, number, row, "sent_A"),
                    "text_b": require_text(path, number, row, "sent_B"),
                    "category": (row.get("category") or "").strip(),
                    "label": require_text(path, number, row, "label").strip() if labelled else None})
    return out


def _aspects(text_field: str, aspects: tuple[str, ...]):
    def parse(path, labelled=True):
        out = []
        for number, row in read_csv(path, columns=len(aspects) + 1 if labelled else None):
            missing = [a for a in ((text_field, *aspects) if labelled else (text_field,)) if a not in row]
            if missing:
                raise DataError(f"{path}:{number}: missing column(s) {missing}")
            out.append({"line": number, "text": require_text(path, number, row, text_field),
                        "labels": [require_text(path, number, row, a).strip() for a in aspects] if labelled else None})
        return out
    return parse


# A chunk tag: O, or B/I/E/S with an optional type (KEPS and FacQA use bare B/I/O).
TAG = re.compile(r"^(O|[BIES](-[^\s-][^\s]*)?)$")


def _check_tag(path, number, tag):
    if not TAG.match(tag):
        raise DataError(f"{path}:{number}: unknown tag {tag!r} (expected O or B/I/E/S with an optional -TYPE)")
    return tag


def _tagging(path, labelled=True):
    """token<TAB>tag lines; a blank line ends a sentence. `line` is the sentence's first line.
    Unlabelled input may also have a bare token per line."""
    out, tokens, tags, start = [], [], [], None
    for number, line in enumerate(text_lines(_open_text(path)), start=1):
        if not line.strip():
            if tokens:
                out.append({"line": start, "tokens": tokens, "tags": tags})
            tokens, tags, start = [], [], None
            continue
        fields = line.split("\t")  # tokens may hold spaces, never tabs
        if len(fields) > 2:
            raise DataError(f"{path}:{number}: expected 'token<TAB>tag', got {len(fields)} tab-separated fields "
                            f"({line[:60]!r})")
        if not labelled:
            token = fields[0]
            if is_whitespace(token):
                raise DataError(f"{path}:{number}: empty token")
            tokens.append(token)
            start = start or number
            continue
        if len(fields) != 2:
            raise DataError(f"{path}:{number}: expected 'token<TAB>tag', got {line[:60]!r}")
        token, tag = fields
        if is_blank(tag) or is_whitespace(token):
            raise DataError(f"{path}:{number}: empty token or tag")
        tokens.append(token)
        tags.append(_check_tag(path, number, tag.strip()))
        start = start or number
    if tokens:
        out.append({"line": start, "tokens": tokens, "tags": tags})
    if not labelled:
        for example in out:
            example["tags"] = None
    return out


def _literal_list(path, number, row, field):
    raw = row.get(field)
    if raw is None:
        raise DataError(f"{path}:{number}: missing column {field!r}")
    try:
        value = ast.literal_eval(raw)  # literals only: no code is run
    except (ValueError, SyntaxError) as e:
        raise DataError(f"{path}:{number}: column {field!r} is not a Python list literal ({e})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{path}:{number}: column {field!r} must be a list of strings")
    return value


def _facqa(path, labelled=True):
    out = []
    for number, row in read_csv(path, columns=3 if labelled else None):
        question = _literal_list(path, number, row, "question")
        passage = _literal_list(path, number, row, "passage")
        if not labelled:
            if not question or not passage or any(is_blank(w) for w in question + passage):
                raise DataError(f"{path}:{number}: empty question or passage, or an empty word in them")
            out.append({"line": number, "question": question, "tokens": passage, "tags": None})
            continue
        labels = _literal_list(path, number, row, "seq_label")
        if len(passage) != len(labels):
            raise DataError(f"{path}:{number}: passage has {len(passage)} tokens but seq_label has {len(labels)} labels")
        if not question or not passage or any(is_blank(w) for w in question + passage):
            raise DataError(f"{path}:{number}: empty question or passage, or an empty word in them")
        for tag in labels:
            _check_tag(path, number, tag)
        out.append({"line": number, "question": question, "tokens": passage, "tags": labels})
    return out


# Tag sets: IndoNLP/indonlu utils/data_utils.py (commit 72112b9d), LABEL2INDEX of each dataset class,
# in its order (the leaderboard's submission files); a task's classes are them sorted.
POSP_TAGS = ("B-PPO", "B-KUA", "B-ADV", "B-PRN", "B-VBI", "B-PAR", "B-VBP", "B-NNP", "B-UNS", "B-VBT", "B-VBL",
             "B-NNO", "B-ADJ", "B-PRR", "B-PRK", "B-CCN", "B-$$$", "B-ADK", "B-ART", "B-CSN", "B-NUM", "B-SYM",
             "B-INT", "B-NEG", "B-PRI", "B-VBE")
BAPOS_TAGS = ("B-PR", "B-CD", "I-PR", "B-SYM", "B-JJ", "B-DT", "I-UH", "I-NND", "B-SC", "I-WH", "I-IN", "I-NNP",
              "I-VB", "B-IN", "B-NND", "I-CD", "I-JJ", "I-X", "B-OD", "B-RP", "B-RB", "B-NNP", "I-RB", "I-Z", "B-CC",
              "B-NEG", "B-VB", "B-NN", "B-MD", "B-UH", "I-NN", "B-PRP", "I-SC", "B-Z", "I-PRP", "I-OD", "I-SYM",
              "B-WH", "B-FW", "I-CC", "B-X")
TERMA_TAGS = ("I-SENTIMENT", "O", "I-ASPECT", "B-SENTIMENT", "B-ASPECT")
BIO_TAGS = ("O", "B", "I")
NERGRIT_TAGS = ("I-PERSON", "B-ORGANISATION", "I-ORGANISATION", "B-PLACE", "I-PLACE", "O", "B-PERSON")
NERP_TAGS = ("I-PPL", "B-EVT", "B-PLC", "I-IND", "B-IND", "B-FNB", "I-EVT", "B-PPL", "I-PLC", "O", "I-FNB")

CASA_ASPECTS = ("fuel", "machine", "others", "part", "price", "service")
HOASA_ASPECTS = ("ac", "air_panas", "bau", "general", "kebersihan", "linen", "service", "sunrise_meal", "tv", "wifi")

# The 12 IndoNLU tasks, in the benchmark's order (5 classification, then 7 sequence labelling):
# the one list every part of nli-jax takes them from (tasks, configs, benchmark, leaderboard).
TASKS: dict[str, IndoNLUTask] = {t.name: t for t in [
    IndoNLUTask("emot", "emot_emotion-twitter", "csv", "single", _single_csv("tweet", "label"), "EmoT",
                labels=("anger", "fear", "happy", "love", "sadness")),
    IndoNLUTask("smsa", "smsa_doc-sentiment-prosa", "tsv", "single", _smsa, "SmSA",
                labels=("negative", "neutral", "positive")),
    IndoNLUTask("casa", "casa_absa-prosa", "csv", "aspects", _aspects("sentence", CASA_ASPECTS), "CASA", CASA_ASPECTS,
                labels=("negative", "neutral", "positive")),
    IndoNLUTask("hoasa", "hoasa_absa-airy", "csv", "aspects", _aspects("review", HOASA_ASPECTS), "HoASA",
                HOASA_ASPECTS, labels=("neg", "neg_pos", "neut", "pos")),
    IndoNLUTask("wrete", "wrete_entailment-ui", "csv", "pair", _wrete, "WReTE",
                labels=("Entail_or_Paraphrase", "NotEntail")),
    IndoNLUTask("posp", "posp_pos-prosa", "txt", "tagging", _tagging, "POSP", labels=tuple(sorted(POSP_TAGS))),
    IndoNLUTask("bapos", "bapos_pos-idn", "txt", "tagging", _tagging, "BaPOS", labels=tuple(sorted(BAPOS_TAGS))),
    IndoNLUTask("terma", "terma_term-extraction-airy", "txt", "tagging", _tagging, "TermA",
                labels=tuple(sorted(TERMA_TAGS))),
    IndoNLUTask("keps", "keps_keyword-extraction-prosa", "txt", "tagging", _tagging, "KEPS",
                labels=tuple(sorted(BIO_TAGS))),
    IndoNLUTask("nergrit", "nergrit_ner-grit", "txt", "tagging", _tagging, "NERGrit",
                labels=tuple(sorted(NERGRIT_TAGS))),
    IndoNLUTask("nerp", "nerp_ner-prosa", "txt", "tagging", _tagging, "NERP", labels=tuple(sorted(NERP_TAGS))),
    IndoNLUTask("facqa", "facqa_qa-factoid-itb", "csv", "qa", _facqa, "FacQA", labels=tuple(sorted(BIO_TAGS))),
]}
CLASSIFICATION_TASKS = tuple(name for name, task in TASKS.items() if task.is_classification)
SEQUENCE_LABELLING_TASKS = tuple(name for name, task in TASKS.items() if not task.is_classification)


def task_directory(task: IndoNLUTask, source: str) -> str:
    """`source` may be the IndoNLU dataset root (with one folder per task) or the task folder."""
    nested = os.path.join(source, task.folder)
    return nested if storage.isdir(nested) else source


def split_files(task: IndoNLUTask, directory: str) -> dict[str, str]:
    if not storage.isdir(directory):
        raise FileNotFoundError(f"{task.name}: data directory {directory} does not exist")
    files = {}
    present = set(storage.listdir(directory))
    for split in SPLIT_PREFIX:
        path = os.path.join(directory, task.filename(split))
        if task.filename(split) in present and storage.isfile(path):
            files[split] = path
        elif split != "test":
            raise FileNotFoundError(f"{task.name}: {path} not found (split {split!r} is required)")
    return files


def _check_labels(task: IndoNLUTask, path: str, examples: list[dict]) -> None:
    if task.kind in ("tagging", "qa"):
        for e in examples:
            for position, tag in enumerate(e["tags"]):
                if tag not in task.labels:  # a sentence's words are on consecutive lines; FacQA's on its row's
                    line = e["line"] + position if task.kind == "tagging" else e["line"]
                    raise DataError(f"{path}:{line}: tag {tag!r} is not one of {task.title}'s {len(task.labels)} "
                                    f"tags (the IndoNLU benchmark's tag set: {list(task.labels)})")
        return
    for e in examples:
        for label in (e["labels"] if task.kind == "aspects" else [e["label"]]):
            if label not in task.labels:
                raise DataError(f"{path}:{e['line']}: unknown label {label!r} for {task.name}; "
                                f"expected one of {list(task.labels)}")


def load_examples(task: IndoNLUTask, directory: str) -> dict[str, list[dict]]:
    out = {}
    for split, path in split_files(task, directory).items():
        examples = task.parse_file(path)
        if not examples:
            raise DataError(f"{path}: no examples")
        _check_labels(task, path, examples)
        for index, example in enumerate(examples):
            example["idx"] = index
        out[split] = examples
    return out


def read_file(task: IndoNLUTask, path: str, *, labelled: bool = True) -> list[dict]:
    """One file in the task's format (e.g. a test file, or unlabelled input to predict)."""
    if not storage.isfile(path):
        raise FileNotFoundError(f"{task.name}: {path} not found")
    examples = task.parse_file(path, labelled=labelled)
    if not examples:
        raise DataError(f"{path}: no examples")
    if labelled:
        _check_labels(task, path, examples)
    for index, example in enumerate(examples):
        example["idx"] = index
    return examples


def label_vocabulary(task: IndoNLUTask) -> list[str]:
    """The benchmark's label (or tag) set: every split's labels were checked against it."""
    return list(task.labels)


def prepare(name: str, source: str | None, data_dir: str, *, base_url: str = BASE_URL):
    """(splits as random-access sources, label vocabulary) of one task, validated and written
    as array_record. Without `source` the official files are downloaded."""
    if name not in TASKS:
        raise DataError(f"unknown IndoNLU task {name!r}; known: {sorted(TASKS)}")
    task = TASKS[name]
    if source:
        directory = task_directory(task, source)
    else:
        directory = os.path.join(os.path.expanduser(data_dir), "downloads", "indonlu", task.folder)
        files = {task.filename(s): f"{base_url.rstrip('/')}/{task.folder}/{task.filename(s)}" for s in SPLIT_PREFIX}
        records.download_files(files, directory, required={task.filename("train"), task.filename("validation")})
    examples = load_examples(task, directory)
    vocabulary = label_vocabulary(task)
    splits = records.prepare_records(f"indonlu_{name}", examples, list(split_files(task, directory).values()), data_dir,
                                     f"IndoNLU {name} ({task.folder})")
    return splits, vocabulary
