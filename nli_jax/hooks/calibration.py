"""Calibration of a run's predictions (`hooks.calibration`, on by default): after training, a
temperature is fitted on the validation split with the best parameters (minimising NLL), and
every evaluated split reports expected and maximum calibration error (15 bins), Brier score and
NLL, raw and temperature-scaled, with a reliability diagram (`reliability_<split>.png`).
Prediction records carry `probabilities` (raw) and `calibrated_probabilities`.

The temperature is stored with the best parameters, in <workdir>/calibration.json; the tools
(evaluate, predict) apply it without refitting, and export writes it into the Hugging Face
config.json (`nli_jax.temperature`: divide the logits by it). The metrics are
nli_jax.metrics.calibration's (checked against scikit-learn in tests/test_calibration.py).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import numpy as np

from nli_jax import storage
from nli_jax.errors import RunError
from nli_jax.hooks import HOOKS, HookOptions, RunHook
from nli_jax.metrics import calibration as metrics
from nli_jax.options import option
from nli_jax.train.reporting import log

CALIBRATION_FILE = "calibration.json"
MEASURES = ("ece", "mce", "brier", "nll")


def check_temperature(value, source: str) -> float:
    """A usable temperature (a finite number > 0), or a RunError naming where it came from."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise RunError(f"{source}: temperature {value!r} is not a finite number > 0: the file is damaged or was "
                       "edited; remove it (no temperature scaling) or fit the temperature again by rerunning the run")
    return float(value)


def read_temperature(checkpoint: str) -> float | None:
    """The temperature stored with a run's best parameters (<run>/calibration.json) or in an
    exported Hugging Face directory (config.json's nli_jax.temperature); None when there is none."""
    path = os.path.join(checkpoint, CALIBRATION_FILE)
    try:
        saved = storage.read_json_object(path)
    except ValueError as e:
        raise RunError(f"{path} is unreadable ({type(e).__name__}: {e})") from None
    if saved is not None:
        return check_temperature(saved.get("temperature"), path)
    config = os.path.join(checkpoint, "config.json")
    if "best" not in storage.listdir(checkpoint) and storage.isfile(config):
        value = (storage.read_json_object(config) or {}).get("nli_jax", {}).get("temperature")
        return None if value is None else check_temperature(value, f"{config} (nli_jax.temperature)")
    return None


def write_temperature(workdir: str, temperature: float, fit: dict) -> None:
    if jax.process_index() == 0:
        storage.write_text(storage.under(workdir, CALIBRATION_FILE), json.dumps(dict(fit, temperature=temperature),
                                                                                indent=2))


def with_calibrated_probabilities(records: list[dict], logits, temperature: float | None) -> list[dict]:
    """Prediction records (in the order of `logits`) with `calibrated_probabilities` next to the
    raw `probabilities`, for tasks whose records carry probabilities."""
    if temperature is None or not records or "probabilities" not in records[0]:
        return records
    scaled = metrics.softmax(np.stack([np.asarray(x) for x in logits]), temperature)
    return [dict(r, calibrated_probabilities=[round(float(x), 6) for x in p]) for r, p in zip(records, scaled)]


def fit(task, evaluation) -> tuple[float, dict]:
    """(temperature, what it was fitted on) from a split's evaluation (SplitEvaluation)."""
    inputs = task.calibration_inputs(evaluation.examples, evaluation.predictions)
    if inputs is None:
        raise RunError(f"task {task.name!r}: the validation split has no labelled predictions to fit a temperature on")
    logits, labels = inputs
    temperature = metrics.fit_temperature(logits, labels)
    return temperature, {"fitted_on": evaluation.split, "count": int(len(labels)),
                         "nll_before": metrics.negative_log_likelihood(logits, labels),
                         "nll_after": metrics.negative_log_likelihood(logits, labels, temperature)}


# Labelled validation predictions a temperature is fitted on, at least.
MIN_FIT_PREDICTIONS = 10


def not_a_fit(temperature: float, logits, labels) -> str | None:
    """Why a fitted temperature is not one to use, or None: too few predictions to fit it on,
    T at a bound of its range, or predictions that are all right (their NLL falls as T goes to 0:
    no T minimises it, and where the fit stopped is no estimate)."""
    count = len(labels)
    if count < MIN_FIT_PREDICTIONS:
        return (f"the validation split has {count} labelled prediction(s), fewer than the {MIN_FIT_PREDICTIONS} a "
                "temperature is fitted on")
    if any(math.isclose(temperature, bound) for bound in (metrics.MIN_TEMPERATURE, metrics.MAX_TEMPERATURE)):
        return (f"the temperature fitted on {count} validation predictions reached its bound {temperature:g} (range "
                f"[{metrics.MIN_TEMPERATURE:g}, {metrics.MAX_TEMPERATURE:g}]): no temperature minimises their NLL")
    if bool(np.all(np.argmax(np.asarray(logits), -1) == np.asarray(labels))):
        return (f"every one of the {count} validation predictions is right: their NLL falls as the temperature goes "
                f"to 0, so no temperature minimises it (the fit stopped at {temperature:.3g})")
    return None


def report(task, evaluation, temperature: float | None, workdir: str) -> dict | None:
    """A split's calibration: raw and (with a temperature) scaled metrics, and its reliability
    diagram written to <workdir>/reliability_<split>.png; None for tasks without probabilities."""
    inputs = task.calibration_inputs(evaluation.examples, evaluation.predictions)
    if inputs is None:
        return None
    logits, labels = inputs
    raw = metrics.report(logits, labels)
    out = {"count": raw["count"], "raw": {k: raw[k] for k in MEASURES}}
    curves = {"raw": raw}
    if temperature is not None:
        scaled = metrics.report(logits, labels, temperature)
        out["temperature"] = temperature
        out["temperature_scaled"] = {k: scaled[k] for k in MEASURES}
        curves[f"temperature {temperature:.2f}"] = scaled
    if jax.process_index() == 0:
        # The split name (a task's, or --file's of finetune.evaluate) is one path component.
        path = storage.under(workdir, f"reliability_{storage.component(evaluation.split, 'split name')}.png")
        metrics.plot_reliability(curves, path, f"{task.name} {evaluation.split}: {raw['count']} predictions")
        out["reliability_diagram"] = os.path.basename(path)
    return out


def summarize_seeds(per_seed: dict[int, dict]) -> dict:
    """{split: {raw|temperature_scaled: {measure: mean, std, values}}} over seeds' results."""
    out = {}
    splits = sorted({s for r in per_seed.values() for s, rep in r["splits"].items() if rep.get("calibration")})
    for split in splits:
        reports = [r["splits"][split]["calibration"] for r in per_seed.values()
                   if r["splits"].get(split, {}).get("calibration")]
        out[split] = {}
        for kind in ("raw", "temperature_scaled"):
            if all(kind in c for c in reports):
                out[split][kind] = {m: _mean_std([c[kind][m] for c in reports]) for m in MEASURES}
    return out


def _mean_std(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "values": values}


def log_summary(results: dict) -> None:
    for split, r in results["splits"].items():
        c = r.get("calibration")
        if c and "temperature_scaled" in c:
            log.info("calibration %s: ECE %.4f -> %.4f (temperature %.3f), NLL %.4f -> %.4f", split, c["raw"]["ece"],
                     c["temperature_scaled"]["ece"], c["temperature"], c["raw"]["nll"], c["temperature_scaled"]["nll"])


@dataclasses.dataclass(frozen=True)
class CalibrationOptions(HookOptions):
    enabled: bool = option(True)  # every classification run reports calibration unless turned off


@HOOKS.register("calibration", options=CalibrationOptions)
class CalibrationHook(RunHook):
    """Calibration as a run hook. In training (hooks.calibration.enabled): a temperature fitted on the
    validation split at the final evaluation and stored with the best parameters
    (<workdir>/calibration.json, exports' config.json). In the tools: the checkpoint's stored
    temperature (read and checked before any compute) scales finetune.predict's probabilities and
    goes with finetune.export. Either way, when enabled, every split's calibration
    metrics (raw and scaled) and reliability diagram."""

    def __init__(self, *, report: bool, fit: bool = False, temperature: float | None = None, source: str | None = None):
        self.report, self.fit, self.temperature, self.source = report, fit, temperature, source

    @classmethod
    def for_training(cls, run, train_source, options):
        return cls(report=True, fit=True)

    @classmethod
    def for_checkpoint(cls, plan, checkpoint, options):
        temperature = read_temperature(checkpoint)
        if temperature is None and not options.enabled:
            return None
        return cls(report=options.enabled, temperature=temperature, source=checkpoint)

    def final_results(self, run, params, results, evaluations):
        task = run.task
        if self.fit and task.validation_split in run.splits:
            validation = evaluations.get(task.validation_split) or run.evaluate(params, task.validation_split)
            if task.calibration_inputs(validation.examples, validation.predictions) is not None:
                temperature, fitted = fit(task, validation)
                unfit = not_a_fit(temperature, *task.calibration_inputs(validation.examples, validation.predictions))
                if unfit:  # neither stored nor exported as if it were fitted
                    log.warning("calibration: %s; no temperature is stored or exported (probabilities unscaled)", unfit)
                    results["calibration"] = dict(fitted, temperature=None, not_fitted=unfit)
                else:
                    self.temperature = temperature
                    results["calibration"] = dict(fitted, temperature=self.temperature)
                    # Stored with the best parameters, for evaluate / predict / export.
                    write_temperature(run.workdir, self.temperature, dict(results["calibration"],
                                                                          best_step=results.get("best_step")))
        elif self.temperature is not None:
            results["calibration"] = {"temperature": self.temperature, "from": self.source}
        if not self.report:
            return
        for split, evaluation in evaluations.items():
            split_report = report(task, evaluation, self.temperature, run.workdir)
            if split_report is not None:
                results["splits"][split]["calibration"] = split_report
                evaluations[split] = evaluation._replace(records=with_calibrated_probabilities(
                    evaluation.records, evaluation.predictions.get("logits"), self.temperature))
        log_summary(results)

    def predictions(self, records, outputs):
        return with_calibrated_probabilities(records, outputs.get("logits"), self.temperature)

    def export_fields(self):
        return {} if self.temperature is None else {"temperature": self.temperature}

    @classmethod
    def summarize_seeds(cls, per_seed, summary):
        for split, measures in summarize_seeds(per_seed).items():
            summary["splits"][split]["calibration"] = measures
