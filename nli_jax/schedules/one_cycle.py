"""one_cycle, Cramming's triangle: linear from `start` x lr up to lr at `peak` of the run, then
linear down to 0 at its end (Cramming's budget-triangle2: start 0.25, peak 0.75)."""
from __future__ import annotations

import dataclasses

import optax

from nli_jax.options import option
from nli_jax.schedules import SCHEDULES, ScheduleOptions


@dataclasses.dataclass(frozen=True)
class OneCycleOptions(ScheduleOptions):
    rises_itself = True
    peak: float = option(0.5, low=0.0, high=1.0, low_open=True, high_open=True)  # the peak's share of the run
    start: float = option(0.0, low=0.0, high=1.0, high_open=True)  # the rate's share of lr at step 0


@SCHEDULES.register("one_cycle", options=OneCycleOptions)
def one_cycle(options, *, lr, total_steps, steps_per_epoch, warmup_steps):
    up = max(1, int(round(float(options.peak) * total_steps)))
    return optax.join_schedules([optax.linear_schedule(float(options.start) * lr, lr, up),
                                 optax.linear_schedule(lr, 0.0, max(1, total_steps - warmup_steps - up))], [up])
