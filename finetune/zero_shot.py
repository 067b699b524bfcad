"""Zero-shot classification of a task's texts by an NLI model (nli_jax.zero_shot): each label a
hypothesis from a template and the label's phrase (Indonesian defaults for SmSA, EmoT, CASA,
HoASA, WReTE and NusaX-Senti's labels: nli_jax.verbalizers), scored as transformers'
zero-shot-classification pipeline scores them, reported with the task's own metric,
calibration and the majority-class baseline.

    python -m finetune.zero_shot --checkpoint=runs/indonli --task=smsa --workdir=zs/smsa \\
        --override=data.source=../shared/data/indonlu
    python -m finetune.zero_shot --checkpoint=exports/indonli --task=emot --workdir=zs/emot \\
        --override=data.source=../shared/data/indonlu --template="Perasaan penulis: {}." \\
        --labels=anger=marah,fear=takut,happy=gembira,love=sayang,sadness=sedih --multi_label

--checkpoint: an NLI run's workdir (its best parameters) or a Hugging Face NLI directory (an
nli-jax export or an imported transformers checkpoint, any family nli-jax reads). Writes
results.json and predictions.jsonl (each example's record with every label's score) in --workdir.
"""
from absl import app, flags
from ml_collections import config_flags

from nli_jax import cli

config_flags.DEFINE_config_file("config", None, "the task's config file (path[:variant]); default: the defaults of "
                                "--task", lock_config=True)
flags.DEFINE_string("task", None, "the task to classify (smsa, emot, casa, hoasa, wrete, ...), unless --config says")
flags.DEFINE_string("checkpoint", None, "an NLI run's workdir or a Hugging Face NLI model directory")
flags.DEFINE_string("workdir", None, "where results.json and predictions.jsonl go")
flags.DEFINE_multi_string("override", [], "the task's config assignment key=value, e.g. data.source=/data/indonlu")
flags.DEFINE_multi_string("split", ["validation"], "split(s) of the task to classify")
flags.DEFINE_string("template", None, "hypothesis template with {} for the label's phrase ({aspect} for an aspect's)")
flags.DEFINE_string("labels", None, "label=phrase,... for every label of the task (default: nli_jax.verbalizers)")
flags.DEFINE_bool("multi_label", False, "each label scored alone, entailment against contradiction (the pipeline's "
                  "multi_label=True), instead of a softmax over the labels' entailment logits")
flags.DEFINE_integer("max_seq_length", 0, "tokens per pair (default: the run's own; 128 for a Hugging Face directory)")
flags.DEFINE_integer("eval_batch_size", 0, "pairs per batch (default: the run's own train.eval_batch_size)")
flags.DEFINE_bool("allow_unfinished", False, "Use the best parameters of a run that has not finished.")
flags.DEFINE_bool("allow_overlap", False, "score a task whose texts are translations of a dataset the model trained on "
                  "(refused by default: NusaX-Senti after SmSA)")
cli.define_multihost_flags()
flags.mark_flags_as_required(["checkpoint", "workdir"])
FLAGS = flags.FLAGS


def task_config(config, task: str | None, overrides):
    """--config, or the defaults of --task; then the --override assignments."""
    from nli_jax.errors import RunError
    if config is None:
        from nli_jax.plan import default_config
        from nli_jax.tasks import TASKS, options_config
        if not task:
            raise RunError("--task (or --config): which task to classify")
        if task not in TASKS:
            raise RunError(f"--task={task}: unknown task; registered tasks: {sorted(TASKS)}")
        config = default_config(task, options_config(task))
    else:
        config = config.copy_and_resolve_references()
        if task and task != config.task:
            raise RunError(f"--task={task} but --config is a config of task {config.task!r}")
    cli.apply_overrides(config, overrides)
    return config


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    from nli_jax.verbalizers import parse_labels
    labels = None if FLAGS.labels is None else parse_labels(FLAGS.labels)
    config = task_config(FLAGS.config, FLAGS.task, FLAGS.override)
    cli.init_distributed()
    from nli_jax.zero_shot import classify
    results = classify(FLAGS.checkpoint, config, workdir=FLAGS.workdir, splits=tuple(FLAGS.split),
                       template=FLAGS.template, labels=labels, multi_label=FLAGS.multi_label,
                       max_seq_length=FLAGS.max_seq_length, eval_batch_size=FLAGS.eval_batch_size,
                       allow_unfinished=FLAGS.allow_unfinished, allow_overlap=FLAGS.allow_overlap)
    for split, report in results["splits"].items():
        metric = results["primary_metric"]
        print(f"{results['task']} {split}: {metric} {report[metric]:.4f} (majority baseline "
              f"{report.get('majority_baseline', {}).get(metric, float('nan')):.4f}, {report['count']} examples)")


if __name__ == "__main__":
    cli.run(main)
