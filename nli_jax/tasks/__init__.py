"""The task registry: every module of this package is imported here, and registers its tasks
(`register("name")(factory)`; docs/extending.md), so a new task is one module;
`create_task(plan)` builds the plan's task from the sections it needs."""
import importlib
import pkgutil

import ml_collections

from nli_jax.plan import NoOptions, section_defaults
from nli_jax.tasks.base import TASK_OPTIONS, TASKS, Task, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "common"):
        importlib.import_module(f"{__name__}.{_module.name}")


def create_task(plan) -> Task:
    """The task `plan.task` names (KeyError naming the registered ones when none does)."""
    if plan.task not in TASKS:
        raise KeyError(f"unknown task {plan.task!r}; registered tasks: {sorted(TASKS)}")
    return TASKS[plan.task](plan)


def options_class(name: str):
    """The options class task `name` registered (NoOptions for an unknown name: the planner
    refuses the name itself)."""
    return TASK_OPTIONS.get(name, NoOptions)


def options_config(name: str, **values):
    """config.task_options for task `name`: its options' defaults, `values` set over them."""
    defaults = section_defaults(options_class(name))
    unknown = sorted(set(values) - set(defaults))
    if unknown:
        raise ValueError(f"task {name!r} has no option(s) {unknown}; its options: {sorted(defaults)}")
    return ml_collections.ConfigDict({**defaults, **values})


__all__ = ["TASKS", "TASK_OPTIONS", "Task", "create_task", "options_class", "options_config", "register"]
