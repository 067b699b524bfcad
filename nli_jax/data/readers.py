"""Readers for the official dataset files. Every problem is a DataError naming file and line.

Rows are validated here, once, before anything is written or trained: a malformed line, a
missing field, an empty text or an unknown label stops the run with its location.
"""
from __future__ import annotations

import csv
import io
import json
import os
from typing import Any, Callable, Iterator


class DataError(ValueError):
    """A dataset file that cannot be used; the message names the file and line."""


def _open_text(path: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file {path} not found")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 (byte {raw[e.start]:#x} at offset {e.start})") from None


def read_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line."""
    for number, line in enumerate(_open_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: malformed JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def read_json_records(path: str) -> Iterator[tuple[int, dict]]:
    """A file that is either one JSON array of objects or JSON lines (IndoNLI's diagnostic.jsonl
    is, despite its name, one array). The position reported is the 1-based record index."""
    text = _open_text(path)
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: malformed JSON array ({e.msg})") from None
        for index, row in enumerate(rows, start=1):
            if not isinstance(row, dict):
                raise DataError(f"{path}: record {index}: expected a JSON object, got {type(row).__name__}")
            yield index, row
    else:
        yield from read_jsonl(path)


def read_csv(path: str, *, delimiter: str = ",", header: bool = True, columns: int | None = None
             ) -> Iterator[tuple[int, list[str] | dict[str, str]]]:
    """(line number, row) with a column-count check. Rows are dicts when `header`."""
    reader = csv.reader(io.StringIO(_open_text(path), newline=""), delimiter=delimiter)
    names = None
    for row in reader:
        number = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if header and names is None:
            names = [c.strip() for c in row]
            continue
        expected = len(names) if names else columns
        if expected is not None and len(row) != expected:
            raise DataError(f"{path}:{number}: expected {expected} columns, got {len(row)}")
        yield number, (dict(zip(names, row)) if names else row)


def require_text(path: str, number: int, row: dict, field: str) -> str:
    if field not in row:
        raise DataError(f"{path}:{number}: missing field {field!r}")
    value = row[field]
    if not isinstance(value, str):
        raise DataError(f"{path}:{number}: field {field!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{path}:{number}: field {field!r} is empty")
    return value


def map_label(path: str, number: int, value: Any, mapping: dict[str, int], field: str = "label") -> int:
    if value is None:
        raise DataError(f"{path}:{number}: missing field {field!r}")
    key = str(value).strip()
    if key not in mapping:
        raise DataError(f"{path}:{number}: unknown label {key!r} in field {field!r}; expected one of {sorted(mapping)}")
    return mapping[key]


def read_validated(path: str, records: Callable[[str], Iterator[tuple[int, Any]]],
                   parse: Callable[[str, int, Any], dict | None]) -> list[dict]:
    """Parses every record; `parse` returns None to drop a row on purpose (OCNLI's '-')."""
    out = []
    for number, row in records(path):
        example = parse(path, number, row)
        if example is not None:
            out.append(example)
    if not out:
        raise DataError(f"{path}: no examples")
    return out
