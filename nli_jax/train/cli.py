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
    import jax
    if FLAGS.multihost or FLAGS.coordinator_address:
        jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                                   num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
    from nli_jax.train import train_and_evaluate
    train_and_evaluate(FLAGS.config, FLAGS.workdir)
