"""Evaluation and prediction: a split's examples (each read and encoded once per run) in
evaluation batches over every process, the jitted evaluation or prediction step, the outputs
merged back into file order, then the task's report and prediction records. Owns the final
evaluation of a run's parameters on every split (results.json's task fields), then the run's
hooks (nli_jax.hooks: calibration, ...).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

from nli_jax.data import pipeline
from nli_jax.data.records import InMemorySource
from nli_jax.plan import BatchPlan
from nli_jax.train import compilation
from nli_jax.train import mesh as mesh_lib
from nli_jax.train.reporting import log


class SplitEvaluation(NamedTuple):
    """One split evaluated: the task's report and prediction records, and what they came from
    (the examples and the merged per-example outputs, in file order)."""
    report: dict
    records: list
    split: str
    examples: list
    predictions: dict


def predict_step(steps):
    """The jitted prediction step (of a setup.StepSetup): the task's per-example outputs, with
    idx, replicated."""
    graphdef, rest, task = steps.graphdef, nnx.to_pure_dict(steps.rest), steps.task

    def step(params, batch):
        return {**task.predict(nnx.merge(graphdef, params, rest), batch), "idx": batch["idx"]}
    return jax.jit(step, in_shardings=(steps.param_shardings, steps.batch_sharding),
                   out_shardings=mesh_lib.replicated(steps.mesh),
                   compiler_options=compilation.forward_compiler_options(mesh_lib.platform(steps.mesh)))


class EvalSplit:
    """A split read once and each example encoded once (lazily: a process encodes only the
    rows it evaluates), reused by every evaluation of the run."""

    def __init__(self, source, encode):
        self.examples = [source[i] for i in range(len(source))]
        self.by_idx = {e["idx"]: e for e in self.examples}
        self._encode, self._encoded = encode, {}
        self._lengths = None

    def lengths(self, process_index: int, process_count: int):
        """Every example's encoded length, gathered across processes once per run."""
        if self._lengths is None:
            self._lengths = pipeline.encoded_lengths(self.examples, self.encode, process_index, process_count)
        return self._lengths

    def encode(self, example):
        key = example["idx"]
        if key not in self._encoded:
            self._encoded[key] = self._encode(example)
        return self._encoded[key]


class Evaluator:
    """Evaluates parameters on a run's splits and predicts on given examples. Evaluation batches
    are global (train.eval_batch_size), each process taking its share."""

    def __init__(self, task, encode, batching, batch: BatchPlan, eval_step, batch_sharding, *, predict_step):
        self.task, self.encode, self.batching, self.batch = task, encode, batching, batch
        self.eval_step, self.predict_step, self.batch_sharding = eval_step, predict_step, batch_sharding
        self._splits: dict[str, EvalSplit] = {}

    def evaluate(self, params, split: str, source) -> SplitEvaluation:
        """One split's report and prediction records; each split is read and encoded once per run."""
        if split not in self._splits:
            self._splits[split] = EvalSplit(source, self.encode)
        sums, merged, ordered = self._run(self.eval_step, params, self._splits[split], split)
        report = self.task.report(split, ordered, merged)
        report["loss"] = float(sums["loss_sum"]) / max(float(sums["weight"]), 1.0)
        return SplitEvaluation(report, self.task.prediction_records(split, ordered, merged), split, ordered, merged)

    def predict(self, params, examples: list[dict], name: str) -> tuple[list[dict], dict]:
        """(prediction records with label names, the step's per-example outputs in their order)
        for examples that may have no gold labels."""
        _, merged, ordered = self._run(self.predict_step, params, EvalSplit(InMemorySource(examples), self.encode), name)
        return self.task.prediction_records(name, ordered, merged), merged

    def _run(self, step_fn, params, data: EvalSplit, split: str):
        """Runs `step_fn` over a split in eval batches: (summed metrics or None, per-example
        outputs merged in file order, the examples in that order)."""
        pc, pi = self.batch.processes, self.batch.process_index
        examples = data.examples
        dummy = dict(data.encode(examples[0]), idx=np.int32(-1))
        packed = self.batching.eval_packing_groups
        lengths = data.lengths(pi, pc) if packed or (pc > 1 and self.batching.bucketed) else None
        sums, outputs = None, []
        for local in pipeline.eval_batches(examples, data.encode, self.batching, local_batch_size=self.batch.local_eval_batch,
                                           dummy=dummy, process_index=pi, process_count=pc, lengths=lengths):
            out = step_fn(params, pipeline.to_global(local, self.batch_sharding))
            metrics, predictions = out if isinstance(out, tuple) else (None, out)
            # Replicated outputs: every process sees every row; idx maps rows back to examples.
            outputs.append(dict(jax.device_get(predictions)))
            if metrics is not None:
                metrics = jax.device_get(metrics)
                sums = metrics if sums is None else {k: sums[k] + metrics[k] for k in sums}
        # Per-example rows (tag sequences differ in width between batches), in file order.
        rows = [{k: v[i] for k, v in batch.items()} for batch in outputs for i in range(len(batch["idx"]))]
        rows = sorted((r for r in rows if r["idx"] >= 0), key=lambda r: int(r["idx"]))
        merged = {k: [r[k] for r in rows] for k in outputs[0]}
        ordered = [data.by_idx[int(r["idx"])] for r in rows]
        if len(ordered) != len(examples):
            raise RuntimeError(f"{split}: evaluated {len(ordered)} of {len(examples)} examples")
        return sums, merged, ordered


def final_evaluation(run, params, splits: list[str], *, hooks=(), reused: dict | None = None,
                     fields: dict | None = None):
    """results.json (the task's fields, `fields`, every split's report) and the prediction
    records, for `params`; then each run hook's final_results (calibration, ...). `reused`:
    {split: SplitEvaluation} already computed with these parameters."""
    task = run.task
    results = {"task": task.name, "primary_metric": task.primary_metric, **task.result_fields(), **(fields or {}),
               "splits": {}}
    evaluations = {}
    for split in splits:
        evaluations[split] = (reused or {}).get(split) or run.evaluate(params, split)
        report = results["splits"][split] = evaluations[split].report
        log.info("final %s: %s %.4f (%d examples)", split, task.primary_metric, report[task.primary_metric],
                 report["count"])
    for hook in hooks:
        hook.final_results(run, params, results, evaluations)
    return results, [record for evaluation in evaluations.values() for record in evaluation.records]
