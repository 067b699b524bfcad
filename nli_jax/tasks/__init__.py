"""Registered tasks: importing this package registers the built-in ones."""
from nli_jax.tasks import indonlu, nli, pretraining  # noqa: F401
from nli_jax.tasks.base import TASKS, Task, get_task, register

__all__ = ["TASKS", "Task", "get_task", "register"]
