"""Progress log with ETA, TensorBoard summaries, results.json and predictions.jsonl."""
from __future__ import annotations

import json
import logging
import os
import time

import jax
import numpy as np

from nli_jax import storage

log = logging.getLogger("nli_jax")


def setup_logging(workdir: str) -> None:
    """Log to stdout and <workdir>/train.log (process 0 writes the file)."""
    log.setLevel(logging.INFO)
    log.propagate = False  # first: a refused train.log below leaves one handler, not absl's as well
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in log.handlers):
        stream = logging.StreamHandler()
        stream.setFormatter(fmt)
        log.addHandler(stream)
    for h in [h for h in log.handlers if isinstance(h, logging.FileHandler)]:
        log.removeHandler(h)
        h.close()
    if jax.process_index() == 0:
        # On gs:// a local file uploaded every few seconds (an object cannot be appended to).
        file = storage.LogFile(storage.under(workdir, "train.log"))  # gs://: uploaded every few seconds
        file.setFormatter(fmt)
        log.addHandler(file)


class Reporter:
    """The training log, metrics.jsonl and TensorBoard: loss, learning rate, gradient norm,
    throughput, MFU, and every scalar the task names (Task.training_scalars: name, numerator and
    denominator among its loss's metric sums)."""

    def __init__(self, workdir: str, total_steps: int, start_step: int, *, scalars=(), flops_per_token: float = 0.0,
                 peak_flops: float = 0.0):
        self.workdir, self.named = workdir, tuple(scalars)
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.total_steps = total_steps
        self.start_step = start_step
        self.start_time = time.time()
        self.last_time, self.last_step = self.start_time, start_step
        self.examples = 0
        self.tokens = 0
        self.writer = None
        if jax.process_index() == 0:
            self.writer = tensorboard_writer(workdir)

    def count(self, examples: int, tokens: int) -> None:
        self.examples += examples
        self.tokens += tokens

    def train(self, step: int, sums: dict, epoch: float) -> None:
        now = time.time()
        elapsed = max(now - self.last_time, 1e-9)
        weight = max(float(sums["weight"]), 1.0)
        scalars = {"train/loss": float(sums["loss_sum"]) / weight,
                   "train/lr": float(sums["lr"]), "train/grad_norm": float(sums["grad_norm"]),
                   "train/examples_per_s": self.examples / elapsed, "train/tokens_per_s": self.tokens / elapsed}
        named = [name for name, numerator, denominator in self.named if numerator in sums and denominator in sums]
        for name, numerator, denominator in self.named:
            if name in named:
                scalars[f"train/{name}"] = float(sums[numerator]) / max(float(sums[denominator]), 1.0)
        if self.peak_flops > 0:
            scalars["train/mfu"] = scalars["train/tokens_per_s"] * self.flops_per_token / self.peak_flops
        done = step - self.start_step
        rate = done / max(now - self.start_time, 1e-9)
        eta = (self.total_steps - step) / rate if rate > 0 else float("nan")
        if jax.process_index() == 0:
            with storage.open_append(storage.under(self.workdir, "metrics.jsonl")) as f:
                f.write(json.dumps({"step": step, "epoch": round(epoch, 4), **scalars}) + "\n")
        extra = "".join(f" {k[6:]} {scalars[k]:.3f}" for k in (*(f"train/{n}" for n in named), "train/mfu")
                        if k in scalars)
        log.info("step %d/%d (epoch %.2f) loss %.4f%s lr %.2e | %.1f examples/s %.0f tokens/s | ETA %s",
                 step, self.total_steps, epoch, scalars["train/loss"], extra,
                 scalars["train/lr"], scalars["train/examples_per_s"], scalars["train/tokens_per_s"], _duration(eta))
        self.scalars(step, scalars)
        self.last_time, self.last_step, self.examples, self.tokens = now, step, 0, 0

    def scalars(self, step: int, scalars: dict) -> None:
        if self.writer is not None:
            for k, v in scalars.items():
                if isinstance(v, (int, float)) and np.isfinite(v):
                    self.writer.add_scalar(k, v, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        storage.sync()


def tensorboard_writer(workdir: str, suffix: str = ""):
    """A TensorBoard writer of <workdir>/tensorboard (the Reporter's, and run hooks' own, each with its
    file name `suffix`: two writers opened in the same second would otherwise share one file);
    process 0's."""
    from tensorboardX import SummaryWriter  # late: ~1 s of imports (protobuf), only where events are written
    return SummaryWriter(storage.output_dir(storage.under(workdir, "tensorboard"), synced=True),
                         filename_suffix=suffix)


def _duration(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def write_json(path, obj) -> None:
    """`obj` as JSON to `path` (a storage.under(...) OutputPath), by process 0."""
    if jax.process_index() != 0:
        return
    storage.write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False))


def write_jsonl(path, rows) -> None:
    """One JSON line per row to `path` (a storage.under(...) OutputPath), by process 0."""
    if jax.process_index() != 0:
        return
    storage.write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
