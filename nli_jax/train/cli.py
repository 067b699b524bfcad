"""The command line shared by finetune.main and pretrain.main (absl flags + ml_collections)."""
from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS


def define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:variant]).", lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs, results.json.")
    flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (TPU pods detect the rest).")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs off TPU.")
    flags.DEFINE_integer("num_processes", None, "Number of processes, for multi-process runs off TPU.")
    flags.DEFINE_integer("process_id", None, "This process's index, for multi-process runs off TPU.")
    flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it writes at INFO
    init_distributed()
    from nli_jax.train import train_and_evaluate
    train_and_evaluate(FLAGS.config, FLAGS.workdir)


def override(config, assignment: str) -> None:
    """'a.b.c=value' (a Python literal, else a string) into a ConfigDict; unknown keys are refused."""
    import ast
    key, sep, raw = assignment.partition("=")
    if not sep:
        raise app.UsageError(f"--override {assignment!r}: expected key=value")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        if part not in node:
            raise app.UsageError(f"--override {assignment!r}: no config field {key!r}")
        node = node[part]
    if leaf not in node:
        raise app.UsageError(f"--override {assignment!r}: no config field {key!r}")
    with config.unlocked():
        node[leaf] = tuple(value) if isinstance(value, list) else value


def checkpoint_config(config, checkpoint: str, overrides=()):
    """The config to evaluate or predict with: --config when given, else the config.json of the
    run in `checkpoint`; then --override key=value assignments."""
    import json
    import os

    import ml_collections
    if config is None:
        path = os.path.join(checkpoint, "config.json")
        if not os.path.isfile(path):
            raise app.UsageError(f"--config is required: {checkpoint} is not a run directory with config.json")
        with open(path, encoding="utf-8") as f:
            config = ml_collections.ConfigDict(_tuples(json.load(f)))
    else:
        config = config.copy_and_resolve_references()
    for assignment in overrides:
        override(config, assignment)
    return config


def _tuples(node):
    if isinstance(node, dict):
        return {k: _tuples(v) for k, v in node.items()}
    if isinstance(node, list):
        return tuple(_tuples(v) for v in node)
    return node


def parse_files(assignments) -> dict[str, str]:
    """['name=path', ...] (or bare paths: named by their file stem) -> {name: path}."""
    import os
    out = {}
    for item in assignments:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = os.path.splitext(os.path.basename(item))[0], item
        if name in out:
            raise app.UsageError(f"input name {name!r} given twice")
        out[name] = path
    return out


def init_distributed() -> None:
    import jax
    if FLAGS.multihost or FLAGS.coordinator_address:
        jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                                   num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
