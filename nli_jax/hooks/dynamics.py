"""Training dynamics (dataset cartography, Swayamdipta et al., EMNLP 2020), recorded while a run
trains (`hooks.dynamics.enabled=True`): for every training example, its gold label's probability
and whether it was predicted correctly, once per epoch, from the training step's own forward
pass (no second pass over the training set; dropout on, as the cartography paper's code
records them). With `hooks.dynamics.every_steps=N` the whole training split is instead
evaluated every N steps (deterministic), for runs too short for several epochs.

Records go to <workdir>/dynamics/ (local or gs://): `meta.json` (the run they belong to) and one
`records-<step>.npz` per checkpoint, written before the checkpoint of that step, so a resumed
run drops the files past its checkpoint and records those steps again: a SIGKILL and rerun
leave the same records as an uninterrupted run. The step's per-example outputs are replicated
on every process (each sees the whole global batch's, a few bytes an example): process 0 writes.
`python -m nli_jax.analysis cartography --workdir=RUN` turns them into the data map.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os

import jax
import numpy as np

from nli_jax import storage
from nli_jax import workdir as workdir_lib
from nli_jax.errors import RunError
from nli_jax.hooks import HOOKS, HookOptions, RunHook
from nli_jax.options import flag, option

DIRECTORY = "dynamics"
META = "meta.json"
FIELDS = ("gold_probability", "correct")


class DynamicsError(RunError):
    """Dynamics records that belong to another run or task; names the file."""


def _chunk_name(step: int) -> str:
    return f"records-{step:09d}.npz"


def _chunk_step(name: str) -> int | None:
    if name.startswith("records-") and name.endswith(".npz"):
        try:
            return int(name[len("records-"):-len(".npz")])
        except ValueError:
            return None
    return None


def identity(task: str, config_json: dict, train_examples: int) -> dict:
    """What the records are of: the task, the training split's size and a digest of the config
    (the run's config.json, so records of another run or config are told apart)."""
    digest = hashlib.sha256(json.dumps(config_json, sort_keys=True).encode()).hexdigest()[:16]
    return {"task": task, "train_examples": int(train_examples), "config_sha256": digest}


def read_meta(workdir: str) -> dict | None:
    path = os.path.join(workdir, DIRECTORY, META)
    try:
        return storage.read_json_object(path)
    except ValueError as e:
        raise DynamicsError(f"{path} is unreadable ({e}): not dynamics nli-jax wrote") from None


def check_meta(workdir: str, expected: dict) -> None:
    """Records already in the workdir must be this run's (same task, config and training split)."""
    meta = read_meta(workdir)
    if meta is None:
        return
    differing = [f"{k}: {meta.get(k)!r} (records) vs {v!r} (this run)" for k, v in expected.items()
                 if k != "mode" and meta.get(k) != v]
    if differing:
        raise DynamicsError(f"{os.path.join(workdir, DIRECTORY, META)} belongs to another run or task "
                            f"({'; '.join(differing)}): use a new --workdir, or move {DIRECTORY}/ away")


def read_records(workdir: str) -> dict[str, np.ndarray]:
    """Every record of a run: {"pass", "idx", "gold_probability", "correct"} (a pass is an
    epoch, or an every-N-steps evaluation), one row per (pass, example), later chunks winning."""
    directory = os.path.join(workdir, DIRECTORY)
    chunks = sorted((s, n) for n in storage.listdir(directory) if (s := _chunk_step(n)) is not None)
    if not chunks:
        raise FileNotFoundError(f"{directory} holds no records: was the run trained with "
                                "--config.hooks.dynamics.enabled=True?")
    parts = []
    for _, name in chunks:
        path = os.path.join(directory, name)
        try:
            with np.load(io.BytesIO(storage.read_bytes(path))) as data:
                parts.append({k: data[k] for k in ("pass", "idx", *FIELDS)})
        except Exception as e:  # a damaged file
            raise DynamicsError(f"{path} is unreadable ({type(e).__name__}: {e})") from None
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    # A (pass, example) recorded twice (an every-N evaluation repeated by a resume): the last.
    keys = merged["pass"].astype(np.int64) * (1 << 32) + merged["idx"].astype(np.int64)
    _, last = np.unique(keys[::-1], return_index=True)
    keep = np.sort(len(keys) - 1 - last)
    return {k: v[keep] for k, v in merged.items()}


class Recorder:
    """Collects the per-example outputs of the loop's steps and writes them with each checkpoint.

    An example's pass is its epoch in the shuffled stream the pipeline reads (position // number
    of training examples; row r of step s's global batch is position (s - 1) x batch + r), so
    each example is recorded once per epoch even where a batch spans two epochs."""

    def __init__(self, workdir: str, meta: dict, *, global_batch: int, every_steps: int = 0):
        self.workdir, self.directory = workdir, os.path.join(workdir, DIRECTORY)
        self.meta = dict(meta, mode=f"every {every_steps} steps" if every_steps else "epoch")
        self.global_batch, self.examples, self.every_steps = global_batch, int(meta["train_examples"]), every_steps
        self._pending: list[tuple[np.ndarray, dict]] = []  # (pass per row, device arrays) since the last write
        check_meta(workdir, meta)

    def start(self, step: int) -> None:
        """Before the first step of this invocation (`step`: the restored one, or 0): records
        written past it belong to steps the run is about to train again."""
        if jax.process_index() != 0:
            return
        for name in storage.listdir(self.directory):
            s = _chunk_step(name)
            if s is not None and s > step:
                storage.remove(os.path.join(self.directory, name))
        if storage.read_json_object(os.path.join(self.directory, META)) is None:
            storage.write_text(storage.under(self.workdir, DIRECTORY, META), json.dumps(self.meta, indent=2, sort_keys=True))

    def training_step(self, step: int, per_example: dict) -> None:
        """The outputs of training step `step` (1-based): each row's epoch is its pass."""
        if not self.every_steps:
            positions = (step - 1) * self.global_batch + np.arange(self.global_batch)
            self._pending.append(((positions // self.examples).astype(np.int32), per_example))

    def wants_pass(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0

    def evaluation_pass(self, step: int, per_example: dict) -> None:
        """Outputs of an evaluation of the whole training split at `step` (every N steps)."""
        self._pending.append((np.full(len(per_example["idx"]), step // self.every_steps - 1, np.int32), per_example))

    def write(self, step: int) -> None:
        """The records since the last write, as records-<step>.npz (before the checkpoint of `step`)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        fetched = jax.device_get([p for _, p in pending])
        rows = {k: [] for k in ("pass", "idx", *FIELDS)}
        for (passes, _), outputs in zip(pending, fetched):
            real = np.asarray(outputs["weight"]) > 0  # padding rows of a batch carry weight 0
            rows["pass"].append(passes[real])
            rows["idx"].append(np.asarray(outputs["idx"], np.int64)[real])
            for k in FIELDS:
                rows[k].append(np.asarray(outputs[k], np.float32)[real])
        if jax.process_index() != 0:
            return
        buffer = io.BytesIO()
        np.savez(buffer, **{k: np.concatenate(v) for k, v in rows.items()})
        storage.write_bytes(storage.under(self.workdir, DIRECTORY, _chunk_name(step)), buffer.getvalue())


@dataclasses.dataclass(frozen=True)
class DynamicsOptions(HookOptions):
    # > 0: instead of the training steps' own outcomes, the whole training split is evaluated every
    # N steps (deterministic), for runs too short for several epochs.
    every_steps: int = option(0, low=0)

    def problems(self):
        if self.every_steps and not self.enabled:
            return [f"{flag('hooks.dynamics.every_steps', self.every_steps)}: records training dynamics: also pass "
                    "--config.hooks.dynamics.enabled=True"]
        return []

    def plan_problems(self, plan, task, key):
        if self.enabled and not task.records_dynamics:
            return [f"--config.{key}.enabled=True: task {plan.task!r} has no one prediction per example to record "
                    "(training dynamics are for sequence-level tasks: NLI, EmoT, SmSA, WReTE, CASA, HoASA)"]
        return []


@HOOKS.register("dynamics", options=DynamicsOptions)
class DynamicsHook(RunHook):
    """Training dynamics as a run hook: each step's per-example outcomes (or, every
    `every_steps`, an evaluation of the whole training split) recorded, and written before each
    checkpoint."""

    def __init__(self, run, train_source, options: DynamicsOptions):
        plan = run.plan
        # Records of another run or task in this workdir are refused here, before any compute. The run's
        # config is the workdir's config.json when it has one (a resumed run keeps the one it started
        # with, perhaps written by an older nli-jax with older keys), as the cartography reads it.
        config_json = workdir_lib.read_config(run.workdir) or plan.config_json
        self.recorder = Recorder(run.workdir, identity(plan.task, config_json, len(train_source)),
                                 global_batch=plan.batch.global_batch, every_steps=options.every_steps)
        self.per_example_outcomes = not self.recorder.every_steps
        self.evaluator, self.train_source = run.evaluator, train_source

    @classmethod
    def for_training(cls, run, train_source, options):
        return cls(run, train_source, options)

    def start(self, step):
        self.recorder.start(step)

    def after_step(self, step, outputs):
        if outputs.outcomes is not None:
            self.recorder.training_step(step, outputs.outcomes)
        if self.recorder.wants_pass(step):
            p = self.evaluator.evaluate(outputs.params, "dynamics", self.train_source).predictions
            self.recorder.evaluation_pass(step, {"idx": np.asarray(p["idx"]), "weight": np.ones(len(p["idx"]), np.float32),
                                                 **{k: np.asarray(p[k]) for k in FIELDS}})

    def before_checkpoint(self, step):
        self.recorder.write(step)  # the records up to a checkpoint, before it
