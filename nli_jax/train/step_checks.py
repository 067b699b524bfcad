"""What the loop checks and counts of its steps: every step's loss and gradient norm finite
(`FiniteSteps`: a diverged run stops in one line, nothing after the bad step saved) and the tokens
the steps computed on against real ones (`Padding`).
"""
from __future__ import annotations

import contextlib
import hashlib

import jax
import numpy as np

from nli_jax import workdir as workdir_lib
from nli_jax.errors import RunError
from nli_jax.train.checkpointing import Checkpointer
from nli_jax.train.reporting import Reporter, log


class NonFiniteStepError(RunError):
    """A training step whose loss or gradient norm is NaN or Inf: the run stops, marked failed."""


class FiniteSteps:
    """The loop's check that every step's loss and gradient norm are finite, made on metrics it
    fetches anyway (log steps) and before each evaluation and checkpoint, so a diverged step is
    never saved. `stops` turns the first bad step into one line naming it: the checkpoints
    written before it are kept, and run.json says "failed" (never "finished")."""

    def __init__(self, workdir: str, ckpt: Checkpointer, step: int, run_state: dict, best_step):
        self.workdir, self.ckpt, self.run_state, self.best_step = workdir, ckpt, run_state, best_step
        self.last_saved = step if step else None  # a resumed run's checkpoint

    def saved(self, step: int) -> None:
        self.last_saved = step

    def check(self, pending: list) -> list:
        """[(step, metrics)] fetched to the host (device_get: a no-op for fetched values), or a
        NonFiniteStepError naming the first step whose loss or gradient norm is not finite."""
        fetched = list(zip([s for s, _ in pending], jax.device_get([m for _, m in pending])))
        for step, metrics in fetched:
            bad = {k: float(metrics[k]) for k in ("loss_sum", "grad_norm") if k in metrics
                   and not np.isfinite(metrics[k])}
            if bad:
                what = " and ".join(f"{'loss' if k == 'loss_sum' else 'gradient norm'} {v}" for k, v in bad.items())
                raise NonFiniteStepError(step, what)
        return fetched

    @contextlib.contextmanager
    def stops(self, reporter: Reporter):
        try:
            yield
        except NonFiniteStepError as e:
            step, what = e.args
            self.ckpt.wait()
            self.ckpt.close()
            reporter.close()
            workdir_lib.write_state(self.workdir, "failed", step=step, last_checkpoint=self.last_saved,
                                    best_step=self.best_step(), reason=f"step {step}: {what}",
                                    **self.run_state)
            kept = (f"its last checkpoint, step {self.last_saved}, was written before it and is kept"
                    if self.last_saved else "no checkpoint was written before it")
            raise NonFiniteStepError(
                f"training step {step} of {self.run_state['total_steps']} computed {what}: the run diverged and "
                f"stopped; {kept} (nothing after it was saved) and {self.workdir}/{workdir_lib.RUN_STATE_FILE} "
                "says failed. Lower optimizer.lr or set optimizer.grad_clip (a new --workdir), or check model.init "
                "and the data") from None


class Padding:
    """Tokens the steps computed on against real ones (from `restored`, the counts a resumed run
    had saved), and a digest of this invocation's padded length per step (processes that agree
    on every step's shape print the same digest)."""

    def __init__(self, restored: dict | None = None):
        self.lengths, self.per_length = hashlib.sha1(), {}
        self.real, self.padded = int((restored or {}).get("real", 0)), int((restored or {}).get("computed", 0))

    def totals(self) -> dict:
        return {"computed": self.padded, "real": self.real}

    def count(self, shape, real_tokens: int) -> None:
        rows, length = (int(n) for n in shape)
        self.lengths.update(length.to_bytes(4, "little"))
        self.per_length[length] = self.per_length.get(length, 0) + 1
        self.real += real_tokens
        self.padded += rows * length

    def log(self) -> None:
        if self.per_length and self.real:
            log.info("process %d: padded length per step sha1 %s (%s steps at each length); %.3f padded tokens per "
                     "real token", jax.process_index(), self.lengths.hexdigest()[:12],
                     ", ".join(f"{n}: {c}" for n, c in sorted(self.per_length.items())),
                     (self.padded - self.real) / self.real)
