"""SIGTERM (TPU maintenance, preemption) turned into "checkpoint and exit at the same step on
every process", without a per-step exchange between hosts. Owns the signal handler while the
loop runs; the loop asks `reached(step)` after each step.

- several processes with JAX's preemption service (started by jax.distributed.initialize,
  which catches SIGTERM itself): orbax's `CheckpointManager.reached_preemption(step)`, a local
  check each step; when a host gets the notice the service agrees on a step in the background;
- several processes without it (jax_enable_preemption_service off): the processes exchange
  their flags every `check_every` steps only (the log steps, where the loop waits anyway);
- one process: the flag set by our SIGTERM handler, checked every step.
"""
from __future__ import annotations

import signal
from typing import Callable

import jax
import numpy as np


class Preempted(SystemExit):
    """Raised after the checkpoint of a SIGTERM: exit status 143, as a process killed by it."""


class Preemption:
    def __init__(self, reached_sync_point: Callable[[int], bool], check_every: int = 1):
        """`reached_sync_point`: the checkpoint manager's reached_preemption (the service's agreed step)."""
        self.requested = False
        self._previous = None
        self._reached_sync_point = reached_sync_point
        self.check_every = max(1, check_every)
        self.service = jax.process_count() > 1 and bool(jax.config.jax_enable_preemption_service)

    def __enter__(self):
        if self.service:
            return self  # the service's own SIGTERM handler must stay in place
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def reached(self, step: int) -> bool:
        """Whether this step is the one to checkpoint at and exit (the same on every process)."""
        if jax.process_count() == 1:
            return self.requested
        if self.service:
            return self._reached_sync_point(step)
        if step % self.check_every:
            return False
        from jax.experimental import multihost_utils
        return bool(np.any(multihost_utils.process_allgather(np.array(self.requested))))
