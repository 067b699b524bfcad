"""Pretraining input pipeline: corpus tokenisation (words/s) and masked phase-1 batches from the
array_record shards (sequences/s), against transformers' DataCollatorForLanguageModeling.

    python benchmarks/input_pipeline.py                        # ../shared/data/id_corpus_sample
    python benchmarks/input_pipeline.py --corpus=my/*.txt --batches=200

Both sides mask the same segment pairs: nli-jax's grain pipeline (read record, build
[CLS] A [SEP] B [SEP], whole-word masking off, 15% / 80-10-10, at most 20 predictions, pad to
128, batch) and the peer (DataCollatorForLanguageModeling with the same tokenizer, on the same
token ids, return_tensors="np"). Target: >= 20,000 sequences/s at 128 on 2 cores, i.e. >= 10x
what a TPU v3-8 consumed for IndoBERT-base (~2,000 sequences/s).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DEFAULT_CORPUS = os.path.join(REPO, "..", "shared", "data", "id_corpus_sample", "*.txt")


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/machine.py
import machine  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS)
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="grain worker processes")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    print(machine.line(), flush=True)  # ratios differ between CPUs

    files = sorted(glob.glob(args.corpus))
    if not files:
        print(f"no corpus files at {args.corpus}: skipping (point --corpus at text files)")
        return
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
              "create_examples_s": round(tokenise_s, 1), "words_per_s": round(meta["words"] / tokenise_s),
              "cpu_count": os.cpu_count()}

    import nli_jax
    from configs.pretrain import indobert_base
    from nli_jax.data import pipeline
    from nli_jax.tasks import create_task
    from nli_jax.train.planner import build_plan
    tokenizer = nli_jax.load_tokenizer(vocab_dir)
    # The BERT phase-1 recipe's masking (max 20 predictions at 128, token masking), this batch.
    config = indobert_base.get_config("phase=1")
    config.model.tokenizer, config.pretrain.examples_dir = vocab_dir, examples_dir
    config.train.batch_size, config.train.seed = args.batch, 0
    plan = build_plan(config)
    task = create_task(plan)
    encode = task.encoder(tokenizer)
    source = ExampleSource(examples_dir, "train")
    batching = task.batching(tokenizer, plan.batch)
    needed = args.batch * (args.batches + 5)
    epochs = -(-needed // len(source))

    def grain_rate(workers):
        it = iter(pipeline.train_dataset(source, encode, batching, local_batch_size=args.batch, seed=0,
                                         num_epochs=epochs, workers=workers))
        for _ in range(5):
            next(it)  # workers start, caches warm
        t = time.perf_counter()
        for _ in range(args.batches):
            batch = next(it)
        assert batch["input_ids"].shape == (args.batch, 128)
        return args.batch * args.batches / (time.perf_counter() - t)

    ours = grain_rate(args.workers)
    result[f"nli_jax_seq_per_s_{args.workers}_workers"] = round(ours)

    # Peer: transformers' MLM collator on the same token ids.
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
    t = time.perf_counter()
    n = 0
    for b in range(20):
        out = collator(rows[b * args.batch:(b + 1) * args.batch])
        n += len(out["input_ids"])
    peer = n / (time.perf_counter() - t)
    result["peer_transformers_collator_seq_per_s"] = round(peer)
    result["ratio_nli_jax_over_peer"] = round(ours / peer, 2)
    print(f"corpus: {result['words']:,} words in {result['corpus_files']} files -> {result['examples']:,} examples "
          f"in {tokenise_s:.1f} s ({result['words_per_s']:,} words/s, {args.workers} workers)")
    print(f"masked phase-1 batches ({args.batch} x 128): nli-jax grain {ours:,.0f} sequences/s ({args.workers} workers)")
    print(f"peer transformers DataCollatorForLanguageModeling: {peer:,.0f} sequences/s (one process)")
    print(f"ratio nli-jax / peer: {ours / peer:.2f}x; vs TPU v3-8 consumption (~2,000 seq/s): {ours / 2000:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
