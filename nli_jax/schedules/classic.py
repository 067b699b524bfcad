"""The fine-tuning papers' schedules: constant; linear decay to 0 (IndoNLI, OCNLI); polynomial
decay (InferES); exponential per epoch (IndoNLU: lr x decay_rate ** epoch, decay_rate 0.9)."""
from __future__ import annotations

import dataclasses

import optax

from nli_jax.options import option
from nli_jax.schedules import SCHEDULES, NoScheduleOptions, ScheduleOptions


@SCHEDULES.register("constant", options=NoScheduleOptions)
def constant(options, *, lr, total_steps, steps_per_epoch, warmup_steps):
    return optax.constant_schedule(lr)


@SCHEDULES.register("linear", options=NoScheduleOptions)
def linear(options, *, lr, total_steps, steps_per_epoch, warmup_steps):
    return optax.linear_schedule(lr, 0.0, max(1, total_steps - warmup_steps))


@dataclasses.dataclass(frozen=True)
class PolynomialOptions(ScheduleOptions):
    end_lr: float = option(0.0, low=0.0)  # the rate it decays to
    power: float = option(1.0, low=0.0, low_open=True)  # the decay's power

    def in_units_of(self, lr):
        return dataclasses.replace(self, end_lr=float(self.end_lr) / float(lr))


@SCHEDULES.register("polynomial", options=PolynomialOptions)
def polynomial(options, *, lr, total_steps, steps_per_epoch, warmup_steps):
    return optax.polynomial_schedule(lr, float(options.end_lr), float(options.power), max(1, total_steps - warmup_steps))


@dataclasses.dataclass(frozen=True)
class ExponentialPerEpochOptions(ScheduleOptions):
    decay_rate: float = option(0.9, low=0.0, high=1.0, low_open=True)  # lr x decay_rate ** epoch


@SCHEDULES.register("exponential_per_epoch", options=ExponentialPerEpochOptions)
def exponential_per_epoch(options, *, lr, total_steps, steps_per_epoch, warmup_steps):
    return optax.exponential_decay(lr, transition_steps=max(1, steps_per_epoch), decay_rate=float(options.decay_rate),
                                   staircase=True)
