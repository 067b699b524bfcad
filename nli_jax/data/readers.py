"""Readers for the official dataset files. Every problem is a DataError naming file and line.

Rows are validated here, once, before anything is written or trained: a malformed line, a
missing field, an empty text or an unknown label stops the run with its location.

One reader per file format, each counting rows the way an editor numbers lines ("\n" only):
JSON lines (one object per non-blank line), JSON arrays, plain tab-separated text (quotes are
text: one row per non-blank line, never merged) and CSV (standard quoting, strict; a quoted
field that spans lines is logged with its line range). Every file read through `_open_text` is
also reported to `recording_reads()`, which the training loop uses to fingerprint its data.
"""
from __future__ import annotations

import collections
import contextlib
import csv
import hashlib
import io
import json
import logging
import time
import unicodedata
from typing import Any, Callable, Iterator

from nli_jax import storage

log = logging.getLogger("nli_jax")


class DataError(ValueError):
    """A dataset file that cannot be used; the message names the file and line."""


_recorders: list[dict] = []


@contextlib.contextmanager
def recording_reads():
    """{absolute path: "sha256:..."} of every dataset file read inside the block."""
    record: dict[str, str] = {}
    _recorders.append(record)
    try:
        yield record
    finally:
        _recorders.remove(record)


def is_blank(text: str) -> bool:
    """Empty to a reader: only whitespace and invisible format characters (Unicode Z* and Cf:
    no-break and zero-width spaces, joiners, BOMs). str.strip() keeps the latter."""
    return all(_is_space(ch) or unicodedata.category(ch) == "Cf" for ch in text)


def is_whitespace(text: str) -> bool:
    """Empty or only whitespace (Unicode Z* included), format characters excepted: a tagging
    token of a zero-width space is a word of the official data (POSP and NERP train hold 7 each,
    tagged SYM / O, and the benchmark's counts include them)."""
    return all(_is_space(ch) for ch in text)


def _is_space(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in ("Zs", "Zl", "Zp")


def check_regular_file(path: str, what: str = "dataset file") -> None:
    """A path that is not a regular file (a directory, a FIFO, a device such as /dev/zero, also
    behind a symlink) is refused before it is read: it would never end or is not data. The
    storage layer's read gate (storage.readable_file), which every read goes through."""
    storage.readable_file(path, what)


def _open_text(path: str) -> str:
    check_regular_file(path)
    raw = storage.read_bytes(path)
    if _recorders:
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        for record in _recorders:
            record[storage.resolve(path)] = digest
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 (byte {raw[e.start]:#x} at offset {e.start})") from None
    nul = raw.find(b"\0")
    if nul >= 0:  # text files hold no NUL bytes: a damaged (zero-filled) or binary file
        line = raw[:nul].count(b"\n") + 1
        raise DataError(f"{path}:{line}: NUL byte at offset {nul} (a damaged or binary file)")
    return text


def text_lines(text: str) -> list[str]:
    """Lines as editors and `wc -l` number them: split on "\n" only (a trailing "\r" is
    dropped), never on the other separators str.splitlines() knows (U+2028, \x0c, \x1c, ...),
    which may occur inside a JSON string or a tweet."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


class _RepeatedKeys:
    """A json object_pairs_hook noting the keys a JSON object gives twice (json keeps the last
    silently): `check` refuses a row whose repeated key has two values (which one is meant is
    unknown) and counts the rows that repeat one with the same value, which `log` reports."""

    def __init__(self, path: str):
        self.path, self.repeated, self.same = path, [], []

    def __call__(self, pairs):
        out = {}
        for key, value in pairs:
            if key in out:
                self.repeated.append((key, out[key], value))
            out[key] = value
        return out

    def check(self, number: int) -> None:
        if not self.repeated:
            return
        repeated, self.repeated = self.repeated, []
        for key, first, second in repeated:
            if first != second:
                raise DataError(f"{self.path}:{number}: key {key!r} appears twice in the row with different values "
                                f"({_shown(first)} and {_shown(second)}): which one is meant is unknown")
        self.same.append((number, repeated[0][0]))

    def log(self) -> None:
        if self.same:
            number, key = self.same[0]
            log.warning("%s: %d row(s) give a key twice with the same value (e.g. line %d: %r); read once", self.path,
                        len(self.same), number, key)


def _shown(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_limit(path: str, number: int, error: storage.JSONLimitError) -> DataError:
    return DataError(f"{path}:{number}: {error}: not a dataset row")


def read_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line (nesting and integers bounded:
    storage.decode_json)."""
    repeated = _RepeatedKeys(path)
    decoder = storage.json_decoder(repeated)
    for number, line in enumerate(text_lines(_open_text(path)), start=1):
        if not line.strip():
            continue
        try:
            row = _decode_line(decoder, line)
        except storage.JSONLimitError as e:
            raise _json_limit(path, number, e) from None
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: malformed JSON ({e.msg} at column {e.colno})") from None
        repeated.check(number)
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        yield number, row
    repeated.log()


def _decode_line(decoder, line: str):
    start = len(line) - len(line.lstrip())
    value, end = storage.decode_json(decoder, line, start)
    if line[end:].strip():
        raise json.JSONDecodeError("Extra data", line, end)
    return value


def read_json_records(path: str) -> Iterator[tuple[int, dict]]:
    """A file that is either one JSON array of objects or JSON lines (IndoNLI's diagnostic.jsonl
    is, despite its name, one array). The position reported is the line where a record starts."""
    text = _open_text(path)
    stripped = text.lstrip()
    if not stripped.startswith("["):
        yield from read_jsonl(path)
        return
    repeated = _RepeatedKeys(path)
    decoder = storage.json_decoder(repeated)
    counted = [0, 1]  # (offset, its line): lines counted once, front to back (linear in the file)

    def line_of(offset):
        counted[1] += text.count("\n", counted[0], offset)
        counted[0] = offset
        return counted[1]

    def skip(i):
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i
    position = skip(len(text) - len(stripped) + 1)
    records = []
    try:
        if position < len(text) and text[position] == "]":
            position += 1
        else:
            while True:
                number = line_of(position)
                try:
                    value, end = storage.decode_json(decoder, text, position)
                except storage.JSONLimitError as e:
                    raise _json_limit(path, number, e) from None
                records.append((number, value))
                repeated.check(records[-1][0])
                position = skip(end)
                if position < len(text) and text[position] == ",":
                    position = skip(position + 1)
                    continue
                if position < len(text) and text[position] == "]":
                    position += 1
                    break
                raise json.JSONDecodeError("expected ',' or ']' after a record", text, position)
        if text[position:].strip():
            raise json.JSONDecodeError("extra data after the array", text, skip(position))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON array ({e.msg})") from None
    repeated.log()
    for number, row in records:
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def read_tsv(path: str, *, columns: int | None = None, header: bool = False
             ) -> Iterator[tuple[int, list[str] | dict[str, str]]]:
    """Plain tab-separated text (the IndoNLU .tsv files): one row per non-blank line, split on
    tabs only. Quotes are text, so no row can swallow the next one; the rows yielded are exactly
    the non-blank lines."""
    names = None
    for number, line in enumerate(text_lines(_open_text(path)), start=1):
        if not line.strip():
            continue
        row = line.split("\t")
        if header and names is None:
            names = [c.strip() for c in row]
            continue
        expected = len(names) if names else columns
        if expected is not None and len(row) != expected:
            raise DataError(f"{path}:{number}: expected {expected} columns, got {len(row)} (tab-separated)")
        yield number, (dict(zip(names, row)) if names else row)


def read_csv(path: str, *, delimiter: str = ",", header: bool = True, columns: int | None = None
             ) -> Iterator[tuple[int, list[str] | dict[str, str]]]:
    """(line number, row) of a CSV file with standard quoting, strict (a stray quote inside a
    field is an error, never a silent merge) and a column-count check. Rows are dicts when
    `header`; the line number is the row's first line. A quoted field spanning several lines is
    legal CSV (and how pandas, the benchmarks' reader, reads it) but is logged, with its lines."""
    if delimiter == "\t":
        yield from read_tsv(path, columns=columns, header=header)
        return
    reader = csv.reader(io.StringIO(_open_text(path), newline=""), delimiter=delimiter, strict=True)
    names = None
    previous_end = 0
    spanning = []
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise DataError(f"{path}:{previous_end + 1}: malformed CSV ({e})") from None
        number, previous_end = previous_end + 1, reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if reader.line_num > number:
            spanning.append(f"{number}-{reader.line_num}")
        if header and names is None:
            names = [c.strip() for c in row]
            continue
        expected = len(names) if names else columns
        if expected is not None and len(row) != expected:
            lines = f"{number}-{reader.line_num}" if reader.line_num > number else str(number)
            raise DataError(f"{path}:{lines}: expected {expected} columns, got {len(row)}")
        yield number, (dict(zip(names, row)) if names else row)
    if spanning:
        log.warning("%s: %d row(s) with a quoted field spanning several lines, read as one row each "
                    "(standard CSV, as pandas reads it): lines %s", path, len(spanning), ", ".join(spanning[:5]))


def require_text(path: str, number: int, row: dict, field: str) -> str:
    if field not in row:
        raise DataError(f"{path}:{number}: missing field {field!r}")
    value = row[field]
    if not isinstance(value, str):
        raise DataError(f"{path}:{number}: field {field!r} must be a string, got {type(value).__name__}")
    if is_blank(value):
        raise DataError(f"{path}:{number}: field {field!r} is empty" +
                        ("" if not value else " (only whitespace or invisible characters)"))
    return value


def map_label(path: str, number: int, value: Any, mapping: dict[str, int], field: str = "label") -> int:
    if value is None:
        raise DataError(f"{path}:{number}: missing field {field!r}")
    key = str(value).strip()
    if key not in mapping:
        raise DataError(f"{path}:{number}: unknown label {key!r} in field {field!r}; expected one of {sorted(mapping)}")
    return mapping[key]


class _Progress:
    """A log line every PROGRESS_S seconds while a long file is read (200k rows took 50 s
    without a word)."""
    PROGRESS_S = 10.0

    def __init__(self, path: str):
        self.path, self.rows, self.next = path, 0, time.monotonic() + self.PROGRESS_S

    def row(self, number: int) -> None:
        self.rows += 1
        if self.rows % 1000 == 0 and time.monotonic() > self.next:
            self.next = time.monotonic() + self.PROGRESS_S
            log.info("%s: %d rows read (line %d) ...", self.path, self.rows, number)


def read_validated(path: str, records: Callable[[str], Iterator[tuple[int, Any]]],
                   parse: Callable[[str, int, Any], dict | None], *, dropped: str = "",
                   id_field: str = "") -> list[dict]:
    """Parses every record, and says in one log line each what it dropped or adjusted: rows
    `parse` drops on purpose (returns None: OCNLI's '-', described by `dropped`), examples whose
    "id" is None (no `id_field`, or null: identified by their line number, never "None") and ids
    that occur more than once (told apart by position; a data.train_subset by id refuses them)."""
    out, dropped_rows, without_id = [], 0, []
    progress = _Progress(path)
    for number, row in records(path):
        progress.row(number)
        example = parse(path, number, row)
        if example is None:
            dropped_rows += 1
            continue
        if "id" in example and example["id"] is None:
            example["id"] = str(number)
            without_id.append(number)
        out.append(example)
    if dropped_rows:
        log.warning("%s: %d of %d rows dropped: %s", path, dropped_rows, dropped_rows + len(out),
                    dropped or "rows the format excludes")
    if without_id:
        log.warning("%s: %d row(s) without %s (absent or null, e.g. line %d): identified by their line number", path,
                    len(without_id), repr(id_field) if id_field else "an id", without_id[0])
    counts = collections.Counter(e["id"] for e in out if "id" in e)
    repeated = [i for i, c in counts.items() if c > 1]
    if repeated:
        log.warning("%s: %d id(s) occur more than once (%d rows, e.g. %s): the rows are told apart by position",
                    path, len(repeated), sum(counts[i] for i in repeated), repeated[:3])
    if not out:
        raise DataError(f"{path}: no examples")
    return out
