"""grain input pipelines: seeded shuffle (new order each epoch) -> this process's rows of each
global batch (one batched read) -> encode (tokenise) -> collate (pad to a length bucket, or MLM
masking) -> global jax.Array.

Training iterators are grain DatasetIterators whose state is checkpointed with the model, so
a resumed run continues from the exact batch. Evaluation visits every example once: the last
batches are padded with weight-0 rows so every process runs the same number of steps.
"""
from __future__ import annotations

import bisect
import threading
from typing import Callable, Iterator, Sequence

import grain
import jax
import numpy as np


def pad_batch(rows: Sequence[dict], *, buckets: Sequence[int], pad_values: dict[str, int] | None = None) -> dict:
    """Stacks encoded rows. The fields named in `pad_values` have variable length and are padded
    with their value to the smallest bucket >= the longest row, so a run compiles one step per
    bucket instead of one per length; the others are stacked as they are."""
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


class EpochPermutations:
    """Element of the shuffled, repeated stream at a position: epoch e = position // n visits
    [0, n) in the order numpy.random.default_rng((seed, e)).permutation(n). Each epoch's
    permutation is built once (int32, 4 bytes per example) and the last two are cached.
    (A cheap O(1)-memory Feistel permutation was tried first: its orders correlate across
    epochs and measurably slowed learning, so nli-jax pays the memory.)"""

    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._cache: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"n": self.n, "seed": self.seed}

    def __setstate__(self, state):
        self.__init__(state["n"], state["seed"])

    def _epoch(self, epoch: int) -> np.ndarray:
        with self._lock:
            if epoch not in self._cache:
                if len(self._cache) >= 2:
                    self._cache.pop(min(self._cache))
                self._cache[epoch] = np.random.default_rng((self.seed, epoch)).permutation(self.n).astype(np.int32)
            return self._cache[epoch]

    def __call__(self, positions) -> np.ndarray:
        positions = np.asarray(positions, np.int64)
        epochs, offsets = positions // self.n, positions % self.n
        out = np.empty(len(positions), np.int64)
        for e in np.unique(epochs):
            where = epochs == e
            out[where] = self._epoch(int(e))[offsets[where]]
        return out


def shuffled_index(positions, n: int, seed: int) -> np.ndarray:
    return EpochPermutations(n, seed)(positions)


class _ProcessBatch:
    """Global batch b of the shuffled stream -> this process's rows (contiguous slice), read
    with one batched call when the source has one, then encoded."""

    def __init__(self, source, encode, global_batch: int, local_batch: int, process_index: int, seed: int):
        self.source, self.encode = source, encode
        self.g, self.l, self.p = global_batch, local_batch, process_index
        self.order = EpochPermutations(len(source), seed)

    def __call__(self, b):
        positions = b * self.g + self.p * self.l + np.arange(self.l)
        indices = self.order(positions).tolist()
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
    """Every example once; rows carry `weight` 1, padding rows (copies of `dummy`) weight 0.

    Rows are batched in order of length (rows carry `idx`, so outputs map back to examples):
    each batch then pads only to its own longest row's bucket, not to a random long row's."""
    indices = process_shard(len(source), process_index, process_count, drop_remainder=False)
    per_process = -(-len(source) // process_count)
    num_batches = max(1, -(-per_process // local_batch_size))
    rows = [dict(encode(source[i]), weight=np.float32(1.0)) for i in indices]
    if rows and "input_ids" in rows[0]:
        rows.sort(key=lambda r: len(r["input_ids"]))
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
