"""Compile a run's own train and evaluation steps for a Cloud TPU topology on this host (no TPU,
no data, no weights): does it fit, how is it sharded, and how fast does the TPU compiler expect
it to be, before a slice is booked (nli_jax.aot).

    python -m launch.compile --config=configs/pretrain/indobert_large.py:phase=1 --topology=v3-8
    python -m launch.compile --config=configs/indonli_large.py --topology=v4-8 --output=indonli_v4-8.json
    python -m launch.compile --config=configs/pretrain/indobert_large.py:phase=2 --topology=v5e-256 \\
        --config.mesh.shape="{'data': 1, 'fsdp': -1}"

Topologies: v2-8, v3-8, v4-8, v4-16, v4-32, v5e-4, v5e-8, v5e-256, v5p-8, v6e-8 (the TPU compiler
comes with `pip install -e ".[tpu]"`). The model's shape comes from its preset, a local
model.init directory, or the published shape of the hub checkpoint the config names. Exit status
0 when every step fits, 2 when one does not (its line says what would make it fit), 1 for an
input error.
"""
import os
import sys

# Before JAX starts: the host computes nothing, and off Cloud TPU there is no metadata server.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from nli_jax import cli  # noqa: E402

config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:variant]).", lock_config=True)
flags.DEFINE_string("topology", "v3-8", "Cloud TPU slice to compile for (nli_jax.aot.TOPOLOGIES).")
flags.DEFINE_string("output", "", "Write the full report here as JSON.")
flags.DEFINE_bool("eval_step", True, "Also compile the evaluation step.")
flags.mark_flags_as_required(["config"])
FLAGS = flags.FLAGS


def main(argv) -> None:
    if len(argv) > 1:
        raise cli.CommandLineError(f"unexpected arguments: {argv[1:]}")
    import json
    from absl import logging as absl_logging
    from nli_jax import aot
    absl_logging.set_verbosity(absl_logging.WARNING)
    aot.topology(FLAGS.topology)  # an unknown name is one line before anything is built
    if FLAGS.output:  # never over a run's files: before minutes of compiling
        from nli_jax.workdir import check_tool_output
        check_tool_output(FLAGS.output, "--output")
    report = aot.compile_run(FLAGS.config, FLAGS.topology, eval_step=FLAGS.eval_step)
    report["command"] = " ".join(sys.argv)
    print("\n".join(aot.report_lines(report)), flush=True)
    if FLAGS.output:
        from nli_jax import storage
        import os
        output = storage.resolve(FLAGS.output)
        storage.write_text(storage.under(os.path.dirname(output), os.path.basename(output)),
                           json.dumps(report, indent=1) + "\n")
    if not all(report[s]["fits"] for s in ("train_step", "eval_step") if s in report):
        sys.exit(2)


if __name__ == "__main__":
    cli.run_offline(main)
