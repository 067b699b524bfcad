"""The held-out-dataset protocol of Laurer et al. (2023) for a universal classifier: for each task
of --tasks, one universal_nli run trained on NLI (mapped to binary) and every other task recast
as NLI pairs, then scored zero-shot on the held-out task's split with its own metric, beside the
majority-class baseline.

    python -m finetune.universal_heldout --config=configs/universal_nli.py --tasks=smsa,emot,wrete,casa,hoasa \\
        --seeds=1,2,3 --workdir=runs/heldout --config.data.source=../shared/data/indonli \\
        --config.task_options.recast_source=../shared/data/indonlu

Each cell trains in DIR/heldout_<task>/seed_<s> (resumable; a finished cell is read back, as
finetune.sweep does) and is scored zero-shot into DIR/heldout_<task>/seed_<s>/zero_shot; a
held-out task whose runs would train on the same tasks as an earlier one's is scored with that
one's run (into its zero_shot_<task>). A held-out task's run never trains on a task it shares
texts with (NusaX-Senti and SmSA: nli_jax.data.provenance). --heldout_only tasks are held out
and scored but never recast into the others' runs (a task whose data is elsewhere: NusaX-Senti).
The held-out task's data is read from task_options.recast_source unless --task_override says
otherwise (`key=value` for every held-out task, `task:key=value` for one). Every split of the
held-out task named --split or <split>_<suffix> is scored, a table row each (NusaX-Senti's
validation_<language>, with task_options.eval_languages). --ceiling also fine-tunes the same
model on each held-out task itself (DIR/ceiling_<task>/seed_<s>; --ceiling_seeds: for some seeds
only). Writes DIR/table.md (the primary metric x 100, mean (std) over seeds) and DIR/heldout.json
after every task.
"""
from __future__ import annotations

import os

from absl import app, flags
from ml_collections import config_flags

from nli_jax import storage
from nli_jax import cli
from nli_jax.heldout import overrides_for, recast_for, run_owner, table

config_flags.DEFINE_config_file("config", None, "the universal_nli config (path[:variant])", lock_config=True)
flags.DEFINE_string("workdir", None, "DIR/heldout_<task>/seed_<s> per cell; table.md and heldout.json at the top")
flags.DEFINE_list("tasks", None, "classification tasks, each held out once and recast for the others' runs")
flags.DEFINE_list("heldout_only", [], "tasks held out and scored zero-shot but never recast into the others' runs")
flags.DEFINE_list("seeds", ["1"], "random restarts (train.seed) per held-out task")
flags.DEFINE_string("split", "validation", "the held-out task's split scored zero-shot")
flags.DEFINE_multi_string("task_override", [], "key=value for the held-out tasks' configs, task:key=value for one "
                          "(default data.source: task_options.recast_source)")
flags.DEFINE_bool("multi_label", False, "score labels as the pipeline's multi_label=True")
flags.DEFINE_list("ceiling_seeds", [], "the seeds of the ceiling runs (default: every seed of --seeds)")
flags.DEFINE_bool("ceiling", False, "also fine-tune the same model on each held-out task itself (DIR/ceiling_<task>/"
                  "seed_<s>, the config's model, optimizer and training settings): the table's ceiling column")
flags.mark_flags_as_required(["config", "workdir", "tasks"])
FLAGS = flags.FLAGS


def heldout_config(config, heldout: str, tasks, seed: int):
    """The universal run's config with the tasks of recast_for(heldout) recast, at `seed`."""
    from finetune.sweep import with_lr_and_seed
    cell = with_lr_and_seed(config, seed=seed)
    with cell.unlocked():
        cell.task_options.recast_tasks = ",".join(recast_for(heldout, tasks))
    return cell


def target_config(config, task: str, overrides):
    """The held-out task's config: its defaults, data from recast_source, then `overrides`."""
    from nli_jax.plan import default_config
    from nli_jax.tasks import options_config
    target = default_config(task, options_config(task))
    target.data.source = config.task_options.recast_source
    target.data.tfds_dir = config.data.tfds_dir
    cli.apply_overrides(target, overrides_for(task, overrides))
    return target


def scored_splits(target, split: str) -> tuple[str, ...]:
    """`split` and the task's `<split>_<suffix>` splits (NusaX-Senti's validation_<language>)."""
    from nli_jax.planner import build_plan
    from nli_jax.tasks import create_task
    names = create_task(build_plan(target, training=False)).load(None)
    return (split, *sorted(n for n in names if n.startswith(split + "_")))


def ceiling_config(config, task: str, overrides, seed: int):
    """The held-out task fine-tuned on itself with the universal run's model, optimizer and
    training settings: the ceiling a zero-shot score is read against."""
    target = target_config(config, task, overrides)
    with target.unlocked():
        for section in ("model", "optimizer", "train"):
            target[section] = config[section].copy_and_resolve_references()
        target.data.max_seq_length = config.data.max_seq_length
        target.train.seed = seed
        target.seeds = ()
    return target


def _ceiling(config, heldout, seed, workdir):
    from finetune.sweep import run_cell
    from nli_jax.errors import RunError
    run_dir = storage.under(workdir, f"ceiling_{heldout}", f"seed_{seed}")
    outcome = run_cell(ceiling_config(config, heldout, FLAGS.task_override, seed), run_dir)
    if outcome["status"] == "failed":
        raise RunError(f"{run_dir}: training failed: {outcome['error']}")
    return outcome["results"]


def _cell(config, tasks, named, heldout, seed, workdir, canary):
    from finetune.sweep import run_cell
    from nli_jax.errors import RunError
    from nli_jax.zero_shot import classify
    owner = run_owner(heldout, named, tasks)
    run_dir = storage.under(workdir, f"heldout_{owner}", f"seed_{seed}")
    outcome = run_cell(heldout_config(config, heldout, tasks, seed), run_dir, canary=canary)
    if outcome["status"] == "failed":
        raise RunError(f"{run_dir}: training failed: {outcome['error']}")
    scored = storage.under(run_dir, "zero_shot" if owner == heldout else f"zero_shot_{heldout}")
    done = storage.read_json_object(os.path.join(scored, "results.json"))
    if done is not None:  # scored by an earlier attempt
        return done
    target = target_config(config, heldout, FLAGS.task_override)
    return classify(run_dir, target, workdir=scored, splits=scored_splits(target, FLAGS.split),
                    multi_label=FLAGS.multi_label)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    from nli_jax.errors import RunError
    from nli_jax.tasks import TASKS
    from nli_jax.train.reporting import write_json
    tasks = [t.strip() for t in FLAGS.tasks if t.strip()]
    heldout_only = [t.strip() for t in FLAGS.heldout_only if t.strip()]
    named = tasks + heldout_only
    unknown = [t for t in named if t not in TASKS]
    if len(named) < 2 or unknown or len(set(named)) != len(named):
        raise RunError(f"--tasks={','.join(FLAGS.tasks)} --heldout_only={','.join(FLAGS.heldout_only)}: at least "
                       "two distinct registered tasks, none named twice" + (f"; unknown {unknown}" if unknown else ""))
    config = FLAGS.config
    if config.task != "universal_nli":
        raise RunError(f"--config is a config of task {config.task!r}, not universal_nli")
    # Every held-out task's data and splits, read before any training.
    splits = {t: scored_splits(target_config(config, t, FLAGS.task_override), FLAGS.split) for t in named}
    rows = {}
    for heldout in named:
        not_recast = [t for t in tasks if t != heldout and t not in recast_for(heldout, tasks)]
        keys = {split: heldout if split == FLAGS.split else f"{heldout} {split}" for split in splits[heldout]}
        for key in keys.values():
            rows[key] = {"seeds": [], "zero_shot": [], "majority": [], "ceiling": [], "not_recast": not_recast}
        for seed in (int(s) for s in FLAGS.seeds):
            results = _cell(config, tasks, named, heldout, seed, FLAGS.workdir, canary=len(rows) == len(keys))
            ceiling = (_ceiling(config, heldout, seed, FLAGS.workdir)["splits"]
                       if FLAGS.ceiling and (not FLAGS.ceiling_seeds or str(seed) in FLAGS.ceiling_seeds) else {})
            for split, key in keys.items():
                row, report = rows[key], results["splits"][split]
                row["metric"] = results["primary_metric"]
                row["seeds"].append(seed)
                row["zero_shot"].append(report[row["metric"]])
                row["majority"].append(report["majority_baseline"][row["metric"]])
                if split in ceiling:
                    row["ceiling"].append(ceiling[split][row["metric"]])
                    row.setdefault("ceiling_seeds", []).append(seed)
        storage.write_text(storage.under(FLAGS.workdir, "table.md"), table(rows))
        write_json(storage.under(FLAGS.workdir, "heldout.json"), rows)
    print(table(rows), end="")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    cli.run(main)
