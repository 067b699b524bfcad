"""Sequential fine-tuning: `model.init` naming a finished fine-tuning run's workdir (an
intermediate task or a pivot language: IndoNLI -> WReTE, Indonesian -> Javanese -> Madurese).

The run's best parameters (best/, verified as a resume verifies them: the run identity recorded
with them is the workdir's config.json digest, the arrays match their content digest) are
exported once per process as a Hugging Face directory (nli_jax.train.setup.load_source_run, in
this process's scratch directory), and the new run loads that directory like any model.init;
its tokenizer is the source run's own. The contamination check (nli_jax.hooks.overlap) also
compares the new run's evaluation splits with the source runs' training splits. The classification head is kept when the source's head is the same
class with the same labels in the same order, and initialised afresh otherwise; what was done
(the source's workdir, identity, digest, best step, head kept or new and why) is `init_from` in
the new run's run.json and results.json. A source that is unfinished, has no best parameters,
holds several seeds' runs or is a pretraining run is refused in one line naming the path,
before any data is read.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os

from nli_jax import planner, storage
from nli_jax import workdir as workdir_lib
from nli_jax.checkpoints.hf import read_config
from nli_jax.errors import ConfigValueError
from nli_jax.planner import saved_config
from nli_jax.train.checkpointing import Checkpointer, CheckpointUnreadableError, abstract_like, run_identity

FLAG = "--config.model.init"


@dataclasses.dataclass(frozen=True)
class RunInit:
    workdir: str  # the source run, resolved
    run_identity: str
    content_digest: str | None
    best_step: int
    task: str
    labels: tuple[str, ...] | None
    head_class: str  # the source model's class (ForSequenceClassification, ...)
    directory: str  # its best parameters as a Hugging Face directory (this process's scratch)
    tokenizer_dir: str  # the source run's tokenizer directory

    def head_decision(self, head_class: str, labels) -> tuple[bool, str]:
        """(keep the source's head, why) for a model of `head_class` with `labels`."""
        labels = tuple(labels or ())
        if head_class != self.head_class:
            return False, f"the source's head is {self.head_class}, this task's {head_class}"
        if not self.labels or not labels:
            return False, "label names unknown on one side"
        if labels == self.labels:
            return True, f"same labels in the same order ({', '.join(labels)})"
        if sorted(labels) == sorted(self.labels):
            return False, f"same labels in another order (source {list(self.labels)}, this task {list(labels)})"
        return False, f"labels differ (source {list(self.labels)}, this task {list(labels)})"

    def record(self, head_kept: bool, reason: str) -> dict:
        """run.json's and results.json's `init_from`."""
        return {"workdir": self.workdir, "run_identity": self.run_identity, "content_digest": self.content_digest,
                "best_step": self.best_step, "task": self.task, "labels": list(self.labels or ()),
                "head": "kept" if head_kept else "new", "head_reason": reason}

    def fingerprint(self) -> dict[str, str]:
        """inputs.json's `model.init` part: the source's best parameters by their digests (the
        export's own path is this process's scratch directory)."""
        return {os.path.join(self.workdir, "best", str(self.best_step)): f"{self.run_identity}|{self.content_digest}"}


def is_run_directory(path: str) -> bool:
    return bool(path) and not storage.is_remote(path) and workdir_lib.is_run(storage.resolve(path))


def _refuse(path: str, why: str) -> ConfigValueError:
    return ConfigValueError(f"{FLAG}={path}: {why}")


def _best_info(path: str, resolved: str) -> dict:
    """The source's best-step info (its identity checked against the workdir's config.json), or
    a one-line refusal naming the path."""
    if not storage.isdir(os.path.join(resolved, "best")):
        raise _refuse(path, "the run has no best/ (no parameters were saved): nothing to start from")
    try:
        info = Checkpointer.read_best_info(resolved, signed=True)
    except Exception as e:  # unreadable info, or best/ written by another run than this workdir's
        raise _refuse(path, " ".join(str(e).split())) from None
    if info is None:
        raise _refuse(path, "its best/ holds no saved parameters: nothing to start from")
    return info


def check_source(path: str):
    """(resolved workdir, its plan, its best-step info with identity and digest) of a finished
    fine-tuning run, or a one-line refusal naming the path, before any data or weights are read."""
    resolved = storage.resolve(path)
    names = set(storage.listdir(resolved))
    if "best" not in names and any(n.startswith("seed_") for n in names):
        seeds = sorted(n for n in names if n.startswith("seed_"))
        raise _refuse(path, f"holds the runs of several seeds ({', '.join(seeds)}): name one of them, e.g. "
                            f"{os.path.join(path, seeds[0])}")
    workdir_lib.require_finished(path, False, flag=FLAG, remedy="then start from it")
    plan = planner.build_plan(saved_config(resolved), training=False)
    if plan.pretrain is not None:
        raise _refuse(path, f"is a pretraining run ({plan.task}): start from its export "
                            f"({FLAG}={os.path.join(path, 'export')})")
    return resolved, plan, _best_info(path, resolved)


def restore_best(path: str, resolved: str, params_like):
    """The source's best parameters (in the structure of `params_like`), verified as a resume
    verifies them (run identity, content digest); damage is a one-line refusal naming the path."""
    ckpt = Checkpointer(resolved, async_save=False, create=False)
    try:
        params, _ = ckpt.restore_best(abstract_like(params_like))
    except CheckpointUnreadableError as e:
        raise _refuse(path, " ".join(str(e).split())) from None
    finally:
        ckpt.close()
    return params


def export_directory(resolved: str, info: dict) -> str:
    """Where this process exports a source's best parameters (its scratch directory)."""
    key = repr((resolved, run_identity(resolved), info.get("content_digest"), int(info["step"])))
    return storage.under(storage.scratch_dir(), "run_init", hashlib.sha256(key.encode()).hexdigest()[:16])


def source(resolved: str, plan, info: dict, directory: str, tokenizer_dir: str) -> RunInit:
    return RunInit(workdir=resolved, run_identity=run_identity(resolved), content_digest=info.get("content_digest"),
                   best_step=int(info["step"]), task=plan.task, labels=tuple(info.get("labels") or ()) or None,
                   head_class=read_config(directory).get("nli_jax", {}).get("class", ""), directory=directory,
                   tokenizer_dir=tokenizer_dir)
