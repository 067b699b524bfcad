"""The task registry: every module of this package is imported here, and registers its tasks
(`register("name")(factory)`; docs/extending.md), so a new task is one module;
`create_task(plan)` builds the plan's task from the sections it needs."""
import importlib
import pkgutil

from nli_jax.tasks.base import TASKS, Task, register

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "common"):
        importlib.import_module(f"{__name__}.{_module.name}")


def create_task(plan) -> Task:
    """The task `plan.task` names (KeyError naming the registered ones when none does)."""
    if plan.task not in TASKS:
        raise KeyError(f"unknown task {plan.task!r}; registered tasks: {sorted(TASKS)}")
    return TASKS[plan.task](plan)


__all__ = ["TASKS", "Task", "create_task", "register"]
