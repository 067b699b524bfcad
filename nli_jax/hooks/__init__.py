"""Run hooks: what a run does besides training and evaluating, at fixed points of the loop, the
final evaluation and the offline tools. Training dynamics (`dynamics`), calibration
(`calibration`) and per-layer norms (`layer_norms`) are hooks; a new recorder or analysis is one
module of this package: a `RunHook` subclass registered with its options class,

    @HOOKS.register("name", options=MyOptions)   # MyOptions(HookOptions): `enabled` + its own
    class MyHook(RunHook): ...

chosen and configured in the config as big_vision chooses evaluators, by a mapping of name ->
options: `config.hooks.<name>.enabled=True`, `config.hooks.<name>.<option>=...` (every registered
hook's options are in the config with their defaults). The planner resolves them into
`RunPlan.hooks`; the loop calls every enabled hook at its points and knows none by name.

Points, in a run's order:
  start(step)                        before the first step of this invocation (resumed or 0)
  after_step(step, outputs)          after each train step, `outputs` its StepOutputs: the step's
                                     metrics (loss_sum, weight, grad_norm, lr), the examples'
                                     outcomes when the hook asked for them (`per_example_outcomes`),
                                     what the hook's `step_probe` computed inside the step, and the
                                     updated parameters. All are device arrays: a hook reads them
                                     only every N steps (reading waits for the step).
  step_probe(grads, params)          traced inside the jitted train step when a hook defines it
                                     (`probes_step`): small values of the step's gradients (before
                                     clipping) and parameters, returned as the hook's `probe`
  before_checkpoint(step)            before each checkpoint (and the one a SIGTERM forces)
  final_results(run, params, results, evaluations)
                                     after the final evaluation of every split (training and
                                     finetune.evaluate): may add to results and replace a split's
                                     prediction records
  predictions(records, outputs)      finetune.predict's records, with the step's outputs
  export_fields()                    what an export of the parameters records (config.json's nli_jax)
and `summarize_seeds(per_seed, summary)` (a classmethod) over a seeds run's results.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from nli_jax.options import Options, Registry, option

HOOKS = Registry("hook", __name__)


@dataclasses.dataclass(frozen=True)
class HookOptions(Options):
    """A hook's options: `enabled` (each hook's own default) and what the hook alone reads."""
    enabled: bool = option(False)


class StepOutputs(NamedTuple):
    """What a hook's after_step sees of one train step (device arrays)."""
    metrics: dict  # loss_sum, weight, grad_norm, lr and the task's sums
    outcomes: dict | None  # each example's outcomes, when the hook has per_example_outcomes
    probe: Any  # what the hook's step_probe returned inside the step, or None
    params: Any  # the parameters after the step


class RunHook:
    """A hook's points, each doing nothing by default."""
    per_example_outcomes = False  # the train step returns each example's outcomes (Task.records_dynamics)
    probes_step = False  # step_probe is traced into the train step

    def start(self, step: int) -> None:
        pass

    def step_probe(self, grads, params):
        return None

    def after_step(self, step: int, outputs: StepOutputs) -> None:
        pass

    def before_checkpoint(self, step: int) -> None:
        pass

    def final_results(self, run, params, results: dict, evaluations: dict) -> None:
        pass

    def predictions(self, records: list[dict], outputs: dict) -> list[dict]:
        return records

    def export_fields(self) -> dict:
        return {}

    @classmethod
    def summarize_seeds(cls, per_seed: dict[int, dict], summary: dict) -> None:
        pass

    # Construction: for a training run (its set-up, training split and the hook's options), or for
    # a tool reading a finished run or Hugging Face directory (`checkpoint`); None where the hook
    # has no part. Only enabled hooks are built for training; every hook is asked by the tools (a
    # checkpoint's stored calibration temperature applies even when the tool's config turns
    # calibration's report off).
    @classmethod
    def for_training(cls, run, train_source, options: HookOptions) -> "RunHook | None":
        return None

    @classmethod
    def for_checkpoint(cls, plan, checkpoint: str, options: HookOptions) -> "RunHook | None":
        return None


def for_training(run, train_source) -> list[RunHook]:
    """The enabled hooks of a training run (each checks what it needs before any compute)."""
    built = (HOOKS.get(name).for_training(run, train_source, options) for name, options in run.plan.hooks
             if options.enabled)
    return [hook for hook in built if hook is not None]


def for_checkpoint(plan, checkpoint: str) -> list[RunHook]:
    """The hooks of a tool reading `checkpoint` (each reads and checks its files before any compute)."""
    built = (HOOKS.get(name).for_checkpoint(plan, checkpoint, options) for name, options in plan.hooks)
    return [hook for hook in built if hook is not None]


def step_probes(hooks) -> tuple:
    """The train step's in-step probes, one per hook that has one (in the hooks' order)."""
    return tuple(hook.step_probe for hook in hooks if hook.probes_step)


def after_step(hooks, step: int, metrics: dict, outcomes, probes: tuple, params) -> None:
    """Every hook's after_step, each given its own probe's values."""
    probes = iter(probes)
    for hook in hooks:
        hook.after_step(step, StepOutputs(metrics, outcomes, next(probes) if hook.probes_step else None, params))


def export_fields(hooks) -> dict:
    """What an export of the parameters records from the hooks (the calibration temperature)."""
    return {k: v for hook in hooks for k, v in hook.export_fields().items()}


def summarize_seeds(per_seed: dict[int, dict], summary: dict) -> None:
    """What each hook adds to a seeds run's summary (calibration measures' mean and std)."""
    for name in HOOKS.names():
        HOOKS.get(name).summarize_seeds(per_seed, summary)
