"""Optimizers and learning-rate schedules of the papers' recipes.

adam  - Adam without weight decay (IndoNLU / IndoNLI fine-tuning)
adamw - AdamW, decay 0.01 not applied to LayerNorm parameters and biases (BERT pretraining)
lamb  - LAMB with the same exclusions (ALBERT / IndoBERT-lite pretraining)

Schedules, all after an optional linear warmup: constant, linear decay to 0, polynomial decay,
and exponential per epoch (IndoNLU: lr * gamma ** epoch, gamma 0.9).
"""
from __future__ import annotations

import jax
import optax


def decay_mask(params):
    """True for matrices (kernels, embeddings); False for biases and LayerNorm scales/biases."""
    def leaf_mask(path, _):
        return getattr(path[-1], "key", None) in ("kernel", "embedding")
    return jax.tree_util.tree_map_with_path(leaf_mask, params)


def learning_rate_schedule(cfg, total_steps: int, steps_per_epoch: int) -> optax.Schedule:
    lr = float(cfg.lr)
    warmup = int(cfg.get("warmup_steps", 0) or round(float(cfg.get("warmup_ratio", 0.0)) * total_steps))
    kind = cfg.get("schedule", "constant")
    decay_steps = max(1, total_steps - warmup)
    if kind == "constant":
        after = optax.constant_schedule(lr)
    elif kind == "linear":
        after = optax.linear_schedule(lr, 0.0, decay_steps)
    elif kind == "polynomial":
        after = optax.polynomial_schedule(lr, float(cfg.get("end_lr", 0.0)), float(cfg.get("power", 1.0)), decay_steps)
    elif kind == "exponential_per_epoch":
        after = optax.exponential_decay(lr, transition_steps=max(1, steps_per_epoch),
                                        decay_rate=float(cfg.get("decay_rate", 0.9)), staircase=True)
    else:
        raise ValueError(f"unknown optimizer.schedule {kind!r}; expected constant, linear, polynomial, "
                         "exponential_per_epoch")
    if warmup <= 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def make_optimizer(cfg, total_steps: int, steps_per_epoch: int):
    """(optax transformation, schedule) from the config's `optimizer` block."""
    schedule = learning_rate_schedule(cfg, total_steps, steps_per_epoch)
    name = cfg.get("name", "adam")
    b1, b2, eps = float(cfg.get("b1", 0.9)), float(cfg.get("b2", 0.999)), float(cfg.get("eps", 1e-8))
    wd = float(cfg.get("weight_decay", 0.0))
    if name == "adam":
        opt = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
    elif name == "adamw":
        opt = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=decay_mask)
    elif name == "lamb":
        opt = optax.lamb(schedule, b1=b1, b2=b2, eps=float(cfg.get("eps", 1e-6)), weight_decay=wd, mask=decay_mask)
    else:
        raise ValueError(f"unknown optimizer.name {name!r}; expected adam, adamw or lamb")
    clip = float(cfg.get("grad_clip", 0.0))
    return (optax.chain(optax.clip_by_global_norm(clip), opt) if clip > 0 else opt), schedule
