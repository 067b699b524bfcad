"""Extends a tokenizer with pieces trained on new text (NusaBERT's recipe for new languages):
WordPiece (BERT, IndoBERT) or SentencePiece unigram (XLM-R) tokenizers; every old token keeps its
id, the new pieces follow. Prints each language's fertility (pieces per word) before and after.

    python -m pretrain.extend_vocab --tokenizer=/models/indobert --corpus="/data/local/*.txt" \\
        --new_pieces=5000 --output=/models/indobert_extended
    python -m pretrain.extend_vocab ... --corpus="jav=/data/jav/*.txt,sun=/data/sun/*.txt"   # per language

Continue pretraining with it (the embeddings grow, new rows the mean of their old pieces):
    python -m pretrain.main --config=configs/pretrain/indobert_base.py:continue --workdir=runs/local \\
        --config.model.init=/models/indobert --config.model.tokenizer=/models/indobert_extended ...
"""
from absl import flags

from nli_jax import storage
from nli_jax.errors import RunError

flags.DEFINE_string("tokenizer", None, "tokenizer directory (a Hugging Face model or tokenizer directory)")
flags.DEFINE_list("corpus", None, "text files or globs, one sentence per line; NAME=GLOB names a language "
                  "(its fertility reported on its own)")
flags.DEFINE_integer("new_pieces", None, "how many pieces the tokenizer lacks to add (at most)")
flags.DEFINE_string("output", None, "where the extended tokenizer is written")
flags.DEFINE_integer("sample_sentences", 2_000_000, "train on a seeded sample of this many lines (0 = every line)")
flags.DEFINE_integer("fertility_lines", 5000, "lines of each language the fertility is measured on")
flags.mark_flags_as_required(["tokenizer", "corpus", "new_pieces", "output"])
FLAGS = flags.FLAGS


def named_corpora(entries: list[str]) -> dict[str, list[str]]:
    """{language: files} from NAME=GLOB entries (plain globs: the language "corpus")."""
    corpora: dict[str, list[str]] = {}
    for entry in entries:
        name, pattern = entry.split("=", 1) if "=" in entry else ("corpus", entry)
        if not name or not pattern:
            raise RunError(f"--corpus={entry!r}: expected GLOB or NAME=GLOB")
        files = storage.local_inputs([pattern]) if storage.glob(pattern) else []  # local or gs://
        if not files:
            raise RunError(f"--corpus={entry!r}: {pattern!r} matches no files")
        corpora.setdefault(name, [])
        corpora[name] += [f for f in files if f not in corpora[name]]
    return corpora


def main(argv):
    from nli_jax.checkpoints.hf import resolve_directory
    from nli_jax.pretraining.vocab_extension import extend_vocabulary
    output = storage.local_output_dir(FLAGS.output)
    report = extend_vocabulary(resolve_directory(FLAGS.tokenizer), named_corpora(FLAGS.corpus), FLAGS.new_pieces, output,
                               sample_sentences=FLAGS.sample_sentences, fertility_lines=FLAGS.fertility_lines)
    if storage.is_remote(FLAGS.output):
        storage.upload(output, storage.under(FLAGS.output))
    print(f"{report.kind}: {report.base_vocab_size} -> {report.vocab_size} entries "
          f"({len(report.pieces)} new pieces, e.g. {', '.join(report.pieces[:10])})")
    if report.left_out:
        print(f"not carried over (cannot hold the new pieces): {', '.join(report.left_out)}")
    print(report.table())
    print(FLAGS.output)


if __name__ == "__main__":
    from nli_jax.cli import run_tool
    run_tool(main)
