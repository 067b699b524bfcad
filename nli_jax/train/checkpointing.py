"""orbax checkpoints: train state + grain iterator state + the loop's record in one step
directory, the latest N kept, plus the best parameters by validation metric kept apart.

A restarted command restores the newest complete checkpoint; orbax never exposes a step whose
(async) write did not finish, so a SIGKILL mid-save loses at most the steps since the last one.
A step that was finished but later damaged (a truncated array file, an empty `loop/metadata`,
a cut `data/process_*.json`) is moved aside to `<workdir>/checkpoints_unreadable/` with one log
line, and the previous step is restored instead (`restore_latest`); when no step is intact the
error names the directory. Saving a step that exists already (SIGTERM arriving on a checkpoint
step) is a no-op.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from nli_jax import storage
from nli_jax.errors import RunError, disk_full, no_space_left
from nli_jax.train.record import LoopRecord
from nli_jax.workdir import UNREADABLE_DIR

log = logging.getLogger("nli_jax")



class CheckpointUnreadableError(RunError):
    """No intact checkpoint to resume from, or unreadable best parameters; names the directory."""


class ForeignCheckpointError(RunError):
    """A checkpoint (or best/) written by another run than the workdir's: names both."""


# --- what a checkpoint says about itself ----------------------------------------------------
# Every checkpoint step (its loop record) and best step (its info) carries the identity of the
# run that wrote it (a digest of the run's config.json, which a workdir never rewrites) and a
# digest of the arrays it holds (sha256 over every array's path, dtype, shape and bytes, as
# fetched to the host). A restore compares both: another run's checkpoint is refused, a step
# whose arrays differ from what was written is damaged (the previous intact step is taken).
# Steps written before these fields existed are restored as they are (logged once).

def run_identity(workdir: str) -> str | None:
    """The identity of the run in `workdir`: sha256 of its config.json (None: no config.json)."""
    path = os.path.join(storage.resolve(workdir), "config.json")
    if not storage.isfile(path):
        return None
    return "config-sha256:" + hashlib.sha256(storage.read_bytes(path)).hexdigest()[:32]


def content_digest(tree) -> str | None:
    """sha256 over a tree of arrays (path, dtype, shape, bytes), the same whatever their sharding;
    None when an array is not wholly on this process (a multi-host run: not digested)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for _, x in leaves):
        return None
    digest = hashlib.sha256()
    for path, leaf in leaves:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        array = np.ascontiguousarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}|".encode())
        digest.update(memoryview(array).cast("B") if array.size else b"")
    return "sha256:" + digest.hexdigest()


def _signed(record: dict, workdir_identity: str | None, tree) -> dict:
    return dict(record, run_identity=workdir_identity, content_digest=content_digest(tree))


def _unsigned(record: dict) -> dict:
    """A record as its writer gave it (without the fields `_signed` added)."""
    return {k: v for k, v in record.items() if k not in ("run_identity", "content_digest")}


def check_identity(where: str, record: dict, identity: str | None) -> None:
    """Refuses a checkpoint whose recorded run is not the workdir's (one line naming both)."""
    theirs = record.get("run_identity") if isinstance(record, dict) else None
    if theirs is not None and identity is not None and theirs != identity:
        raise ForeignCheckpointError(
            f"{where} was written by another run ({theirs}) than the one in {os.path.dirname(os.path.dirname(where))} "
            f"({identity}, the digest of its config.json): a checkpoint copied from another run is not restored. "
            "Move it away (or use its own run directory)")


def check_digest(where: str, record: dict, tree) -> None:
    """ValueError when the arrays restored differ from those the checkpoint was written with."""
    recorded = record.get("content_digest") if isinstance(record, dict) else None
    if recorded is None:
        return
    restored = content_digest(tree)
    if restored is not None and restored != recorded:
        raise ValueError(f"its arrays differ from those written (content digest {restored[:23]}..., written "
                         f"{recorded[:23]}...)")


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split()).split(" See full TensorStore details")[0]
    cause = error.__cause__ or error.__context__
    if cause is not None and len(text) < 80:
        text += f" <- {type(cause).__name__}: {' '.join(str(cause).split())}"
    return f"{type(error).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


class Checkpointer:
    def __init__(self, workdir: str, *, keep: int = 2, async_save: bool = True, create: bool = True):
        self.workdir = storage.resolve(workdir)
        self.directory = os.path.join(self.workdir, "checkpoints")
        if create:  # orbax writes in them: directories of the workdir, not links out of it
            for name in ("checkpoints", "best"):
                storage.output_dir(storage.under(self.workdir, name))
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                                 enable_async_checkpointing=async_save),
            item_names=("state", "data", "loop"))
        self.best = ocp.CheckpointManager(
            os.path.join(storage.resolve(workdir), "best"),
            # Two: after a resume from an earlier checkpoint, the best step the loop restored
            # survives one newer best saved before the interruption (see save_best / prune_best).
            # Written in the background like the checkpoints (the best step is often the last, and
            # its two writes then go side by side): a best step whose write a kill cut short is
            # taken from the same step's checkpoint (restore_best).
            options=ocp.CheckpointManagerOptions(max_to_keep=2, create=create, enable_async_checkpointing=async_save),
            item_names=("params", "info"))
        self._saved: set[int] = set()
        self.identity = run_identity(self.workdir)
        self._unverified_logged = False

    @staticmethod
    def read_best_info(workdir: str, signed: bool = False) -> dict | None:
        """The JSON saved with a run's best parameters (step, metric, label names), or None;
        `signed`: with the run identity and content digest they were written with."""
        best = ocp.CheckpointManager(os.path.join(storage.resolve(workdir), "best"),
                                     options=ocp.CheckpointManagerOptions(create=False), item_names=("params", "info"))
        try:
            step = best.latest_step()
            if step is None:
                return None
            try:
                info = best.restore(step, args=ocp.args.Composite(info=ocp.args.JsonRestore()))["info"]
                if not isinstance(info, dict):
                    raise ValueError("not a JSON object")
            except Exception as e:
                raise CheckpointUnreadableError(f"{os.path.join(str(best.directory), str(step), 'info')} is "
                                                f"unreadable ({_short(e)})") from e
            check_identity(os.path.join(str(best.directory), str(step)), info, run_identity(workdir))
            return info if signed else _unsigned(info)
        finally:
            best.close()

    def save(self, step: int, state, data_iterator, loop: LoopRecord, *, force: bool = False,
             final: bool = False) -> bool:
        """Saves `step` unless it is saved (or being saved) already: a SIGTERM that arrives on
        a checkpoint step asks for the step that was just written.

        `final` (the run's last step): the optimizer state is left out, as no step will use it
        (a rerun of the finished command only evaluates; more steps are another config, which
        the workdir refuses). For Adam that is two thirds of the state's bytes, written when
        the run is otherwise done."""
        if step in self._saved or step in self.manager.all_steps():
            return False
        self._saved.add(step)
        loop = json.loads(json.dumps(dict(loop.to_json(), optimizer_state=not final)))
        if final:
            state = _without_optimizer(state)
        loop = _signed(loop, self.identity, state)  # written in the same step as the arrays
        try:
            return self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=grain.checkpoint.CheckpointSave(data_iterator),
                loop=ocp.args.JsonSave(loop)), force=force)
        except Exception as e:
            raise self._full(e, f"the checkpoint of step {step}") if no_space_left(e) else e

    def restore_latest(self, abstract_state, data_iterator):
        """(step, state, loop) of the newest intact checkpoint, or None when there is none.

        A step that cannot be read is logged (one line naming its directory), moved to
        <workdir>/checkpoints_unreadable/ so that the rerun can write that step again, and the
        previous step is tried. When every step is unreadable nothing is moved and the error
        names the directory."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        bad = []
        for step in steps:
            try:
                state, loop = self.restore(step, abstract_state, data_iterator)
                record = LoopRecord.from_json(loop)  # the loop's record, or damage
                check_digest(os.path.join(self.directory, str(step)), loop, state)
                self._log_unverified(os.path.join(self.directory, str(step)), loop)
                restored_step = int(jax.device_get(state["step"]))
                if restored_step != step:
                    raise ValueError(f"its state holds step {restored_step}")
            except ForeignCheckpointError:
                raise
            except Exception as e:  # any damage: arrays, metadata, iterator state, loop JSON, digest
                bad.append((step, e))
                continue
            moved = self._set_aside([s for s, _ in bad])
            for (bad_step, error), target in zip(bad, moved):
                log.warning("checkpoint %s is unreadable (%s); moved it to %s and resumed from step %d",
                            os.path.join(self.directory, str(bad_step)), _short(error), target, step)
            return step, state, record
        if bad:
            details = "; ".join(f"step {s}: {_short(e)}" for s, e in bad)
            raise CheckpointUnreadableError(
                f"no intact checkpoint in {self.directory} ({details}). Nothing was changed; to start over, "
                f"move {self.directory} away (or use a new --workdir)")
        return None

    def _set_aside(self, steps) -> list[str]:
        """Moves unreadable steps out of checkpoints/ (so the resumed run can write them again)."""
        if not steps:
            return []
        target_root = os.path.join(os.path.dirname(self.directory), UNREADABLE_DIR)
        targets = []
        for step in steps:
            target = os.path.join(target_root, str(step))
            if storage.exists(target):
                target = f"{target}.{time.strftime('%Y%m%d-%H%M%S')}"
            targets.append(target)
        if jax.process_index() == 0:
            for step, target in zip(steps, targets):
                storage.move(os.path.join(self.directory, str(step)),
                             storage.under(self.workdir, UNREADABLE_DIR, os.path.basename(target)))
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("nli_jax checkpoints set aside")
        self.manager.reload()
        return targets

    def _set_aside_best(self, step: int) -> str:
        target = os.path.join(os.path.dirname(self.directory), UNREADABLE_DIR, f"best-{step}")
        if storage.exists(target):
            target = f"{target}.{time.strftime('%Y%m%d-%H%M%S')}"
        if jax.process_index() == 0:
            storage.move(os.path.join(str(self.best.directory), str(step)),
                         storage.under(self.workdir, UNREADABLE_DIR, os.path.basename(target)))
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("nli_jax best set aside")
        self.best.reload()
        return target

    def restore(self, step: int, abstract_state, data_iterator):
        """(state, loop) of `step`; a final step's state has no "opt_state" (see `save`)."""
        loop, abstract = self._as_saved(step, abstract_state)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), data=grain.checkpoint.CheckpointRestore(data_iterator)))
        return restored["state"], loop

    def _log_unverified(self, where: str, record: dict) -> None:
        if isinstance(record, dict) and record.get("content_digest") is None and not self._unverified_logged:
            self._unverified_logged = True
            log.info("%s carries no content digest (written by an older nli-jax, or by several processes): "
                     "restored unverified", where)

    def _as_saved(self, step: int, abstract_state):
        """(loop record, `abstract_state` as `step` was saved: without the optimizer state for a
        final step); another run's step is refused here, before its arrays are read."""
        loop = self.manager.restore(step, args=ocp.args.Composite(loop=ocp.args.JsonRestore()))["loop"]
        check_identity(os.path.join(self.directory, str(step)), loop, self.identity)
        if isinstance(loop, dict) and loop.get("optimizer_state") is False:
            return loop, _without_optimizer(abstract_state)
        return loop, abstract_state

    def save_best(self, step: int, params, info: dict) -> None:
        """The best parameters so far. A step saved before an interruption and reached again
        after the resume is written again (the loop recomputed it), never an error."""
        try:
            self.best.wait_until_finished()  # the previous best's write, if it is still going
            if step in self.best.all_steps():
                self.best.delete(step)
            info = _signed(info, self.identity, params)
            self.best.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                         info=ocp.args.JsonSave(info)), force=True)
        except Exception as e:
            raise self._full(e, f"the best parameters of step {step} to best/") if no_space_left(e) else e

    def _full(self, error: BaseException, what: str):
        """The one-line error of a full disk (the step being written is not kept: orbax only
        exposes finished steps, so the rerun resumes from the newest complete checkpoint)."""
        steps = self.manager.all_steps()
        resume = f"it resumes from step {max(steps)}" if steps else "it starts over (no checkpoint was complete)"
        return disk_full(error, what, os.path.dirname(self.directory), resume)

    def prune_best(self, keep_step: int | None) -> None:
        """Leaves only the run's best step in best/ (what evaluate, predict and export read)."""
        if keep_step is None or keep_step not in self.best.all_steps():
            return
        for step in self.best.all_steps():
            if step != keep_step:
                self.best.delete(step)

    def restore_best(self, abstract_params, step: int | None = None, abstract_state=None):
        """(params, info) of `step` (default: the latest best), or (None, None) when none was saved.

        Unreadable best parameters are taken from the same step's regular checkpoint when it is
        still there and `abstract_state` is given (one log line), and best/ is repaired with them;
        otherwise the error names the directory."""
        if step is None:
            step = self.best.latest_step()
            if step is None:
                return None, None
        path = os.path.join(str(self.best.directory), str(step))
        try:
            if step not in self.best.all_steps():  # its write cut short by a kill, say
                raise FileNotFoundError(f"best/ holds steps {sorted(self.best.all_steps())}, not {step}")
            info = self.best.restore(step, args=ocp.args.Composite(info=ocp.args.JsonRestore()))["info"]
            if not isinstance(info, dict):
                raise ValueError("its info is not a JSON object")
            check_identity(path, info, self.identity)
            restored = self.best.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params), info=ocp.args.JsonRestore()))
            check_digest(path, info, restored["params"])
            self._log_unverified(path, info)
            return restored["params"], _unsigned(info)
        except ForeignCheckpointError:
            raise
        except Exception as e:
            error = e
        if abstract_state is not None and step in self.manager.all_steps():
            try:
                loop, abstract = self._as_saved(step, abstract_state)
                state = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract)))["state"]
                check_digest(os.path.join(self.directory, str(step)), loop, state)
            except ForeignCheckpointError:
                raise
            except Exception:
                state = None
            if state is not None:
                info = {"step": step, "repaired_from": os.path.join(self.directory, str(step))}
                if step in self.best.all_steps():
                    target = self._set_aside_best(step)
                    log.warning("best parameters %s are unreadable (%s); moved them to %s and took step %d's "
                                "parameters from %s instead", path, _short(error), target, step,
                                os.path.join(self.directory, str(step)))
                else:
                    log.warning("best parameters %s are missing (their write did not finish); took step %d's "
                                "parameters from %s instead", path, step, os.path.join(self.directory, str(step)))
                self.save_best(step, state["params"], info)
                self.best.wait_until_finished()
                return state["params"], info
        if step not in self.best.all_steps():
            raise CheckpointUnreadableError(
                f"the run's best step {step} has no parameters in {self.best.directory} (it holds steps "
                f"{sorted(self.best.all_steps())}) and no checkpoint of step {step} is left to take them from: start "
                "over in a new --workdir") from None
        if abstract_state is None and step in self.manager.all_steps():  # a tool: the run's command repairs best/
            raise CheckpointUnreadableError(
                f"the best parameters in {path} are unreadable ({_short(error)}); nothing was changed. Rerun the "
                f"run's own command: it takes step {step}'s parameters from {self.directory}/{step} and rewrites "
                "best/") from error
        raise CheckpointUnreadableError(
            f"the best parameters in {path} are unreadable ({_short(error)}) and no checkpoint of step {step} is "
            "left to take them from: start over in a new --workdir (nothing was changed)") from error

    def reached_preemption(self, step: int) -> bool:
        """Whether JAX's preemption service agreed on `step` to checkpoint at (several processes)."""
        return self.manager.reached_preemption(step)

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
            self.best.wait_until_finished()
        except Exception as e:
            raise self._full(e, "a checkpoint") if no_space_left(e) else e

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
        self.best.close()


def _without_optimizer(state: dict) -> dict:
    """A train state (or its abstract) as a final checkpoint holds it: no "opt_state"."""
    return {k: v for k, v in state.items() if k != "opt_state"}


def abstract_like(tree):
    """ShapeDtypeStructs with the same shardings: what StandardRestore restores into."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
