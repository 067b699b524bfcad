"""grain input pipelines: seeded shuffle (new order each epoch) -> this process's rows of each
global batch (one batched read) -> encode (tokenise) -> batch (a `Batching`: padded to a length
bucket or packed; MLM masking for pretraining) -> global jax.Array.

Training iterators are grain DatasetIterators whose state is checkpointed with the model, so
a resumed run continues from the exact batch. Evaluation visits every example once: the last
batches are padded with weight-0 rows so every process runs the same number of steps.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import threading
from typing import Callable, ClassVar, Iterator, Protocol, Sequence

import grain
import jax
import numpy as np
from absl import flags
from jax.experimental import multihost_utils

from nli_jax.data.records import read_many


def bucket_length(buckets: Sequence[int], longest: int) -> int:
    """The smallest bucket that holds `longest` tokens (`longest` itself beyond the last bucket)."""
    index = bisect.bisect_left(buckets, longest)
    return buckets[index] if index < len(buckets) else longest


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Positions of `lengths` grouped into bins whose lengths sum to at most `capacity`: longest
    first, each into the first bin with room (ties keep their order, so packing is deterministic)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for position in sorted(range(len(lengths)), key=lambda i: -int(lengths[i])):
        n = int(lengths[position])
        target = next((b for b, r in enumerate(room) if r >= n), None)
        if target is None:
            bins.append([position])
            room.append(capacity - n)
        else:
            bins[target].append(position)
            room[target] -= n
    return bins


def _rounded_rows(needed: int, examples_per_group: int) -> int:
    """Rows per group rounded up to a multiple of an eighth of the group's examples, so a run
    compiles a few row counts per length bucket, not one per batch."""
    granule = max(1, -(-examples_per_group // 8))
    return min(-(-needed // granule) * granule, examples_per_group)


def packed_shape(lengths: Sequence[int], *, groups: int, buckets: Sequence[int]) -> tuple[int, int]:
    """(rows per group, row length) of a packed global batch with these example lengths (in
    global order, cut into `groups` contiguous groups): rows are as long as the bucket of the
    longest example, and every group gets the most rows any group needs."""
    needs = packed_needs(lengths, groups=groups, buckets=buckets, longer=False)
    return needs[min(needs)], min(needs)


def packed_needs(lengths: Sequence[int], *, groups: int, buckets: Sequence[int], longer: bool = True) -> dict[int, int]:
    """{row length: rows per group} a packed global batch with these example lengths needs, for
    its own bucket (that of its longest example) and (`longer`) every longer one: each group's
    first-fit-decreasing row count, the most of any group, rounded up (_rounded_rows)."""
    lengths = np.asarray(lengths)
    own = bucket_length(buckets, int(lengths.max()))
    per_group = len(lengths) // groups
    capacities = [own] + ([b for b in buckets if b > own] if longer else [])
    return {capacity: _rounded_rows(max(len(first_fit_decreasing(lengths[g * per_group:(g + 1) * per_group], capacity))
                                        for g in range(groups)), per_group)
            for capacity in capacities}


def _cheapest_shape(needs: dict[int, int], shapes) -> tuple[int, int] | None:
    fitting = [(rows * length, length, rows) for rows, length in shapes if needs.get(length, rows + 1) <= rows]
    if not fitting:
        return None
    _, length, rows = min(fitting)
    return rows, length


def choose_packed_shape(needs: dict[int, int], shapes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(rows per group, row length): of `shapes`, the one with the fewest tokens (rows x length;
    then the shorter rows) that holds a batch with these `needs` (packed_needs); a batch that fits
    none takes its own bucket and row count (packed_shape's)."""
    own = min(needs)
    return _cheapest_shape(needs, shapes) or (needs[own], own)


@dataclasses.dataclass(frozen=True)
class PackedShapePlan:
    """The packed shapes a run's training steps take: `shapes` as (rows per group, row length),
    what Batching.pack chooses from, and `per_step` the shape each step takes, in order (a batch
    that fits none of `shapes` takes its own)."""
    shapes: tuple[tuple[int, int], ...]
    per_step: tuple[tuple[int, int], ...]
    default_shapes: int  # how many shapes the steps would take without planning
    extra_tokens: int  # tokens (rows x length, all groups) computed beyond the unplanned shapes

    def describe(self) -> str:
        counts = collections.Counter(self.per_step)
        listed = ", ".join(f"{rows} x {length}: {n}" for (rows, length), n in counts.items())
        return (f"{len(counts)} packed step shape(s) (rows per group x length: steps) instead of "
                f"{self.default_shapes}: {listed}; {self.extra_tokens:+d} tokens computed over "
                f"{len(self.per_step)} steps")


def apply_packed_shapes(shapes: Sequence[tuple[int, int]], lengths_of_batches: Sequence[np.ndarray], *,
                        groups: int, buckets: Sequence[int]) -> PackedShapePlan:
    """The shape each of these global batches takes given the planned `shapes` (choose_packed_shape)."""
    return _assign_shapes(shapes, [packed_needs(lengths, groups=groups, buckets=buckets)
                                   for lengths in lengths_of_batches], groups)


def _assign_shapes(shapes, needs: list[dict[int, int]], groups: int) -> PackedShapePlan:
    own = [choose_packed_shape(n, ()) for n in needs]
    choice = [choose_packed_shape(n, shapes) for n in needs]
    extra = groups * (sum(r * c for r, c in choice) - sum(r * c for r, c in own))
    return PackedShapePlan(shapes=tuple(shapes), per_step=tuple(choice), default_shapes=len(set(own)),
                           extra_tokens=extra)


def plan_packed_shapes(lengths_of_batches: Sequence[np.ndarray], *, groups: int, buckets: Sequence[int],
                       compile_cost_tokens: int) -> PackedShapePlan:
    """The set of packed step shapes that minimises tokens computed + `compile_cost_tokens` per
    shape compiled, over these global batches (each given by its examples' lengths, in global
    order; `groups` packing groups over all processes). Every batch's own shape (packed_shape) is
    a candidate; the shape whose removal adds the fewest tokens is dropped while that is less
    than a compilation costs, its batches taking their next-cheapest shape that holds them (more
    rows, or longer rows). The plan changes which padding rows a step computes, not which
    examples it trains on or their loss."""
    needs = [packed_needs(lengths, groups=groups, buckets=buckets) for lengths in lengths_of_batches]
    shapes = sorted({choose_packed_shape(n, ()) for n in needs})
    choice = [choose_packed_shape(n, shapes) for n in needs]
    while len(shapes) > 1:
        users = collections.defaultdict(list)
        for b, shape in enumerate(choice):
            users[shape].append(b)
        best = None  # (tokens added, shape removed, its batches' new shapes)
        for shape in shapes:
            rest = [s for s in shapes if s != shape]
            moved, extra = [], 0
            for b in users[shape]:
                other = _cheapest_shape(needs[b], rest)
                if other is None:  # no other shape holds this batch
                    extra = None
                    break
                moved.append((b, other))
                extra += other[0] * other[1] - shape[0] * shape[1]
            if extra is not None and extra < compile_cost_tokens and (best is None or extra < best[0]):
                best = (extra, shape, moved)
        if best is None:
            break
        shapes.remove(best[1])
        for b, other in best[2]:
            choice[b] = other
    used = sorted(set(choice), key=choice.index)  # in order of first use
    return _assign_shapes(used, needs, groups)


# Packed evaluation rows are at least this long (or the longest bucket, if shorter), so that
# short examples share rows.
EVAL_PACKED_MIN_LENGTH = 128


class BatchingProtocol(Protocol):
    """What the input pipeline, the loop and evaluation read of a task's batching: `Batching`
    below, or a task's own (MLM masking: nli_jax.pretraining.masking.MaskedBatching)."""
    random: bool  # batches draw random numbers (an rng per batch is passed)
    packing_groups: int  # training batches packed in this many groups per process (0: padded)
    eval_packing_groups: int  # evaluation batches likewise

    @property
    def bucketed(self) -> bool: ...  # padded batches take one of several lengths

    @property
    def needs_global_lengths(self) -> bool: ...  # processes need every example's length to agree on shapes

    def training(self, rows: Sequence[dict], *, global_lengths=None, rng=None) -> dict: ...

    def evaluation(self, rows: Sequence[dict], *, min_length: int = 0, rng=None) -> dict: ...


@dataclasses.dataclass(frozen=True)
class Batching:
    """How encoded rows become a batch, for training and for evaluation: the one object the
    input pipeline, the loop and evaluation are given (a task with batch-level random work,
    MLM masking, gives its own object with the same four members instead).

    `pad`: fields with a pad value (token fields) are padded to the smallest of `buckets` that
    holds the longest row, so a run compiles one step per bucket instead of one per length.
    `pack` (training, when `packing_groups` > 0; evaluation, when `eval_packing_groups` > 0):
    several examples per row, each attending to itself only, in that many groups per process.
    `per_example_fields`: fields with a pad value that stay one row per example when packed
    (tagging's word alignment and word labels), padded to the rows' length.
    `packed_shapes`: the (rows per group, row length) packed training batches may take (a run's
    plan_packed_shapes): each takes the one with the fewest tokens that holds it. Empty: each
    takes its own bucket and row count (packed_shape)."""
    buckets: tuple[int, ...]
    pad_values: tuple[tuple[str, int], ...]
    packing_groups: int = 0
    eval_packing_groups: int = 0
    per_example_fields: tuple[str, ...] = ()
    packed_shapes: tuple[tuple[int, int], ...] = ()
    random: ClassVar[bool] = False  # whether batches draw random numbers (MLM masking)

    @property
    def bucketed(self) -> bool:
        """Whether padded batches take one of several lengths (processes must agree on it)."""
        return len(self.buckets) > 1

    @property
    def needs_global_lengths(self) -> bool:
        """Whether processes holding parts of a global training batch need every example's
        length to agree on its shape (bucketed padding, or packing)."""
        return self.packing_groups > 0 or self.bucketed

    def training(self, rows: Sequence[dict], *, global_lengths=None, rng=None) -> dict:
        """A training batch: packed, or padded to the bucket of the global batch's longest row."""
        if self.packing_groups:
            return self.pack(rows, global_lengths=global_lengths)
        return self.pad(rows, min_length=0 if global_lengths is None else int(np.max(global_lengths)))

    def evaluation(self, rows: Sequence[dict], *, min_length: int = 0, rng=None) -> dict:
        return self.pad(rows, min_length=min_length)

    def pad(self, rows: Sequence[dict], *, min_length: int = 0) -> dict:
        """Stacks encoded rows. The fields with a pad value have variable length and are padded
        to the smallest bucket >= the longest row (or >= `min_length`: the longest row of the
        global batch, when other processes hold the rest of it); the others are stacked as they are."""
        pad_values = dict(self.pad_values)
        out = {}
        for key in rows[0]:
            values = [r[key] for r in rows]
            first = np.asarray(values[0])
            if first.ndim >= 1 and key in pad_values:
                length = bucket_length(self.buckets, max(max(len(v) for v in values), min_length))
                arr = np.full((len(values), length) + first.shape[1:], pad_values[key], dtype=first.dtype)
                for i, v in enumerate(values):
                    arr[i, : len(v)] = v
                out[key] = arr
            else:
                out[key] = np.stack([np.asarray(v) for v in values])
        return out

    def pack(self, rows: Sequence[dict], *, global_lengths: Sequence[int] | None = None) -> dict:
        """Several examples per row: a batch of B sequence-level examples becomes R <= B rows of
        token fields, each example a segment of a row with its own position ids and an attention
        mask that keeps it to itself, so every example's outputs are those of its unpacked row
        (IndoNLI at length 128: 20 rows of 128 instead of 32, 0.79 -> 0.19 padded tokens per real one).

        The rows are cut into `packing_groups` contiguous groups of examples, each packed into its
        own rows (one group per data-parallel shard and micro-batch: an example and its row are on
        the same device). Token fields become [groups * rows_per_group, length] with `segment_ids`
        (1, 2, ... per example in its row, 0 for padding) and `position_ids`; `cls_index`
        [groups, B / groups] is each example's first token as an index into its group's rows
        flattened; the other fields (label, weight, idx) stay one per example, in order.
        `global_lengths`: the example lengths of the whole global batch when other processes hold
        the rest of it; every process then uses the same row count and length."""
        groups = max(1, self.packing_groups)
        per_group = len(rows) // groups
        if per_group * groups != len(rows):
            raise ValueError(f"{len(rows)} examples do not split into {groups} packing groups")
        lengths = [len(r["input_ids"]) for r in rows]
        # The shape is the whole global batch's (other processes hold the rest of `global_lengths`).
        every, all_groups = (lengths, groups) if global_lengths is None else \
            (global_lengths, groups * (len(global_lengths) // len(rows)))
        if self.packed_shapes:  # the run's planned shapes
            rows_per_group, capacity = choose_packed_shape(packed_needs(every, groups=all_groups, buckets=self.buckets),
                                                           self.packed_shapes)
        else:
            rows_per_group, capacity = packed_shape(every, groups=all_groups, buckets=self.buckets)
        group_bins = [[sorted(b) for b in first_fit_decreasing(lengths[g * per_group:(g + 1) * per_group], capacity)]
                      for g in range(groups)]
        return self.assemble(rows, group_bins, rows_per_group=rows_per_group, capacity=capacity)

    def assemble(self, rows: Sequence[dict], group_bins: list[list[list[int]]], *, rows_per_group: int,
                 capacity: int) -> dict:
        """The packed batch of `rows` (len(group_bins) equal groups of examples, in order) with
        each group's rows as `group_bins` says: bin b of group g lists the positions (in the
        group) of the examples in its row b, in the order they are laid out. Examples in no bin
        (evaluation's weight-0 fillers) point at their group's first token."""
        groups, pad_values = len(group_bins), dict(self.pad_values)
        per_group = len(rows) // groups
        packed = {k: v for k, v in pad_values.items() if k not in self.per_example_fields}
        out = {key: np.full((groups * rows_per_group, capacity), value, dtype=np.asarray(rows[0][key]).dtype)
               for key, value in packed.items()}
        segment_ids = np.zeros((groups * rows_per_group, capacity), np.int32)
        position_ids = np.zeros((groups * rows_per_group, capacity), np.int32)
        cls_index = np.zeros((groups, per_group), np.int32)
        for g, bins in enumerate(group_bins):
            if len(bins) > rows_per_group:
                raise ValueError(f"packing group {g} needs {len(bins)} rows, more than the batch's {rows_per_group}")
            for b, positions in enumerate(bins):
                row, offset = g * rows_per_group + b, 0
                for segment, position in enumerate(positions, 1):
                    example = g * per_group + position
                    n = len(rows[example]["input_ids"])
                    for key in packed:
                        out[key][row, offset:offset + n] = rows[example][key]
                    segment_ids[row, offset:offset + n] = segment
                    position_ids[row, offset:offset + n] = np.arange(n)
                    cls_index[g, position] = b * capacity + offset
                    offset += n
        # Per-example fields: one row per example, as long as the rows (or the bucket of a longer
        # field: words without a sub-token can outnumber an example's tokens).
        width = bucket_length(self.buckets, max([capacity] + [len(r[k]) for r in rows for k in self.per_example_fields]))
        for key in self.per_example_fields:
            first = np.asarray(rows[0][key])
            arr = np.full((len(rows), width), pad_values[key], dtype=first.dtype)
            for i, r in enumerate(rows):
                arr[i, :len(r[key])] = r[key]
            out[key] = arr
        for key in rows[0]:
            if key not in pad_values:
                out[key] = np.stack([np.asarray(r[key]) for r in rows])
        out.update(segment_ids=segment_ids, position_ids=position_ids, cls_index=cls_index)
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


class _ProcessBatch:
    """Global batch b of the shuffled stream -> this process's rows (contiguous slice), read
    with one batched call when the source has one, then encoded. With `lengths` (every
    example's encoded length): (rows, the lengths of the whole global batch's examples)."""

    def __init__(self, source, encode, global_batch: int, local_batch: int, process_index: int, seed: int,
                 lengths: np.ndarray | None = None):
        self.source, self.encode = source, encode
        self.g, self.l, self.p = global_batch, local_batch, process_index
        self.order = EpochPermutations(len(source), seed)
        self.lengths = lengths

    def __call__(self, b):
        positions = b * self.g + self.p * self.l + np.arange(self.l)
        indices = self.order(positions).tolist()
        rows = [self.encode(r) for r in read_many(self.source, indices)]
        if self.lengths is None:
            return rows
        return rows, self.lengths[self.order(b * self.g + np.arange(self.g))]


def shard_major(batch: dict, micro_batches: int, shards: int) -> dict:
    """A training batch whose rows (and examples, packing groups) come micro-batch by micro-batch
    ([micro_batches, shards, n] along the leading axis), laid out shard by shard instead
    ([shards, micro_batches, n]): each data-parallel device then holds its own rows of every
    micro-batch, and the train step takes micro-batch m as [:, m] of that layout
    (steps.make_train_step) with the same examples, in the same order, as before. Laid out
    micro-batch by micro-batch, a device would hold rows of one micro-batch only, and the
    compiler moves rows between devices at every micro-step instead of shrinking the step's
    memory (launch.compile on a v3-8)."""
    return {k: swap_blocks(np.asarray(v), micro_batches, shards) for k, v in batch.items()}


def swap_blocks(x, outer: int, inner: int):
    """x (numpy or jax) with its leading axis read as [outer, inner, n] blocks, reordered
    [inner, outer, n]; same shape. swap_blocks(swap_blocks(x, a, b), b, a) is x."""
    return x.reshape(outer, inner, -1, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)


class _ShardMajor:
    """batch -> shard_major(batch, ...) (a grain map)."""

    def __init__(self, micro_batches: int, shards: int):
        self.micro_batches, self.shards = micro_batches, shards

    def __call__(self, batch):
        return shard_major(batch, self.micro_batches, self.shards)


class _TrainingBatch:
    """rows -> batching.training(rows) (a grain map)."""

    def __init__(self, batching):
        self.batching = batching

    def __call__(self, rows):
        return self.batching.training(rows)


class _TrainingBatchToGlobalShape(_TrainingBatch):
    """(rows, global batch lengths) -> the batch padded (or packed) to the global batch's shape:
    every process shapes its rows of a global batch alike, with no communication."""

    def __call__(self, element):
        rows, lengths = element
        return self.batching.training(rows, global_lengths=lengths)


class _RandomTrainingBatch(_TrainingBatch):
    """(rows, generator) -> batching.training(rows, rng=...) (a grain random_map)."""

    def __call__(self, rows, rng):
        return self.batching.training(rows, rng=rng)


def encoded_lengths(source, encode: Callable[[dict], dict], process_index: int, process_count: int) -> np.ndarray:
    """The encoded length (input_ids) of every example of `source`, each process encoding its
    strided share, gathered once across processes (one collective per split and run, none per
    step)."""
    n = len(source)
    mine = process_shard(n, process_index, process_count, drop_remainder=False)
    per_process = -(-n // process_count)
    local = np.zeros(per_process, np.int32)
    local[:len(mine)] = [len(encode(example)["input_ids"]) for example in read_many(source, mine)]
    if process_count == 1:
        return local[:n]
    gathered = np.asarray(multihost_utils.process_allgather(local))  # [process, row]
    lengths = np.zeros(n, np.int32)
    for p in range(process_count):
        shard = process_shard(n, p, process_count, drop_remainder=False)
        lengths[list(shard)] = gathered[p, :len(shard)]
    return lengths


# Batches a run plans its packed shapes from (plan_packed_shapes), and looks ahead at.
PLANNED_BATCHES = 8192
PLAN_ORDER_SEED = 0


@dataclasses.dataclass(frozen=True)
class TrainingBatches:
    """A run's training batches: `batches[b]` is this process's part of global batch b (random
    access: the loop reads one batch of each planned shape ahead, to compile its step), and
    `plan` the packed shapes the steps take (None: not planned)."""
    batches: grain.MapDataset
    plan: PackedShapePlan | None = None

    def iterator(self, workers: int = 0) -> grain.IterDataset:
        it = self.batches.to_iter_dataset()
        if workers > 0:
            # grain workers read absl flags: parse them when the program did not (argparse, pytest).
            # The program still needs a __main__ guard; a saved iterator state restores only with
            # the same worker count.
            if not flags.FLAGS.is_parsed():
                flags.FLAGS.mark_as_parsed()
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
        return it


def training_batches(source, encode: Callable[[dict], dict], batching, *, local_batch_size: int, seed: int,
                     num_epochs: int, process_index: int = 0, process_count: int = 1,
                     lengths: np.ndarray | None = None, compile_cost_tokens: int = 0,
                     steps: int | None = None, micro_batches: int = 1, shards: int = 1) -> TrainingBatches:
    """Global batches do not depend on the number of processes or devices: the split is
    shuffled with `seed` (a new order each epoch) identically everywhere, cut into global
    batches, and each process reads only its contiguous rows of each global batch. The grain
    element is a batch, so per-example pipeline overhead is paid once per batch. `lengths`
    (encoded_lengths of the source): each batch is padded to the bucket of the global batch's
    longest row, so processes agree on shapes without padding everything to the maximum; with
    packing and `compile_cost_tokens` > 0, the packed shapes are planned from them
    (plan_packed_shapes) so that the run compiles fewer train steps, and `plan` gives the shape of
    each of its first `steps` batches (default: all). `micro_batches` (accumulation) over
    `shards` (this process's data-parallel devices): batches laid out shard by shard (shard_major)."""
    global_batch = local_batch_size * process_count
    if len(source) < global_batch:
        raise ValueError(f"training split has {len(source)} examples, fewer than one global batch of {global_batch}")
    num_batches = len(source) * num_epochs // global_batch
    if batching.random:
        lengths = None  # batch-level random batchings (MLM) produce fixed shapes
    plan = None
    if lengths is not None and compile_cost_tokens > 0 and batching.packing_groups:
        groups = batching.packing_groups * process_count

        def batches(order: EpochPermutations, count: int) -> list[np.ndarray]:
            return [lengths[order(b * global_batch + np.arange(global_batch))] for b in range(count)]

        # Planned on an epoch in an order of its own (not the run's seed), so that runs and sweep
        # cells that differ in seed or learning rate take, and compile, the same shapes.
        shapes = plan_packed_shapes(batches(EpochPermutations(len(source), PLAN_ORDER_SEED),
                                            min(len(source) // global_batch, PLANNED_BATCHES)),
                                    groups=groups, buckets=batching.buckets,
                                    compile_cost_tokens=compile_cost_tokens).shapes
        plan = apply_packed_shapes(shapes, batches(EpochPermutations(len(source), seed),
                                                   min(num_batches, steps or num_batches, PLANNED_BATCHES)),
                                   groups=groups, buckets=batching.buckets)
        batching = dataclasses.replace(batching, packed_shapes=shapes)
    ds = grain.MapDataset.range(num_batches).map(
        _ProcessBatch(source, encode, global_batch, local_batch_size, process_index, seed, lengths))
    if lengths is not None:
        ds = ds.map(_TrainingBatchToGlobalShape(batching))
    elif batching.random:
        # Batch-level randomness (MLM masking): a generator per global batch index, the same on
        # every process, so masks do not depend on the process count.
        ds = ds.random_map(_RandomTrainingBatch(batching), seed=seed)
    else:
        ds = ds.map(_TrainingBatch(batching))
    if micro_batches > 1 and shards > 1:
        ds = ds.map(_ShardMajor(micro_batches, shards))
    return TrainingBatches(ds, plan)


def train_dataset(source, encode: Callable[[dict], dict], batching, *, local_batch_size: int, seed: int,
                  num_epochs: int, process_index: int = 0, process_count: int = 1,
                  workers: int = 0, lengths: np.ndarray | None = None,
                  compile_cost_tokens: int = 0) -> grain.IterDataset:
    """training_batches(...) as a checkpointable iterable (`workers` grain worker processes)."""
    return training_batches(source, encode, batching, local_batch_size=local_batch_size, seed=seed,
                            num_epochs=num_epochs, process_index=process_index, process_count=process_count,
                            lengths=lengths, compile_cost_tokens=compile_cost_tokens).iterator(workers)


def eval_batches(source, encode: Callable[[dict], dict], batching, *, local_batch_size: int, dummy: dict,
                 process_index: int = 0, process_count: int = 1, lengths: np.ndarray | None = None) -> Iterator[dict]:
    """Every example once; rows carry `weight` 1, padding rows (copies of `dummy`) weight 0.

    Rows are batched in order of length (rows carry `idx`, so outputs map back to examples):
    each batch then pads only to its own longest row's bucket, not to a random long row's.
    `lengths` (encoded_lengths of the source, several processes): each process works out every
    process's sorted rows from it and pads batch b to the longest row of all processes' batch b.
    A random batching (MLM) draws from a generator fixed per batch (its first example and this
    process), so every evaluation of a run masks alike. A batching with `eval_packing_groups`
    packs instead (packed_eval_batches; `lengths` required)."""
    if batching.eval_packing_groups:
        if lengths is None:
            raise ValueError("packed evaluation needs every example's encoded length")
        yield from packed_eval_batches(source, encode, batching, local_batch_size=local_batch_size, dummy=dummy,
                                       process_index=process_index, process_count=process_count, lengths=lengths)
        return
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
        rng = np.random.default_rng((7919, int(batch[0]["idx"]), process_index)) if batching.random else None
        yield batching.evaluation(batch, min_length=int(longest[b]), rng=rng)


def packed_eval_plan(lengths: Sequence[int], *, groups: int, rows_per_group: int,
                     buckets: Sequence[int]) -> list[tuple[int, int, int, list[list[list[int]]]]]:
    """Packed evaluation batches of every example, planned from the lengths alone (so every
    process plans alike): [(row length, rows per group, the most examples a group holds,
    [groups: [rows: [example indices]]])].

    Best fit decreasing: longest first, each example goes into the fullest row it fits in, or
    starts a row as long as its bucket (at least EVAL_PACKED_MIN_LENGTH, or the longest bucket).
    Rows of one length make batches of `groups` x `rows_per_group` rows (the last one as few as
    it needs, rounded up to a power of two); a shape's most examples per group is the most any
    of its groups holds, so a run compiles a step or two per row length. IndoNLI validation
    computes 1.06x tokens per real one this way at length 128 (MiniLM's vocabulary, 64 rows a
    batch), against 1.43x for batches sorted by length and padded to buckets."""
    floor = bucket_length(buckets, min(EVAL_PACKED_MIN_LENGTH, buckets[-1]))
    longest = max([floor, *map(int, lengths)]) if len(lengths) else floor
    rows: list[tuple[int, list[int]]] = []  # (row length, examples)
    by_room: list[collections.deque] = [collections.deque() for _ in range(longest + 1)]  # room -> open rows
    for i in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        n = int(lengths[i])
        room = next((r for r in range(n, longest + 1) if by_room[r]), None)
        if room is None:
            rows.append((max(floor, bucket_length(buckets, n)), []))
            row, room = len(rows) - 1, rows[-1][0]
        else:
            row = by_room[room].popleft()
        rows[row][1].append(i)
        if room - n > 0:
            by_room[room - n].append(row)
    batches = []
    per_batch = groups * rows_per_group
    for capacity in sorted({c for c, _ in rows}):
        same = [examples for c, examples in rows if c == capacity]
        chunks = [same[b:b + per_batch] for b in range(0, len(same), per_batch)]
        # The last batch of a row length has as few rows as it needs (a power of two: few shapes).
        needed = -(-len(chunks[-1]) // groups)
        sizes = [rows_per_group] * (len(chunks) - 1) + [min(rows_per_group, 1 << (needed - 1).bit_length())]
        for size in sorted(set(sizes), reverse=True):
            planned = [[chunk[g * size:(g + 1) * size] for g in range(groups)]
                       for chunk, n in zip(chunks, sizes) if n == size]
            most = max(sum(len(r) for r in group) for batch in planned for group in batch)
            batches += [(capacity, size, most, batch) for batch in planned]
    return batches


def packed_eval_batches(source, encode: Callable[[dict], dict], batching, *, local_batch_size: int, dummy: dict,
                        process_index: int, process_count: int, lengths: np.ndarray) -> Iterator[dict]:
    """Packed evaluation batches (packed_eval_plan): each of the batching's eval_packing_groups
    groups per process is one data-parallel device's `local_batch_size / groups` rows, its
    examples laid out in order of length and padded to the group's most examples with weight-0
    copies of `dummy`. Every process plans every batch from `lengths` and packs its own groups,
    so all run the same steps on the same shapes with no exchange."""
    groups = batching.eval_packing_groups
    plan = packed_eval_plan(lengths, groups=groups * process_count, rows_per_group=max(1, local_batch_size // groups),
                            buckets=batching.buckets)
    filler = dict(dummy, weight=np.float32(0.0))
    for capacity, rows_per_group, most, members in plan:
        rows, group_bins = [], []
        for group in members[process_index * groups:(process_index + 1) * groups]:
            encoded, bins = [], []
            for row in group:
                bins.append(list(range(len(encoded), len(encoded) + len(row))))
                encoded += [dict(encode(source[i]), weight=np.float32(1.0)) for i in row]
            group_bins.append(bins)
            rows += encoded + [filler] * (most - len(encoded))
        yield batching.assemble(rows, group_bins, rows_per_group=rows_per_group, capacity=capacity)


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
