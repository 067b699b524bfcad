"""orbax checkpoints: train state + grain iterator state + loop bookkeeping in one step
directory, the latest N kept, plus the best parameters by validation metric kept apart.

A restarted command restores the newest complete checkpoint; orbax never exposes a step whose
(async) write did not finish, so a SIGKILL mid-save loses at most the steps since the last one.
"""
from __future__ import annotations

import json
import os

import grain
import jax
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, workdir: str, *, keep: int = 2, async_save: bool = True, create: bool = True):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                                 enable_async_checkpointing=async_save),
            item_names=("state", "data", "loop"))
        self.best = ocp.CheckpointManager(
            os.path.join(os.path.abspath(workdir), "best"),
            options=ocp.CheckpointManagerOptions(max_to_keep=1, create=create, enable_async_checkpointing=False),
            item_names=("params", "info"))

    @staticmethod
    def read_best_info(workdir: str) -> dict | None:
        """The JSON saved with a run's best parameters (step, metric, label names), or None."""
        best = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "best"),
                                     options=ocp.CheckpointManagerOptions(create=False), item_names=("params", "info"))
        try:
            step = best.latest_step()
            return None if step is None else best.restore(step, args=ocp.args.Composite(info=ocp.args.JsonRestore()))["info"]
        finally:
            best.close()

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator, loop: dict, *, force: bool = False) -> bool:
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(data_iterator),
            loop=ocp.args.JsonSave(loop)), force=force)

    def restore(self, step: int, abstract_state, data_iterator):
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=grain.checkpoint.CheckpointRestore(data_iterator),
            loop=ocp.args.JsonRestore()))
        return restored["state"], restored["loop"]

    def save_best(self, step: int, params, info: dict) -> None:
        self.best.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                     info=ocp.args.JsonSave(info)), force=True)
        self.best.wait_until_finished()

    def best_step(self) -> int | None:
        return self.best.latest_step()

    def restore_best(self, abstract_params):
        step = self.best.latest_step()
        if step is None:
            return None, None
        restored = self.best.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params),
                                                                   info=ocp.args.JsonRestore()))
        return restored["params"], restored["info"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
        self.best.close()


def abstract_like(tree):
    """ShapeDtypeStructs with the same shardings: what StandardRestore restores into."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


CONFIG_FILE = "config.json"
# Keys that may change between a run and its resumption without changing what is computed.
RESUMABLE_CHANGES = ("train.log_every_steps", "data.workers", "report.")


def check_workdir_config(workdir: str, config_dict: dict) -> None:
    """Refuses to resume or overwrite a workdir written by a different config, naming the keys."""
    path = os.path.join(workdir, CONFIG_FILE)
    flat = _flatten(config_dict)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            previous = _flatten(json.load(f))
        differing = sorted(k for k in set(flat) | set(previous)
                           if flat.get(k) != previous.get(k) and not k.startswith(RESUMABLE_CHANGES))
        if differing:
            details = "; ".join(f"{k}: {previous.get(k)!r} -> {flat.get(k)!r}" for k in differing[:20])
            raise ValueError(f"workdir {workdir} holds a run with a different config ({details}). "
                             "Use a new --workdir, or delete the old one to start over.")
        return
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config_dict, f, indent=2, sort_keys=True)


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = json.loads(json.dumps(v))  # tuples -> lists, as stored
    return out
