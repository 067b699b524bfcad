"""The command line shared by finetune.main and pretrain.main (absl flags + ml_collections), and
the error handling of every nli-jax command (`run`):

- a mistyped config key (`--config.train.batchsize=8`) is one line naming the key and the
  closest valid keys, before anything is loaded;
- input that stops a run before compute (a bad dataset row, a config value out of range, a
  workdir of another config or other inputs, an unreadable checkpoint) is one line `error: ...`
  (also in the workdir's train.log when there is one) and exit status 1, without a traceback;
  unexpected errors keep theirs.
"""
from __future__ import annotations

import re
import sys

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS


def user_errors() -> tuple[type, ...]:
    """Exceptions that are input problems with a complete message (printed as one line)."""
    from nli_jax.checkpoints.hf import CheckpointError
    from nli_jax.data.readers import DataError
    from nli_jax.errors import RunError
    from nli_jax.models.config import ConfigError
    return DataError, ConfigError, CheckpointError, RunError, FileNotFoundError


def report_error(error: BaseException) -> None:
    import logging
    message = "error: " + " ".join(str(error).split()) if str(error) else f"error: {type(error).__name__}"
    logger = logging.getLogger("nli_jax")
    if logger.handlers:  # the run's log: stderr and <workdir>/train.log
        logger.error("%s", message)
    else:
        sys.stderr.write(message + "\n")


def _reporting_input_errors(main):
    """`main` with config-key mistakes and input errors reported as one line (exit status 1)."""
    def wrapped(argv):
        try:
            return main(argv)
        except user_errors() as e:
            report_error(e)
            sys.exit(1)
    return wrapped


def run(main) -> None:
    """app.run with one-line reports of config-key mistakes and input errors (exit status 1).

    On a CPU-only machine, XLA's per-step temporaries are first kept in the heap
    (nli_jax.train.host_memory): this must precede anything JAX runs."""
    from nli_jax.train import host_memory
    host_memory.keep_temporaries_in_heap()
    app.run(_reporting_input_errors(main), flags_parser=parse_flags)


def run_tool(main) -> None:
    """app.run for the corpus tools (plain absl flags, no config): input errors such as a
    missing file or too little disk space as one line, exit status 1."""
    app.run(_reporting_input_errors(main))


def parse_flags(argv):
    """absl's flag parsing; a config override naming no field is reported as one line."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        problem = _config_key_problem(argv) or f"flag parsing: {' '.join(str(e).split())}"
    except Exception as e:  # ml_collections raises AttributeError/KeyError for unknown fields
        problem = _config_key_problem(argv) or f"flag parsing: {type(e).__name__}: {' '.join(str(e).split())}"
    sys.stderr.write(f"error: {problem}\n")
    sys.exit(1)


def _is_config_flag(flag) -> bool:
    from ml_collections.config_flags import config_flags as implementation
    return isinstance(flag, getattr(implementation, "_ConfigFlag", ())) or type(flag).__name__ == "_ConfigFlag"


def _config_key_problem(argv) -> str | None:
    """'unknown config key ...; did you mean ...' for the first --<config>.<key> override that
    names no field of its config file, or None."""
    from nli_jax.train.validation import close_keys, flat_keys
    for arg in argv[1:]:
        match = re.match(r"^--?(no)?(\w+)\.([^=]+)(=.*)?$", arg)
        if not match or match.group(2) not in FLAGS or not _is_config_flag(FLAGS[match.group(2)]):
            continue
        name, key = match.group(2), match.group(3)
        value = next((a.split("=", 1)[1] for a in argv[1:] if re.match(rf"^--?{name}=", a)), None)
        if value is None:
            return f"--{name}.{key} given without --{name}=<config file>"
        try:
            config = FLAGS[name].parser.parse(value)
        except Exception as e:
            return f"--{name}={value}: the config cannot be loaded ({type(e).__name__}: {' '.join(str(e).split())})"
        node, parts = config, key.split(".")
        for depth, part in enumerate(parts):
            if hasattr(node, "keys") and part in node:
                node = node[part]
                continue
            keys = flat_keys(config)
            suggestions = close_keys(key, keys)
            parent = ".".join(parts[:depth])
            hint = (f"did you mean {' or '.join(suggestions)}?" if suggestions else
                    f"the keys under {parent or 'the config'} are: "
                    f"{', '.join(sorted(k for k in keys if k.startswith(parent)))[:400]}")
            return f"unknown config key {key!r} ({arg}); {hint}"
    return None


def define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:variant]).", lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs, results.json.")
    flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (TPU pods detect the rest).")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs off TPU.")
    flags.DEFINE_integer("num_processes", None, "Number of processes, for multi-process runs off TPU.")
    flags.DEFINE_integer("process_id", None, "This process's index, for multi-process runs off TPU.")
    flags.mark_flags_as_required(["config", "workdir"])


def main(argv) -> None:
    """finetune.main / pretrain.main: `cli.run(cli.main)`."""
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
    for depth, part in enumerate(parents + [leaf]):
        if not hasattr(node, "keys") or part not in node:
            from nli_jax.train.validation import close_keys, flat_keys
            suggestions = close_keys(key, flat_keys(config))
            raise app.UsageError(f"--override {assignment!r}: no config field {key!r}"
                                 + (f"; did you mean {' or '.join(suggestions)}?" if suggestions else ""))
        if depth < len(parents):
            node = node[part]
    with config.unlocked():
        node[leaf] = tuple(value) if isinstance(value, list) else value


def checkpoint_config(config, checkpoint: str, overrides=()):
    """The config to evaluate or predict with: --config when given, else the config.json of the
    run in `checkpoint`; then --override key=value assignments."""
    import ml_collections
    if config is None:
        from nli_jax.train.checkpointing import read_workdir_config
        saved = read_workdir_config(checkpoint)
        if saved is None:
            raise app.UsageError(f"--config is required: {checkpoint} is not a run directory with config.json")
        config = ml_collections.ConfigDict(_tuples(saved))
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
