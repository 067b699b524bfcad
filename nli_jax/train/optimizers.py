"""Optimizers and learning-rate schedules of the papers' recipes.

adam  - Adam without weight decay (IndoNLU / IndoNLI fine-tuning)
adamw - AdamW, decay 0.01 not applied to LayerNorm parameters and biases (BERT pretraining)
lamb  - LAMB with the same exclusions (ALBERT / IndoBERT-lite pretraining)

Schedules, all after an optional linear warmup: constant, linear decay to 0, polynomial decay,
and exponential per epoch (IndoNLU: lr * gamma ** epoch, gamma 0.9).
"""
from __future__ import annotations

import dataclasses

import jax
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
    else:
        raise ValueError(f"unknown optimizer.schedule {opt.schedule!r}; expected constant, linear, polynomial, "
                         "exponential_per_epoch")
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
    b1, b2, eps, wd = float(opt.b1), float(opt.b2), float(opt.eps), float(opt.weight_decay)
    if opt.name == "adam":
        tx = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    elif opt.name == "adamw":
        tx = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    elif opt.name == "lamb":
        tx = optax.lamb(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    else:
        raise ValueError(f"unknown optimizer.name {opt.name!r}; expected adam, adamw or lamb")
    clip = float(opt.grad_clip)
    return (optax.chain(optax.clip_by_global_norm(clip), tx) if clip > 0 else tx), schedule
