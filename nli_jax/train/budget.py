"""A wall-clock budget for training (train.budget_minutes, Cramming's): the run's step count fixed
once, from the time a step takes, so that the schedule and the batch ramp can be laid over it and a
resumed run ends where an uninterrupted one does.

Design. Steps, not clocks, drive everything the run computes (learning rate, ramp, data order,
dropout keys), so the budget becomes a step count before the first real step:

1. calibration: `budget_calibration_steps` steps of the run's own compiled train step, on a copy
   of the initial state (thrown away) and the run's first batches (read from a second iterator:
   the run's own still starts at its first batch). The first is the compilation and is not timed;
   the median of the others is the time of a step;
2. total = min(the cap: train.max_steps / num_epochs, floor(budget_minutes x 60 / that time));
3. the total and the measurement are recorded in the loop's record, which every checkpoint
   saves (and in run.json's total_steps); a resumed run reads them back and does not measure
   again, so a run killed and resumed finishes at the same step, with the same schedule and ramp,
   as the same run uninterrupted. Killed before its first checkpoint, a run starts over and
   measures again.

What the budget counts: the training steps' time. Compilation, the calibration itself,
evaluations and checkpoints are outside it (Cramming's budget, too, is its training's); on a
shared machine the measured step time is what the machine gave during the calibration.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from nli_jax.plan import RunPlan, StepPlan
from nli_jax.train.record import BudgetRecord, LoopRecord
from nli_jax.train.reporting import log



def budget_steps(plan: RunPlan, steps: StepPlan, record: LoopRecord, seconds_per_step) -> tuple[StepPlan, LoopRecord]:
    """(the run's StepPlan with its total fixed by the budget (the plan's own without one), the
    loop's record with that total). `seconds_per_step(n)`: measures a step on n throw-away steps
    (called only when the run has a budget and no recorded total)."""
    minutes = float(plan.train.budget_minutes)
    if minutes <= 0:
        return steps, record
    fixed = record.budget
    if fixed is None:
        per_step = float(seconds_per_step(plan.train.budget_calibration_steps))
        total = max(1, min(steps.total_steps, int(minutes * 60.0 // per_step)))
        fixed = BudgetRecord(minutes=minutes, seconds_per_step=per_step, total_steps=total, cap=steps.total_steps)
        record = record.with_budget(fixed)
        log.info("budget %.4g minutes: %.4f s a step (median of %d calibration steps) -> %d steps%s", minutes, per_step,
                 plan.train.budget_calibration_steps - 1, total,
                 " (train.max_steps / num_epochs cap it)" if total == steps.total_steps else "")
    else:
        log.info("budget %.4g minutes: %d steps, as fixed when the run started (%.4f s a step)", minutes,
                 fixed.total_steps, fixed.seconds_per_step)
    return with_total(plan, steps, int(fixed.total_steps)), record


def with_total(plan: RunPlan, steps: StepPlan, total: int) -> StepPlan:
    """`steps` over `total` steps: a warmup given as a share of the run re-laid over it."""
    opt = plan.optimizer
    warmup = opt.warmup_steps or round(opt.warmup_ratio * total)
    return dataclasses.replace(steps, total_steps=total, warmup_steps=int(min(warmup, max(0, total - 1))))


def time_steps(train_step, state, batch_iterator, to_global, count: int) -> float:
    """Median seconds of steps 2..count of `train_step` from a copy of `state` (donated and
    discarded) on the iterator's batches; step 1 compiles."""
    copy = jax.tree.map(lambda x: x.copy(), state)
    times = []
    for _ in range(count):
        batch = to_global(next(batch_iterator))
        start = time.perf_counter()
        copy, metrics = train_step(copy, batch)
        jax.block_until_ready((copy, metrics))
        times.append(time.perf_counter() - start)
    del copy
    return float(np.median(times[1:]))
