"""python -m nli_jax.analysis --task=indonli --source=DIR --workdir=OUT [--split=train]
[--predictions=RUN/predictions.jsonl] [--top_k=10]: annotation-artifact statistics of an NLI
corpus (analysis.md, analysis.json and PNG plots in --workdir). See nli_jax.analysis."""
from __future__ import annotations

import os
import sys

from absl import app, flags

FLAGS = flags.FLAGS

flags.DEFINE_string("task", None, "Registered NLI task: indonli, ocnli, inferes, indonli_translate_train.")
flags.DEFINE_string("source", None, "Folder with the corpus' official files (e.g. ../shared/data/indonli).")
flags.DEFINE_string("workdir", None, "Output folder for analysis.md, analysis.json and the plots.")
flags.DEFINE_string("split", "train", "Split to analyse; 'train' on OCNLI means its largest training file.")
flags.DEFINE_string("predictions", None, "A hypothesis-only run's predictions.jsonl: accuracy by label/category/tag.")
flags.DEFINE_integer("top_k", 10, "PMI words listed per label.", lower_bound=1)
flags.DEFINE_float("pmi_smoothing", 100.0, "k of the add-k smoothing of (word, label) counts.", lower_bound=0.0)
flags.DEFINE_integer("pmi_min_count", 5, "Words with fewer occurrences in all hypotheses are not ranked.",
                     lower_bound=1)
flags.mark_flags_as_required(["task", "source", "workdir"])


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from nli_jax.analysis import analyse
    from nli_jax.data.readers import DataError
    try:
        report = analyse(FLAGS.task, FLAGS.source, FLAGS.workdir, split=FLAGS.split, predictions=FLAGS.predictions,
                         top_k=FLAGS.top_k, smoothing=FLAGS.pmi_smoothing, min_count=FLAGS.pmi_min_count)
    except (DataError, FileNotFoundError, ValueError) as e:
        sys.exit(f"nli_jax.analysis: error: {e}")
    print(f"{report['corpus']} {report['split']}: {report['counts']['overall']['count']} examples; "
          f"wrote {os.path.join(FLAGS.workdir, 'analysis.md')}")


if __name__ == "__main__":
    app.run(main)
