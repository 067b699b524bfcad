"""Learning-rate schedules, one module each, every one with its own options.

A schedule is a function registered with its options class:

    @SCHEDULES.register("linear", options=NoScheduleOptions)
    def linear(options, *, lr, total_steps, steps_per_epoch, warmup_steps) -> optax.Schedule

returning the rate from the end of the run's warmup (`optimizer.warmup_steps` /
`warmup_ratio`, which every run has; the optimizer joins the linear warmup in front) to its end.
`config.optimizer.schedule` names the schedule; its options are `config.schedules.<name>.<option>`
(every registered schedule's defaults are in the config, so that any can be set on the command
line), resolved by the planner into `RunPlan.schedule`. A new schedule is one module of this
package (docs/extending.md).
"""
from __future__ import annotations

import dataclasses

from nli_jax.options import Options, Registry

SCHEDULES = Registry("schedule", __name__)


@dataclasses.dataclass(frozen=True)
class ScheduleOptions(Options):
    """A schedule's options. `rises_itself`: the schedule starts below its peak by design and a
    warmup in front of it is refused. `in_units_of(lr)`: the options with every absolute rate
    divided by `lr` (runs differing only in optimizer.lr share one compiled step, the schedule
    peaking at 1 and the updates scaled by lr)."""
    rises_itself = False

    def in_units_of(self, lr: float) -> "ScheduleOptions":
        return self

    def milestones(self, total_steps: int, warmup_steps: int) -> dict[str, int]:
        """{name: step} of the parameters the schedule marks (WSD's pre-decay ones): the loop
        checkpoints each step and exports its parameters to <workdir>/<name>/, kept."""
        return {}

    def plan_problems(self, plan, task, key: str) -> list[str]:
        opt = plan.optimizer
        if self.rises_itself and (opt.warmup_steps or opt.warmup_ratio):
            return [f"--config.optimizer.warmup_steps={opt.warmup_steps}, --config.optimizer.warmup_ratio="
                    f"{opt.warmup_ratio}: optimizer.schedule={opt.schedule!r} rises to its peak itself ({key}); "
                    "set both to 0"]
        return []


@dataclasses.dataclass(frozen=True)
class NoScheduleOptions(ScheduleOptions):
    """A schedule without options of its own."""


def build(name: str, options: ScheduleOptions, *, lr: float, total_steps: int, steps_per_epoch: int,
          warmup_steps: int):
    """Schedule `name` with `options` for a run of `total_steps` whose warmup is `warmup_steps`:
    the rate after the warmup (the optimizer joins the warmup in front)."""
    return SCHEDULES.get(name)(options, lr=lr, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                               warmup_steps=warmup_steps)
