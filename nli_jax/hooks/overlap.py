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

from nli_jax.data import overlap
from nli_jax.errors import RunError
from nli_jax.hooks import HOOKS, HookOptions, RunHook
from nli_jax.options import option
from nli_jax.train.reporting import log

MAX_SHARE = 0.15


class OverlapError(RunError):
    """An evaluation split that overlaps the training examples beyond MAX_SHARE."""


def split_description(task, split: str) -> str:
    """A split's file(s) when the task can tell (Task.split_file), else its name and data.source."""
    path = task.split_file(split)
    return path if path else f"split {split!r} of {task.name} (data.source={task.data.source!r})"


def _examples(source) -> list[dict]:
    """Every example of a random-access source, in one batched read where it has one."""
    get_many = getattr(source, "get_many", None)
    return get_many(list(range(len(source)))) if get_many else [source[i] for i in range(len(source))]


@dataclasses.dataclass(frozen=True)
class OverlapOptions(HookOptions):
    # On in every fine-tuning run; whether an overlapping split may run is the run's data.allow_overlap.
    enabled: bool = option(True)


@HOOKS.register("overlap", options=OverlapOptions)
class OverlapHook(RunHook):
    def __init__(self, found: dict[str, overlap.Overlap], idx: dict[str, set], allowed: bool):
        self.found, self.idx, self.allowed = found, idx, allowed

    @classmethod
    def for_training(cls, run, train_source, options):
        if run.plan.pretrain is not None:  # pretraining's held-out segments are its own concern
            return None
        task = run.task
        evaluated = [s for s in dict.fromkeys((task.validation_split, *run.plan.eval_splits))
                     if s in run.splits and s != task.train_split and s != "train"]
        if not evaluated:
            return None
        index = overlap.TrainingIndex(_examples(train_source))
        found, idx = {}, {}
        for split in evaluated:
            examples = _examples(run.splits[split])
            found[split] = result = overlap.compare(index, examples)
            idx[split] = {int(examples[p]["idx"]) for p in result.positions}
            log.info("overlap %s with %s: %s", split, task.train_split, result.describe())
        allowed = run.plan.data.allow_overlap
        refused = {s: r for s, r in found.items() if r.share > MAX_SHARE}
        if refused and not allowed:
            split, result = max(refused.items(), key=lambda item: item[1].share)
            raise OverlapError(
                f"{split_description(task, split)} overlaps the training examples "
                f"({split_description(task, task.train_split)}): {result.describe()}, above the "
                f"{100 * MAX_SHARE:.0f}% a run accepts (its scores would be scores on training data"
                + (f"; also {', '.join(s for s in refused if s != split)}" if len(refused) > 1 else "")
                + "); pass --config.data.allow_overlap=True to run anyway, the overlapping examples then also scored "
                  "apart")
        return cls(found, idx, allowed)

    def final_results(self, run, params, results, evaluations):
        results["overlap"] = {split: dict(result.as_dict(), train_split=run.task.train_split)
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
