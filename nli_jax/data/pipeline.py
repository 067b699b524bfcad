"""grain input pipelines: seeded shuffle (new order each epoch) -> this process's rows of each
global batch (one batched read) -> encode (tokenise) -> collate (pad to a length bucket, or MLM
masking) -> global jax.Array.

Training iterators are grain DatasetIterators whose state is checkpointed with the model, so
a resumed run continues from the exact batch. Evaluation visits every example once: the last
batches are padded with weight-0 rows so every process runs the same number of steps.
"""
from __future__ import annotations

import bisect
import functools
import threading
from typing import Callable, Iterator, Sequence

import grain
import jax
import numpy as np


def pad_batch(rows: Sequence[dict], *, buckets: Sequence[int], pad_values: dict[str, int] | None = None,
              min_length: int = 0) -> dict:
    """Stacks encoded rows. The fields named in `pad_values` have variable length and are padded
    with their value to the smallest bucket >= the longest row (or >= `min_length`: the longest
    row of the global batch, when other processes hold the rest of it), so a run compiles one step
    per bucket instead of one per length; the others are stacked as they are."""
    pad_values = pad_values or {}
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        first = np.asarray(values[0])
        if first.ndim >= 1 and key in pad_values:
            longest = max(max(len(v) for v in values), min_length)
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
    with one batched call when the source has one, then encoded. With `lengths` (every
    example's encoded length): (rows, the longest row of the whole global batch)."""

    def __init__(self, source, encode, global_batch: int, local_batch: int, process_index: int, seed: int,
                 lengths: np.ndarray | None = None):
        self.source, self.encode = source, encode
        self.g, self.l, self.p = global_batch, local_batch, process_index
        self.order = EpochPermutations(len(source), seed)
        self.lengths = lengths

    def __call__(self, b):
        positions = b * self.g + self.p * self.l + np.arange(self.l)
        indices = self.order(positions).tolist()
        get_many = getattr(self.source, "get_many", None)
        rows = get_many(indices) if get_many else [self.source[i] for i in indices]
        rows = [self.encode(r) for r in rows]
        if self.lengths is None:
            return rows
        return rows, int(self.lengths[self.order(b * self.g + np.arange(self.g))].max())


class _CollateToLength:
    """(rows, global longest) -> collate(rows, min_length=global longest): every process pads
    its rows of a global batch to the same bucket, with no communication."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, element):
        rows, longest = element
        return self.collate(rows, min_length=longest)


def is_bucketing(collate) -> bool:
    """Whether `collate` pads to length buckets (pad_batch with more than one bucket)."""
    return (isinstance(collate, functools.partial) and collate.func is pad_batch
            and len(collate.keywords.get("buckets", ())) > 1)


def encoded_lengths(source, encode: Callable[[dict], dict], process_index: int, process_count: int) -> np.ndarray:
    """The encoded length (input_ids) of every example of `source`, each process encoding its
    strided share, gathered once across processes (one collective per split and run, none per
    step)."""
    n = len(source)
    mine = process_shard(n, process_index, process_count, drop_remainder=False)
    per_process = -(-n // process_count)
    local = np.zeros(per_process, np.int32)
    local[:len(mine)] = [len(encode(source[i])["input_ids"]) for i in mine]
    if process_count == 1:
        return local[:n]
    from jax.experimental import multihost_utils
    gathered = np.asarray(multihost_utils.process_allgather(local))  # [process, row]
    lengths = np.zeros(n, np.int32)
    for p in range(process_count):
        shard = process_shard(n, p, process_count, drop_remainder=False)
        lengths[list(shard)] = gathered[p, :len(shard)]
    return lengths


def train_dataset(source, encode: Callable[[dict], dict], *, local_batch_size: int, seed: int, num_epochs: int,
                  collate: Callable, process_index: int = 0, process_count: int = 1,
                  workers: int = 0, lengths: np.ndarray | None = None) -> grain.IterDataset:
    """Global batches do not depend on the number of processes or devices: the split is
    shuffled with `seed` (a new order each epoch) identically everywhere, cut into global
    batches, and each process reads only its contiguous rows of each global batch. The grain
    element is a batch, so per-example pipeline overhead is paid once per batch. `lengths`
    (encoded_lengths of the source): each batch is padded to the bucket of the global batch's
    longest row, so processes agree on shapes without padding everything to the maximum."""
    global_batch = local_batch_size * process_count
    if len(source) < global_batch:
        raise ValueError(f"training split has {len(source)} examples, fewer than one global batch of {global_batch}")
    num_batches = len(source) * num_epochs // global_batch
    if getattr(collate, "needs_rng", False):
        lengths = None  # batch-level random collates (MLM) produce fixed shapes
    ds = grain.MapDataset.range(num_batches).map(
        _ProcessBatch(source, encode, global_batch, local_batch_size, process_index, seed, lengths))
    if lengths is not None:
        ds = ds.map(_CollateToLength(collate))
    elif getattr(collate, "needs_rng", False):
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
                 process_index: int = 0, process_count: int = 1, lengths: np.ndarray | None = None) -> Iterator[dict]:
    """Every example once; rows carry `weight` 1, padding rows (copies of `dummy`) weight 0.

    Rows are batched in order of length (rows carry `idx`, so outputs map back to examples):
    each batch then pads only to its own longest row's bucket, not to a random long row's.
    `lengths` (encoded_lengths of the source, several processes): each process works out every
    process's sorted rows from it and pads batch b to the longest row of all processes' batch b."""
    indices = process_shard(len(source), process_index, process_count, drop_remainder=False)
    per_process = -(-len(source) // process_count)
    num_batches = max(1, -(-per_process // local_batch_size))
    rows = [dict(encode(source[i]), weight=np.float32(1.0)) for i in indices]
    if rows and "input_ids" in rows[0]:
        rows.sort(key=lambda r: len(r["input_ids"]))
    filler = dict(dummy, weight=np.float32(0.0))
    rows += [filler] * (num_batches * local_batch_size - len(rows))
    longest = [0] * num_batches
    if lengths is not None:
        size = num_batches * local_batch_size
        for p in range(process_count):
            theirs = sorted(lengths[list(process_shard(len(source), p, process_count, drop_remainder=False))])
            theirs = np.asarray(theirs + [len(dummy["input_ids"])] * (size - len(theirs)))
            longest = np.maximum(longest, theirs.reshape(num_batches, local_batch_size).max(axis=1))
    for b in range(num_batches):
        batch = rows[b * local_batch_size:(b + 1) * local_batch_size]
        yield collate(batch, min_length=int(longest[b])) if lengths is not None else collate(batch)


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
