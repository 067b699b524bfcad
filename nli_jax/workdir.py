"""A run's workdir as a unit: its config.json (what identifies the run), and whether it holds
trained state. The files inside it are owned by the modules that write them: checkpoints/ and
best/ (nli_jax.train.checkpointing), inputs.json (nli_jax.train.inputs), results.json,
predictions.jsonl, train.log, metrics.jsonl and tensorboard/ (nli_jax.train.reporting).

A workdir holds one config: rerunning it with a config whose keys differ (other than those
in RESUMABLE_CHANGES) is refused, naming the keys. A key that an older nli-jax did not have is
no difference when this command gives it the config files' default (the behaviour the older
run had), so a workdir survives an upgrade that adds keys.
"""
from __future__ import annotations

import json
import os

from nli_jax import storage
from nli_jax.errors import RunError

CONFIG_FILE = "config.json"
UNREADABLE_DIR = "checkpoints_unreadable"
# Keys that may change between a run and its resumption without changing what is computed.
RESUMABLE_CHANGES = ("train.log_every_steps", "data.workers", "data.tfds_dir")


class WorkdirConfigError(RunError):
    """The workdir holds a run of another config (or an unreadable config.json); names the keys."""


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


def read_config(workdir: str) -> dict | None:
    """The config.json of a workdir, or None; an unreadable one is an error naming it."""
    path = os.path.join(workdir, CONFIG_FILE)
    try:
        return storage.read_json_object(path)
    except ValueError as e:  # UnicodeDecodeError included
        raise WorkdirConfigError(f"{path} is unreadable ({_short(e)}): it is not a config nli-jax wrote. Use a new "
                                 f"--workdir, or delete the old one to start over") from None


def flatten(config_json: dict) -> dict:
    """{dotted key: value} of a config as config.json stores it (mesh.shape is one value)."""
    from flax import traverse_util
    d = json.loads(json.dumps(config_json))
    shape = d["mesh"].pop("shape", None) if isinstance(d.get("mesh"), dict) else None
    flat = traverse_util.flatten_dict(d, sep=".")
    if shape is not None:
        flat["mesh.shape"] = shape
    return flat


def _defaults() -> dict:
    """Every key's default, from the config files (the keys all configs share)."""
    from configs import finetune_common
    return flatten(finetune_common.base_config().to_dict())


def config_differences(saved: dict, current: dict) -> list[str]:
    """'key: saved -> current' for every key that differs, except the resumable ones and keys
    the saved config lacks that the current one gives its default."""
    ours, theirs = flatten(current), flatten(saved)
    defaults = None
    out = []
    for key in sorted(set(ours) | set(theirs)):
        if key.startswith(RESUMABLE_CHANGES) or ours.get(key) == theirs.get(key):
            continue
        if key not in theirs:
            defaults = _defaults() if defaults is None else defaults
            if key in defaults and defaults[key] == ours[key]:
                continue  # added after that run: the default is what it ran with
        out.append(f"{key}: {theirs.get(key)!r} -> {ours.get(key)!r}")
    return out


def check_config(workdir: str, config_json: dict) -> None:
    """Refuses to resume or overwrite a workdir written by a different config, naming the keys."""
    previous = read_config(workdir)
    if previous is None:
        return
    differing = config_differences(previous, config_json)
    if differing:
        raise WorkdirConfigError(f"workdir {workdir} holds a run with a different config ({'; '.join(differing[:20])}). "
                                 "Use a new --workdir, or delete the old one to start over.")


def write_config(workdir: str, config_json: dict) -> None:
    """config.json, written atomically by process 0 (kept when present: resumable keys may differ)."""
    import jax
    path = os.path.join(workdir, CONFIG_FILE)
    if jax.process_index() != 0 or storage.isfile(path):
        return
    storage.write_text(path, json.dumps(config_json, indent=2, sort_keys=True))


def has_trained_state(workdir: str) -> bool:
    """Whether any step was trained in `workdir` (a checkpoint, best parameters or results)."""
    for sub in ("checkpoints", "best", UNREADABLE_DIR):
        d = os.path.join(workdir, sub)
        if any(p.split(".")[0].isdigit() for p in storage.listdir(d)):
            return True
    return storage.isfile(os.path.join(workdir, "results.json"))
