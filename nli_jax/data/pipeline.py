"""grain input pipelines: seeded shuffle (new order each epoch) -> this process's rows of each
global batch (one batched read) -> encode (tokenise) -> collate (pad to a length bucket, or MLM
masking) -> global jax.Array.

Training iterators are grain DatasetIterators whose state is checkpointed with the model, so
a resumed run continues from the exact batch. Evaluation visits every example once: the last
batches are padded with weight-0 rows so every process runs the same number of steps.
"""
from __future__ import annotations

import bisect
from typing import Callable, Iterator, Sequence

import grain
import jax
import numpy as np


def pad_batch(rows: Sequence[dict], *, buckets: Sequence[int], pad_values: dict[str, int] | None = None) -> dict:
    """Stacks encoded rows; variable-length int fields (1-D, name ending in `ids`/`mask`/
    `labels`/`positions`) are padded to the smallest bucket >= the longest row, so a run compiles
    one step per bucket instead of one per length."""
    pad_values = pad_values or {}
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        first = np.asarray(values[0])
        if first.ndim >= 1 and key in pad_values:
            longest = max(len(v) for v in values)
            index = bisect.bisect_left(buckets, longest)
            length = buckets[index] if index < len(buckets) else longest
            arr = np.full((len(values), length) + first.shape[1:], pad_values[key], dtype=first.dtype)
            for i, v in enumerate(values):
                arr[i, : len(v)] = v
            out[key] = arr
        else:
            out[key] = np.stack([np.asarray(v) for v in values])
    return out


def process_shard(n: int, process_index: int, process_count: int, *, drop_remainder: bool) -> range:
    """Example indices of one process: strided, and equal-sized across processes when training."""
    if drop_remainder:
        n = n // process_count * process_count
    return range(process_index, n, process_count)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z):
    """splitmix64's finaliser: a bijective 64-bit hash (vectorised)."""
    z = z.astype(np.uint64)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def shuffled_index(positions, n: int, seed: int):
    """Element of the shuffled, repeated stream at `positions`: epoch e = position // n visits
    [0, n) in its own pseudo-random order (a keyed 4-round Feistel network on the next even
    power of two, cycle-walking into [0, n)). O(1) memory, so a 250M-example corpus is fine."""
    positions = np.asarray(positions, np.int64)
    epoch, x = positions // n, (positions % n).astype(np.uint64)
    half = max(1, ((max(n - 1, 1)).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    with np.errstate(over="ignore"):
        keys = [_mix(_mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + epoch.astype(np.uint64)) + np.uint64(r))
                for r in range(4)]

        def feistel(v, k):
            left, right = v >> np.uint64(half), v & mask
            for key in k:
                left, right = right, left ^ (_mix(right ^ key) & mask)
            return (left << np.uint64(half)) | right

        out = feistel(x, keys)
        bad = out >= np.uint64(n)
        while bad.any():  # cycle walking: at most a few rounds, the domain is < 4n
            out[bad] = feistel(out[bad], [k[bad] for k in keys])
            bad = out >= np.uint64(n)
    return out.astype(np.int64)


class _ProcessBatch:
    """Global batch b of the shuffled stream -> this process's rows (contiguous slice), read
    with one batched call when the source has one, then encoded."""

    def __init__(self, source, encode, global_batch: int, local_batch: int, process_index: int, seed: int):
        self.source, self.encode, self.seed = source, encode, seed
        self.g, self.l, self.p, self.n = global_batch, local_batch, process_index, len(source)

    def __call__(self, b):
        positions = b * self.g + self.p * self.l + np.arange(self.l)
        indices = shuffled_index(positions, self.n, self.seed).tolist()
        get_many = getattr(self.source, "get_many", None)
        rows = get_many(indices) if get_many else [self.source[i] for i in indices]
        return [self.encode(r) for r in rows]


def train_dataset(source, encode: Callable[[dict], dict], *, local_batch_size: int, seed: int, num_epochs: int,
                  collate: Callable, process_index: int = 0, process_count: int = 1,
                  workers: int = 0) -> grain.IterDataset:
    """Global batches do not depend on the number of processes or devices: the split is
    shuffled with `seed` (a new order each epoch) identically everywhere, cut into global
    batches, and each process reads only its contiguous rows of each global batch. The grain
    element is a batch, so per-example pipeline overhead is paid once per batch."""
    global_batch = local_batch_size * process_count
    if len(source) < global_batch:
        raise ValueError(f"training split has {len(source)} examples, fewer than one global batch of {global_batch}")
    num_batches = len(source) * num_epochs // global_batch
    ds = grain.MapDataset.range(num_batches).map(
        _ProcessBatch(source, encode, global_batch, local_batch_size, process_index, seed))
    if getattr(collate, "needs_rng", False):
        # Batch-level randomness (MLM masking): a generator per global batch index, the same on
        # every process, so masks do not depend on the process count.
        ds = ds.random_map(collate, seed=seed)
    else:
        ds = ds.map(collate)
    it = ds.to_iter_dataset()
    if workers > 0:
        # grain workers read absl flags: parse them when the program did not (argparse, pytest).
        # The program still needs a __main__ guard; a saved iterator state restores only with
        # the same worker count.
        from absl import flags
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return it


def steps_per_epoch(n: int, global_batch_size: int) -> int:
    return n // global_batch_size


def eval_batches(source, encode: Callable[[dict], dict], *, local_batch_size: int,
                 collate: Callable[[Sequence[dict]], dict], dummy: dict,
                 process_index: int = 0, process_count: int = 1) -> Iterator[dict]:
    """Every example once; rows carry `weight` 1, padding rows (copies of `dummy`) weight 0."""
    indices = process_shard(len(source), process_index, process_count, drop_remainder=False)
    per_process = -(-len(source) // process_count)
    num_batches = max(1, -(-per_process // local_batch_size))
    rows = [dict(encode(source[i]), weight=np.float32(1.0)) for i in indices]
    filler = dict(dummy, weight=np.float32(0.0))
    rows += [filler] * (num_batches * local_batch_size - len(rows))
    for b in range(num_batches):
        yield collate(rows[b * local_batch_size:(b + 1) * local_batch_size])


class Subset:
    """A random-access view of some indices of a source."""

    def __init__(self, source, indices):
        self._source, self._indices = source, list(indices)

    def __len__(self):
        return len(self._indices)

    def __getitem__(self, index):
        return self._source[self._indices[index]]


def to_global(batch: dict, sharding) -> dict:
    """Process-local numpy batch -> global jax.Arrays sharded over the batch axes."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}
