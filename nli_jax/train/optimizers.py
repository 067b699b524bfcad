"""Optimizers and learning-rate schedules of the papers' recipes.

adam  - Adam without weight decay (IndoNLU / IndoNLI fine-tuning)
adamw - AdamW, decay 0.01 not applied to LayerNorm parameters and biases (BERT pretraining)
lamb  - LAMB with the same exclusions (ALBERT / IndoBERT-lite pretraining)

The learning rate follows an optional linear warmup (optimizer.warmup_steps / warmup_ratio), then
the schedule `optimizer.schedule` names (nli_jax.schedules, each with its own options); the batch
ramp (nli_jax.train.batch_ramp) wraps the optimizer when `config.batch_ramp` asks for it.
"""
from __future__ import annotations

import dataclasses

import jax
import optax

from nli_jax import schedules
from nli_jax.plan import OptimizerPlan
from nli_jax.train.batch_ramp import BatchRampOptions, ramp_accumulation, ramp_schedule


def decay_mask(params):
    """True for matrices (kernels, embeddings); False for biases and LayerNorm scales/biases."""
    def leaf_mask(path, _):
        return getattr(path[-1], "key", None) in ("kernel", "embedding")
    return jax.tree_util.tree_map_with_path(leaf_mask, params)


def learning_rate_schedule(opt: OptimizerPlan, options: schedules.ScheduleOptions | None = None, *,
                           total_steps: int, steps_per_epoch: int, warmup_steps: int) -> optax.Schedule:
    """The rate at each step: a linear warmup from 0 to opt.lr over `warmup_steps`, then schedule
    opt.schedule with its `options` (None: its defaults)."""
    lr, warmup = float(opt.lr), int(warmup_steps)
    options = schedules.SCHEDULES.options_class(opt.schedule)() if options is None else options
    after = schedules.build(opt.schedule, options, lr=lr, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                            warmup_steps=warmup)
    if warmup <= 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def make_optimizer(opt: OptimizerPlan, schedule_options: schedules.ScheduleOptions | None = None,
                   batch_ramp: BatchRampOptions | None = None, *, total_steps: int, steps_per_epoch: int,
                   warmup_steps: int, unit_peak: bool = False):
    """(optax transformation, schedule) of the plan's optimizer over a run of `total_steps`, its
    schedule's `schedule_options` (None: that schedule's defaults) and the `batch_ramp` (None: no
    ramp). `unit_peak`: the schedule's peak is 1 and the caller scales the updates by `opt.lr` (the
    learning rate is applied last by adam, adamw and lamb alike), so that runs differing only in
    learning rate (a sweep's cells) share one compiled train step."""
    if schedule_options is None:
        schedule_options = schedules.SCHEDULES.options_class(opt.schedule)()
    if unit_peak:
        schedule_options = schedule_options.in_units_of(float(opt.lr))
        opt = dataclasses.replace(opt, lr=1.0)
    schedule = learning_rate_schedule(opt, schedule_options, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                                      warmup_steps=warmup_steps)
    ramp = batch_ramp is not None and batch_ramp.ramps
    # Ramped: the inner optimizer runs at rate 1 on its own updates' count and ramp_accumulation
    # scales its updates by the schedule at the step (all three apply the rate last).
    rate = 1.0 if ramp else schedule
    b1, b2, eps, wd = float(opt.b1), float(opt.b2), float(opt.eps), float(opt.weight_decay)
    if opt.name == "adam":
        tx = optax.adam(rate, b1=b1, b2=b2, eps=eps)
    elif opt.name == "adamw":
        tx = optax.adamw(rate, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    elif opt.name == "lamb":
        tx = optax.lamb(rate, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    else:
        raise ValueError(f"unknown optimizer.name {opt.name!r}; expected adam, adamw or lamb")
    clip = float(opt.grad_clip)
    tx = optax.chain(optax.clip_by_global_norm(clip), tx) if clip > 0 else tx
    if ramp:
        tx = ramp_accumulation(tx, schedule, ramp_schedule(batch_ramp, total_steps), total_steps)
    return tx, schedule
