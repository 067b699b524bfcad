"""Which datasets a model was trained on, and which datasets share texts by translation: a score
on a dataset whose texts are a translation of the model's training data is a score on training
data, and no text overlap shows it (nli_jax.data.overlap finds copied sentences; a Javanese
translation of an SmSA sentence shares no word sequence with it).

A task declares, when it registers, the datasets its texts are translated or drawn from
(`texts_from`: NusaX-Senti's are SmSA's, Winata et al. 2023), and names the datasets a run of it
trains on (`Task.trained_task_names`: a universal classifier's recast tasks and its NLI corpus). A
model's training is its run's tasks, those of every run its `model.init` chain starts from, and
those an export records in config.json (`nli_jax.trained_on`).
"""
from __future__ import annotations

import json
import os

from nli_jax import storage
from nli_jax.planner import build_plan, saved_config
from nli_jax.tasks import create_task
from nli_jax.tasks.base import TEXTS_FROM
from nli_jax.train.run_init import is_run_directory


def texts_from(task_name: str) -> tuple[str, ...]:
    """The datasets task `task_name`'s texts are translated or drawn from (registered with it)."""
    return TEXTS_FROM.get(task_name, ())


def share_texts(a: str, b: str) -> bool:
    """Whether two different datasets share texts: one's are translated or drawn from the other's."""
    return a != b and (b in texts_from(a) or a in texts_from(b))


def _export_trained_on(path: str) -> dict[str, str]:
    config_path = os.path.join(path, "config.json")
    if not storage.isfile(config_path):
        return {}
    try:
        recorded = json.loads(storage.read_text(config_path)).get("nli_jax", {}).get("trained_on", {})
    except (ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}


def trained_on(path: str) -> dict[str, str]:
    """{dataset (task name): where the model met it} for the model in `path`: a fine-tuning run's
    workdir (its task's training data and its model.init chain's) or a Hugging Face directory (what
    an nli-jax export recorded; nothing for other checkpoints). Reads configs only, no weights."""
    out: dict[str, str] = {}
    seen = set()
    while path and path not in seen:
        seen.add(path)
        if not is_run_directory(path):
            for name, where in _export_trained_on(path).items():
                out.setdefault(name, where)
            break
        plan = build_plan(saved_config(path), training=False)
        task = create_task(plan)
        for name in task.trained_task_names():
            out.setdefault(name, f"the run {path}")
        path = plan.model.init
    return out


def translated_training(path: str, task_name: str, trained: dict[str, str] | None = None) -> str | None:
    """A one-clause description of why the model in `path` has seen `task_name`'s texts in
    another dataset (the model trained on a dataset it shares texts with), or None. `trained`:
    trained_on(path) when the caller has it already."""
    for name, where in (trained_on(path) if trained is None else trained).items():
        if share_texts(name, task_name):
            source, derived = (name, task_name) if name in texts_from(task_name) else (task_name, name)
            return (f"{where} trained on {name}, and {derived}'s texts are {source}'s (translated or drawn "
                    f"from them)")
    return None
