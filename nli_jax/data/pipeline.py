"""grain input pipelines: seeded shuffle (new order each epoch) -> this process's rows of each
global batch -> encode (tokenise) -> batch with padding to a length bucket -> global jax.Array.

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


class _ProcessRows:
    """Row r of this process's stream = row (b * global + process * local + i) of the global
    stream, for batch b = r // local and i = r % local."""

    def __init__(self, ordered, global_batch: int, local_batch: int, process_index: int):
        self.ordered, self.g, self.l, self.p = ordered, global_batch, local_batch, process_index

    def __call__(self, r):
        return self.ordered[(r // self.l) * self.g + self.p * self.l + r % self.l]


def train_dataset(source, encode: Callable[[dict], dict], *, local_batch_size: int, seed: int, num_epochs: int,
                  collate: Callable[[Sequence[dict]], dict], process_index: int = 0, process_count: int = 1,
                  workers: int = 0) -> grain.IterDataset:
    """Global batches do not depend on the number of processes or devices: the split is
    shuffled with `seed` (a new order each epoch) identically everywhere, cut into global
    batches, and each process reads only its contiguous rows of each global batch."""
    global_batch = local_batch_size * process_count
    if len(source) < global_batch:
        raise ValueError(f"training split has {len(source)} examples, fewer than one global batch of {global_batch}")
    ordered = grain.MapDataset.source(source).shuffle(seed=seed).repeat(num_epochs)
    # Encoding that draws random numbers (MLM masking) gets a generator per position of the
    # global stream: new masks every epoch, the same ones whatever the process count.
    if getattr(encode, "needs_rng", False):
        ordered = ordered.random_map(encode, seed=seed)
    else:
        ordered = ordered.map(encode)
    num_batches = len(ordered) // global_batch
    ds = grain.MapDataset.range(num_batches * local_batch_size).map(
        _ProcessRows(ordered, global_batch, local_batch_size, process_index))
    ds = ds.batch(local_batch_size, drop_remainder=True, batch_fn=collate)
    it = ds.to_iter_dataset()
    if workers > 0:
        # Workers need absl flags parsed and a __main__ guard; a saved iterator state restores
        # only with the same worker count.
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
