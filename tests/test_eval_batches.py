"""Evaluation batches group rows of similar length, so padding follows each batch's own rows."""
import numpy as np

from nli_jax.data import pipeline


def test_eval_batches_pad_to_their_own_rows_and_keep_every_example():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 300, 200)
    source = [{"idx": i, "n": int(n)} for i, n in enumerate(lengths)]
    encode = lambda e: {"input_ids": np.ones(e["n"], np.int32), "idx": np.int32(e["idx"])}
    batching = pipeline.Batching(buckets=(32, 64, 128, 256, 512), pad_values=(("input_ids", 0),))
    dummy = dict(encode(source[0]), idx=np.int32(-1))
    batches = list(pipeline.eval_batches(source, encode, batching, local_batch_size=16, dummy=dummy))
    seen = sorted(int(i) for b in batches for i, w in zip(b["idx"], b["weight"]) if w > 0)
    assert seen == list(range(200))
    padded = sum(b["input_ids"].size for b in batches)
    # In file order nearly every batch of 16 holds a row over 256 tokens and pads to 512.
    assert padded < 0.6 * len(batches) * 16 * 512, padded  # sorted: 54,784; file order: 106,496
    for b in batches:  # every batch pads to the bucket of its own longest row
        longest = int((b["input_ids"] * (b["weight"][:, None] > 0)).sum(1).max())
        assert b["input_ids"].shape[1] == min(x for x in (32, 64, 128, 256, 512) if x >= longest)
