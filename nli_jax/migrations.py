"""Config keys an older nli-jax had that live elsewhere now: one table, read at the edges where an
older config meets today's code (a command line's --config.<key>, a workdir's config.json).

A key moved to a task's own options (`task_options.<name>`) moves there only when the run's task
declares it (no other task read it); a key moved to a component's section (a schedule's, a hook's,
the batch ramp's) always moves, every registered component's options being in every config.
"""
from __future__ import annotations

import dataclasses

# Older shared-section keys that are a task's own options now, under the same name.
_TO_TASK_OPTIONS = ("data.hypothesis_only", "data.word_alignment", "data.train_size", "data.holdout_topic",
                    "data.validation_fraction", "data.validation_seed", "data.translate_train_source",
                    "data.mix_indonli_train", "pretrain.whole_word", "pretrain.max_ngram", "pretrain.mask_prob",
                    "pretrain.max_predictions", "pretrain.random_token_low", "pretrain.generator_fraction",
                    "pretrain.discriminator_weight")

# The task of a config.json written before configs had a `task` key: those runs were IndoNLI's.
TASK_OF_CONFIGS_WITHOUT_ONE = "indonli"

# old key -> today's key
MOVED_KEYS = {
    **{key: f"task_options.{key.split('.', 1)[1]}" for key in _TO_TASK_OPTIONS},
    "optimizer.one_cycle_peak": "schedules.one_cycle.peak",
    "optimizer.one_cycle_start": "schedules.one_cycle.start",
    "optimizer.decay_rate": "schedules.exponential_per_epoch.decay_rate",
    "optimizer.end_lr": "schedules.polynomial.end_lr",
    "optimizer.power": "schedules.polynomial.power",
    "optimizer.batch_ramp_max": "batch_ramp.max_accumulation",
    "optimizer.batch_ramp_fraction": "batch_ramp.fraction",
    "train.record_dynamics": "hooks.dynamics.enabled",
    "train.dynamics_every_steps": "hooks.dynamics.every_steps",
    "train.calibration": "hooks.calibration.enabled",
}


def moved_key(key: str) -> str | None:
    """Where an older config key lives now, or None."""
    return MOVED_KEYS.get(key)


def upgrade_config_json(config_json: dict, task_options: type) -> dict:
    """An older config.json as today's: each moved key where it is now (a task option only when the
    run's `task_options` class declares it; the others no task read). Today's config.json comes
    back unchanged."""
    out = _copy(config_json)
    task_names = {f.name for f in dataclasses.fields(task_options)}
    for old, new in MOVED_KEYS.items():
        section, name = old.split(".", 1)
        if not (isinstance(out.get(section), dict) and name in out[section]):
            continue
        value = out[section].pop(name)
        parts = new.split(".")
        if parts[0] == "task_options" and parts[1] not in task_names:
            continue
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node.setdefault(parts[-1], value)  # a value today's keys already hold wins
    return out


def _copy(node):
    return {k: _copy(v) for k, v in node.items()} if isinstance(node, dict) else node
