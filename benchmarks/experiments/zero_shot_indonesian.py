"""Zero-shot classification of Indonesian and local-language label sets by NLI models (issue 50):
IndoNLU classification tasks' validation (--tasks, default SmSA and EmoT, through
nli_jax.zero_shot.classify) and NusaX-Senti validation per language (read here from NusaX's
sentiment/<language>/{train,valid}.csv: id,text,label, scored with the sentiment verbaliser of
nli_jax.verbalizers; a checkpoint trained on SmSA is refused, as classify refuses it), macro-F1
beside the majority-class baseline (the training split's most frequent label).

    python -m benchmarks.experiments.zero_shot_indonesian --checkpoints=runs/e5_indonli/seed_1,... \\
        --indonlu=../shared/data/indonlu --nusax=../shared/data/nusax --workdir=/tmp/zs_e5 \\
        --languages=indonesian,javanese,sundanese,balinese,minangkabau

Writes <workdir>/results.json and table.md (macro-F1 x 100, mean (std) over the checkpoints).
"""
from __future__ import annotations

import csv
import io
import os

import numpy as np
from absl import app, flags

from nli_jax import storage
from nli_jax.data import provenance
from nli_jax.errors import RunError
from nli_jax.metrics import precision_recall_f1
from nli_jax.plan import default_config
from nli_jax.tasks import options_config
from nli_jax import cli
from nli_jax.train.reporting import write_json
from nli_jax.verbalizers import SENTIMENT, verbalizer_for

flags.DEFINE_list("checkpoints", None, "NLI runs or Hugging Face NLI directories (e.g. one per seed)")
flags.DEFINE_string("indonlu", None, "IndoNLU data folder (the --tasks); empty: skipped")
flags.DEFINE_list("tasks", ["smsa", "emot"], "IndoNLU classification tasks scored (each with its default verbaliser)")
flags.DEFINE_string("nusax", None, "NusaX data folder (sentiment/<language>/); empty: skipped")
flags.DEFINE_list("languages", ["indonesian", "javanese", "sundanese", "balinese", "minangkabau"], "NusaX languages")
flags.DEFINE_string("workdir", None, "where results.json and table.md go")
flags.DEFINE_string("tfds_dir", "/tmp/nli_jax_tfds", "data.tfds_dir of the IndoNLU tasks")
flags.mark_flags_as_required(["checkpoints", "workdir"])
FLAGS = flags.FLAGS


def nusax_rows(folder: str, language: str, split: str) -> list[tuple[str, str]]:
    path = os.path.join(folder, "sentiment", language, f"{split}.csv")
    rows = list(csv.DictReader(io.StringIO(storage.read_text(path))))
    return [(row["text"], row["label"]) for row in rows]


def nusax_scores(model, rows, train_rows) -> dict:
    labels = ("negative", "neutral", "positive")
    verbalizer = verbalizer_for("nusax_senti", labels, "single")
    scores = model.scores([t for t, _ in rows], [SENTIMENT[label] for label in labels], verbalizer.template)
    gold = [label for _, label in rows]
    majority = max(labels, key=[label for _, label in train_rows].count)
    return {"f1": precision_recall_f1(gold, [labels[i] for i in scores.argmax(-1)])["f1"],
            "majority_f1": precision_recall_f1(gold, [majority] * len(gold))["f1"], "count": len(gold)}


def main(argv):
    from nli_jax.zero_shot import classify, load_model
    results = {}
    for number, checkpoint in enumerate(FLAGS.checkpoints):
        out = results[checkpoint] = {}
        workdir = storage.under(FLAGS.workdir, f"checkpoint_{number}")
        if FLAGS.indonlu:
            for task in FLAGS.tasks:
                config = default_config(task, options_config(task))
                cli.apply_overrides(config, [f"data.source={FLAGS.indonlu}", f"data.tfds_dir={FLAGS.tfds_dir}"])
                report = classify(checkpoint, config, workdir=os.path.join(workdir, task))["splits"]["validation"]
                out[task] = {"f1": report["f1"], "majority_f1": report["majority_baseline"]["f1"], "count": report["count"]}
        if FLAGS.nusax:
            # Scored here from NusaX's files, not through classify: its refusal of a model trained on
            # SmSA (whose texts NusaX's are) is made here too.
            translated = provenance.translated_training(checkpoint, "nusax")
            if translated:
                raise RunError(f"{checkpoint}: {translated}: its NusaX scores would be scores on translations of "
                               "its training data")
            model = load_model(checkpoint, workdir=os.path.join(workdir, "nusax"))
            for language in FLAGS.languages:
                out[f"nusax_{language}"] = nusax_scores(model, nusax_rows(FLAGS.nusax, language, "valid"),
                                                        nusax_rows(FLAGS.nusax, language, "train"))
        write_json(storage.under(FLAGS.workdir, "results.json"), results)
    columns = list(next(iter(results.values())))
    lines = ["| dataset (validation) | zero-shot macro-F1 | majority baseline | n |", "|---|---|---|---|"]
    for column in columns:
        f1 = [100 * r[column]["f1"] for r in results.values()]
        std = np.std(f1, ddof=1) if len(f1) > 1 else 0.0
        first = next(iter(results.values()))[column]
        lines.append(f"| {column} | {np.mean(f1):.2f} ({std:.2f}) | {100 * first['majority_f1']:.2f} | {first['count']} |")
    storage.write_text(storage.under(FLAGS.workdir, "table.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    cli.run_tool(main)
