"""All 12 IndoNLU tasks for one model, reported in the IndoNLU paper's Table 5 layout.

    python -m finetune.indonlu_benchmark --model=large --workdir=runs/indonlu_large \\
        --source=/data/indonlu [--override=train.num_epochs=3 ...] [--tasks=smsa,emot] [--seeds=1,2,3]

Each task runs `train_and_evaluate` with configs/indonlu.py:task=T,model=M in <workdir>/<task>,
or with --seeds once per seed (train.seed) in <workdir>/<task>/seed_<s>. Writes <workdir>/table.md
and table.csv: F1 x 100 per task ("mean (std)" over the finished seeds with --seeds), the
classification average (5 tasks) and the sequence-labelling average (7) (with --seeds: mean (std)
over seeds of each seed's average), one row per evaluated split; and, when the source has the
test files, the leaderboard submission (<workdir>/submission/<task>/pred.txt and <task>.zip, in
the format of IndoNLP/indonlu's submission_examples; with --seeds, from the first seed).

Rerunning skips finished runs (results.json present, same config) and resumes unfinished ones.
Every task's config (with the overrides) is built before any training, so a bad --override fails
at once; a run that fails is reported under the table and in the exit status, and the other
tasks still run (finetune.sweep.run_cell, as the learning-rate sweep does).
"""
from __future__ import annotations

import json
import os

from absl import app, flags

from configs import indonlu as indonlu_config
from finetune.sweep import run_seeds
from nli_jax import storage, tables
from nli_jax.data import indonlu as indonlu_data
from nli_jax import cli

flags.DEFINE_string("model", "large", f"one of {sorted(indonlu_config.MODELS)}")
flags.DEFINE_string("workdir", None, "output directory")
flags.DEFINE_string("source", "", "IndoNLU dataset root (one folder per task); empty = download")
flags.DEFINE_list("tasks", list(indonlu_config.TASKS), "tasks to run")
flags.DEFINE_bool("cpu_test", False, "tiny from-scratch model (configs/indonlu.py's cpu_test variant)")
flags.DEFINE_multi_string("override", [], "config overrides key=value, e.g. train.num_epochs=3")
flags.DEFINE_list("seeds", [], "random restarts, e.g. 1,2,3: one run per seed, mean (std) in the table")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS

NAMES = {name: task.title for name, task in indonlu_data.TASKS.items()}
CLASSIFICATION, SEQUENCE = indonlu_data.CLASSIFICATION_TASKS, indonlu_data.SEQUENCE_LABELLING_TASKS


def table(runs: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """runs[task][seed] = that run's results.json (seed None without --seeds); one row per split."""
    header = ["split"] + [NAMES[t] for t in CLASSIFICATION] + ["cls avg"] + [NAMES[t] for t in SEQUENCE] + ["seq avg"]
    finished = [r for per_seed in runs.values() for r in per_seed.values()]
    splits = sorted({s for r in finished for s in r["splits"]}, key=lambda s: (s != "validation", s))
    seeds = sorted({seed for per_seed in runs.values() for seed in per_seed}, key=str)
    rows = []
    for split in splits:
        def score(task, seed):
            r = runs.get(task, {}).get(seed, {}).get("splits", {}).get(split)
            return None if r is None else r["f1"]

        def cell(task):
            return tables.format_mean_std([v for v in (score(task, seed) for seed in seeds) if v is not None])

        def average(tasks):
            # Each seed's average over the tasks (all of them finished), then mean (std) over seeds.
            per_seed = [[score(t, seed) for t in tasks] for seed in seeds]
            return tables.format_mean_std([sum(v) / len(v) for v in per_seed if None not in v])
        rows.append([split] + [cell(t) for t in CLASSIFICATION] + [average(CLASSIFICATION)]
                    + [cell(t) for t in SEQUENCE] + [average(SEQUENCE)])
    return header, rows


def write_tables(workdir: str, runs: dict[str, dict], model: str, seconds: dict[str, float],
                 failures: list[str] = (), seeds=()) -> str:
    header, rows = table(runs)
    tables.write_csv(storage.under(workdir, "table.csv"), header, rows)
    spread = f", mean (std) over seeds {', '.join(map(str, seeds))}" if seeds else ""
    title = (f"IndoNLU, model {model} (F1 x 100{spread}; averages over the 5 classification and 7 "
             "sequence-labelling tasks)")
    notes = [f"failed: {f}" for f in failures]
    notes += ["wall time per task (s): " + ", ".join(f"{NAMES[t]} {s:.0f}" for t, s in seconds.items()),
              f"total: {sum(seconds.values()):.0f} s"]
    return tables.write_markdown(storage.under(workdir, "table.md"), header, rows, title=title, notes=notes)


def write_submission(workdir: str, tasks, source: str, seeds) -> tuple[list[str], str | None]:
    """The IndoNLU leaderboard files (<workdir>/submission/<task>/pred.txt and <task>.zip) from the
    runs' test predictions: (paths, None), or ([], why not). Nothing is written unless every
    task has test predictions (the test files are optional in data.source)."""
    from nli_jax import leaderboard
    seed = seeds[0] if seeds else None
    with_test = []
    for task in tasks:
        try:
            path = leaderboard.predictions_path(os.path.join(workdir, task), seed)
        except leaderboard.SubmissionError:
            continue
        if any(json.loads(line).get("split") == "test" for line in storage.read_text(path).splitlines() if line.strip()):
            with_test.append(task)
    if not with_test:
        return [], "no test predictions (no test_preprocess.* files in the source)"
    try:
        return leaderboard.indonlu_submission(workdir, os.path.join(workdir, "submission"), tasks=list(tasks),
                                              source=source or None, seed=seed), None
    except leaderboard.SubmissionError as e:
        return [], str(e)


def task_configs(model: str, source: str, tasks, overrides=(), cpu_test: bool = False) -> dict:
    """Every task's config, built before any training so that a bad override fails at once."""
    configs = {}
    for task in tasks:
        config = indonlu_config.get_config(f"task={task},model={model}" + (",cpu_test" if cpu_test else ""))
        config.data.source = source
        cli.apply_overrides(config, overrides)
        configs[task] = config
    return configs


def built_model(model: str, configs: dict) -> str:
    """--model as the tables name it, with what the runs build when that is not its checkpoint
    (--cpu_test and a model.init / model.preset override replace it): `large`, or
    `large` (run: preset tiny-modernbert from scratch)."""
    built = sorted({c.model.init or f"preset {c.model.preset} from scratch" for c in configs.values()})
    return f"`{model}`" + ("" if built == [indonlu_config.MODELS[model][0]] else f" (run: {'; '.join(built)})")


def check_names(model: str, tasks) -> None:
    """--model and --tasks name known ones (a task name becomes a directory of the workdir): one
    line, before anything is read or written."""
    problems = []
    if model not in indonlu_config.MODELS:
        problems.append(f"--model={model}: unknown model (models: {', '.join(sorted(indonlu_config.MODELS))})")
    unknown = [t for t in tasks if t not in indonlu_config.TASKS]
    if unknown or not tasks:
        problems.append(f"--tasks={','.join(tasks)}: unknown task(s) {unknown} (tasks: "
                        f"{', '.join(indonlu_config.TASKS)})")
    if problems:
        raise cli.CommandLineError("; ".join(problems))


def run_benchmark(model: str, workdir: str, source: str, tasks, overrides=(), cpu_test: bool = False,
                  seeds=()) -> tuple[str, list[str]]:
    """Runs (or reads, when finished) every task x seed; returns table.md's text and the failures."""
    from nli_jax.workdir import check_tool_output
    check_names(model, tasks)
    check_tool_output(workdir, "--workdir", directory=True)  # its task runs are its own; the benchmark is inside no other run
    configs = task_configs(model, source, tasks, overrides, cpu_test)
    label = built_model(model, configs)
    runs, seconds, failures = {}, {}, []
    for task, config in configs.items():
        runs[task], seconds[task], failed = run_seeds(config, os.path.join(workdir, task), seeds, NAMES[task])
        failures += failed
        write_tables(workdir, runs, label, seconds, failures, seeds)  # readable while the benchmark runs
    written, why_not = write_submission(workdir, list(configs), source, seeds)
    if written:
        print(f"leaderboard submission: {os.path.join(workdir, 'submission')} ({len(written) // 2} tasks)")
    elif why_not and "no test predictions" not in why_not:
        failures.append(f"leaderboard submission: {why_not[:300]}")
    return write_tables(workdir, runs, label, seconds, failures, seeds), failures


def run(model: str, workdir: str, source: str, tasks, overrides=(), cpu_test: bool = False, seeds=()) -> str:
    return run_benchmark(model, workdir, source, tasks, overrides, cpu_test, seeds)[0]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        raise cli.CommandLineError(f"--seeds={','.join(FLAGS.seeds)}: seeds are integers, e.g. 1,2,3") from None
    text, failures = run_benchmark(FLAGS.model, FLAGS.workdir, FLAGS.source, FLAGS.tasks, FLAGS.override,
                                   FLAGS.cpu_test, seeds)
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    cli.run_tool(main)
