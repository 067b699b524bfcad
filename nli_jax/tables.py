"""Result tables as the papers print them: one cell per (row, split) holding the mean over
random restarts with the sample standard deviation in parentheses, "84.20 (0.35)".

A table is a header and rows of already formatted strings; the same table is written as
markdown (table.md, to read) and csv (table.csv, to paste into a spreadsheet).
"""
from __future__ import annotations

import csv
import io
from typing import Sequence

import numpy as np

from nli_jax import storage


def mean_std(values: Sequence[float]) -> dict:
    """mean and sample std (ddof=1, as over the papers' random restarts) of the values;
    std is 0.0 for a single value, as `nli_jax.train.loop.aggregate_seeds` writes it."""
    values = [float(v) for v in values]
    if not values:
        return {"mean": None, "std": None, "n": 0, "values": []}
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "n": len(values), "values": values}


def format_mean_std(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """"mean (std)" of scale x values; a single value is printed alone (one run has no spread)
    and no values give an empty cell."""
    summary = mean_std(values)
    if summary["n"] == 0:
        return ""
    mean = f"{scale * summary['mean']:.{digits}f}"
    if summary["n"] == 1:
        return mean
    return f"{mean} ({scale * summary['std']:.{digits}f})"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_markdown(path: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, title: str = "",
                   notes: Sequence[str] = ()) -> str:
    """Writes `title`, the table and the note lines below it; returns the text written."""
    parts = ([title, ""] if title else []) + [markdown(header, rows).rstrip("\n")]
    if notes:
        parts += [""] + list(notes)
    text = "\n".join(parts) + "\n"
    _write_text(path, text)
    return text


def write_csv(path: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    _write_text(path, buffer.getvalue())


def _write_text(path, text: str) -> None:
    storage.write_text(path, text)  # an OutputPath (storage.under), local or gs://, atomic
