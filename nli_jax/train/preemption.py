"""SIGTERM (TPU maintenance, preemption) and SIGINT (Ctrl-C) turned into "checkpoint and exit at
the same step on every process", without a per-step exchange between hosts. Owns the signal
handlers while the loop runs; the loop asks `reached(step)` after each step. A Ctrl-C that lands
in a checkpoint's write lets the write finish (it left a cut checkpoint and ~100 lines of
tracebacks, run.json "running"); a second Ctrl-C stops at once (KeyboardInterrupt).

- several processes with JAX's preemption service (started by jax.distributed.initialize,
  which catches SIGTERM itself): orbax's `CheckpointManager.reached_preemption(step)`, a local
  check each step; when a host gets the notice the service agrees on a step in the background;
- several processes without it (jax_enable_preemption_service off): the processes exchange
  their flags every `check_every` steps only (the log steps, where the loop waits anyway);
- one process: the flag set by our signal handler, checked every step.

With the service, SIGINT keeps Python's own handler (the service agrees on SIGTERM only).
"""
from __future__ import annotations

import logging
import signal
from typing import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils


log = logging.getLogger("nli_jax")


class Preempted(SystemExit):
    """Raised after the checkpoint of a SIGTERM (exit status 143) or SIGINT (130), as a process
    killed by it."""


_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)"}


class Preemption:
    def __init__(self, reached_sync_point: Callable[[int], bool], check_every: int = 1):
        """`reached_sync_point`: the checkpoint manager's reached_preemption (the service's agreed step)."""
        self.requested = False
        self.received = signal.SIGTERM  # which signal asked (another process's: SIGTERM)
        self._previous = {}
        self._reached_sync_point = reached_sync_point
        self.check_every = max(1, check_every)
        self.service = jax.process_count() > 1 and bool(jax.config.jax_enable_preemption_service)

    def __enter__(self):
        if self.service:
            return self  # the service's own SIGTERM handler must stay in place
        try:
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        except ValueError:  # not the main thread
            pass
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: at once, without the checkpoint
        self.requested, self.received = True, signal.Signals(signum)

    def exit(self, step: int):
        """After the checkpoint of `step`: one line, and the exit status of a process the signal
        killed (143, 130)."""
        log.info("%s: checkpoint saved at step %d; exiting (rerun the same command to resume)", _SIGNALS[self.received],
                 step)
        raise Preempted(128 + int(self.received))

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def reached(self, step: int) -> bool:
        """Whether this step is the one to checkpoint at and exit (the same on every process)."""
        if jax.process_count() == 1:
            return self.requested
        if self.service:
            return self._reached_sync_point(step)
        if step % self.check_every:
            return False
        return bool(np.any(multihost_utils.process_allgather(np.array(self.requested))))
