"""Optimizers and learning-rate schedules of the papers' recipes.

adam  - Adam without weight decay (IndoNLU / IndoNLI fine-tuning)
adamw - AdamW, decay 0.01 not applied to LayerNorm parameters and biases (BERT pretraining)
lamb  - LAMB with the same exclusions (ALBERT / IndoBERT-lite pretraining)

Schedules, all after an optional linear warmup: constant, linear decay to 0, polynomial decay,
and exponential per epoch (IndoNLU: lr * gamma ** epoch, gamma 0.9); and one_cycle (Cramming's
triangle): linear from `one_cycle_start` x lr to lr at `one_cycle_peak` of the run, then linear to 0
at its end.

Batch ramp (`batch_ramp_max` > 1, Cramming's): the optimizer updates every k steps, averaging the
gradients of those k steps, k growing linearly with the run's progress from 1 to batch_ramp_max at
`batch_ramp_fraction` of it (`ramp_accumulation`); the step's shapes and the loop stay as they are.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from nli_jax.plan import OptimizerPlan


def decay_mask(params):
    """True for matrices (kernels, embeddings); False for biases and LayerNorm scales/biases."""
    def leaf_mask(path, _):
        return getattr(path[-1], "key", None) in ("kernel", "embedding")
    return jax.tree_util.tree_map_with_path(leaf_mask, params)


def learning_rate_schedule(opt: OptimizerPlan, *, total_steps: int, steps_per_epoch: int,
                           warmup_steps: int) -> optax.Schedule:
    lr, warmup = float(opt.lr), int(warmup_steps)
    decay_steps = max(1, total_steps - warmup)
    if opt.schedule == "constant":
        after = optax.constant_schedule(lr)
    elif opt.schedule == "linear":
        after = optax.linear_schedule(lr, 0.0, decay_steps)
    elif opt.schedule == "polynomial":
        after = optax.polynomial_schedule(lr, float(opt.end_lr), float(opt.power), decay_steps)
    elif opt.schedule == "exponential_per_epoch":
        after = optax.exponential_decay(lr, transition_steps=max(1, steps_per_epoch), decay_rate=float(opt.decay_rate),
                                        staircase=True)
    elif opt.schedule == "one_cycle":
        up = max(1, int(round(float(opt.one_cycle_peak) * total_steps)))
        after = optax.join_schedules([optax.linear_schedule(float(opt.one_cycle_start) * lr, lr, up),
                                      optax.linear_schedule(lr, 0.0, max(1, decay_steps - up))], [up])
    else:
        raise ValueError(f"unknown optimizer.schedule {opt.schedule!r}; expected constant, linear, polynomial, "
                         "exponential_per_epoch, one_cycle")
    if warmup <= 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def make_optimizer(opt: OptimizerPlan, *, total_steps: int, steps_per_epoch: int, warmup_steps: int,
                   unit_peak: bool = False):
    """(optax transformation, schedule) of the plan's optimizer over a run of `total_steps`.
    `unit_peak`: the schedule's peak is 1 and the caller scales the updates by `opt.lr` (the
    learning rate is applied last by adam, adamw and lamb alike), so that runs differing only in
    learning rate (a sweep's cells) share one compiled train step."""
    if unit_peak:
        opt = dataclasses.replace(opt, lr=1.0, end_lr=float(opt.end_lr) / float(opt.lr))
    schedule = learning_rate_schedule(opt, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                                      warmup_steps=warmup_steps)
    ramp = int(opt.batch_ramp_max) > 1
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
        tx = ramp_accumulation(tx, schedule, ramp_schedule(opt, total_steps), total_steps)
    return tx, schedule


def ramp_schedule(opt: OptimizerPlan, total_steps: int):
    """step -> the steps one update averages (int32): linear in the run's progress from 1 to
    batch_ramp_max at batch_ramp_fraction of `total_steps`, then batch_ramp_max."""
    top, span = int(opt.batch_ramp_max), max(1.0, float(opt.batch_ramp_fraction) * total_steps)

    def k(step):
        progress = jnp.minimum(1.0, step.astype(jnp.float32) / span)
        return jnp.clip(jnp.floor(1.0 + (top - 1) * progress), 1, top).astype(jnp.int32)
    return k


class RampState(NamedTuple):
    step: jax.Array  # steps seen (the loop's step count, checkpointed with it)
    count: jax.Array  # steps in the current accumulation
    grads: optax.Updates  # their summed gradients
    inner: optax.OptState


def ramp_accumulation(inner: optax.GradientTransformation, schedule, k,
                      total_steps: int) -> optax.GradientTransformation:
    """`inner` (rate 1) applied every k(step) steps to the mean of those steps' gradients (and at
    the run's last step), its updates scaled by schedule(step); zero updates in between. Clipping,
    when part of `inner`, clips the averaged gradient, as Cramming clips the accumulated batch's."""
    def init(params):
        return RampState(step=jnp.zeros([], jnp.int32), count=jnp.zeros([], jnp.int32),
                         grads=optax.tree.zeros_like(params), inner=inner.init(params))

    def update(grads, state, params=None):
        summed = jax.tree.map(jnp.add, state.grads, grads)
        count = state.count + 1
        due = (count >= k(state.step)) | (state.step + 1 >= total_steps)

        def apply(_):
            mean = jax.tree.map(lambda g: g / count.astype(g.dtype), summed)
            updates, inner_state = inner.update(mean, state.inner, params)
            rate = schedule(state.step)
            updates = jax.tree.map(lambda u: u * jnp.asarray(rate, u.dtype), updates)
            return updates, RampState(state.step + 1, jnp.zeros([], jnp.int32), optax.tree.zeros_like(summed),
                                      inner_state)

        def wait(_):
            return optax.tree.zeros_like(grads), RampState(state.step + 1, count, summed, state.inner)
        return jax.lax.cond(due, apply, wait, None)

    return optax.GradientTransformation(init, update)
