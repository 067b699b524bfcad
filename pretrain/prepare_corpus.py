"""Raw text -> deduplicated documents (one sentence per line, blank line between documents), sharded.

    python -m pretrain.prepare_corpus --inputs="/data/raw/*.txt" --output_dir=/data/corpus --shards=64 --workers=16
    python -m pretrain.prepare_corpus --inputs=tweets.txt --twitter --output_dir=...   # <username> <hashtag> <email> <links>
"""
import json

from absl import app, flags

flags.DEFINE_list("inputs", None, "input files or globs")
flags.DEFINE_string("output_dir", None, "where corpus-SSSSS-of-NNNNN.txt are written")
flags.DEFINE_integer("shards", 8, "output shards (dedup buckets)")
flags.DEFINE_integer("workers", 2, "worker processes")
flags.DEFINE_bool("twitter", False, "mask usernames, hashtags, emails and links as in the IndoNLU paper")
flags.DEFINE_bool("lines_are_sentences", False, "input already has one sentence per line")
flags.DEFINE_integer("max_lines_per_document", 0, "cut longer documents (sources without document breaks)")
flags.mark_flags_as_required(["inputs", "output_dir"])
FLAGS = flags.FLAGS


def main(argv):
    from nli_jax.workdir import check_tool_output
    check_tool_output(FLAGS.output_dir, "--output_dir", directory=True)  # never into a run: before anything is read or written
    from nli_jax.pretraining.corpus import prepare_corpus
    from nli_jax import storage
    files = storage.local_inputs(FLAGS.inputs)  # local or gs://
    output_dir = storage.local_output_dir(FLAGS.output_dir)
    stats = prepare_corpus(files, output_dir, shards=FLAGS.shards, workers=FLAGS.workers, twitter=FLAGS.twitter,
                           lines_are_sentences=FLAGS.lines_are_sentences,
                           max_lines_per_document=FLAGS.max_lines_per_document)
    if storage.is_remote(FLAGS.output_dir):
        storage.upload(output_dir, storage.under(FLAGS.output_dir))
    print(json.dumps({k: v for k, v in stats.items() if k != "shards"}, indent=2))


if __name__ == "__main__":
    from nli_jax.cli import run_tool
    run_tool(main)
