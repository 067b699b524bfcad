"""The offline tools behind finetune.evaluate, finetune.predict and finetune.export: a run's best
parameters (or a Hugging Face checkpoint) evaluated on its splits and on given files, used to
predict on unlabelled input, or exported as a Hugging Face directory; and `export`, which the
loop uses too. Every file is read and validated before any compute. The tools run on one or
several processes alike (the command-line flags for several are nli_jax.cli's).
"""
from __future__ import annotations

import os

import jax
from flax import nnx
from jax.experimental import multihost_utils

from nli_jax import hooks as run_hooks
from nli_jax import storage
from nli_jax import workdir as workdir_lib
from nli_jax.checkpoints.hf import read_config
from nli_jax.data.records import InMemorySource
from nli_jax.errors import RunError
from nli_jax.tasks import Task, create_task
from nli_jax.train import inputs as inputs_lib
from nli_jax import planner
from nli_jax.data import provenance
from nli_jax.migrations import upgrade_config_json
from nli_jax.train.checkpointing import Checkpointer, abstract_like
from nli_jax.train.evaluation import final_evaluation
from nli_jax.train.reporting import log, setup_logging, write_json, write_jsonl
from nli_jax.train.setup import model_inputs, prepare

# What must match between the run that trained a checkpoint and the config that evaluates it
# (and the task's options declared with option(..., model_input=True)).
_MODEL_KEYS = ("task", "model.", "data.max_seq_length")


def host_params(params):
    """Whole parameters as numpy arrays on this host. Arrays sharded across processes (fsdp or
    tensor axes spanning hosts) are gathered with multihost_utils: device_get cannot read the
    shards of another process."""
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree.leaves(params)):
        return multihost_utils.process_allgather(params, tiled=True)
    return jax.device_get(params)


def export(run, params, directory: str, *, fields: dict | None = None) -> str:
    """`params` as a Hugging Face directory (config with id2label names, weights, tokenizer; the
    run hooks' `fields`, e.g. the calibration temperature, as config.json's nli_jax). Every
    process calls it (the gather is collective); process 0 writes."""
    nnx.update(run.model, nnx.State(host_params(params)))
    if jax.process_index() == 0:
        run.model.save_pretrained(directory, tokenizer=run.tokenizer, label_names=run.label_names,
                                  extra=dict(fields) if fields else None)
    return directory


def resolve_checkpoint(path: str) -> dict:
    """A run's workdir (its best parameters, under best/) or a Hugging Face directory."""
    if not path:
        raise RunError("no checkpoint given: a fine-tuning run's workdir or a Hugging Face model directory")
    storage.check_reachable(storage.check(path), what="checkpoint")
    if storage.isdir(os.path.join(path, "best")):
        config = workdir_lib.read_config(path)
        if config is None:
            raise FileNotFoundError(f"{path} has best/ but no {workdir_lib.CONFIG_FILE}: not a complete nli-jax run")
        return {"kind": "run", "path": path, "config": config}
    if storage.isfile(os.path.join(path, "config.json")):
        return {"kind": "hf", "path": path}
    raise FileNotFoundError(f"checkpoint {path}: neither a run directory (with best/ and {workdir_lib.CONFIG_FILE}) "
                            "nor a Hugging Face model directory (with config.json)")


def _run_checkpoint_setup(plan, workdir, checkpoint: str, saved_config: dict, splits=None):
    """RunSetup and best parameters of a run's workdir, refusing a config whose model differs."""
    options = type(plan.task_options)
    model_keys = (*_MODEL_KEYS, *(f"task_options.{name}" for name in options.model_input_fields()))
    ours = workdir_lib.flatten(plan.config_json)
    theirs = workdir_lib.flatten(upgrade_config_json(saved_config, options))
    differing = sorted(k for k in set(ours) | set(theirs) if k.startswith(model_keys) and ours.get(k) != theirs.get(k))
    if differing:
        raise RunError(f"{checkpoint} was trained with a different model or task config: " + "; ".join(
            f"{k}: {theirs.get(k)!r} (run) vs {ours.get(k)!r} (given)" for k in differing[:10]))
    info = Checkpointer.read_best_info(checkpoint)
    if info is None:
        raise FileNotFoundError(f"{checkpoint}/best holds no saved parameters")
    labels = info.get("labels")
    checked = model_inputs(plan)
    recorded = inputs_lib.read_inputs(checkpoint)
    if recorded is not None:
        changed = inputs_lib.differences(recorded, inputs_lib.fingerprint(tokenizer_dir=checked.tokenizer_dir),
                                         parts=("tokenizer",))
        if changed:
            raise inputs_lib.InputsChangedError(
                f"{checkpoint} was trained with another tokenizer than this config's ({'; '.join(changed[:5])}): "
                "its parameters would read the wrong token ids; restore the run's tokenizer files")
    run = prepare(plan, workdir, splits=splits, labels=labels if splits is not None else None, checked=checked)
    if labels and run.label_names and list(labels) != run.label_names:
        raise RunError(f"{checkpoint} was trained with labels {labels} but the data gives {run.label_names}")
    ckpt = Checkpointer(checkpoint, async_save=False, create=False)
    try:
        params, _ = ckpt.restore_best(abstract_like(run.params))
    finally:
        ckpt.close()
    return run, params


def _checkpoint_setup(plan, workdir, checkpoint: str, splits=None, need_labels=False):
    """RunSetup and parameters for a checkpoint: a run's best, or a Hugging Face directory's."""
    found = resolve_checkpoint(checkpoint)
    if found["kind"] == "run":
        return _run_checkpoint_setup(plan, workdir, checkpoint, found["config"], splits)
    labels = _hf_label_names(checkpoint)
    run = prepare(plan, workdir, splits=splits, labels=labels if splits is not None else None, model_init=checkpoint)
    if labels and run.label_names and labels != run.label_names:
        raise RunError(f"{checkpoint}: id2label {labels} differs from task {run.task.name!r}'s labels {run.label_names}")
    if need_labels and not run.label_names:
        raise RunError(f"{checkpoint}: its config.json has no label names (id2label) for task {run.task.name!r}")
    return run, run.params


def _hf_label_names(directory: str) -> list[str] | None:
    id2label = read_config(directory).get("id2label") or {}
    names = [id2label[k] for k in sorted(id2label, key=int)]
    return None if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)) else names


def _check_checkpoint(checkpoint: str, output: str, flag: str, allow_unfinished: bool, task) -> None:
    """Before any file is read: the output is the tool's own, and a run's parameters are final."""
    workdir_lib.check_tool_output(output, flag, reads=[checkpoint], directory=True)
    if resolve_checkpoint(checkpoint)["kind"] == "run":
        workdir_lib.require_finished(checkpoint, allow_unfinished)
    if type(task).read_file is Task.read_file:
        raise RunError(f"--checkpoint={checkpoint}: task {task.name!r} has no files to evaluate or predict on "
                       "(a pretraining run: fine-tune its export, <run>/export, with finetune.main)")


def evaluate_checkpoint(config, workdir: str, checkpoint: str, files: dict[str, str] | None = None, *,
                        allow_unfinished: bool = False) -> dict:
    """Evaluates a run's best parameters (or a Hugging Face checkpoint) on the config's
    eval_splits and on `files` ({split name: path}, in the task's format, labelled), writing
    results.json and predictions.jsonl to `workdir` with the same breakdowns as training."""
    plan = planner.build_plan(config, training=False)
    task = create_task(plan)
    _check_checkpoint(checkpoint, workdir, "--workdir", allow_unfinished, task)
    files = dict(files or {})
    extra = {}
    for name, path in files.items():  # every file read and validated before any compute
        extra[name] = InMemorySource(task.read_file(path, labelled=True))
    splits = None
    if plan.data.source or not files:
        splits = task.load(workdir)
    splits = {**(splits or {}), **extra}
    eval_splits = [s for s in plan.eval_splits if s in splits and s not in extra] + list(extra)
    if not eval_splits:
        raise RunError(f"nothing to evaluate: none of eval_splits {list(plan.eval_splits)} is in the data "
                       "and no files were given")
    hooks = run_hooks.for_checkpoint(plan, checkpoint)  # their files (a temperature) checked before any compute
    with workdir_lib.lock(workdir, "finetune.evaluate"):
        setup_logging(workdir)
        run, params = _checkpoint_setup(plan, workdir, checkpoint, splits=splits if extra else None)
        results, records = final_evaluation(run, params, eval_splits, hooks=hooks)
        results["checkpoint"] = checkpoint
        results["files"] = files
        write_json(storage.under(workdir, "results.json"), results)
        write_jsonl(storage.under(workdir, "predictions.jsonl"), records)
    return results


def export_checkpoint(config, checkpoint: str, output: str, *, allow_unfinished: bool = False) -> str:
    """A run's best parameters as a Hugging Face directory with label names and tokenizer."""
    plan = planner.build_plan(config, training=False)
    if resolve_checkpoint(checkpoint)["kind"] != "run":
        raise RunError(f"{checkpoint} is not a fine-tuning run directory (with best/ and {workdir_lib.CONFIG_FILE})")
    _check_checkpoint(checkpoint, output, "--output", allow_unfinished, create_task(plan))
    hooks = run_hooks.for_checkpoint(plan, checkpoint)
    with workdir_lib.lock(output, "finetune.export"):
        run, params = _checkpoint_setup(plan, output, checkpoint, splits={}, need_labels=True)
        # What the encoder was trained on travels with it: a zero-shot or fine-tuning run of the
        # export is checked against it (nli_jax.data.provenance).
        fields = dict(run_hooks.export_fields(hooks) or {}, trained_on=provenance.trained_on(checkpoint))
        export(run, params, output, fields=fields)
    return output


def predict_files(config, output_dir: str, checkpoint: str, files: dict[str, str], *,
                  allow_unfinished: bool = False) -> list[dict]:
    """Predictions with label names for unlabelled input ({name: path}, the task's file format;
    gold fields may be absent), written to <output_dir>/predictions.jsonl (split = name)."""
    plan = planner.build_plan(config, training=False)
    if not files:
        raise RunError("no input files to predict")
    task = create_task(plan)
    _check_checkpoint(checkpoint, output_dir, "--output", allow_unfinished, task)
    inputs = {name: task.read_file(path, labelled=False) for name, path in files.items()}
    hooks = run_hooks.for_checkpoint(plan, checkpoint)
    with workdir_lib.lock(output_dir, "finetune.predict"):
        setup_logging(output_dir)
        run, params = _checkpoint_setup(plan, output_dir, checkpoint, splits={}, need_labels=True)
        records = []
        for name, examples in inputs.items():
            predicted, outputs = run.predict(params, examples, name)
            for hook in hooks:
                predicted = hook.predictions(predicted, outputs)
            records.extend(predicted)
            log.info("predicted %s: %d examples from %s", name, len(examples), files[name])
        write_jsonl(storage.under(output_dir, "predictions.jsonl"), records)
    return records
