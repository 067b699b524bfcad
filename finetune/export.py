"""Export a fine-tuned run's best parameters as a Hugging Face directory: config.json with the
real label names in id2label / label2id, model.safetensors and the tokenizer. It loads in
transformers' *ForSequenceClassification / *ForTokenClassification and in nli-jax.

    python -m finetune.export --checkpoint=runs/indonli_large --output=exports/indonli_large
"""
from absl import app, flags

from nli_jax import cli

cli.define_tool_flags("a fine-tuning run's workdir")
flags.DEFINE_string("output", None, "directory to write the Hugging Face model to")
flags.mark_flags_as_required(["checkpoint", "output"])
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    config = cli.checkpoint_config(FLAGS.config, FLAGS.checkpoint, FLAGS.override)
    cli.init_distributed()  # the gather of parameters sharded across processes is collective
    from nli_jax.tools import export_checkpoint
    print(export_checkpoint(config, FLAGS.checkpoint, FLAGS.output, allow_unfinished=FLAGS.allow_unfinished))


if __name__ == "__main__":
    cli.run(main)
