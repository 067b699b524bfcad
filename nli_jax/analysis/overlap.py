"""python -m nli_jax.analysis overlap TRAIN EVAL [EVAL ...]: the contamination check every
fine-tuning run makes (nli_jax.data.overlap), between any two files or task splits: how many
examples of each EVAL share normalised text with TRAIN (exact, or each text field found in
TRAIN's: the same text or a shared 8-word sequence).

Each argument is a file or, with --task (and --source), a split of that task:

    python -m nli_jax.analysis overlap --task=indonli --source=../shared/data/indonli train validation
    python -m nli_jax.analysis overlap --task=smsa \\
        ../shared/data/indonlu/smsa_doc-sentiment-prosa/train_preprocess.tsv \\
        --eval_task=nusax ../shared/data/nusax/sentiment/indonesian/valid.csv

A file is read by its task's reader (--task for TRAIN, --eval_task for the others, default
--task); without one by its extension: JSON lines or CSV with a header (the text fields of
nli_jax.data.overlap.TEXT_FIELDS), or TSV whose first column is the text (SmSA's layout).
Prints one line per EVAL; --output writes the counts as JSON.
"""
from __future__ import annotations

import json
import os
import sys

from absl import flags

from configs import finetune_common
from nli_jax import cli, planner, storage
from nli_jax.data import overlap
from nli_jax.data.readers import DataError, read_csv, read_jsonl, read_tsv
from nli_jax.tasks import create_task


def define_flags() -> None:
    flags.DEFINE_string("task", "", "the task whose reader reads TRAIN (and whose splits the names are)")
    flags.DEFINE_string("eval_task", "", "the task whose reader reads each EVAL (default: --task)")
    flags.DEFINE_string("source", "", "the task's data directory, for split names (data.source)")
    flags.DEFINE_integer("n", overlap.NGRAM, "words in a shared sequence")
    flags.DEFINE_string("output", "", "a JSON file for the counts")


def _generic(path: str) -> list[dict]:
    if path.endswith((".jsonl", ".json")):
        rows = [row for _, row in read_jsonl(path)]
    elif path.endswith(".tsv"):
        rows = [{"text": row[0]} for _, row in read_tsv(path, header=False)]
    else:
        rows = [row for _, row in read_csv(path)]
    if rows and not any(f in rows[0] for f in overlap.TEXT_FIELDS):
        raise DataError(f"{path}: none of the text fields {list(overlap.TEXT_FIELDS)} in its rows (fields "
                        f"{sorted(rows[0])[:10]}); name its task with --task / --eval_task")
    return rows


def _task(name: str, source: str):
    config = finetune_common.base_config(name)
    config.data.source = source
    return create_task(planner.build_plan(config, training=False))


def examples_of(argument: str, task, splits: dict) -> list[dict]:
    """A file's examples (by the task's reader, else by extension) or a split's of the task."""
    if storage.isfile(argument):
        return task.read_file(argument) if task is not None else _generic(argument)
    if task is None:
        raise FileNotFoundError(f"{argument}: no such file (a split name needs --task)")
    if not splits:
        splits.update(task.load())
    if argument not in splits:
        raise FileNotFoundError(f"{argument}: neither a file nor a split of task {task.name!r} (its splits: "
                                f"{', '.join(sorted(splits))})")
    source = splits[argument]
    return [source[i] for i in range(len(source))]


def compare(train: str, evaluated: list[str], *, task: str = "", eval_task: str = "", source: str = "",
            n: int = overlap.NGRAM) -> dict[str, dict]:
    train_task = _task(task, source) if task else None
    other = _task(eval_task, source) if eval_task and eval_task != task else train_task
    splits: dict = {}
    index = overlap.TrainingIndex(examples_of(train, train_task, splits), n=n)
    out = {}
    for argument in evaluated:
        result = overlap.compare(index, examples_of(argument, other, splits if other is train_task else {}))
        out[argument] = dict(result.as_dict(), train=train, train_examples=index.count)
        print(f"{argument} vs {train}: {result.describe()}")
    return out


def main(argv) -> None:
    FLAGS = flags.FLAGS
    if len(argv) < 3:
        sys.exit("nli_jax.analysis overlap: error: give TRAIN and at least one EVAL (files, or split names with --task)")
    try:
        counts = compare(argv[1], argv[2:], task=FLAGS.task, eval_task=FLAGS.eval_task, source=FLAGS.source,
                         n=FLAGS.n)
    except cli.user_errors() + (ValueError,) as e:
        sys.exit(f"nli_jax.analysis overlap: error: {' '.join(str(e).split())}")
    if FLAGS.output:
        storage.write_text(storage.under(os.path.dirname(os.path.abspath(FLAGS.output)),
                                         os.path.basename(FLAGS.output)), json.dumps(counts, indent=2) + "\n")
