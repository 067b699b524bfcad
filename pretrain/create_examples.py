"""Tokenises the corpus once into array_record segment pairs (masking happens later, on the fly).

    python -m pretrain.create_examples --corpus="/data/corpus/*.txt" --vocab_dir=/data/vocab \\
        --output_dir=/data/examples128 --max_seq_length=128 --sentence_task=nsp --workers=16
    (phase 2: --max_seq_length=512; ALBERT: --sentence_task=sop)
"""
import json

from absl import app, flags

flags.DEFINE_list("corpus", None, "prepared corpus files or globs")
flags.DEFINE_string("vocab_dir", None, "directory with vocab.txt")
flags.DEFINE_string("output_dir", None, "where the array_record shards go")
flags.DEFINE_integer("max_seq_length", 128, "128 for phase 1, 512 for phase 2")
flags.DEFINE_float("short_seq_prob", 0.1, "probability of a shorter target length")
flags.DEFINE_enum("sentence_task", "nsp", ["nsp", "sop", "none"], "NSP (BERT), SOP (ALBERT) or none")
flags.DEFINE_integer("dupe_factor", 1, "passes over the corpus with different segmentations")
flags.DEFINE_integer("seed", 12345, "segmentation seed")
flags.DEFINE_integer("workers", 2, "worker processes")
flags.mark_flags_as_required(["corpus", "vocab_dir", "output_dir"])
FLAGS = flags.FLAGS


def main(argv):
    from nli_jax.workdir import check_tool_output
    check_tool_output(FLAGS.output_dir, "--output_dir", directory=True)  # never into a run: before anything is read or written
    from nli_jax import storage
    from nli_jax.pretraining.examples import create_examples
    files = sorted(f for pattern in FLAGS.corpus for f in (storage.glob(pattern) or [pattern]))  # local or gs://
    meta = create_examples(files, FLAGS.vocab_dir, FLAGS.output_dir, max_seq_length=FLAGS.max_seq_length,
                           short_seq_prob=FLAGS.short_seq_prob, sentence_task=FLAGS.sentence_task,
                           dupe_factor=FLAGS.dupe_factor, seed=FLAGS.seed, workers=FLAGS.workers)
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    from nli_jax.cli import run_tool
    run_tool(main)
