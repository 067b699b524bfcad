"""All 12 IndoNLU tasks for one model, reported in the IndoNLU paper's Table 5 layout.

    python -m finetune.indonlu_benchmark --model=large --workdir=runs/indonlu_large \\
        --source=/data/indonlu [--override=train.num_epochs=3 ...] [--tasks=smsa,emot]

Each task runs `train_and_evaluate` with configs/indonlu.py:task=T,model=M in <workdir>/<task>
(rerunning resumes / skips finished tasks). Writes <workdir>/table.md and table.csv: F1 x 100
per task, the classification average (5 tasks) and the sequence-labelling average (7), one row
per evaluated split; and <workdir>/test_predictions/<task>.csv with the test predictions in
file order (index, prediction) for the leaderboard.
"""
from __future__ import annotations

import ast
import csv
import json
import os
import time

from absl import app, flags

from configs import indonlu as indonlu_config

flags.DEFINE_string("model", "large", f"one of {sorted(indonlu_config.MODELS)}")
flags.DEFINE_string("workdir", None, "output directory")
flags.DEFINE_string("source", "", "IndoNLU dataset root (one folder per task); empty = download")
flags.DEFINE_list("tasks", list(indonlu_config.TASKS), "tasks to run")
flags.DEFINE_bool("cpu_test", False, "tiny from-scratch model (configs/indonlu.py's cpu_test variant)")
flags.DEFINE_multi_string("override", [], "config overrides key=value, e.g. train.num_epochs=3")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS

NAMES = {"emot": "EmoT", "smsa": "SmSA", "casa": "CASA", "hoasa": "HoASA", "wrete": "WReTE", "posp": "POSP",
         "bapos": "BaPOS", "terma": "TermA", "keps": "KEPS", "nergrit": "NERGrit", "nerp": "NERP", "facqa": "FacQA"}
CLASSIFICATION = ("emot", "smsa", "casa", "hoasa", "wrete")
SEQUENCE = ("posp", "bapos", "terma", "keps", "nergrit", "nerp", "facqa")


def apply_override(config, assignment: str) -> None:
    """'a.b.c=value' (value as a Python literal, else a string) into a ConfigDict."""
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise ValueError(f"--override {assignment!r}: expected key=value")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
        node = node[p]
    if leaf not in node:
        raise KeyError(f"--override {assignment!r}: no config field {key!r}")
    node[leaf] = value


def table(results: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    header = ["split"] + [NAMES[t] for t in CLASSIFICATION] + ["cls avg"] + [NAMES[t] for t in SEQUENCE] + ["seq avg"]
    splits = sorted({s for r in results.values() for s in r["splits"]}, key=lambda s: (s != "validation", s))
    rows = []
    for split in splits:
        def score(task):
            r = results.get(task, {}).get("splits", {}).get(split)
            return None if r is None else 100 * r["f1"]

        def avg(tasks):
            values = [score(t) for t in tasks]
            return None if any(v is None for v in values) else sum(values) / len(values)
        cells = [score(t) for t in CLASSIFICATION] + [avg(CLASSIFICATION)] + [score(t) for t in SEQUENCE] + [avg(SEQUENCE)]
        rows.append([split] + ["" if v is None else f"{v:.2f}" for v in cells])
    return header, rows


def write_tables(workdir: str, results: dict[str, dict], model: str, seconds: dict[str, float]) -> str:
    header, rows = table(results)
    with open(os.path.join(workdir, "table.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    lines = [f"IndoNLU, model `{model}` (F1 x 100; averages over the 5 classification and 7 sequence-labelling tasks)",
             "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "wall time per task (s): " + ", ".join(f"{NAMES[t]} {s:.0f}" for t, s in seconds.items()),
              f"total: {sum(seconds.values()):.0f} s"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(workdir, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return text


def write_test_predictions(workdir: str, task: str) -> None:
    path = os.path.join(workdir, task, "predictions.jsonl")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")] if os.path.isfile(path) else []
    rows = [r for r in rows if r["split"] == "test"]
    if not rows:
        return
    out_dir = os.path.join(workdir, "test_predictions")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{task}.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["index", "prediction"])
        for r in sorted(rows, key=lambda r: r["idx"]):
            prediction = r["prediction"]
            if isinstance(prediction, list):
                prediction = " ".join(prediction)
            elif isinstance(prediction, dict):
                prediction = json.dumps(prediction, ensure_ascii=False)
            w.writerow([r["idx"], prediction])


def run(model: str, workdir: str, source: str, tasks, overrides=(), cpu_test: bool = False) -> str:
    from nli_jax.train import train_and_evaluate
    os.makedirs(workdir, exist_ok=True)
    results, seconds = {}, {}
    for task in tasks:
        config = indonlu_config.get_config(f"task={task},model={model}" + (",cpu_test" if cpu_test else ""))
        config.data.source = source
        for o in overrides:
            apply_override(config, o)
        task_dir = os.path.join(workdir, task)
        done = os.path.join(task_dir, "results.json")
        start = time.time()
        if os.path.isfile(done):
            with open(done, encoding="utf-8") as f:
                results[task] = json.load(f)
        else:
            results[task] = train_and_evaluate(config, task_dir)
        seconds[task] = time.time() - start
        write_test_predictions(workdir, task)
    return write_tables(workdir, results, model, seconds)


def main(argv):
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    print(run(FLAGS.model, FLAGS.workdir, FLAGS.source, FLAGS.tasks, FLAGS.override, FLAGS.cpu_test))


if __name__ == "__main__":
    app.run(main)
