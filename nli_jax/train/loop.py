"""train_and_evaluate(config, workdir): the one loop behind fine-tuning and pretraining.

The config becomes a checked plan (nli_jax.planner); a run is then set up in an order
that makes bad input fail before compute, and nothing that would block the corrected command is
written before every check has passed: workdir config -> tokenizer and model shape ->
fingerprint of the tokenizer, model.init and task files -> dataset files (validated, written as
array_record) -> [UNK] rate of the training text -> model -> mesh -> the run's steps ->
fingerprint of the data -> config.json and inputs.json written -> steps (resuming from the
newest intact checkpoint). Each step: train; evaluate on validation every `eval_every` steps
(early stopping, best parameters); checkpoint every `checkpoint_every` steps and on SIGTERM.
At the end the best parameters are evaluated on every split and written to results.json and
predictions.jsonl. What a run does besides (training dynamics, calibration) are its hooks
(nli_jax.hooks), called at fixed points; the loop knows none of them.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from nli_jax import hooks as run_hooks
from nli_jax import storage
from nli_jax import workdir as workdir_lib
from nli_jax.data import pipeline
from nli_jax.data.readers import recording_reads
from nli_jax.errors import RunError
from nli_jax.plan import RunPlan, StepPlan, TrainPlan
from nli_jax.tasks.base import PER_EXAMPLE
from nli_jax.train import budget
from nli_jax.train import compilation
from nli_jax.train import inputs as inputs_lib
from nli_jax import planner
from nli_jax.train.checkpointing import Checkpointer, abstract_like
from nli_jax.train.evaluation import final_evaluation
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.preemption import Preemption
from nli_jax.train.record import LoopRecord
from nli_jax.train.reporting import Reporter, log, setup_logging, write_json, write_jsonl
from nli_jax.train.setup import RunSetup, model_inputs, prepare
from nli_jax.train.compiled_step import initial_state_and_step, one_batch_per_shape, train_batches, train_step_for
from nli_jax.train.step_checks import FiniteSteps, Padding
from nli_jax.train.steps import PROBES
from nli_jax.tools import export


def train_and_evaluate(config, workdir: str) -> dict:
    """Runs the config (once, or once per entry of `config.seeds`) and returns results.json."""
    plan = planner.build_plan(config)
    planner.check_paths(plan, workdir)
    seed_plans = planner.seed_plans(config, plan)  # every seed's plan checked before any runs
    with workdir_lib.lock(workdir, "training"):  # one command at a time in a workdir
        if not plan.seeds:
            return run_one(plan, workdir)
        # The seed list is part of the run: W's config.json (with its seeds) is checked like any
        # other key, so a finished run's results are never replaced by another seed list's.
        workdir_lib.check_config(workdir, plan.config_json, type(plan.task_options))
        workdir_lib.check_seeds_of_older_run(workdir, plan.seeds)
        if plan.train.seed != _DEFAULT_SEED:
            log.warning("train.seed=%d is not used: config.seeds=%s gives each run its seed", plan.train.seed,
                        tuple(plan.seeds))
        # Each seed's run in W/seed_<s>, a directory of W (not a link out of it); W's config.json
        # is written with the first seed's, once every check of that run has passed.
        per_seed = {}
        for seed, seed_plan in seed_plans.items():
            per_seed[seed] = run_one(seed_plan, storage.makedirs(storage.under(workdir, f"seed_{seed}")),
                                     parent=(workdir, plan.config_json))
        summary = aggregate_seeds(per_seed)
        write_json(storage.under(workdir, "results.json"), summary)
        return summary


_DEFAULT_SEED = next(f.default for f in dataclasses.fields(TrainPlan) if f.name == "seed")


def aggregate_seeds(per_seed: dict[int, dict]) -> dict:
    """mean ± std (sample std, ddof=1, as over the papers' random restarts) of every split's
    primary metric, and what the run's hooks summarize (calibration measures)."""
    splits = sorted({s for r in per_seed.values() for s in r["splits"]})
    out = {"seeds": sorted(per_seed), "splits": {}}
    for split in splits:
        metric = next(iter(per_seed.values()))["primary_metric"]
        values = [r["splits"][split][metric] for r in per_seed.values() if split in r["splits"]]
        out["splits"][split] = {metric: {"mean": float(np.mean(values)),
                                         "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                                         "values": values}}
    run_hooks.summarize_seeds(per_seed, out)
    out["per_seed"] = {str(s): r for s, r in per_seed.items()}
    return out


def run_one(plan: RunPlan, workdir: str, parent: tuple[str, dict] | None = None) -> dict:
    """One run: set up and checked before anything is written, trained (or resumed), its best
    parameters evaluated on every split; returns (and writes) results.json. `parent`: (W, its
    config) of a seeds run whose seed this is, W's config.json written with the seed's."""
    setup_logging(workdir)
    workdir_lib.check_no_links(workdir)  # (a seed's run: W/seed_<s>) nothing it writes goes through a link
    compiled_before = compilation.totals()
    run, hooks, steps, train_source, inputs = checked_setup(plan, workdir)
    if parent is not None:
        workdir_lib.write_config(*parent)
    workdir_lib.write_config(workdir, plan.config_json)
    inputs_lib.write_inputs(workdir, inputs)
    try:
        return _train_and_report(plan, workdir, run, hooks, steps, train_source, compiled_before)
    except KeyboardInterrupt:  # a Ctrl-C outside the loop's steps, or a second one: no checkpoint of its own
        raise _interrupted(workdir) from None


def _interrupted(workdir: str) -> KeyboardInterrupt:
    """run.json "running" (the step of the last checkpoint) becomes "interrupted"; the one line
    the command line prints."""
    state = workdir_lib.read_state(workdir)
    if state.get("state") != "running":
        return KeyboardInterrupt("interrupted (Ctrl-C) before training began; rerun the same command to run it")
    fields = {k: v for k, v in state.items() if k not in ("state", "updated")}
    workdir_lib.write_state(workdir, "interrupted", **fields)
    return KeyboardInterrupt(f"interrupted (Ctrl-C) after the checkpoint of step {state.get('step')} of "
                             f"{state.get('total_steps')} (kept); rerun the same command to resume from it")


def _train_and_report(plan: RunPlan, workdir: str, run, hooks, steps, train_source, compiled_before) -> dict:
    state, record, reused = train(run, hooks, steps, train_source)
    workdir_lib.check_still_there(workdir, "the final evaluation's files were")
    params, evaluated_step = _best_params(run, state, record)
    fields = dict(steps=record.steps, best_step=record.best_step, evaluated_step=evaluated_step,
                  stopped_early=record.stopped_early, history=list(record.history), train_tokens=record.train_tokens,
                  **({"milestones": {name: {"step": at, "export": storage.resolve(storage.under(workdir, name))}
                                     for name, at in record.milestones}} if record.milestones else {}))
    results, records = final_evaluation(run, params, [s for s in plan.eval_splits if s in run.splits],
                                        hooks=hooks, reused=reused, fields=fields)
    results["compilation"] = compilation.since(compiled_before)
    if run.init_from:
        results["init_from"] = run.init_from
    log.info("compilation: %(programs)d programs in %(seconds).1f s (%(cache_hits)d read from the persistent cache %(cache_dir)s)",
             results["compilation"])
    workdir_lib.check_still_there(workdir, "results.json, predictions.jsonl and the exports were")
    if plan.export_final:  # the final parameters: pretraining's export (fine-tunes with model.init)
        results["export"] = export(run, state["params"], storage.makedirs(storage.under(workdir, "export")))
    if plan.export_best:  # the best parameters with real label names: loads in *For...Classification
        results["export_best"] = export(run, params, storage.makedirs(storage.under(workdir, "export_best")),
                                        fields=run_hooks.export_fields(hooks))
    write_json(storage.under(workdir, "results.json"), results)
    write_jsonl(storage.under(workdir, "predictions.jsonl"), records)
    workdir_lib.write_state(workdir, "finished", step=record.steps, total_steps=record.total_steps,
                            best_step=record.best_step, **({"init_from": run.init_from} if run.init_from else {}))
    return results


def checked_setup(plan: RunPlan, workdir: str):
    """(run setup, its hooks, step plan, training examples, the inputs' fingerprint), every
    check passed: the workdir's config and inputs against this run's, the data, the model, the
    steps and the hooks' own (records of another run in the workdir)."""
    workdir_lib.check_config(workdir, plan.config_json, type(plan.task_options))
    trained = workdir_lib.has_trained_state(workdir)
    if trained and workdir_lib.read_config(workdir) is None:
        raise RunError(f"workdir {workdir} holds checkpoints or results but no {workdir_lib.CONFIG_FILE}: its config "
                       "is unknown. Use a new --workdir, or delete the old one to start over.")
    checked = model_inputs(plan)
    files = checked.task.input_files(workdir) + ([plan.data.train_subset] if plan.data.train_subset else [])
    known = inputs_lib.fingerprint(files=files, tokenizer_dir=checked.tokenizer_dir,
                                   model_dir=None if checked.run_init else checked.model_dir)
    if checked.run_init:  # a source run's best parameters, by their digests (their export is this process's)
        known["model.init"] = checked.run_init.fingerprint()
    inputs_lib.check_inputs(workdir, known, trained=trained)  # before any data is (re)built in the workdir
    with recording_reads() as data_files:
        run = prepare(plan, workdir, checked=checked, training=True)
    task, train_source = run.task, run.train_examples
    missing = [s for s in plan.eval_splits if s not in run.splits]
    if missing:
        log.info("splits not in the data (held-out files absent), skipped: %s", missing)
    planner.check_label_variety(plan, task, train_source)
    steps = planner.step_plan(plan, len(train_source))
    hooks = tuple(run_hooks.for_training(run, train_source))
    current = dict(known, data=dict(sorted(data_files.items())))
    inputs_lib.check_inputs(workdir, current, trained=trained, parts=("data",))
    if trained and inputs_lib.read_inputs(workdir) is None:
        log.info("%s has no %s (written by an older nli-jax): recording this run's inputs from now on", workdir,
                 inputs_lib.INPUTS_FILE)
    return run, hooks, steps, train_source, current


def _best_params(run: RunSetup, state, record: LoopRecord):
    """(parameters, step) of the run's best evaluation (best/, pruned to that step), else the
    final ones. When the best step is the final one, best/ holds the parameters in memory: they
    are not read back (on a 117M-parameter model that read was 2-3 s of every short fine-tuning run)."""
    final_step = int(jax.device_get(state["step"]))
    ckpt = Checkpointer(run.workdir, keep=run.plan.train.keep_checkpoints, async_save=False)
    try:
        if record.best_step is not None and record.best_step == final_step:
            best = state["params"]
        else:
            best, _ = ckpt.restore_best(abstract_like(state["params"]), step=record.best_step,
                                        abstract_state=abstract_like(state))
        ckpt.prune_best(record.best_step)
    finally:
        ckpt.close()
    return (best, record.best_step) if best is not None else (state["params"], final_step)


# --- the training loop ----------------------------------------------------------------------

def train(run: RunSetup, hooks: tuple, steps: StepPlan, train_source):
    """The training loop: returns (final state, the loop's record, the evaluation made at the best
    step in this process, if any, so the final evaluation need not repeat it)."""
    task, plan = run.task, run.plan
    tx, schedule = make_optimizer(plan.optimizer, plan.schedule, plan.batch_ramp, total_steps=steps.total_steps,
                                  steps_per_epoch=steps.steps_per_epoch, warmup_steps=steps.warmup_steps,
                                  unit_peak=True)  # over the cap
    state, train_step = initial_state_and_step(run.steps, run.params, tx, schedule, **_hook_outputs(hooks))
    batches = train_batches(run, train_source, steps.total_steps)
    train_iter = iter(batches.iterator(plan.data.workers))
    ckpt = Checkpointer(run.workdir, keep=plan.train.keep_checkpoints, async_save=plan.train.async_checkpointing)
    state, record = _resume(ckpt, state, train_iter)
    steps, train_step, record = _budgeted(run, hooks, steps, record, state, train_step, batches)
    step = int(jax.device_get(state["step"]))
    train_step.compile_ahead(state, one_batch_per_shape(run, batches, step, steps.total_steps))
    for hook in hooks:
        hook.start(step)
    run_state = {"total_steps": steps.total_steps, **({"init_from": run.init_from} if run.init_from else {})}
    workdir_lib.write_state(run.workdir, "running", step=step, best_step=record.best_step, **run_state)
    reporter = Reporter(run.workdir, steps.total_steps, step, scalars=task.training_scalars,
                        flops_per_token=run.model.training_flops_per_token(plan.data.max_seq_length),
                        peak_flops=plan.train.peak_tflops_per_device * 1e12 * jax.device_count())
    _log_start(run, steps, state["params"], len(train_source))
    selects = _selects_best_step(run)
    # Parameters the schedule marks (WSD's pre-decay ones): checkpointed and exported at their step.
    milestones = {at: name for name, at in plan.schedule.milestones(steps.total_steps, steps.warmup_steps).items()}
    best_evaluation = None  # (step, SplitEvaluation) of the best evaluation made in this process
    pending, padding = [], Padding(record.train_tokens)
    finite = FiniteSteps(run.workdir, ckpt, step, run_state, lambda: record.best_step)
    with Preemption(ckpt.reached_preemption, check_every=steps.log_every) as preemption, finite.stops(reporter):
        while step < steps.total_steps and not record.stopped_early:
            local = next(train_iter)
            real_tokens = int(local["attention_mask"].sum())
            reporter.count(int(local["weight"].sum()) * plan.batch.processes, real_tokens * plan.batch.processes)
            padding.count(local["attention_mask"].shape, real_tokens)
            state, metrics = train_step(state, pipeline.to_global(local, run.batch_sharding))
            step += 1
            outcomes, probes = metrics.pop(PER_EXAMPLE, None), metrics.pop(PROBES, ())
            run_hooks.after_step(hooks, step, metrics, outcomes, probes, state["params"])
            pending.append((step, metrics))
            # Metrics are fetched (and checked finite) at log steps and before any evaluation or save:
            # no host sync of their own, and a diverged step never reaches a checkpoint or best/.
            if step % steps.log_every == 0 or step == steps.total_steps:
                _report(reporter, finite.check(pending), step, steps)
                pending = []
            if step % steps.eval_every == 0 or step == steps.total_steps:
                pending = finite.check(pending)
                evaluation, record = _validate(run, ckpt, reporter, state, step, steps, record, selects=selects)
                if record.best_step == step:
                    best_evaluation = (step, evaluation)
            final = step == steps.total_steps or record.stopped_early
            if step % steps.checkpoint_every == 0 or final or step in milestones:
                pending = finite.check(pending)  # a diverged step is never saved nor exported
                if step in milestones:
                    _export_milestone(run, state["params"], milestones[step], step)
                workdir_lib.check_still_there(run.workdir, f"the checkpoint of step {step} was")
                record = record.with_tokens(padding.totals())  # saved with it: results.json's counts survive a resume
                _save(ckpt, hooks, step, state, train_iter, record, final=final)
                finite.saved(step)
                workdir_lib.write_state(run.workdir, "running", step=step, best_step=record.best_step, **run_state)
            if preemption.reached(step):
                pending = finite.check(pending)
                record = record.with_tokens(padding.totals())
                _save(ckpt, hooks, step, state, train_iter, record, force=True)
                ckpt.close()
                workdir_lib.write_state(run.workdir, "interrupted", step=step, best_step=record.best_step, **run_state)
                preemption.exit(step)
        ckpt.wait()
    ckpt.close()
    reporter.close()
    padding.log()
    # Tokens this process's steps computed on (rows x length, padding included) and real ones,
    # over the whole run (kept in the checkpoints' record across resumes).
    record = record.finished(step, steps.total_steps, padding.totals(),
                             milestones={name: at for at, name in milestones.items() if at <= step})
    reused = None
    if best_evaluation is not None and best_evaluation[0] == record.best_step:
        reused = {task.validation_split: best_evaluation[1]}
    return state, record, reused


def _save(ckpt: Checkpointer, hooks: tuple, step: int, state, train_iter, record: LoopRecord, **kwargs) -> None:
    """A checkpoint of `step`, the hooks' own records written before it (a resumed run records
    exactly what an uninterrupted one does)."""
    for hook in hooks:
        hook.before_checkpoint(step)
    ckpt.save(step, state, train_iter, record, **kwargs)


def _export_milestone(run: RunSetup, params, name: str, step: int) -> str:
    """The parameters of a milestone step as a Hugging Face directory, <workdir>/<name>/ (a rerun
    that passes the step again writes the same files)."""
    directory = export(run, params, storage.makedirs(storage.under(run.workdir, name)))
    log.info("step %d: the schedule's %s parameters exported to %s", step, name, directory)
    return directory


def _budgeted(run: RunSetup, hooks: tuple, steps: StepPlan, record: LoopRecord, state, train_step, batches):
    """(steps, train step, record) over the run's total: with train.budget_minutes, fixed from a
    step's measured time (`train_step` on a copy of `state`) or the checkpoint's record of it
    (nli_jax.train.budget), the optimizer's schedule and batch ramp laid over it; else the plan's."""
    calibration = lambda n: budget.time_steps(  # noqa: E731
        train_step, state, iter(batches.iterator(0)), lambda b: pipeline.to_global(b, run.batch_sharding), n)
    budgeted, record = budget.budget_steps(run.plan, steps, record, calibration)
    if budgeted is steps:  # no budget: the step built over the plan's total is the run's
        return steps, train_step, record
    steps = budgeted
    plan = run.plan
    tx, schedule = make_optimizer(plan.optimizer, plan.schedule, plan.batch_ramp, total_steps=steps.total_steps,
                                  steps_per_epoch=steps.steps_per_epoch, warmup_steps=steps.warmup_steps, unit_peak=True)
    return steps, train_step_for(run.steps, tx, schedule, state["params"], **_hook_outputs(hooks)), record


def _hook_outputs(hooks) -> dict:
    """What the train step returns for the run's hooks: each example's outcomes (a hook such as
    dynamics reads them) and the hooks' in-step probes."""
    return {"per_example": any(h.per_example_outcomes for h in hooks), "probes": run_hooks.step_probes(hooks)}


def _resume(ckpt: Checkpointer, state, train_iter):
    """(state, the loop's record): from the newest intact checkpoint, or the fresh ones."""
    try:
        restored = ckpt.restore_latest(abstract_like(state), train_iter)
    except BaseException:
        ckpt.close()
        raise
    if restored is None:
        return state, LoopRecord()
    latest, restored_state, record = restored
    # A final step's checkpoint has no optimizer state (no step follows it): the fresh one stands in.
    state = dict(restored_state, opt_state=restored_state.get("opt_state", state["opt_state"]))
    log.info("resumed from %s at step %d", ckpt.directory, latest)
    return state, record


def _log_start(run: RunSetup, steps: StepPlan, params, train_examples: int) -> None:
    model, batch = run.model, run.plan.batch
    n_params = sum(x.size for x in jax.tree.leaves(params))
    log.info("task %s | %s %s, %.1fM parameters | mesh %s | %d train examples, %d steps/epoch, %d steps | "
             "batch %d (accumulation %d)", run.task.name, type(model).__name__, model.config.model_type,
             n_params / 1e6, dict(run.mesh.shape), train_examples, steps.steps_per_epoch, steps.total_steps,
             batch.global_batch, batch.accumulation)
    if batch.eval_batch_asked:
        log.warning("train.eval_batch_size=%d: evaluation batches bounded to %d rows (%d tokens per data-parallel "
                    "device at data.max_seq_length=%d; planner.EVAL_TOKENS_PER_DEVICE)", batch.eval_batch_asked,
                    batch.global_eval_batch, planner.EVAL_TOKENS_PER_DEVICE, run.plan.data.max_seq_length)
    if run.batching.packing_groups:
        log.info("training batches packed (data.packing): several examples per row, each attending to itself, "
                 "in %d group(s) per process", run.batching.packing_groups)
    if run.batching.eval_packing_groups:
        log.info("evaluation batches packed (data.packing): rows of %d examples' tokens at most, in %d group(s) "
                 "per process", run.plan.batch.local_eval_batch, run.batching.eval_packing_groups)


def _report(reporter: Reporter, pending: list, step: int, steps: StepPlan) -> None:
    """The logged steps' summed metrics (lr and gradient norm of the last one); `pending`:
    [(step, metrics)] as _FiniteSteps.check fetched them."""
    sums = [metrics for _, metrics in pending]
    total = {k: float(np.sum([m[k] for m in sums])) for k in sums[0] if k not in ("lr", "grad_norm")}
    total.update(lr=float(sums[-1]["lr"]), grad_norm=float(sums[-1]["grad_norm"]))
    reporter.train(step, total, step / steps.steps_per_epoch)


# Validation examples a best step is chosen on (and early stopping decided), at least.
MIN_SELECTION_EXAMPLES = 10


def _selects_best_step(run: RunSetup) -> bool:
    """Whether the best step is chosen on the validation split: not for a task that reports its
    final parameters, nor on fewer than MIN_SELECTION_EXAMPLES examples (one example's accuracy
    is 0 or 1: the "best" step is the first that guesses it), logged."""
    task = run.task
    if task.reports_final_parameters:
        return False
    count = len(run.splits[task.validation_split])
    if count < MIN_SELECTION_EXAMPLES:
        log.warning("%s has %d example(s), fewer than the %d a best step is chosen on: the final parameters are "
                    "kept and reported (best step = last step) and early stopping is off", task.validation_split,
                    count, MIN_SELECTION_EXAMPLES)
        return False
    return True


def _validate(run: RunSetup, ckpt: Checkpointer, reporter: Reporter, state, step: int, steps: StepPlan,
              record: LoopRecord, *, selects: bool = True):
    """Evaluates on the validation split, keeps the best parameters (`selects` False: the latest,
    as for a task that reports its final parameters) and decides on early stopping; returns the
    SplitEvaluation and the loop's record after it."""
    task, patience = run.task, run.plan.train.early_stopping_patience
    evaluation = run.evaluate(state["params"], task.validation_split)
    result = evaluation.report
    metric = result[task.primary_metric]
    tracked = {task.primary_metric: metric, "loss": result["loss"],
               **{k: result[k] for k in task.tracked_metrics if k in result}}
    reporter.scalars(step, {f"{task.validation_split}/{k}": v for k, v in tracked.items()})
    entry = {"step": step, "epoch": round(step / steps.steps_per_epoch, 3), task.validation_split: tracked}
    record = record.after_validation(step, entry, metric, selects=selects, patience=patience)
    if record.best_step == step:
        ckpt.save_best(step, state["params"], {"step": step, task.primary_metric: metric, "labels": run.label_names})
    log.info("eval step %d: %s %s %.4f (best %.4f at step %d)%s", step, task.validation_split, task.primary_metric,
             metric, record.best_metric, record.best_step, " -> early stop" if record.stopped_early else "")
    return evaluation, record
