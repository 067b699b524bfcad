"""Learning rate x seed grid, as the papers tune: one run per cell, lr chosen by mean validation.

    python -m finetune.sweep --config=configs/indonli_large.py --lrs=1e-5,3e-5,1e-6 --seeds=1,2,3 \\
        --workdir=DIR [--config.train.num_epochs=3 ...]
    python -m finetune.sweep --config=configs/indonli_large.py:cpu_test --lrs=1e-3,3e-4 --seeds=1,2 \\
        --workdir=/tmp/sweep

Each cell runs `train_and_evaluate` with optimizer.lr and train.seed set, in DIR/lr_<lr>/seed_<seed>.
Writes, after every cell: DIR/table.md and table.csv (one row per lr: the primary metric x 100 as
"mean (std)" over the finished seeds on every evaluated split; the lr with the best mean
validation score marked), DIR/sweep.json (every cell's per-split values, status, error; the
selected lr) and DIR/sweep.log.

Rerunning the command continues the sweep: a finished cell (results.json present, saved config
equal to this command's) is skipped; an unfinished one resumes from its own checkpoints.

Failures. A cell that raises is recorded as failed (sweep.json, the tables' notes) and the other
cells still run; the command then exits 1. Input that would fail every cell fails once, before
any compute, instead: an unknown --config key stops flag parsing; and the first cell this command
does not skip (the canary) has its error re-raised, stopping the sweep, when it fails before its
training began: before its `checkpoints/` directory exists (the loop creates it only once the
config, workdir config, data, tokenizer, model and mesh are built, just before the first step),
or because its saved config differs from this command's. The canary's directory is removed when
this attempt created it, so the corrected command starts clean. Failures after the canary's
training began, and any failure of a later cell, are that cell's own.
"""
from __future__ import annotations

import json
import logging
import os
import time

from absl import app, flags
from ml_collections import config_flags

from nli_jax import storage, tables
from nli_jax.cli import CommandLineError

FLAGS = flags.FLAGS
log = logging.getLogger("finetune.sweep")


def define_flags() -> None:
    # Defined on demand, not at import: finetune.indonlu_benchmark imports run_cell and has flags of its own.
    config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:variant]).", lock_config=True)
    flags.DEFINE_string("workdir", None, "Sweep directory: DIR/lr_<lr>/seed_<seed> per cell, tables at the top.")
    flags.DEFINE_list("lrs", None, "Learning rates, e.g. 1e-5,3e-5,1e-6.")
    flags.DEFINE_list("seeds", ["1", "2", "3"], "Random restarts per learning rate (train.seed).")
    flags.mark_flags_as_required(["config", "workdir", "lrs"])


def with_lr_and_seed(config, lr: float | None = None, seed: int | None = None):
    """A copy of the config for one cell: one run (no `seeds` loop of its own)."""
    cell = config.copy_and_resolve_references()
    with cell.unlocked():
        cell.seeds = ()
        if lr is not None:
            cell.optimizer.lr = float(lr)
        if seed is not None:
            cell.train.seed = int(seed)
    return cell


def run_seeds(config, workdir: str, seeds, name: str) -> tuple[dict, float, list[str]]:
    """One benchmark row: `config` run (or read) once per seed in <workdir>/seed_<s>, or once in
    <workdir> when `seeds` is empty. ({seed or None: results}, seconds, failure lines named `name`)."""
    results, seconds, failures = {}, 0.0, []
    for seed in seeds or [None]:
        if seed is None:  # the single-run layout: <workdir>
            outcome = run_cell(config, workdir)
        else:
            outcome = run_cell(with_lr_and_seed(config, seed=seed), os.path.join(workdir, f"seed_{seed}"))
        seconds += outcome["seconds"]
        if "results" in outcome:
            results[seed] = outcome["results"]
        else:
            failures.append(f"{name}{'' if seed is None else f' seed {seed}'}: {outcome['error'][:300]}")
    return results, seconds, failures


def run_cell(config, workdir: str, *, canary: bool = False) -> dict:
    """Runs (or, when finished, reads) one training run: {"status": "finished"|"failed"|"skipped",
    "results" | "error", "seconds"}. Exceptions become "failed", except for the canary failing
    before its training began (see the module docstring), which is re-raised."""
    from nli_jax.tasks import options_class
    from nli_jax.train.loop import train_and_evaluate
    from nli_jax.planner import config_dict
    from nli_jax.workdir import check_config
    start = time.time()
    results_path = os.path.join(workdir, "results.json")
    if storage.isfile(results_path):
        try:
            # A finished run of another config is not this command's result.
            check_config(workdir, config_dict(config), options_class(config.task))
        except ValueError as e:
            if canary:
                log.error("%s: finished by a different config; stopping before any compute", workdir)
                raise
            return {"status": "failed", "error": f"{type(e).__name__}: {e}", "seconds": 0.0}
        return {"status": "skipped", "results": read_results(workdir), "seconds": 0.0}
    created = [d for d in (os.path.dirname(workdir), workdir) if not storage.exists(d)]
    try:
        results = train_and_evaluate(config, workdir)
    except Exception as e:
        if canary and not storage.isdir(os.path.join(workdir, "checkpoints")):
            for d in created:  # only config.json and train.log: nothing computed
                storage.rmtree(d)
            log.error("%s failed before its training began; stopping: every cell would fail the same way", workdir)
            raise
        log.exception("%s failed", workdir)
        return {"status": "failed", "error": f"{type(e).__name__}: {e}", "seconds": time.time() - start}
    return {"status": "finished", "results": results, "seconds": time.time() - start}


def read_results(workdir: str) -> dict | None:
    """A cell's results.json, None when it has none; one error naming it when it cannot be read
    (cut by a full disk or a kill while written by an older nli-jax, or edited)."""
    from nli_jax.errors import RunError
    path = os.path.join(workdir, "results.json")
    try:
        results = storage.read_json_object(path)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, not an object
        raise RunError(f"{path} is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:120]}): not the results "
                       f"of a finished cell; move it away and rerun the sweep (the cell's run, {workdir}, then "
                       "evaluates its parameters again)") from None
    if results is not None and not isinstance(results.get("splits"), dict):
        raise RunError(f"{path} has no 'splits': not the results nli-jax writes; move it away and rerun the sweep")
    return results


def lr_name(lr: float) -> str:
    return f"{lr:g}"


def split_order(plan, cells) -> list[str]:
    """validation first, then the plan's eval_splits order (the papers' dev / test columns)."""
    seen = {s for c in cells for s in c.get("splits", {})}
    order = ["validation"] + [s for s in plan.eval_splits if s != "validation"]
    return [s for s in order if s in seen] + sorted(seen - set(order))


def summarize(plan, cells: list[dict], lrs: list[float], seeds: list[int]) -> dict:
    splits = split_order(plan, cells)
    rows = []
    for lr in lrs:
        finished = [c for c in cells if c["lr"] == lr and c["status"] == "finished"]
        rows.append({"lr": lr, "seeds_finished": len(finished),
                     "splits": {s: tables.mean_std([c["splits"][s] for c in finished if s in c["splits"]])
                                for s in splits}})
    candidates = [r for r in rows if r["splits"].get("validation", {}).get("n")]
    # max() keeps the first of equal means: ties go to the lr listed first in --lrs.
    selected = max(candidates, key=lambda r: r["splits"]["validation"]["mean"])["lr"] if candidates else None
    metric = next((c["primary_metric"] for c in cells if c.get("primary_metric")), None)  # the task's: one for all
    return {"task": plan.task, "primary_metric": metric,
            "model": os.path.basename(plan.model.init.rstrip("/")) or plan.model.preset,
            "lrs": lrs, "seeds": seeds, "splits": splits, "selected_lr": selected, "rows": rows, "cells": cells}


def write_outputs(workdir: str, summary: dict) -> str:
    metric = summary["primary_metric"] or "primary metric"
    header = ["model", "lr", "seeds"] + summary["splits"] + ["selected"]
    rows = []
    for r in summary["rows"]:
        selected = r["lr"] == summary["selected_lr"]
        rows.append([summary["model"], lr_name(r["lr"]), f"{r['seeds_finished']}/{len(summary['seeds'])}"]
                    + [tables.format_mean_std(r["splits"][s]["values"]) for s in summary["splits"]]
                    + ["*" if selected else ""])
    notes = [f"{c['status']}: lr {lr_name(c['lr'])} seed {c['seed']}: {c['error'][:300]}"
             for c in summary["cells"] if c["status"] == "failed"]
    pending = [f"lr {lr_name(c['lr'])} seed {c['seed']}" for c in summary["cells"] if c["status"] == "pending"]
    if pending:
        notes.append("not run yet: " + ", ".join(pending))
    selected = "none (no finished cell)" if summary["selected_lr"] is None else lr_name(summary["selected_lr"])
    notes.append(f"selected lr: {selected} (best mean validation {metric}); per-cell values in sweep.json")
    title = (f"{summary['task']}, {summary['model']}: {metric} x 100, mean (sample std) over seeds; "
             f"* = lr selected by mean validation {metric}")
    tables.write_csv(storage.under(workdir, "table.csv"), header, rows)
    text = tables.write_markdown(storage.under(workdir, "table.md"), header, rows, title=title, notes=notes)
    storage.write_text(storage.under(workdir, "sweep.json"), json.dumps(summary, indent=2))
    return text


def run_sweep(config, workdir: str, lrs: list[float], seeds: list[int]) -> dict:
    """Runs every (lr, seed) cell not finished yet; returns sweep.json's contents (plus "table")."""
    from nli_jax.planner import build_plan
    from nli_jax.workdir import check_tool_output
    check_tool_output(workdir, "--workdir", directory=True)  # its cells are its own runs; the sweep is inside no other run
    plan = build_plan(config, training=False)  # the sweep's task, splits and model (the cells check the rest)
    cells = [{"lr": lr, "seed": seed, "workdir": os.path.join(workdir, f"lr_{lr_name(lr)}", f"seed_{seed}"),
              "status": "pending"} for lr in lrs for seed in seeds]
    for cell in cells:  # every finished cell's results read before any compute: a cut one stops the sweep now
        read_results(cell["workdir"])
    canary = True
    for cell in cells:
        outcome = run_cell(with_lr_and_seed(config, cell["lr"], cell["seed"]), cell["workdir"], canary=canary)
        if outcome["status"] != "skipped":
            canary = False
        cell["status"] = "finished" if outcome["status"] == "skipped" else outcome["status"]
        cell["seconds"] = round(outcome["seconds"], 1)
        if "results" in outcome:
            results = outcome["results"]
            metric = results["primary_metric"]
            cell["primary_metric"] = metric
            cell["splits"] = {s: r[metric] for s, r in results["splits"].items()}
            # Expected calibration error per split, raw and temperature-scaled (hooks.calibration).
            cell["ece"] = {s: {k: r["calibration"][k]["ece"] for k in ("raw", "temperature_scaled")
                               if k in r["calibration"]}
                           for s, r in results["splits"].items() if r.get("calibration")}
        else:
            cell["error"] = outcome["error"]
        log.info("lr %s seed %d: %s%s", lr_name(cell["lr"]), cell["seed"], outcome["status"],
                 f" ({cell['seconds']:.0f} s)" if outcome["status"] == "finished" else
                 f": {cell['error']}" if outcome["status"] == "failed" else " (results.json present)")
        # Tables after every cell: a long sweep can be read while it runs.
        summary = summarize(plan, cells, lrs, seeds)
        summary["table"] = write_outputs(workdir, summary)
    return summary


def setup_sweep_log(workdir: str) -> None:
    log.setLevel(logging.INFO)
    log.propagate = False
    fmt = logging.Formatter("%(asctime)s sweep: %(message)s", "%H:%M:%S")
    # gs://: a local file uploaded every few seconds
    for handler in (logging.StreamHandler(), storage.LogFile(storage.under(workdir, "sweep.log"))):
        handler.setFormatter(fmt)
        log.addHandler(handler)


def parse_grid(lrs: list[str], seeds: list[str]) -> tuple[list[float], list[int]]:
    try:
        lr_values, seed_values = [float(x) for x in lrs], [int(x) for x in seeds]
    except ValueError as e:
        raise CommandLineError(f"--lrs={','.join(lrs)} --seeds={','.join(seeds)}: --lrs takes numbers and --seeds "
                               f"integers ({e})") from None
    if not lr_values or not seed_values or min(lr_values) <= 0:
        raise CommandLineError("--lrs needs positive learning rates and --seeds at least one seed")
    if len({lr_name(x) for x in lr_values}) < len(lr_values) or len(set(seed_values)) < len(seed_values):
        raise CommandLineError(f"repeated value in --lrs={lrs} or --seeds={seeds}")
    return lr_values, seed_values


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it writes at INFO
    lrs, seeds = parse_grid(FLAGS.lrs, FLAGS.seeds)
    from nli_jax.workdir import check_tool_output
    check_tool_output(FLAGS.workdir, "--workdir", directory=True)  # before sweep.log: its cells are its own runs, it is in none
    setup_sweep_log(FLAGS.workdir)
    log.info("%d learning rates x %d seeds in %s", len(lrs), len(seeds), FLAGS.workdir)
    summary = run_sweep(FLAGS.config, FLAGS.workdir, lrs, seeds)
    print(summary["table"])
    failed = [c for c in summary["cells"] if c["status"] == "failed"]
    if failed:
        log.error("%d of %d cells failed (see %s)", len(failed), len(summary["cells"]),
                  os.path.join(FLAGS.workdir, "sweep.json"))
        return 1
    return 0


if __name__ == "__main__":
    define_flags()
    from nli_jax import cli
    cli.run(main)
