"""Pretraining input pipeline: corpus tokenisation (words/s) and masked phase-1 batches from the
array_record shards (sequences/s), against transformers' DataCollatorForLanguageModeling.

    python -m benchmarks.input_pipeline                        # ../shared/data/id_corpus_sample
    python -m benchmarks.input_pipeline --corpus=my/*.txt --batches=200

Both sides mask the same segment pairs: nli-jax's grain pipeline (read record, build
[CLS] A [SEP] B [SEP], whole-word masking off, 15% / 80-10-10, at most 20 predictions, pad to
128, batch) and the peer (DataCollatorForLanguageModeling with the same tokenizer, on the same
token ids, return_tensors="np"). Target: >= 20,000 sequences/s at 128 on 2 cores, i.e. >= 10x
what a TPU v3-8 consumed for IndoBERT-base (~2,000 sequences/s). Each side is timed batch by
batch (after 5 warm-up batches), one side after the other; sequences/s = sequences / total time.
"""
from __future__ import annotations

import glob
import itertools
import os
import tempfile
import time

from benchmarks import harness


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--corpus", default=os.path.join(harness.shared_data(), "id_corpus_sample", "*.txt"))
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="grain worker processes")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs

    files = sorted(glob.glob(args.corpus))
    if not files:
        raise SystemExit(f"no corpus files at {args.corpus} (point --corpus at text files)")
    from nli_jax.pretraining.examples import ExampleSource, create_examples
    from nli_jax.pretraining.vocab import train_vocabulary
    workdir = args.workdir or tempfile.mkdtemp(prefix="nli_jax_pipeline_")
    vocab_dir = os.path.join(workdir, "vocab")
    if not os.path.isfile(os.path.join(vocab_dir, "vocab.txt")):
        train_vocabulary(files, vocab_dir, vocab_size=args.vocab_size)
    examples_dir = os.path.join(workdir, "examples")
    t0 = time.perf_counter()
    meta = create_examples(files, vocab_dir, examples_dir, max_seq_length=128, sentence_task="nsp",
                           workers=args.workers, progress=False)
    tokenise_s = time.perf_counter() - t0
    result = {"corpus_files": len(files), "words": meta["words"], "examples": meta["counts"]["train"],
              "create_examples_s": tokenise_s, "words_per_s": meta["words"] / tokenise_s, "batch": args.batch,
              "batches": args.batches}

    import nli_jax
    from configs.pretrain import indobert_base
    from nli_jax.data import pipeline
    from nli_jax.tasks import create_task
    from nli_jax.planner import build_plan
    tokenizer = nli_jax.load_tokenizer(vocab_dir)
    # The BERT phase-1 recipe's masking (max 20 predictions at 128, token masking), this batch.
    config = indobert_base.get_config("phase=1")
    config.model.tokenizer, config.pretrain.examples_dir = vocab_dir, examples_dir
    config.train.batch_size, config.train.seed = args.batch, 0
    plan = build_plan(config)
    task = create_task(plan).bind(tokenizer)
    encode = task.encoder(tokenizer)
    source = ExampleSource(examples_dir, "train")
    batching = task.batching(tokenizer, plan.batch)
    needed = args.batch * (args.batches + 5)
    epochs = -(-needed // len(source))

    it = iter(pipeline.train_dataset(source, encode, batching, local_batch_size=args.batch, seed=0,
                                      num_epochs=epochs, workers=args.workers))

    def grain_batch():
        assert next(it)["input_ids"].shape == (args.batch, 128)

    # Peer: transformers' MLM collator on the same token ids (20 batches' rows, cycled).
    from transformers import DataCollatorForLanguageModeling
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="np")
    rows = []
    for i in range(args.batch * 20):
        ex = source[i % len(source)]
        ids = [tokenizer.cls_token_id, *ex["a"].tolist(), tokenizer.sep_token_id, *ex["b"].tolist(),
               tokenizer.sep_token_id]
        rows.append({"input_ids": ids, "token_type_ids": [0] * (len(ex["a"]) + 2) + [1] * (len(ex["b"]) + 1)})
    tokenizer.model_max_length = 128
    collator.pad_to_multiple_of = 128
    peer_calls = itertools.count()

    def peer_batch():
        b = next(peer_calls) % 20
        assert len(collator(rows[b * args.batch:(b + 1) * args.batch])["input_ids"]) == args.batch

    # One side after the other (rounds=1): grain's workers would fill their buffers during the peer's turns.
    grain = harness.time_sides({"nli-jax": grain_batch}, rounds=1, calls=args.batches, warmup=5)["nli-jax"]
    peer_timing = harness.time_sides({"peer": peer_batch}, rounds=1, calls=args.batches, warmup=5)["peer"]
    ours = args.batch * args.batches / sum(grain.times)
    peer = args.batch * args.batches / sum(peer_timing.times)
    result["sides"] = {"nli-jax": dict(grain.summary(), seq_per_s=ours, workers=args.workers),
                       "transformers-collator": dict(peer_timing.summary(), seq_per_s=peer)}
    print(f"corpus: {result['words']:,} words in {result['corpus_files']} files -> {result['examples']:,} examples "
          f"in {tokenise_s:.1f} s ({result['words_per_s']:,.0f} words/s, {args.workers} workers)")
    print(f"masked phase-1 batches ({args.batch} x 128): nli-jax grain {ours:,.0f} sequences/s ({args.workers} workers)")
    print(f"peer transformers DataCollatorForLanguageModeling: {peer:,.0f} sequences/s (one process)")
    print(f"ratio nli-jax / peer: {ours / peer:.2f}x; vs TPU v3-8 consumption (~2,000 seq/s): {ours / 2000:.1f}x")
    harness.write_result(args.json, result, ratios={"nli_jax_over_peer_seq_per_s": ours / peer})


if __name__ == "__main__":
    main()
