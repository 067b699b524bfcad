"""Zero-shot classification with an NLI model, as transformers' zero-shot-classification
pipeline does it: each candidate label becomes a hypothesis (nli_jax.verbalizers), each text
the premise, and

- single-label: the labels' scores are a softmax over their hypotheses' entailment logits;
- multi-label (the pipeline's multi_label=True): each label's score is softmax([contradiction,
  entailment]) of its own pair, independently (a binary model's not-entailment takes the
  contradiction's place).

The model is an nli-jax run (its best parameters) or a Hugging Face directory of any family
nli-jax imports, whose labels name entailment (the pipeline's rule: a label starting with
"entail") and contradiction or not-entailment. Every (text, label) pair of a split goes through
the run's evaluation batches in one pass (N labels: N pairs per text, packed with the rest).

    model = load_model("runs/indonli")                       # or an exported / imported directory
    scores = model.scores(["Makanannya enak sekali."], ["positif", "negatif"], "Sentimen teks ini {}.")
    results = classify("runs/indonli", task_config, workdir="zs/smsa")   # a task's split, its metric

`python -m finetune.zero_shot` is the command (docs/zero_shot.md).
"""
from __future__ import annotations

import dataclasses
import re
import tempfile

import numpy as np

from nli_jax import storage
from nli_jax import workdir as workdir_lib
from nli_jax.errors import RunError
from nli_jax.metrics import calibration
from nli_jax.data import provenance
from nli_jax.plan import default_config
from nli_jax.tasks import create_task, options_config
from nli_jax.tasks.nli import NLITask
from nli_jax.tasks.universal import example_texts, task_kind
from nli_jax import planner
from nli_jax import tools
from nli_jax.train.checkpointing import Checkpointer
from nli_jax.train.reporting import log, setup_logging, write_json, write_jsonl
from nli_jax.train.setup import prepare
from nli_jax.verbalizers import ASPECTS, PAIR, SINGLE, Verbalizer, check_template, verbalizer_for

# The task an imported NLI checkpoint is scored through: premise-hypothesis pairs, any labels.
PAIR_TASK = "universal_nli"


@dataclasses.dataclass(frozen=True)
class NLIColumns:
    """Where an NLI model's logits hold entailment and its opposite (contradiction, or a binary
    model's not-entailment)."""
    entailment: int
    against: int
    labels: tuple[str, ...]

    def pipeline_contradiction(self) -> int:
        """The column transformers' pipeline takes as contradiction: the last when entailment is
        the first, else the first."""
        return len(self.labels) - 1 if self.entailment == 0 else 0


def _normal(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def nli_columns(labels, source: str) -> NLIColumns:
    """The entailment and contradiction (or not-entailment) columns of a model with `labels`,
    refused in one line naming them when there is no entailment label or a label nli-jax cannot
    map (only entailment, neutral and contradiction / not-entailment are known)."""
    labels = tuple(str(label) for label in (labels or ()))
    names = [_normal(label) for label in labels]
    entail = [i for i, n in enumerate(names) if n.startswith("entail")]
    against = [i for i, n in enumerate(names) if n.startswith(("contradict", "not_entail", "non_entail", "notentail"))]
    neutral = [i for i, n in enumerate(names) if n.startswith("neutral")]
    unknown = [labels[i] for i in range(len(labels)) if i not in (*entail, *against, *neutral)]
    if len(entail) != 1:
        which = (f"its labels {list(labels)} have {'no' if not entail else 'more than one'} entailment label" if labels
                 else "it names no labels (no id2label names in its config.json)")
        raise RunError(f"{source}: {which}: a zero-shot classifier needs an NLI model whose label names say which "
                       "output is entailment")
    if unknown or len(against) != 1 or len(neutral) > 1:
        raise RunError(f"{source}: labels {list(labels)} cannot be mapped to NLI outcomes ("
                       + (f"unknown {unknown}" if unknown else "no single contradiction or not-entailment label")
                       + "); nli-jax knows entailment, neutral and contradiction / not_entailment")
    return NLIColumns(entail[0], against[0], labels)


def pair_example(idx: int, premise: str, hypothesis: str) -> dict:
    """A premise-hypothesis pair in the NLI tasks' example format, unlabelled."""
    return {"idx": idx, "id": idx, "premise": premise, "hypothesis": hypothesis, "label": -1, "categories": {},
            "tags": []}


class ZeroShotModel:
    """An NLI model's run set-up and parameters, scoring premise-hypothesis pairs."""

    def __init__(self, run, params, columns: NLIColumns, checkpoint: str):
        self.run, self.params, self.columns, self.checkpoint = run, params, columns, checkpoint
        if self.columns.against != self.columns.pipeline_contradiction():
            log.warning("%s: contradiction is column %d of %s; transformers' pipeline takes column %d for "
                        "multi_label: its multi-label scores differ from these", checkpoint, columns.against,
                        list(columns.labels), self.columns.pipeline_contradiction())

    def logits(self, pairs: list[tuple[str, str]], name: str = "zero_shot") -> np.ndarray:
        """[pairs, NLI labels] logits, every pair in one pass of the run's evaluation batches."""
        if not pairs:
            return np.zeros((0, len(self.columns.labels)), np.float32)
        examples = [pair_example(i, premise, hypothesis) for i, (premise, hypothesis) in enumerate(pairs)]
        _, outputs = self.run.predict(self.params, examples, name)
        return np.stack([np.asarray(x, np.float32) for x in outputs["logits"]])

    def label_scores(self, logits: np.ndarray, multi_label: bool) -> np.ndarray:
        """[..., labels, NLI labels] logits -> [..., labels] scores (the pipeline's postprocess)."""
        logits = np.asarray(logits, np.float64)
        if multi_label:
            pair = logits[..., [self.columns.against, self.columns.entailment]]
            return calibration.softmax(pair)[..., 1]
        return calibration.softmax(logits[..., self.columns.entailment])

    def scores(self, texts: list[str], candidates: list[str], template: str, *, multi_label: bool = False) -> np.ndarray:
        """[texts, candidates] scores of `candidates` (phrases) for each text, hypotheses
        template.format(candidate): what pipeline(texts, candidates, hypothesis_template=template,
        multi_label=...) gives, in the candidates' order."""
        check_template(template, SINGLE)
        if not candidates:
            raise RunError("an empty label list: zero-shot classification needs at least one candidate label")
        pairs = [(text, template.format(c)) for text in texts for c in candidates]
        logits = self.logits(pairs).reshape(len(texts), len(candidates), -1)
        return self.label_scores(logits, multi_label or len(candidates) == 1)


def _checkpoint_labels(found: dict, checkpoint: str) -> tuple[list[str], object]:
    """(the checkpoint's label names, the plan of a run or None), before any weight is read."""
    if found["kind"] == "run":
        plan = planner.build_plan(planner.saved_config(checkpoint), training=False)
        info = Checkpointer.read_best_info(checkpoint) or {}
        task = create_task(plan)
        labels = info.get("labels") or list(getattr(task, "labels", ()) or ())
        return labels, plan
    return tools._hf_label_names(checkpoint) or [], None


def load_model(checkpoint: str, *, workdir: str | None = None, max_seq_length: int = 0, eval_batch_size: int = 0,
               allow_unfinished: bool = False) -> ZeroShotModel:
    """An NLI model for zero-shot scoring: a run's best parameters (its own config: length,
    batches) or a Hugging Face directory (read through task universal_nli; `max_seq_length`
    default 128). Its labels are checked (nli_columns) before any parameter is read."""
    found = tools.resolve_checkpoint(checkpoint)
    labels, plan = _checkpoint_labels(found, checkpoint)
    columns = nli_columns(labels, checkpoint)
    workdir = workdir or tempfile.mkdtemp(prefix="nli_jax_zero_shot_")
    if found["kind"] == "run":
        workdir_lib.require_finished(checkpoint, allow_unfinished)
        task = create_task(plan)
        if not isinstance(task, NLITask):
            raise RunError(f"{checkpoint}: a run of task {task.name!r}, which does not classify premise-hypothesis "
                           "pairs: zero-shot classification needs an NLI run (indonli, universal_nli, ...)")
        if task.options.hypothesis_only:
            raise RunError(f"{checkpoint}: trained with task_options.hypothesis_only: it never reads the premise, "
                           "so it cannot classify a text")
        if max_seq_length or eval_batch_size:
            config = planner.saved_config(checkpoint)
            config.data.max_seq_length = max_seq_length or config.data.max_seq_length
            config.train.eval_batch_size = eval_batch_size or config.train.eval_batch_size
            plan = planner.build_plan(config, training=False)
        run, params = tools._run_checkpoint_setup(plan, workdir, checkpoint, found["config"], splits={})
        return ZeroShotModel(run, params, columns, checkpoint)
    config = default_config(PAIR_TASK, options_config(PAIR_TASK))
    config.model.init = checkpoint
    config.data.max_seq_length = max_seq_length or 128
    if eval_batch_size:
        config.train.eval_batch_size = eval_batch_size
    plan = planner.build_plan(config, training=False)
    run = prepare(plan, workdir, splits={}, labels=list(columns.labels))
    return ZeroShotModel(run, run.params, columns, checkpoint)


# --- a task's split classified zero-shot ------------------------------------------------------

def hypotheses(task, verbalizer: Verbalizer) -> list[list[str]]:
    """The hypotheses of one text: per aspect (one row for a single-label task), per label."""
    if verbalizer.kind == ASPECTS:
        return [[verbalizer.hypothesis(label, aspect) for label in task.labels] for aspect in task.aspects]
    return [[verbalizer.hypothesis(label) for label in task.labels]]


def score_examples(model: ZeroShotModel, task, verbalizer: Verbalizer, examples: list[dict], *,
                   multi_label: bool = False, name: str = "zero_shot") -> np.ndarray:
    """[examples, labels] scores ([examples, aspects, labels] for a multi-aspect task); every
    example's pairs in one pass."""
    n_labels = len(task.labels)
    if verbalizer.kind == PAIR:
        texts = [example_texts(e, PAIR) for e in examples]
        logits = model.logits([(a, verbalizer.template.format(b)) for a, b in texts], name)
        if multi_label:
            entail = model.label_scores(logits[:, None, :], True)[:, 0]
        else:
            entail = calibration.softmax(np.asarray(logits, np.float64))[:, model.columns.entailment]
        outcomes = [verbalizer.phrases[label] for label in task.labels]
        others = max(outcomes.count("not_entailment"), 1)
        return np.stack([entail if o == "entailment" else (1 - entail) / others for o in outcomes], axis=-1)
    rows = hypotheses(task, verbalizer)
    pairs = [(example_texts(e, verbalizer.kind)[0], h) for e in examples for row in rows for h in row]
    logits = model.logits(pairs, name).reshape(len(examples), len(rows), n_labels, -1)
    scores = model.label_scores(logits, multi_label or n_labels == 1)
    return scores if verbalizer.kind == ASPECTS else scores[:, 0]


def predictions_of(scores: np.ndarray) -> dict:
    """The task's prediction fields from label scores (log-scores as its logits)."""
    normalised = scores / np.maximum(scores.sum(-1, keepdims=True), 1e-30)  # multi-label scores do not sum to 1
    return {"prediction": np.argmax(scores, -1), "probabilities": normalised,
            "logits": np.log(np.maximum(normalised, 1e-30))}


def majority_predictions(task, train_examples: list[dict], n: int) -> dict:
    """Every example predicted as the most frequent training label (per aspect)."""
    index = {name: i for i, name in enumerate(task.labels)}
    if task_kind(task) == ASPECTS:
        counts = np.zeros((len(task.aspects), len(task.labels)))
        for e in train_examples:
            for a, label in enumerate(e["labels"]):
                counts[a, index[label]] += 1
        return {"prediction": np.tile(counts.argmax(-1), (n, 1))}
    counts = np.zeros(len(task.labels))
    for e in train_examples:
        counts[index[task.label_name(e)]] += 1
    return {"prediction": np.full(n, counts.argmax())}


def _all(source) -> list[dict]:
    return [source[i] for i in range(len(source))]


def classify(checkpoint: str, task_config, *, workdir: str, splits=("validation",), template: str | None = None,
             labels: dict | None = None, multi_label: bool = False, max_seq_length: int = 0,
             eval_batch_size: int = 0, allow_unfinished: bool = False, allow_overlap: bool = False) -> dict:
    """The task of `task_config` (a config dict: task, data.source, ...) classified zero-shot by
    the NLI model in `checkpoint` on `splits`: its own report (metric), calibration and the
    majority-class baseline per split in <workdir>/results.json, one record per example (the
    task's record plus every label's score) in <workdir>/predictions.jsonl. Template, labels,
    task and checkpoint labels are checked before any parameter is read, and so is what the model
    was trained on: a task whose texts are translations of (or drawn from) a dataset the model
    trained on is refused (nli_jax.data.provenance) unless `allow_overlap`."""
    workdir_lib.check_tool_output(workdir, "--workdir", reads=[checkpoint], directory=True)
    plan = planner.build_plan(task_config, training=False)
    task = create_task(plan)
    kind = task_kind(task)
    verbalizer = verbalizer_for(task.name, task.labels, kind, template=template, phrases=labels)
    data = task.load(workdir)
    missing = [s for s in splits if s not in data]
    if missing:
        raise RunError(f"task {task.name!r} has no split(s) {missing} in its data (it has {sorted(data)})")
    nli_columns(_checkpoint_labels(tools.resolve_checkpoint(checkpoint), checkpoint)[0], checkpoint)  # no weights read
    trained = provenance.trained_on(checkpoint)
    translated = provenance.translated_training(checkpoint, task.name, trained)
    if translated and not allow_overlap:
        raise RunError(f"{checkpoint}: {translated}: its zero-shot scores on {task.name} would be scores on "
                       "translations of its training data; pass --allow_overlap (allow_overlap=True) to score anyway")
    with workdir_lib.lock(workdir, "finetune.zero_shot"):
        setup_logging(workdir)
        model = load_model(checkpoint, workdir=workdir, max_seq_length=max_seq_length,
                           eval_batch_size=eval_batch_size, allow_unfinished=allow_unfinished)
        bound = task.bind(model.run.tokenizer, data)
        train = _all(data[bound.train_split]) if bound.train_split in data else []
        results = {"task": bound.name, "primary_metric": bound.primary_metric, "checkpoint": checkpoint,
                   "nli_labels": list(model.columns.labels), "multi_label": multi_label,
                   "trained_on": trained, **({"translated_training": translated} if translated else {}),
                   "verbalizer": {"template": verbalizer.template, "labels": dict(verbalizer.phrases),
                                  **({"aspects": {a: verbalizer.aspects.get(a, a) for a in bound.aspects}}
                                     if kind == ASPECTS else {})},
                   "splits": {}}
        if task.name in trained:
            log.warning("%s was trained on %s (%s): its scores are not zero-shot", checkpoint, task.name,
                        trained[task.name])
        records = []
        for split in splits:
            examples = sorted(_all(data[split]), key=lambda e: e["idx"])
            scores = score_examples(model, bound, verbalizer, examples, multi_label=multi_label, name=split)
            predictions = predictions_of(scores)
            report = bound.report(split, examples, predictions)
            inputs = bound.calibration_inputs(examples, predictions)
            if inputs is not None:
                report["calibration"] = {k: v for k, v in calibration.report(*inputs).items() if k != "bins"}
            if train:
                report["majority_baseline"] = bound.report(split, examples,
                                                           majority_predictions(bound, train, len(examples)))
            results["splits"][split] = report
            log.info("zero-shot %s %s: %s %.4f (%d examples, majority baseline %.4f)", bound.name, split,
                     bound.primary_metric, report[bound.primary_metric], len(examples),
                     report.get("majority_baseline", {}).get(bound.primary_metric, float("nan")))
            for record, row in zip(bound.prediction_records(split, examples, predictions), scores):
                if kind == ASPECTS:
                    record["scores"] = {a: dict(zip(bound.labels, map(_round, r))) for a, r in zip(bound.aspects, row)}
                else:
                    record["scores"] = dict(zip(bound.labels, map(_round, row)))
                records.append(record)
        write_json(storage.under(workdir, "results.json"), results)
        write_jsonl(storage.under(workdir, "predictions.jsonl"), records)
    return results


def _round(x) -> float:
    return round(float(x), 6)
