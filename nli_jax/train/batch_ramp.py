"""The batch ramped up by accumulation (Cramming's), `config.batch_ramp`: the optimizer updates every
k steps, averaging the gradients of those k steps, k growing linearly with the run's progress from 1
to `max_accumulation` at `fraction` of it (then kept); the step's shapes and the loop stay as they
are, and the learning-rate schedule is read at the step (the run's progress). max_accumulation 1:
every step updates (no ramp).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from nli_jax.options import Options, option


@dataclasses.dataclass(frozen=True)
class BatchRampOptions(Options):
    max_accumulation: int = option(1, low=1, high=1 << 20)  # steps one update averages at the ramp's top
    fraction: float = option(0.6, low=0.0, high=1.0, low_open=True)  # the run's share at which it is reached

    @property
    def ramps(self) -> bool:
        return int(self.max_accumulation) > 1


def ramp_schedule(options: BatchRampOptions, total_steps: int):
    """step -> the steps one update averages (int32): linear in the run's progress from 1 to
    max_accumulation at `fraction` of `total_steps`, then max_accumulation."""
    top, span = int(options.max_accumulation), max(1.0, float(options.fraction) * total_steps)

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
