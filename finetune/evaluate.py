"""Evaluate a fine-tuned run's best parameters, or a Hugging Face checkpoint, without training.

    python -m finetune.evaluate --checkpoint=runs/indonli_large --workdir=runs/indonli_large/eval \\
        --override=data.source=/data/indonli_full          # the run's own config, other files
    python -m finetune.evaluate --config=configs/indonli_large.py --checkpoint=/models/finetuned-hf \\
        --workdir=OUT --file=test_lay=/data/test_lay.jsonl --file=mine=/data/my_pairs.jsonl

Writes results.json (the same breakdowns as training: by label, category, diagnostic tag, ...)
and predictions.jsonl in --workdir. Every file is read and validated before any compute.
"""
from absl import app, flags

from nli_jax import cli

cli.define_tool_flags("a fine-tuning run's workdir (best parameters) or a Hugging Face directory")
flags.DEFINE_string("workdir", None, "where results.json and predictions.jsonl go")
flags.DEFINE_multi_string("file", [], "extra labelled split, name=path, in the task's file format")
flags.mark_flags_as_required(["checkpoint", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    files = cli.parse_files(FLAGS.file)  # split names, which name files: checked first
    config = cli.checkpoint_config(FLAGS.config, FLAGS.checkpoint, FLAGS.override)
    cli.init_distributed()
    from nli_jax.tools import evaluate_checkpoint
    evaluate_checkpoint(config, FLAGS.workdir, FLAGS.checkpoint, files, allow_unfinished=FLAGS.allow_unfinished)


if __name__ == "__main__":
    cli.run(main)
