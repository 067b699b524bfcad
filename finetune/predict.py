"""Predictions with label names for unlabelled input, from a fine-tuned run or a Hugging Face
checkpoint whose config.json names its labels (an nli-jax export).

    python -m finetune.predict --checkpoint=runs/indonli_large --output=preds/ --input=test=/data/test.jsonl
    python -m finetune.predict --checkpoint=runs/indonlu_large/smsa --output=preds/ \\
        --input=test=/data/smsa/test_preprocess_masked_label.tsv

Input files are in the task's own format (IndoNLI-style jsonl, the IndoNLU file formats, ...);
gold fields may be absent or masked. Writes <output>/predictions.jsonl, one line per example:
split (the input's name), idx, id, prediction (label name or tag list), probabilities.
"""
from absl import app, flags

from nli_jax import cli

cli.define_tool_flags("a fine-tuning run's workdir (best parameters) or a Hugging Face directory")
flags.DEFINE_string("output", None, "directory for predictions.jsonl")
flags.DEFINE_multi_string("input", [], "name=path (or a path, named by its stem) in the task's file format")
flags.mark_flags_as_required(["checkpoint", "output"])
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    if not FLAGS.input:
        raise app.UsageError("--input=name=path: at least one file to predict")
    files = cli.parse_files(FLAGS.input, "--input")  # split names, which name files: checked first
    config = cli.checkpoint_config(FLAGS.config, FLAGS.checkpoint, FLAGS.override)
    cli.init_distributed()
    from nli_jax.tools import predict_files
    records = predict_files(config, FLAGS.output, FLAGS.checkpoint, files, allow_unfinished=FLAGS.allow_unfinished)
    print(f"{len(records)} predictions written to {FLAGS.output}/predictions.jsonl")


if __name__ == "__main__":
    cli.run(main)
