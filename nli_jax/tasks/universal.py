"""A universal classifier (Laurer et al., 2023): binary entailment / not-entailment, trained on
NLI mapped to binary (IndoNLI: neutral and contradiction become not-entailment) and on labelled
classification tasks recast as NLI pairs, then used zero-shot on a task held out of training
(nli_jax.zero_shot; finetune.universal_heldout runs the protocol).

Recasting is generic: any classification task (one label per text, per aspect, or a sentence
pair) plugs in by name through its own loader and its verbaliser (nli_jax.verbalizers: the
defaults by label set, or none and it is refused). Each training example becomes its true
label's hypothesis as entailment and the other labels' hypotheses as not-entailment (per aspect
for a multi-aspect task; a pair task's second text is the hypothesis, its label the outcome),
after at most `max_per_class` examples of each class are kept (drawn with `recast_seed`), as
Laurer et al. cap every class of their datasets.

    python -m finetune.main --config=configs/universal_nli.py --workdir=runs/universal \\
        --config.task_options.recast_tasks=smsa,emot --config.task_options.recast_source=../shared/data/indonlu

The task also reads any NLI checkpoint's pairs for zero-shot scoring: bound to the checkpoint's
labels (three-way IndoNLI, MNLI's order, binary), it encodes premise-hypothesis pairs as every
NLI task does.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from nli_jax.data.records import InMemorySource
from nli_jax.errors import RunError
from nli_jax.metrics import accuracy, precision_recall_f1
from nli_jax.plan import option
from nli_jax.tasks.base import TASK_OPTIONS, TASKS, register
from nli_jax.tasks.common import ClassificationTask, MultiAspectTask
from nli_jax.tasks.indonli import INDONLI
from nli_jax.tasks.nli import NLIOptions, NLITask, reindex
from nli_jax.verbalizers import ASPECTS, PAIR, SINGLE, Verbalizer, verbalizer_for

BINARY_LABELS = ("entailment", "not_entailment")
ENTAILMENT, NOT_ENTAILMENT = 0, 1


@dataclasses.dataclass(frozen=True)
class UniversalOptions(NLIOptions):
    # Classification tasks recast as NLI pairs for training ("smsa,emot,wrete"); each reads its
    # data from recast_source.
    recast_tasks: str = option("")
    recast_source: str = option("", path=True)  # the recast tasks' data.source (IndoNLU's folder, ...)
    max_per_class: int = option(500, low=1)  # examples kept per class of each recast task (Laurer's cap)
    recast_seed: int = option(0, low=0)  # which examples a cap keeps
    include_nli: bool = option(True)  # the NLI corpus of data.source (IndoNLI) mapped to binary
    max_nli_examples: int = option(0, low=0)  # > 0: the NLI corpus's first N training pairs only (file order)
    # > 0: each dataset's first N validation examples (by idx) only; the validation split drives the
    # best checkpoint, and recast aspect tasks multiply it (HoASA: 40 pairs an example).
    max_validation_examples: int = option(0, low=0)


def task_kind(task) -> str:
    """single, aspects or pair (nli_jax.verbalizers) for a classification task; refused otherwise."""
    if isinstance(task, MultiAspectTask):
        return ASPECTS
    if isinstance(task, ClassificationTask) and not isinstance(task, NLITask):
        return PAIR if getattr(getattr(task, "spec", None), "kind", None) == "pair" else SINGLE
    raise RunError(f"task {task.name!r} is not a classification task (one label per text, per aspect, or per "
                   "sentence pair): it has no label hypotheses")


def example_texts(example: dict, kind: str) -> tuple[str, str | None]:
    """(the text, and a pair task's second text) of a classification example."""
    if kind == PAIR:
        for a, b in (("text_a", "text_b"), ("premise", "hypothesis")):
            if example.get(a) is not None and example.get(b) is not None:
                return example[a], example[b]
    else:
        for field in ("text", "text_a", "sentence", "premise"):
            if isinstance(example.get(field), str):
                return example[field], None
    raise RunError(f"an example of fields {sorted(example)} has no text field nli-jax knows "
                   "(text, text_a/text_b, premise/hypothesis)")


def gold_labels(task, example: dict) -> list[str]:
    """An example's gold label names: one, or one per aspect."""
    if isinstance(task, MultiAspectTask):
        return list(example["labels"])
    return [task.label_name(example)]


def cap_per_class(task, examples: list[dict], max_per_class: int, seed: int) -> list[dict]:
    """At most `max_per_class` examples of each class, drawn with `seed`, in their original order.
    For a multi-aspect task each aspect's label is a class of its own ((aspect, label): 40 on
    HoASA, whose label tuples are nearly all distinct): an example is kept with the aspects it was
    drawn for (`recast_aspects`), and recast for those only."""
    rng = np.random.default_rng(seed)
    if isinstance(task, MultiAspectTask):
        aspects_of: dict[int, list[int]] = {}
        for a in range(len(task.aspects)):
            by_label: dict = {}
            for i, e in enumerate(examples):
                by_label.setdefault(e["labels"][a], []).append(i)
            for key in sorted(by_label, key=str):
                positions = by_label[key]
                drawn = positions if len(positions) <= max_per_class else rng.choice(positions, max_per_class, replace=False)
                for i in drawn:
                    aspects_of.setdefault(int(i), []).append(a)
        if all(len(v) == len(task.aspects) for v in aspects_of.values()) and len(aspects_of) == len(examples):
            return list(examples)  # nothing capped
        return [dict(examples[i], recast_aspects=tuple(sorted(aspects_of[i]))) for i in sorted(aspects_of)]
    by_class: dict = {}
    for i, e in enumerate(examples):
        by_class.setdefault(tuple(gold_labels(task, e)), []).append(i)
    kept = []
    for key in sorted(by_class, key=str):
        positions = by_class[key]
        kept += positions if len(positions) <= max_per_class else list(rng.choice(positions, max_per_class, replace=False))
    return [examples[i] for i in sorted(kept)]


def recast(task, verbalizer: Verbalizer, examples: list[dict], origin: str) -> list[dict]:
    """Binary NLI pairs of a classification task's examples (module docstring); the pairs of an
    example stay together, the true label's first."""
    out = []
    for e in examples:
        text, second = example_texts(e, verbalizer.kind)
        pairs = []
        if verbalizer.kind == PAIR:
            outcome = verbalizer.phrases[task.label_name(e)]
            pairs.append((verbalizer.template.format(second), BINARY_LABELS.index(outcome)))
        else:
            aspects = task.aspects if verbalizer.kind == ASPECTS else (None,)
            kept = e.get("recast_aspects")  # cap_per_class's choice for a multi-aspect task; else all
            for a, (aspect, gold) in enumerate(zip(aspects, gold_labels(task, e))):
                if kept is not None and a not in kept:
                    continue
                pairs.append((verbalizer.hypothesis(gold, aspect), ENTAILMENT))
                pairs += [(verbalizer.hypothesis(label, aspect), NOT_ENTAILMENT) for label in task.labels if label != gold]
        for hypothesis, label in pairs:
            out.append({"idx": len(out), "id": f"{origin}:{e.get('id', e['idx'])}:{len(out)}", "premise": text,
                        "hypothesis": hypothesis, "label": label, "categories": {"origin": origin}, "tags": []})
    return out


def binary_nli(examples, origin: str) -> list[dict]:
    """NLI examples (entailment / neutral / contradiction) as entailment / not-entailment."""
    return [dict(e, label=ENTAILMENT if e["label"] == 0 else NOT_ENTAILMENT,
                 categories={**e["categories"], "origin": origin}) for e in examples]


class UniversalNLI(NLITask):
    """Binary entailment over NLI and recast classification pairs (module docstring)."""
    labels = ()  # binary when trained; an NLI checkpoint's own when it scores pairs (Task.bind)
    primary_metric = "f1"

    def __init__(self, plan):
        super().__init__(INDONLI, plan.data, plan.task_options)
        self.name = "universal_nli"
        self.labels = ()  # binary when trained (labels_from); an NLI checkpoint's own when it scores pairs
        self.plan = plan

    def labels_from(self, splits):
        return BINARY_LABELS

    def recast_task_names(self) -> list[str]:
        return [n.strip() for n in self.options.recast_tasks.split(",") if n.strip()]

    def trained_task_names(self):
        return (("indonli",) if self.options.include_nli else ()) + tuple(self.recast_task_names())

    def plan_problems(self, plan):
        names = self.recast_task_names()
        problems = [f"task_options.recast_tasks names unknown task {n!r}" for n in names if n not in TASKS]
        if len(set(names)) != len(names):
            problems.append(f"task_options.recast_tasks={self.options.recast_tasks!r} names a task twice")
        if not names and not self.options.include_nli:
            problems.append("task_options: no training data (recast_tasks empty and include_nli off)")
        return problems

    def recast_task(self, name: str):
        """Task `name` built from this plan with its data in recast_source and its default options."""
        plan = dataclasses.replace(self.plan, task=name, task_options=TASK_OPTIONS[name](),
                                   data=dataclasses.replace(self.plan.data, source=self.options.recast_source))
        return TASKS[name](plan)

    def possible_splits(self):
        return {"train", "validation"}

    def load(self, workdir=None):
        train, validation = [], []
        if self.options.include_nli:
            nli = super().load(workdir)
            cap = self.options.max_nli_examples or len(nli["train"])
            train += binary_nli((nli["train"][i] for i in range(min(cap, len(nli["train"])))), "indonli")
            kept = self.options.max_validation_examples or len(nli["validation"])
            validation += binary_nli((nli["validation"][i] for i in range(min(kept, len(nli["validation"])))), "indonli")
        for name in self.recast_task_names():
            task = self.recast_task(name)
            kind = task_kind(task)
            verbalizer = verbalizer_for(name, task.labels, kind)
            splits = task.load(workdir)
            for split, out in (("train", train), ("validation", validation)):
                if split not in splits:
                    raise RunError(f"task_options.recast_tasks: task {name!r} has no {split} split in "
                                   f"{self.options.recast_source!r}")
                examples = sorted((splits[split][i] for i in range(len(splits[split]))), key=lambda e: e["idx"])
                if split == "train":
                    examples = cap_per_class(task, examples, self.options.max_per_class, self.options.recast_seed)
                elif self.options.max_validation_examples:
                    examples = examples[:self.options.max_validation_examples]
                out += recast(task, verbalizer, examples, name)
        return {"train": InMemorySource(reindex(train)), "validation": InMemorySource(reindex(validation))}

    def report(self, split, examples, predictions):
        gold = [e["label"] for e in examples]
        pred = [int(p) for p in predictions["prediction"]]
        out = {**precision_recall_f1(gold, pred), "accuracy": accuracy(gold, pred), "count": len(gold)}
        origins = sorted({e["categories"].get("origin", "") for e in examples})
        if len(origins) > 1:
            out["by_origin"] = {o: precision_recall_f1([g for g, e in zip(gold, examples) if e["categories"]["origin"] == o],
                                                       [p for p, e in zip(pred, examples) if e["categories"]["origin"] == o])
                                for o in origins}
        return out


register("universal_nli", options=UniversalOptions)(UniversalNLI)
