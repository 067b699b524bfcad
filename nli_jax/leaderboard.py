"""Leaderboard submission files from a run's predictions.jsonl: IndoNLU (12 tasks) and CLUE OCNLI.

    python -m nli_jax.leaderboard --format=indonlu --runs=WORKDIR --output=DIR [--source=INDONLU_ROOT]
    python -m nli_jax.leaderboard --format=clue_ocnli --run=RUN_DIR --output=FILE_OR_DIR [--source=OCNLI_DIR]

Only the predictions are read (`split`, `idx`, `prediction`, and `id` / `tokens` where present):
gold labels may be absent, None or placeholders (the public IndoNLU test files have masked
labels, OCNLI's public test.json has none). Everything is validated before anything is written:
each task present, its test rows numbered 0..N-1 with no gap or duplicate (written in that order,
which is the test file's order), every label in the task's label set, tag lists as long as the
sentence, and the row count equal to the test file's (`source`) or to results.json's
`splits.<split>.count` where either is available. Errors name the file and line.

Formats, and where each decision comes from
-------------------------------------------
IndoNLU (all references: repository IndoNLP/indonlu):
- README.md (commit 03b58305), "Submission Format": "For each task, there is different format.
  Every submission file always start with the `index` column (the id of the test sample following
  the order of the masked test set)." and "rename your prediction into `pred.txt`, then zip the
  file." README.id.md (commit 02bc52c8) says the same. Submissions go to CodaLab competition 26537.
- submission_examples/ (commit c199ba24): one file per task, 10 rows each, comma-separated, header
  line, `\\n` line ends, minimal quoting (what pandas' `to_csv(index=False)` writes):
    emotion-twitter_test.csv (EmoT), doc-sentiment_test.csv (SmSA), entailment-ui_test.csv (WReTE):
      `index,label`, one label name per row (e.g. `0,happy`).
    absa-prosa_test.csv (CASA): `index,fuel,machine,others,part,price,service`;
    absa-airy_test.csv (HoASA): `index,ac,air_panas,bau,general,kebersihan,linen,service,sunrise_meal,tv,wifi`;
      one column per aspect, in that order, each cell a label name (CASA negative/neutral/positive,
      HoASA neg/neut/pos[/neg_pos]).
    pos-prosa_test.csv (POSP), pos-idn_test.csv (BaPOS), term-extraction-airy_test.csv (TermA),
    keyword-extraction-prosa_test.csv (KEPS), ner-grit_test.csv (NERGrit), ner-prosa_test.csv (NERP),
    qa-factoid-itb_test.csv (FacQA): `index,label`, the label cell the Python repr of the sentence's
      tag list, double-quoted by the CSV writer: `0,"['B-PERSON', 'O']"` (one tag per word; FacQA one
      per passage word).
  The examples notebooks (examples/finetune_casa.ipynb, commit 3781310a; finetune_ner_grit.ipynb)
  write `pd.DataFrame({'label': list_hyp}).reset_index().to_csv('pred.txt', index=False)`: the
  same `index,label` header and list repr. For CASA that notebook would put the aspect list in one
  `label` column, which contradicts absa-prosa_test.csv; the submission example (one column per
  aspect) is followed here.
- Label sets: utils/data_utils.py (commit 72112b9d), the LABEL2INDEX of each dataset class; the
  label, aspect and tag sets are nli_jax.data.indonlu.TASKS[...].labels (tags: nli_jax.data.indonlu.*_TAGS, in
  LABEL2INDEX order).
- Not documented anywhere in the repository: how the 12 tasks are packaged together (the README
  describes one `pred.txt` per zip, so CodaLab presumably takes one zip per task). Written here:
  <out>/<task>/pred.txt and <out>/<task>.zip holding only `pred.txt` at the zip root.
  Also undocumented: the exact test-set sizes (pass `source`, the dataset root holding
  test_preprocess.*, to check them) and the line terminator (the stored examples show `\\n`).

CLUE OCNLI:
- CLUE's submission guide (CLUE benchmark 任务提交说明, updated 2021-09-04; the copy in the search
  index does not name its repository/path): classification files are `<task>_predict.json`, "one
  JSON string per line, with the label value, strictly in the line order of the prediction input
  file test.json"; example `{"id": 0, "label": "0"}` (json.dumps' default separators, keys id then
  label); all task files may be zipped together as submit_<team>_<date>.zip.
- File name `ocnli_50k_predict.json` (the CLUE 1.1 classification leaderboard, OCNLI trained on
  train.50k): PaddlePaddle/PaddleNLP examples/benchmark/clue/classification/predict_clue_classifier.py
  (commit 59f2ffb0), the Paddle baseline that CLUEbenchmark/CLUE baselines/paddlenlp/README.md
  (commit 2690d6cb) points to; it writes `json.dumps({"id": ..., "label": label_name})` per line.
- ids: CLUEbenchmark/OCNLI data/ocnli/test.json (commit ed7ede28) has an integer `id` per line, 0..N-1
  in file order; nli_jax.data.nli keeps it as the string `id` of each example. Written as the
  integer, in idx (file) order; labels are OCNLI's names entailment / neutral / contradiction.
- OCNLI's own NLI leaderboard (CLUEbenchmark/OCNLI README.md, commit b53efdee): "submit one zip
  containing OCNLI_50k.json, OCNLI_30k.json" (models trained on train.50k / train.30k); its line
  format is not documented there, the CLUE format is used (`naming="ocnli"`).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import zipfile
from collections.abc import Mapping, Sequence

from nli_jax.data import indonlu as indonlu_data
from nli_jax.tasks.ocnli import OCNLI
from nli_jax import storage
from nli_jax.data.readers import DataError, read_jsonl
from nli_jax.cli.command_help import empty_path_problem
from nli_jax.workdir import check_tool_output


class SubmissionError(DataError):
    """Predictions that cannot become a submission file; the message names the file and line."""


# The tasks of the benchmark's leaderboard, in its order: every IndoNLU task with a submission
# format below (a task added to nli_jax.data.indonlu for fine-tuning alone is not one of them).
INDONLU_TASKS = ("emot", "smsa", "casa", "hoasa", "wrete", "posp", "bapos", "terma", "keps", "nergrit", "nerp",
                 "facqa")

class IndoNLUFormat:
    """One task's submission file: the documented example it follows, its columns and labels."""

    def __init__(self, task: str, example: str, kind: str, labels: Sequence[str], aspects: Sequence[str] = ()):
        self.task, self.example, self.kind = task, example, kind  # kind: "label", "aspects" or "tags"
        self.labels, self.aspects = tuple(labels), tuple(aspects)
        self.header = ("index",) + (self.aspects if kind == "aspects" else ("label",))

    def cells(self, prediction) -> list[str]:
        if self.kind == "label":
            return [prediction]
        if self.kind == "aspects":
            return [prediction[a] for a in self.aspects]
        return [repr([str(t) for t in prediction])]  # "['B-PER', 'O']", as str(list) / pandas writes it


_T = indonlu_data.TASKS
INDONLU_FORMATS: dict[str, IndoNLUFormat] = {f.task: f for f in [
    IndoNLUFormat("emot", "emotion-twitter_test.csv", "label", _T["emot"].labels),
    IndoNLUFormat("smsa", "doc-sentiment_test.csv", "label", _T["smsa"].labels),
    IndoNLUFormat("casa", "absa-prosa_test.csv", "aspects", _T["casa"].labels, _T["casa"].aspects),
    IndoNLUFormat("hoasa", "absa-airy_test.csv", "aspects", _T["hoasa"].labels, _T["hoasa"].aspects),
    IndoNLUFormat("wrete", "entailment-ui_test.csv", "label", _T["wrete"].labels),
    IndoNLUFormat("posp", "pos-prosa_test.csv", "tags", indonlu_data.POSP_TAGS),
    IndoNLUFormat("bapos", "pos-idn_test.csv", "tags", indonlu_data.BAPOS_TAGS),
    IndoNLUFormat("terma", "term-extraction-airy_test.csv", "tags", indonlu_data.TERMA_TAGS),
    IndoNLUFormat("keps", "keyword-extraction-prosa_test.csv", "tags", indonlu_data.BIO_TAGS),
    IndoNLUFormat("nergrit", "ner-grit_test.csv", "tags", indonlu_data.NERGRIT_TAGS),
    IndoNLUFormat("nerp", "ner-prosa_test.csv", "tags", indonlu_data.NERP_TAGS),
    IndoNLUFormat("facqa", "qa-factoid-itb_test.csv", "tags", indonlu_data.BIO_TAGS),
]}

OCNLI_TRAIN_SIZES = ("50k", "30k", "10k", "3k")


# --- reading and validating predictions -----------------------------------------------------------

def predictions_path(run: str, seed: int | None = None) -> str:
    """A run directory's predictions.jsonl (or `run` itself when it is a file). With config.seeds
    the predictions are per seed, in <run>/seed_<s>/predictions.jsonl: pass `seed` to choose one."""
    if storage.isfile(run):
        return run
    if seed is not None:
        path = os.path.join(run, f"seed_{seed}", "predictions.jsonl")
        if not storage.isfile(path):
            raise SubmissionError(f"{path} not found")
        return path
    path = os.path.join(run, "predictions.jsonl")
    if storage.isfile(path):
        return path
    seeds = [d for d in storage.listdir(run) if d.startswith("seed_")]
    if seeds:
        raise SubmissionError(f"{path} not found; {run} has per-seed runs {seeds}: choose one with seed=")
    raise SubmissionError(f"{path} not found")


def _runs_read(runs, seed: int | None) -> list[str]:
    """The run directories a submission reads (a run, or the one holding a predictions file, and
    its seed_<s>): a tool may write only in a directory of its own inside them."""
    out = []
    for run in runs:
        run = os.path.dirname(storage.resolve(run)) if storage.isfile(run) else run
        out += [run] + ([os.path.join(run, f"seed_{seed}")] if seed is not None else [])
    return out


def read_split_rows(path: str, split: str = "test") -> list[tuple[int, dict]]:
    """(line, row) for the rows of `split`, sorted by idx, after checking that idx is an integer
    and that the idx values are exactly 0..N-1 (no gap, no duplicate)."""
    rows, other_splits = [], set()
    try:
        records = list(read_jsonl(path))
    except (DataError, FileNotFoundError) as e:
        raise SubmissionError(str(e)) from None
    for line, row in records:
        if "split" not in row:
            raise SubmissionError(f"{path}:{line}: no 'split' field")
        if row["split"] != split:
            other_splits.add(str(row["split"]))
            continue
        idx = row.get("idx")
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            raise SubmissionError(f"{path}:{line}: 'idx' must be a non-negative integer, got {idx!r}")
        if "prediction" not in row or row["prediction"] is None:
            raise SubmissionError(f"{path}:{line}: idx {idx}: no 'prediction'")
        rows.append((line, row))
    if not rows:
        found = f" (it has splits {sorted(other_splits)})" if other_splits else " (it is empty)"
        raise SubmissionError(f"{path}: no rows with split {split!r}{found}; predict on the {split} split first")
    first_line: dict[int, int] = {}
    for line, row in rows:
        if row["idx"] in first_line:
            raise SubmissionError(f"{path}:{line}: duplicate idx {row['idx']} in split {split!r} "
                                  f"(first at line {first_line[row['idx']]})")
        first_line[row["idx"]] = line
    rows.sort(key=lambda r: r[1]["idx"])
    for expected, (line, row) in enumerate(rows):
        if row["idx"] != expected:
            raise SubmissionError(f"{path}:{line}: split {split!r} has idx {row['idx']} but no idx {expected}: "
                                  f"the rows must be numbered 0..N-1 in test-file order with no gap")
    return rows


def _check_count(path: str, rows, expected: int | None, origin: str) -> None:
    if expected is not None and len(rows) != expected:
        last_line = max(line for line, _ in rows)
        raise SubmissionError(f"{path}:{last_line}: {len(rows)} test rows (idx 0..{len(rows) - 1}) but {origin} "
                              f"has {expected}")


# The official test sets' sizes (IndoNLU paper Table 1; OCNLI's test.json): a submission with
# another count is not a submission of the benchmark's test set. The command line checks them
# unless --source (the test files themselves) or --expected_rows says otherwise.
PUBLISHED_TEST_ROWS = {"emot": 442, "smsa": 500, "casa": 180, "hoasa": 286, "wrete": 100, "posp": 840, "bapos": 1029,
                       "terma": 1000, "keps": 247, "nergrit": 209, "nerp": 840, "facqa": 311, "ocnli": 3000}


def _check_run_task(path: str, task: str) -> None:
    """The predictions must be a run of this benchmark's task (its results.json / config.json
    beside predictions.jsonl say which), not another benchmark's."""
    directory = os.path.dirname(storage.resolve(path))
    for name in ("results.json", "config.json"):
        try:
            found = json.loads(storage.read_text(os.path.join(directory, name))).get("task")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(found, str) and found != task:
            raise SubmissionError(f"{path}: predictions of task {found!r} ({os.path.join(directory, name)}), not "
                                  f"{task!r}: a {task} submission is made from a {task} run only")


def _results_count(path: str, split: str) -> int | None:
    """splits.<split>.count from the results.json beside predictions.jsonl, if there is one."""
    results = os.path.join(os.path.dirname(storage.resolve(path)), "results.json")
    try:
        count = json.loads(storage.read_text(results))["splits"][split]["count"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(count) if isinstance(count, int) else None


def _check_indonlu_row(fmt: IndoNLUFormat, path: str, line: int, row: dict, words: int | None) -> None:
    where, prediction = f"{path}:{line}: idx {row['idx']}", row["prediction"]

    def check_label(value, what):
        if not isinstance(value, str) or value not in fmt.labels:
            raise SubmissionError(f"{where}: unknown {fmt.task} {what} {value!r}; expected one of {list(fmt.labels)}")

    if fmt.kind == "label":
        check_label(prediction, "label")
    elif fmt.kind == "aspects":
        if not isinstance(prediction, dict):
            raise SubmissionError(f"{where}: 'prediction' must map each {fmt.task} aspect to a label, "
                                  f"got {type(prediction).__name__}")
        if set(prediction) != set(fmt.aspects):
            raise SubmissionError(f"{where}: prediction aspects {sorted(prediction)} != {fmt.task} aspects "
                                  f"{list(fmt.aspects)}")
        for aspect in fmt.aspects:
            check_label(prediction[aspect], f"label for aspect {aspect!r}:")
    else:
        if not isinstance(prediction, list) or not prediction:
            raise SubmissionError(f"{where}: 'prediction' must be a non-empty list of tags")
        for tag in prediction:
            check_label(tag, "tag")
        tokens = row.get("tokens")
        if isinstance(tokens, list) and len(tokens) != len(prediction):
            raise SubmissionError(f"{where}: {len(prediction)} tags for {len(tokens)} tokens")
        if words is not None and words != len(prediction):
            raise SubmissionError(f"{where}: {len(prediction)} tags but the test file's sentence has {words} words")


def _test_file_examples(task: str, source: str) -> tuple[str, list[dict]]:
    spec = indonlu_data.TASKS[task]
    path = os.path.join(indonlu_data.task_directory(spec, source), spec.filename("test"))
    if not storage.isfile(path):
        raise SubmissionError(f"{task}: test file {path} not found (source={source})")
    # Read unlabelled: only the examples and their words are needed, the public test files' gold
    # columns are masked placeholders.
    read_file = getattr(indonlu_data, "read_file", None)
    return path, read_file(spec, path, labelled=False) if read_file else spec.parse_file(path)


def _csv_bytes(header: Sequence[str], rows: Sequence[Sequence[str]]) -> bytes:
    # csv's default dialect quotes minimally with '"', as pandas.to_csv; "\n" ends lines as in
    # the submission examples.
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def _write_bytes(path, data: bytes) -> None:
    storage.write_bytes(path, data)  # an OutputPath (storage.under), local or gs://, atomic


def _zip_bytes(name: str, data: bytes) -> bytes:
    """A zip with one member at its root and a fixed timestamp (same input, same bytes)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(info, data)
    return buffer.getvalue()


# --- IndoNLU --------------------------------------------------------------------------------------

def indonlu_table(task: str, path: str, *, split: str = "test", source: str | None = None,
                  expected_rows: int | None = None) -> tuple[tuple[str, ...], list[list[str]]]:
    """(header, rows) of one task's pred.txt from its predictions.jsonl, validated."""
    if task not in INDONLU_FORMATS:
        raise SubmissionError(f"unknown IndoNLU task {task!r}; known: {list(INDONLU_FORMATS)}")
    fmt = INDONLU_FORMATS[task]
    _check_run_task(path, task)
    rows = read_split_rows(path, split)
    words = None
    if source:
        test_path, examples = _test_file_examples(task, source)
        _check_count(path, rows, len(examples), f"the test file {test_path}")
        if fmt.kind == "tags":
            words = [len(e["tokens"]) for e in examples]
    _check_count(path, rows, expected_rows, "expected_rows")
    _check_count(path, rows, _results_count(path, split), f"results.json (splits.{split}.count)")
    table = []
    for line, row in rows:
        _check_indonlu_row(fmt, path, line, row, None if words is None else words[row["idx"]])
        table.append([str(row["idx"])] + fmt.cells(row["prediction"]))
    return fmt.header, table


def indonlu_submission(runs: str | Mapping[str, str], out_dir: str, *, tasks: Sequence[str] = INDONLU_TASKS,
                       split: str = "test", source: str | None = None,
                       expected_rows: Mapping[str, int] | None = None, seed: int | None = None) -> list[str]:
    """Writes <out_dir>/<task>/pred.txt and <out_dir>/<task>.zip (pred.txt at the zip root) for
    every task in `tasks`; returns the written paths (pred.txt, zip per task, in task order).

    runs: the IndoNLU benchmark workdir (predictions in <runs>/<task>/predictions.jsonl), or
    {task: run directory or predictions.jsonl path}. source: the IndoNLU dataset root (or any
    folder with <task folder>/test_preprocess.*) to check row counts and sentence lengths against
    the test files. Every task is validated before anything is written.
    """
    unknown = [t for t in tasks if t not in INDONLU_FORMATS]
    if unknown:
        raise SubmissionError(f"unknown IndoNLU task(s) {unknown}; known: {list(INDONLU_FORMATS)}")
    if isinstance(runs, str):
        run_dirs = {t: os.path.join(runs, t) for t in tasks}
    else:
        run_dirs = {t: runs[t] for t in tasks if t in runs}
    check_tool_output(out_dir, "--output", reads=_runs_read(run_dirs.values(), seed), directory=True)
    paths, missing = {}, []
    for task in tasks:
        if task not in run_dirs:
            missing.append(f"{task} (no run given)")
            continue
        try:
            paths[task] = predictions_path(run_dirs[task], seed)
        except SubmissionError as e:
            missing.append(f"{task} ({e})")
    if missing:
        raise SubmissionError(f"missing test predictions for {len(missing)} of {len(tasks)} IndoNLU task(s): "
                              + "; ".join(missing))
    files = {}
    for task in tasks:
        header, table = indonlu_table(task, paths[task], split=split, source=source,
                                      expected_rows=(expected_rows or {}).get(task))
        files[task] = _csv_bytes(header, table)
    written = []
    for task in tasks:
        pred = storage.under(out_dir, task, "pred.txt")  # a task name is one path component
        archive = storage.under(out_dir, f"{task}.zip")
        _write_bytes(pred, files[task])
        _write_bytes(archive, _zip_bytes("pred.txt", files[task]))
        written += [pred, archive]
    return written


# --- CLUE OCNLI -----------------------------------------------------------------------------------

def ocnli_filename(train_size: str = "50k", naming: str = "clue") -> str:
    """`ocnli_50k_predict.json` (CLUE classification leaderboard) or `OCNLI_<size>.json` (OCNLI's
    own leaderboard, 50k or 30k)."""
    if train_size not in OCNLI_TRAIN_SIZES:
        raise SubmissionError(f"train_size must be one of {list(OCNLI_TRAIN_SIZES)}, got {train_size!r}")
    if naming == "clue":
        if train_size != "50k":
            raise SubmissionError("CLUE's classification leaderboard documents only ocnli_50k_predict.json "
                                  f"(train.50k); for train.{train_size} use naming='ocnli' (OCNLI_{train_size}.json)")
        return "ocnli_50k_predict.json"
    if naming == "ocnli":
        if train_size not in ("50k", "30k"):
            raise SubmissionError(f"OCNLI's leaderboard takes OCNLI_50k.json and OCNLI_30k.json, not {train_size}")
        return f"OCNLI_{train_size}.json"
    raise SubmissionError(f"naming must be 'clue' or 'ocnli', got {naming!r}")


def _integer_id(path: str, line: int, row: dict) -> int:
    value = row.get("id", row["idx"])
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SubmissionError(f"{path}:{line}: idx {row['idx']}: id {value!r} is not an integer (CLUE files use "
                              f"test.json's integer ids)")
    return value


def ocnli_lines(path: str, *, split: str = "test", source: str | None = None,
                expected_rows: int | None = None) -> list[str]:
    """The submission lines (`{"id": 0, "label": "neutral"}`) in test.json order, validated."""
    _check_run_task(path, "ocnli")
    rows = read_split_rows(path, split)
    if source:
        test_path = os.path.join(source, "test.json") if storage.isdir(source) else source
        if not storage.isfile(test_path):
            raise SubmissionError(f"OCNLI test file {test_path} not found (source={source})")
        test_rows = list(read_jsonl(test_path))
        _check_count(path, rows, len(test_rows), f"the test file {test_path}")
    _check_count(path, rows, expected_rows, "expected_rows")
    _check_count(path, rows, _results_count(path, split), f"results.json (splits.{split}.count)")
    out, first_line = [], {}
    for position, (line, row) in enumerate(rows):
        label = row["prediction"]
        if not isinstance(label, str) or label not in OCNLI.labels:
            raise SubmissionError(f"{path}:{line}: idx {row['idx']}: unknown OCNLI label {label!r}; "
                                  f"expected one of {list(OCNLI.labels)}")
        uid = _integer_id(path, line, row)
        if uid in first_line:
            raise SubmissionError(f"{path}:{line}: duplicate id {uid} (first at line {first_line[uid]})")
        first_line[uid] = line
        if source:
            test_line, test_row = test_rows[position]
            if test_row.get("id") != uid:
                raise SubmissionError(f"{path}:{line}: idx {row['idx']} has id {uid} but line {test_line} of "
                                      f"{test_path} has id {test_row.get('id')!r}")
        out.append(json.dumps({"id": uid, "label": label}, ensure_ascii=False))
    return out


def ocnli_submission(run: str, out_path: str, *, train_size: str = "50k", naming: str = "clue",
                     split: str = "test", source: str | None = None, expected_rows: int | None = None,
                     seed: int | None = None, zip_path: str | None = None) -> str:
    """Writes the CLUE OCNLI submission file and returns its path.

    run: a run directory (its predictions.jsonl) or the predictions.jsonl itself. out_path: the
    file, or an existing directory / a path ending in '/' to get ocnli_filename(train_size,
    naming) inside it. source: OCNLI's folder with test.json (or test.json) to check the count and
    the ids line by line. zip_path: also write a zip with the file at its root (CLUE takes all
    task files zipped together).
    """
    filename = ocnli_filename(train_size, naming)
    if storage.isdir(out_path) or out_path.endswith(("/", os.sep)):
        out_path = os.path.join(out_path, filename)
    for flag, target in (("--output", out_path), ("--zip", zip_path)):
        if target:
            check_tool_output(target, flag, reads=[storage.resolve(predictions_path(run, seed)), *_runs_read([run], seed)],
                              read_flag="--run")
    data = ("\n".join(ocnli_lines(predictions_path(run, seed), split=split, source=source,
                                  expected_rows=expected_rows)) + "\n").encode("utf-8")
    _write_bytes(storage.under(os.path.dirname(storage.resolve(out_path)), os.path.basename(out_path)), data)
    if zip_path:
        _write_bytes(storage.under(os.path.dirname(storage.resolve(zip_path)), os.path.basename(zip_path)),
                     _zip_bytes(os.path.basename(out_path), data))
    return out_path


# --- command line ---------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    # argparse rather than absl flags: this module is imported by finetune/indonlu_benchmark.py,
    # whose absl flags (e.g. --source) would clash with module-level flag definitions.
    parser = argparse.ArgumentParser(prog="python -m nli_jax.leaderboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", required=True, choices=["indonlu", "clue_ocnli"])
    parser.add_argument("--runs", help="indonlu: the benchmark workdir (<runs>/<task>/predictions.jsonl)")
    parser.add_argument("--run", help="clue_ocnli: the run directory or its predictions.jsonl")
    parser.add_argument("--output", required=True, help="indonlu: output directory; clue_ocnli: file or directory")
    parser.add_argument("--source", default=None, help="dataset folder with the test files, to check counts")
    parser.add_argument("--tasks", default=",".join(INDONLU_TASKS), help="indonlu: comma-separated tasks")
    parser.add_argument("--split", default="test")
    parser.add_argument("--seed", type=int, default=None, help="per-seed runs: use <run>/seed_<seed>")
    parser.add_argument("--train_size", default="50k", choices=list(OCNLI_TRAIN_SIZES))
    parser.add_argument("--naming", default="clue", choices=["clue", "ocnli"])
    parser.add_argument("--zip", default=None, help="clue_ocnli: also write this zip")
    parser.add_argument("--expected_rows", default="", help="task=rows,... (default: the published test sizes "
                        "unless --source gives the test files)")
    args = parser.parse_args(argv)
    problem = empty_path_problem({name: value for name, value in vars(args).items() if value is not None})
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        expected = {} if args.source else {t: n for t, n in PUBLISHED_TEST_ROWS.items()}
        for item in filter(None, args.expected_rows.split(",")):
            name, _, rows = item.partition("=")
            expected[name.strip()] = int(rows)
        if args.format == "indonlu":
            if not args.runs:
                parser.error("--format=indonlu needs --runs")
            tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
            written = indonlu_submission(args.runs, args.output, tasks=tasks, split=args.split, source=args.source,
                                         seed=args.seed, expected_rows=expected)
        else:
            if not args.run:
                parser.error("--format=clue_ocnli needs --run")
            written = [ocnli_submission(args.run, args.output, train_size=args.train_size, naming=args.naming,
                                        split=args.split, source=args.source, seed=args.seed, zip_path=args.zip,
                                        expected_rows=expected.get("ocnli"))]
            written += [args.zip] if args.zip else []
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
