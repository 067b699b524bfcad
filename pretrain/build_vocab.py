"""Trains the vocabulary and saves it as IndoBERT's: a WordPiece vocab.txt with BERT special tokens.

    python -m pretrain.build_vocab --corpus="/data/corpus/*.txt" --output_dir=/data/vocab --vocab_size=30522
    python -m pretrain.build_vocab ... --vocab_size=30000 --algorithm=sentencepiece-bpe   # the paper's SentencePiece BPE

A corpus of more than --sample_sentences lines (2M) is trained on a seeded sample of that size.
"""
from absl import app, flags

flags.DEFINE_list("corpus", None, "corpus files or globs (one sentence per line)")
flags.DEFINE_string("output_dir", None, "where vocab.txt and tokenizer_config.json are written")
flags.DEFINE_integer("vocab_size", 30522, "30,522 for IndoBERT, 30,000 for IndoBERT-lite")
flags.DEFINE_enum("algorithm", "wordpiece", ["wordpiece", "sentencepiece-bpe"], "training algorithm")
flags.DEFINE_bool("lowercase", True, "uncased vocabulary, as IndoBERT's")
flags.DEFINE_integer("sample_sentences", 2_000_000, "train on a seeded sample of this many lines (0 = every line)")
flags.mark_flags_as_required(["corpus", "output_dir"])
FLAGS = flags.FLAGS


def main(argv):
    from nli_jax.workdir import check_tool_output
    check_tool_output(FLAGS.output_dir, "--output_dir", directory=True)  # never into a run: before anything is read or written
    from nli_jax.pretraining.vocab import train_vocabulary
    from nli_jax import storage
    files = storage.local_inputs(FLAGS.corpus)  # local or gs://
    output_dir = storage.local_output_dir(FLAGS.output_dir)
    written = train_vocabulary(files, output_dir, vocab_size=FLAGS.vocab_size, algorithm=FLAGS.algorithm,
                               lowercase=FLAGS.lowercase, sample_sentences=FLAGS.sample_sentences)
    if storage.is_remote(FLAGS.output_dir):
        storage.upload(output_dir, storage.under(FLAGS.output_dir))
        written = FLAGS.output_dir
    print(written)


if __name__ == "__main__":
    from nli_jax.cli import run_tool
    run_tool(main)
