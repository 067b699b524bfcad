"""A task = its data (splits), encoding, batching, model head, loss, predictions and report.
The training loop knows nothing else about a task. Adding one is one module that subclasses
`Task` and registers a factory that picks the plan sections it needs, with the task's own
options class when it has options (docs/extending.md):

    register("mytask", options=MyOptions)(lambda plan: MyTask(plan.data, plan.task_options))
"""
from __future__ import annotations

import abc
import copy
from typing import Any, Callable

import numpy as np

from nli_jax.data.pipeline import Batching
from nli_jax.errors import RunError
from nli_jax.plan import BatchPlan, DataPlan, NoOptions, TaskOptions

# name -> factory(RunPlan) -> Task. The built-in tasks register when nli_jax.tasks is imported.
TASKS: dict[str, Callable[[Any], "Task"]] = {}
# name -> the task's options class (RunPlan.task_options, config.task_options).
TASK_OPTIONS: dict[str, type[TaskOptions]] = {}
# name -> the tasks whose texts its texts are translated or drawn from (nli_jax.data.provenance).
TEXTS_FROM: dict[str, tuple[str, ...]] = {}
# The key of `loss`'s metric sums that holds per-example arrays (not summed): the train step
# returns them when asked (training dynamics), the evaluation step with the predictions.
PER_EXAMPLE = "per_example"


def register(name: str, options: type[TaskOptions] = NoOptions, texts_from: tuple[str, ...] = ()):
    """Registers `factory(plan) -> Task` as task `name`, whose options (plan.task_options) are an
    `options` instance; `texts_from`: the tasks its texts are translations of or drawn from (a
    model trained on one is never scored on the other: nli_jax.data.provenance)."""
    def wrap(factory):
        if name in TASKS:
            raise ValueError(f"task {name!r} registered twice")
        TASKS[name], TASK_OPTIONS[name], TEXTS_FROM[name] = factory, options, tuple(texts_from)
        return factory
    return wrap


def pair_min_length(tokenizer) -> tuple[int, str]:
    return tokenizer.num_special_tokens_to_add(pair=True) + 2, "a text pair ([CLS] a [SEP] b [SEP])"


def single_min_length(tokenizer) -> tuple[int, str]:
    return tokenizer.num_special_tokens_to_add(pair=False) + 1, "one text ([CLS] a [SEP])"


class Task(abc.ABC):
    name: str = ""
    primary_metric: str = "accuracy"  # on the validation split: early stopping and best checkpoint
    # Whether the run's parameters (best/, results.json, evaluate, predict, export_best) are its
    # latest evaluated step's rather than the best by primary_metric: pretraining, whose product
    # (the export) is its last model whatever a held-out metric did on the way.
    reports_final_parameters: bool = False
    # Further validation metrics kept at every evaluation (results.json's history, tensorboard).
    tracked_metrics: tuple[str, ...] = ()
    # Training scalars logged and charted (train/<name>) next to the loss: (name, numerator,
    # denominator) among the metric sums `loss` returns, over the steps since the last log line.
    training_scalars: tuple[tuple[str, str, str], ...] = (("accuracy", "correct", "weight"),)
    train_split: str = "train"
    validation_split: str = "validation"
    # Whether training and evaluation batches may put several examples in one row
    # (data.packing, Batching.pack): the task reads each example's outputs through its
    # segment (the packing fields: cls_index, segment_ids, position_ids).
    packs_examples: bool = False
    # Fields with a pad value that stay one row per example in packed batches (tagging's words).
    per_example_fields: tuple[str, ...] = ()
    # Whether `loss` returns per-example outcomes (sums[PER_EXAMPLE]: gold_probability, correct):
    # training dynamics (hooks.dynamics) and the training split's cartography.
    records_dynamics: bool = False

    def __init__(self, data: DataPlan, options: TaskOptions = NoOptions()):
        self.data, self.options = data, options

    def __setattr__(self, name, value):
        if self.__dict__.get("_bound"):
            raise AttributeError(f"task {self.name!r} is bound: {name} was fixed at set-up and cannot change")
        super().__setattr__(name, value)

    def bind(self, tokenizer, splits: dict | None = None, labels=None) -> "Task":
        """A copy of this task with what set-up fixes, frozen from then on: its label names (a
        checkpoint's `labels`, else those its data gives, `labels_from`) and what it takes from the
        tokenizer (`tokenizer_values`). Training, evaluation and the tools use bound tasks only."""
        fixed = tuple(getattr(self, "labels", ()) or ())  # the task's own label set (NLI's: its corpus's)
        if labels is not None and fixed and fixed != tuple(labels):
            raise RunError(f"the checkpoint's labels {list(labels)} are not task {self.name!r}'s {list(fixed)}")
        bound = copy.copy(self)
        names = labels if labels is not None else self.labels_from(splits or {})
        values = dict(self.tokenizer_values(tokenizer), **({"labels": tuple(names)} if names is not None else {}))
        bound.__dict__.update(values, _bound=True)
        return bound

    def result_fields(self) -> dict:
        """Fields results.json records about how the task ran (NLI: hypothesis_only); none by default."""
        return {}

    def labels_from(self, splits: dict) -> tuple[str, ...] | None:
        """Label names the task's data gives (a tagging task's tag set), or None when they are
        the task's own (`labels`) or it has none."""
        return None

    def tokenizer_values(self, tokenizer) -> dict:
        """Attributes the bound task takes from the tokenizer (special-token ids, ...); none by default."""
        return {}

    @abc.abstractmethod
    def load(self, workdir: str | None = None) -> dict[str, Any]:
        """{split: random-access source of examples}, validated (errors name file and line).
        `workdir`: the run's directory, for tasks that derive data there (pretraining examples)."""

    @abc.abstractmethod
    def model_class_and_kwargs(self) -> tuple[type, dict]:
        """(model class, constructor arguments beyond the encoder config), e.g. num_labels."""

    @abc.abstractmethod
    def encoder(self, tokenizer) -> Callable[[dict], dict]:
        """example -> dict of numpy features (unpadded token fields)."""

    def possible_splits(self) -> set[str] | None:
        """Every split name the task's data can have (held-out ones included), to refuse a
        mistyped `eval_splits` entry; None when the task cannot tell."""
        return None

    def trained_task_names(self) -> tuple[str, ...]:
        """The datasets (task names) a run of this task trains on: its own by default; a task
        that trains on others' data names them (nli_jax.data.provenance)."""
        return (self.name,)

    def plan_problems(self, plan) -> list[str]:
        """What the task itself cannot run with in a checked plan (the planner adds them to its
        own refusals), e.g. a preset of another model family; [] by default."""
        return []

    def new_token_init(self) -> str | None:
        """How a run of this task initialises the rows of tokens a tokenizer adds to model.init's
        vocabulary ("mean" / "random", nli_jax.pretraining.vocab_extension); None: it does not grow
        vocabularies (a tokenizer other than the checkpoint's is refused)."""
        return None

    def min_seq_length(self, tokenizer) -> tuple[int, str]:
        """(tokens one example needs at the least, what they are): the special tokens of a
        pair plus one token of each text, unless the task says otherwise."""
        return pair_min_length(tokenizer)

    def input_files(self, workdir: str | None = None) -> list[str]:
        """Input files the task reads other than through nli_jax.data.readers (which report
        theirs themselves), for the workdir's fingerprint of its inputs."""
        return []

    def split_file(self, split: str) -> str | None:
        """The file(s) a split was read from, for messages that name them (the overlap check);
        None when the task cannot tell."""
        return None

    def read_file(self, path: str, *, labelled: bool = True) -> list[dict]:
        """Examples of one file in the task's own format, for evaluate (labelled) and predict
        (labelled=False: gold fields may be absent; labels None / -1)."""
        raise NotImplementedError(f"task {self.name!r} does not read single files (evaluate/predict)")

    def example_of_length(self, length: int) -> dict:
        """An encoded example of `length` tokens with every field `encoder` gives, its values
        arbitrary: the shapes of a run's batches without its data (launch.compile compiles the
        steps for a TPU topology from these)."""
        raise NotImplementedError(f"task {self.name!r} cannot describe its encoded examples (example_of_length)")

    def pad_values(self, tokenizer) -> dict[str, int]:
        return {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "token_type_ids": 0}

    def batching(self, tokenizer, batch: BatchPlan):
        """How rows become batches: padded to the plan's length buckets, and packed for training
        when the plan packs this task. A task with batch-level random work (MLM masking) returns
        its own object with the same members."""
        return Batching(buckets=batch.buckets, pad_values=tuple(self.pad_values(tokenizer).items()),
                        packing_groups=batch.packing_groups if self.packs_examples else 0,
                        eval_packing_groups=batch.eval_packing_groups if self.packs_examples else 0,
                        per_example_fields=self.per_example_fields)

    @abc.abstractmethod
    def loss(self, model, batch, deterministic: bool):
        """(loss sum, weight sum, dict of metric sums) over the batch. The sums may hold
        PER_EXAMPLE: {name: [batch] array} of per-example outcomes, which are not summed."""

    def loss_normalizers(self, batch) -> dict | None:
        """Global-batch denominators for losses that are not means over examples, or None.

        The train step computes them on the whole global batch and passes them to `loss` as
        batch["loss_normalizers"], so a micro-batch's loss is its exact share of the global one."""
        return None

    @abc.abstractmethod
    def predict(self, model, batch) -> dict:
        """Per-example outputs (arrays with the batch as first axis)."""

    @abc.abstractmethod
    def report(self, split: str, examples: list[dict], predictions: dict[str, np.ndarray]) -> dict:
        """Metrics of one split from its examples and predictions (aligned by position)."""

    def prediction_records(self, split: str, examples: list[dict], predictions: dict[str, np.ndarray]) -> list[dict]:
        """One JSON-able record per example for predictions.jsonl (none by default)."""
        return []

    def gold_labels(self, example: dict) -> list | None:
        """The gold labels of an example (one, or one per aspect or word), to tell a degenerate
        training split (one label throughout); None when the task has no labels to count."""
        return None

    def calibration_inputs(self, examples: list[dict], predictions: dict) -> tuple[np.ndarray, np.ndarray] | None:
        """(logits [n, classes], gold label indices [n]) of a split's labelled predictions, for
        calibration metrics and temperature scaling; None when the task has no such predictions."""
        return None
