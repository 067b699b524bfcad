"""Warmup-stable-decay (ModernBERT's trapezoidal schedule): after the run's linear warmup
(optimizer.warmup_steps / warmup_ratio) the rate stays at lr, then decays over the last
`decay_fraction` of the run to `final_fraction` x lr, with the shape `decay_shape`:

    linear   1 - p
    cosine   (1 + cos(pi p)) / 2
    1-sqrt   1 - sqrt(p)          (ModernBERT's decay)

p being the progress through the decay (0 at its first step, 1 at the run's end). The decay
starts at step total - round(decay_fraction x total), never inside the warmup.

`keep_pre_decay`: the parameters at the decay's start (after the stable phase) are a milestone: the
loop checkpoints that step and exports them to <workdir>/pre_decay/ (a Hugging Face directory),
kept, so that anyone can run the decay on their own data, as ModernBERT released its pre-decay
checkpoints. `decay_only`: the whole run is the decay (an annealing run: model.init the pre-decay
export, no warmup), from lr down to final_fraction x lr with the same shape.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from nli_jax.options import option
from nli_jax.schedules import SCHEDULES, ScheduleOptions

SHAPES = {"linear": lambda p: 1.0 - p, "cosine": lambda p: 0.5 * (1.0 + jnp.cos(jnp.pi * p)),
          "1-sqrt": lambda p: 1.0 - jnp.sqrt(p)}


@dataclasses.dataclass(frozen=True)
class WSDOptions(ScheduleOptions):
    decay_fraction: float = option(0.1, low=0.0, high=1.0, low_open=True)  # the run's last share that decays
    decay_shape: str = option("1-sqrt", choices=tuple(SHAPES))
    final_fraction: float = option(0.0, low=0.0, high=1.0, high_open=True)  # the rate at the end, as a share of lr
    keep_pre_decay: bool = option(True)  # export the parameters at the decay's start (<workdir>/pre_decay/)
    decay_only: bool = option(False)  # an annealing run: the decay alone, from a pre-decay export

    def decay_start(self, total_steps: int, warmup_steps: int = 0) -> int:
        """The step the decay starts at (the stable phase's last checkpoint is the pre-decay one)."""
        if self.decay_only:
            return int(warmup_steps)
        return max(int(warmup_steps), total_steps - int(round(float(self.decay_fraction) * total_steps)))

    def milestones(self, total_steps, warmup_steps):
        start = self.decay_start(total_steps, warmup_steps)
        return {"pre_decay": start} if self.keep_pre_decay and not self.decay_only and 0 < start < total_steps else {}

    def plan_problems(self, plan, task, key):
        opt = plan.optimizer
        if self.decay_only and (opt.warmup_steps or opt.warmup_ratio):
            return [f"--config.{key}.decay_only=True with --config.optimizer.warmup_steps={opt.warmup_steps}, "
                    f"--config.optimizer.warmup_ratio={opt.warmup_ratio}: an annealing run starts at the peak rate "
                    "(the pre-decay parameters'); set both to 0"]
        return []


@SCHEDULES.register("wsd", options=WSDOptions)
def wsd(options, *, lr, total_steps, steps_per_epoch, warmup_steps):
    # join_schedules hands this schedule steps counted from the end of the warmup.
    start = options.decay_start(total_steps, warmup_steps) - int(warmup_steps)
    length = max(1, total_steps - int(warmup_steps) - start)
    shape, final = SHAPES[options.decay_shape], float(options.final_fraction)

    def rate(step):
        progress = jnp.clip((step - start) / length, 0.0, 1.0)
        return lr * (final + (1.0 - final) * shape(progress))
    return rate
