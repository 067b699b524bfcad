"""The contamination check of every fine-tuning run, as a run hook: at set-up (before the first
step) the training examples are compared with each evaluation split (nli_jax.data.overlap:
normalised exact matches and shared 8-word sequences); the counts go to the log and to
results.json (`overlap`). A split whose overlapping share is above MAX_SHARE is refused in one
line naming both splits' files and the count, unless `data.allow_overlap=True`; then the
overlapping examples are also scored apart: each such split's report gains `clean`, the scores
of its examples that do not overlap.

MAX_SHARE is 15%: the official splits of IndoNLI (58 of 2,197 validation pairs, 2.6%), SmSA
(26 of 1,260, 2.1%) and EmoT (14 of 440, 3.2%) pass; NusaX-Indonesian's validation split
against SmSA's training split (74 of 100) does not (docs/finetuning.md lists every count).
"""
from __future__ import annotations

import dataclasses

from nli_jax import storage
from nli_jax.data import overlap, provenance
from nli_jax.data.records import read_many
from nli_jax.errors import RunError
from nli_jax.hooks import HOOKS, HookOptions, RunHook
from nli_jax.options import option
from nli_jax.planner import build_plan, saved_config
from nli_jax.tasks import create_task
from nli_jax.train.run_init import is_run_directory
from nli_jax.train.setup import training_examples
from nli_jax.train.reporting import log

MAX_SHARE = 0.15


class OverlapError(RunError):
    """An evaluation split that overlaps the training examples beyond MAX_SHARE."""


def split_description(task, split: str) -> str:
    """A split's file(s) when the task can tell (Task.split_file), else its name and data.source."""
    path = task.split_file(split)
    return path if path else f"split {split!r} of {task.name} (data.source={task.data.source!r})"


def earlier_training(path: str) -> list[tuple[str, str, list[dict]]]:
    """(workdir, its training files, its training examples) of the run in `path` (a sequential
    run's model.init) and of every run that one started from in turn: what the encoder has seen
    besides the run's own training split."""
    out, seen = [], set()
    while is_run_directory(path) and storage.resolve(path) not in seen:
        workdir = storage.resolve(path)
        seen.add(workdir)
        plan = build_plan(saved_config(workdir), training=False)
        task = create_task(plan)
        out.append((workdir, split_description(task, task.train_split),
                    _examples(training_examples(plan, task, task.load(workdir)))))
        path = plan.model.init
    return out


def _examples(source) -> list[dict]:
    """Every example of a random-access source, in one batched read where it has one."""
    return read_many(source, range(len(source)))


@dataclasses.dataclass(frozen=True)
class OverlapOptions(HookOptions):
    # On in every fine-tuning run; whether an overlapping split may run is the run's data.allow_overlap.
    enabled: bool = option(True)


@HOOKS.register("overlap", options=OverlapOptions)
class OverlapHook(RunHook):
    def __init__(self, found: dict[str, overlap.Overlap], idx: dict[str, set], allowed: bool,
                 earlier: dict[str, dict[str, overlap.Overlap]] | None = None):
        self.found, self.idx, self.allowed = found, idx, allowed
        self.earlier = earlier or {}  # split -> {an earlier run's workdir: its overlap} (sequential runs)

    @classmethod
    def for_training(cls, run, train_source, options):
        if run.plan.pretrain is not None:  # pretraining's held-out segments are its own concern
            return None
        task = run.task
        # A translation shares no text with its source: the model.init chain's datasets are
        # checked by name (a task registers its texts_from: NusaX-Senti's texts are SmSA's).
        translated = provenance.translated_training(run.plan.model.init, task.name) if run.plan.model.init else None
        if translated and not run.plan.data.allow_overlap:
            raise OverlapError(f"model.init={run.plan.model.init}: {translated}: this run's scores on {task.name} "
                               "would be scores on translations of its encoder's training data; pass "
                               "--config.data.allow_overlap=True to run anyway")
        evaluated = [s for s in dict.fromkeys((task.validation_split, *run.plan.eval_splits))
                     if s in run.splits and s != task.train_split and s != "train"]
        if not evaluated:
            return None
        index = overlap.TrainingIndex(_examples(train_source))
        # A sequential run's encoder was also trained on the runs it started from (model.init).
        earlier_runs = ([(workdir, files, overlap.TrainingIndex(examples)) for workdir, files, examples
                         in earlier_training(run.plan.model.init)] if run.init_from else [])
        found, idx, earlier, sides = {}, {}, {}, {}
        for split in evaluated:
            examples = _examples(run.splits[split])
            found[split] = result = overlap.compare(index, examples)
            sides[(split, split_description(task, task.train_split))] = result
            idx[split] = {int(examples[p]["idx"]) for p in result.positions}
            log.info("overlap %s with %s: %s", split, task.train_split, result.describe())
            for workdir, files, earlier_index in earlier_runs:
                earlier.setdefault(split, {})[workdir] = theirs = overlap.compare(earlier_index, examples)
                sides[(split, f"{files}, trained on by the run {workdir} this one starts from")] = theirs
                idx[split] |= {int(examples[p]["idx"]) for p in theirs.positions}
                log.info("overlap %s with the training split of %s: %s", split, workdir, theirs.describe())
        allowed = run.plan.data.allow_overlap
        refused = {side: r for side, r in sides.items() if r.share > MAX_SHARE}
        if refused and not allowed:
            (split, training), result = max(refused.items(), key=lambda item: item[1].share)
            others = sorted({s for s, _ in refused} - {split})
            raise OverlapError(
                f"{split_description(task, split)} overlaps the training examples "
                f"({training}): {result.describe()}, above the "
                f"{100 * MAX_SHARE:.0f}% a run accepts (its scores would be scores on training data"
                + (f"; also {', '.join(others)}" if others else "")
                + "); pass --config.data.allow_overlap=True to run anyway, the overlapping examples then also scored "
                  "apart")
        return cls(found, idx, allowed, earlier)

    def final_results(self, run, params, results, evaluations):
        results["overlap"] = {split: dict(result.as_dict(), train_split=run.task.train_split,
                                          **({"earlier_runs": {w: r.as_dict() for w, r in self.earlier[split].items()}}
                                             if split in self.earlier else {}))
                              for split, result in self.found.items()}
        if not self.allowed:
            return
        for split, evaluation in evaluations.items():
            dropped = self.idx.get(split)
            if not dropped or split not in results["splits"]:
                continue
            keep = [i for i, e in enumerate(evaluation.examples) if int(e["idx"]) not in dropped]
            if not keep:
                results["splits"][split]["clean"] = {"count": 0}
                continue
            predictions = {k: [v[i] for i in keep] for k, v in evaluation.predictions.items()}
            clean = run.task.report(split, [evaluation.examples[i] for i in keep], predictions)
            results["splits"][split]["clean"] = clean
            metric = run.task.primary_metric
            log.info("final %s without its %d overlapping examples: %s %.4f (%d examples)", split, len(dropped),
                     metric, clean[metric], clean["count"])
