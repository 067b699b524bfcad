"""A run's hooks (nli_jax.train.hooks.RunHook), in the order they run: each built for a training
run or a tool from the plan, or left out where the plan does not ask for it."""
from __future__ import annotations

from nli_jax.train import calibrate, dynamics, overlap

# The overlap check first: it may refuse the run before the others write anything.
HOOKS = (overlap.OverlapHook, dynamics.DynamicsHook, calibrate.CalibrationHook)


def for_training(run, train_source) -> list:
    """The hooks of a training run (each checks what it needs before any compute)."""
    return [h for h in (cls.for_training(run, train_source) for cls in HOOKS) if h is not None]


def for_checkpoint(plan, checkpoint: str) -> list:
    """The hooks of a tool reading `checkpoint` (each reads and checks its files before any compute)."""
    return [h for h in (cls.for_checkpoint(plan, checkpoint) for cls in HOOKS) if h is not None]


def export_fields(hooks) -> dict:
    """What an export of the parameters records from the hooks (the calibration temperature)."""
    return {k: v for hook in hooks for k, v in hook.export_fields().items()}


def summarize_seeds(per_seed: dict[int, dict], summary: dict) -> None:
    """What each hook adds to a seeds run's summary (calibration measures' mean and std)."""
    for cls in HOOKS:
        cls.summarize_seeds(per_seed, summary)
