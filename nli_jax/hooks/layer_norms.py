"""Per-layer norms and loss spikes (`hooks.layer_norms`): every `every_steps` steps, each layer's
parameter norm and gradient norm (the step's mean gradient, before clipping) go to TensorBoard
(`param_norm/<layer>`, `grad_norm/<layer>` in <workdir>/tensorboard); every step's loss is
compared with the running median of the `window` steps before it, and a loss above
`spike_factor` x that median is a spike. Spikes are logged as they are found, counted in
results.json (`loss_spikes`: count and steps) and recorded in <workdir>/loss_spikes.jsonl, one
row per step, written before each checkpoint: a resumed run reads back the rows up to its
checkpoint (its median window and count included) and drops the rest, so it finds what an
uninterrupted run finds.

A layer is a parameter path up to `layers/<i>` (scanned layers' stacked parameters are split
along their leading axis), else its first two parts (`encoder/embeddings`, `mlm/transform`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np

from nli_jax import storage
from nli_jax.hooks import HOOKS, HookOptions, RunHook
from nli_jax.options import option
from nli_jax.train.reporting import log, tensorboard_writer

RECORDS = "loss_spikes.jsonl"


@dataclasses.dataclass(frozen=True)
class LayerNormsOptions(HookOptions):
    every_steps: int = option(100, low=1)  # steps between the norms written to TensorBoard
    spike_factor: float = option(3.0, low=1.0, low_open=True)  # a loss above this x the running median is a spike
    window: int = option(100, low=1, high=1_000_000)  # steps the running median is taken over


def _path(keys) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "idx", k))) for k in keys]


def squared_norms(tree) -> dict:
    """{leaf path: sum of squares} (per layer, a vector, for scanned layers' stacked leaves)."""
    out = {}
    for keys, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = _path(keys)
        x = jnp.asarray(leaf, jnp.float32)
        scanned = "layers" in parts and not parts[parts.index("layers") + 1].isdigit()
        out["/".join(parts)] = jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim))) if scanned else jnp.sum(jnp.square(x))
    return out


def layer_norms(squares: dict) -> dict[str, float]:
    """{layer: norm} from squared_norms' values (fetched)."""
    sums = defaultdict(float)
    for path, value in squares.items():
        parts = path.split("/")
        if "layers" in parts:
            i = parts.index("layers")
            if parts[i + 1].isdigit():
                sums["/".join(parts[:i + 2])] += float(value)
            else:
                for index, v in enumerate(np.atleast_1d(value)):
                    sums["/".join(parts[:i + 1] + [str(index)])] += float(v)
        else:
            sums["/".join(parts[:2] if len(parts) > 2 else parts[:1])] += float(value)
    return {layer: float(np.sqrt(total)) for layer, total in sorted(sums.items())}


@HOOKS.register("layer_norms", options=LayerNormsOptions)
class LayerNormsHook(RunHook):
    probes_step = True

    def __init__(self, workdir: str, options: LayerNormsOptions):
        self.workdir, self.options = workdir, options
        self.writer = None
        self.pending = []  # (step, loss_sum, weight) device scalars not yet read
        self.rows = []  # {"step", "loss", "spike"} read, not yet written
        self.losses = []  # the last `window` losses
        self.spikes = []  # steps whose loss was a spike

    @classmethod
    def for_training(cls, run, train_source, options):
        return cls(run.workdir, options)

    def step_probe(self, grads, params):
        return {"grad": squared_norms(grads), "param": squared_norms(params)}

    def start(self, step):
        path = os.path.join(self.workdir, RECORDS)
        kept = []
        if storage.isfile(path):
            for number, line in enumerate(storage.read_text(path).splitlines(), 1):
                try:
                    row = json.loads(line)
                except ValueError:
                    raise ValueError(f"{path}:{number}: not a JSON row nli-jax wrote") from None
                if row["step"] <= step:
                    kept.append(row)
        for row in kept:
            self._count(row)
        self._write(kept, replace=True)
        if jax.process_index() == 0:
            self.writer = tensorboard_writer(self.workdir, suffix=".layer_norms")

    def after_step(self, step, outputs):
        self.pending.append((step, outputs.metrics["loss_sum"], outputs.metrics["weight"]))
        if step % self.options.every_steps == 0:
            self._read_losses()
            probe = jax.device_get(outputs.probe)
            if self.writer is not None:
                for kind in ("param", "grad"):
                    for layer, norm in layer_norms(probe[kind]).items():
                        self.writer.add_scalar(f"{kind}_norm/{layer}", norm, step)
                self.writer.flush()

    def before_checkpoint(self, step):
        self._read_losses()
        self._write(self.rows)
        self.rows = []

    def final_results(self, run, params, results, evaluations):
        self._read_losses()
        results["loss_spikes"] = {"count": len(self.spikes), "steps": self.spikes[:1000],
                                  "spike_factor": self.options.spike_factor, "window": self.options.window}
        log.info("loss spikes (loss above %g x the median of the %d steps before): %d", self.options.spike_factor,
                 self.options.window, len(self.spikes))
        if self.writer is not None:
            self.writer.close()

    def _read_losses(self) -> None:
        if not self.pending:
            return
        steps = [s for s, _, _ in self.pending]
        fetched = jax.device_get([(loss, weight) for _, loss, weight in self.pending])
        self.pending = []
        for step, (loss_sum, weight) in zip(steps, fetched):
            row = {"step": step, "loss": float(loss_sum) / max(float(weight), 1.0)}
            row["spike"] = self._count(row)
            self.rows.append(row)

    def _count(self, row) -> bool:
        """Whether the row's loss is a spike against the losses before it; the window moves on."""
        spike = len(self.losses) > 0 and row["loss"] > self.options.spike_factor * float(np.median(self.losses))
        if spike:
            self.spikes.append(row["step"])
            log.warning("loss spike at step %d: %.4f, above %g x the running median %.4f", row["step"], row["loss"],
                        self.options.spike_factor, float(np.median(self.losses)))
        self.losses = (self.losses + [row["loss"]])[-self.options.window:]
        return spike

    def _write(self, rows, replace: bool = False) -> None:
        if jax.process_index() != 0 or not (rows or replace):
            return
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if replace:
            storage.write_text(storage.under(self.workdir, RECORDS), text)
        else:
            with storage.open_append(storage.under(self.workdir, RECORDS)) as f:
                f.write(text)
