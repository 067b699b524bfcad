"""The encoder's attention: softmax(q k^T) v over masked keys, two ways.

"plain": XLA matmuls and a float32 softmax, exactly as the encoder has always computed it.
"splash": the Pallas TPU kernel jax.experimental.pallas.ops.tpu.splash_attention, which never
materialises the [batch, heads, q, k] scores. It takes segment ids instead of a mask (a query
sees the keys of its own segment only), so padded rows become one segment of real tokens (1)
and one of padding (0): real positions get exactly the plain path's attention, padding
positions attend to padding and differ from the plain path (nothing reads them). Packed rows
keep their segment ids (0 = padding).
"auto": splash when compiling for a TPU without attention-probability dropout (the kernel has
none), plain otherwise.

The target of compilation is read from the mesh in context (jax.set_mesh) or from the mesh the
operands are sharded over, never from jax.default_backend(): that says "cpu" while a CPU host
compiles for a TPU topology. Under a multi-device mesh the kernel, which XLA cannot partition,
runs inside jax.shard_map over the batch axes (and heads over "tensor"), as MaxText does.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec as P

from nli_jax.models.config import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS

# Mesh axes of the "batch" and "heads" rules in configs/finetune_common.py (MESH_RULES). Another
# rule only costs a reshard around the kernel, not correctness: shard_map moves data as needed.
BATCH_MESH_AXES = ("data", "fsdp")
HEADS_MESH_AXIS = "tensor"

# The kernel's tiles are multiples of the TPU's 128 lanes; larger tiles mean fewer grid steps.
_LANES = 128
_MAX_BLOCK = 512

_interpret = False  # Pallas interpret mode for the kernel: CPU tests only (see interpret_splash)


@contextlib.contextmanager
def interpret_splash():
    """Within this block, the splash kernel is traced in Pallas interpret mode, which runs on CPU
    (slowly) with the kernel's own numerics: how the tests check it without a TPU. Read at trace
    time: a function jitted inside keeps interpret mode in its cached program."""
    global _interpret
    previous, _interpret = _interpret, True
    try:
        yield
    finally:
        _interpret = previous


@dataclasses.dataclass(frozen=True)
class Target:
    """What a computation is compiled for. `mesh`: the mesh in context or of the operands' shardings
    (None when neither has one: an unsharded jit, compiled for the default devices)."""
    platform: str
    device_kind: str | None  # "TPU v4", ...; None when the mesh does not say
    mesh: jax.sharding.AbstractMesh | None
    device_count: int


def compile_target(*arrays) -> Target:
    """The platform and mesh that `arrays` (traced or concrete) are being computed on."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = next((m for m in (_array_mesh(x) for x in arrays) if m is not None), None)
    if mesh is not None:
        device = getattr(mesh, "abstract_device", None)
        if device is not None:
            return Target(device.platform, device.device_kind, mesh, mesh.size)
        return Target(jax.devices()[0].platform, None, mesh, mesh.size)
    for x in arrays:  # an eager array
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            devices = x.sharding.device_set
            device = next(iter(devices))
            return Target(device.platform, device.device_kind, None, len(devices))
    # Nothing says otherwise: jit compiles for the default devices.
    device = jax.devices()[0]
    return Target(device.platform, device.device_kind, None, jax.device_count())


def _array_mesh(x):
    try:
        sharding = jax.typeof(x).sharding
    except (TypeError, AttributeError):
        return None
    mesh = getattr(sharding, "mesh", None)
    return None if mesh is None or mesh.empty else mesh


def choose(implementation: str, q, *, dropout_active: bool) -> str:
    """The path that runs, "plain" or "splash", for `implementation` ("plain", "splash", "auto")
    and query q [batch, heads, length, head_dim]. "auto" takes splash only where it runs as is: a TPU target
    whose mesh is known (or a single device: XLA cannot partition the kernel itself) and whose
    Mosaic compiles the kernel for q's dtype, lengths the kernel tiles without padding, and no
    dropout on the probabilities."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {implementation!r}; expected one of {IMPLEMENTATIONS}")
    if implementation != "auto":
        return implementation
    target = compile_target(q)
    on_tpu = target.platform == "tpu" and (target.mesh is not None or target.device_count == 1)
    return "splash" if on_tpu and _compiles_on(target.device_kind, q.dtype) and not dropout_active \
        and q.shape[2] % _LANES == 0 else "plain"


def _compiles_on(device_kind: str | None, dtype) -> bool:
    """Whether Mosaic compiles the kernel for this TPU and operand dtype. TPU v2/v3: float32 only
    (libtpu 0.0.42: "Unsupported matmul RHS type on target: vector<128x128xbf16>")."""
    if device_kind in ("TPU v2", "TPU v3"):
        return jnp.dtype(dtype) == jnp.float32
    return True


def attend(q, k, v, mask, *, implementation: str = "auto",
           probs_dropout: Callable[[jax.Array], jax.Array] | None = None, window: int | None = None) -> jax.Array:
    """Attention context [batch, heads, q, head_dim] of q, k, v [batch, heads, length, head_dim]
    (q already scaled).

    mask: which keys each query may see, as
      bool [batch, k]        padding mask (True: real token);
      bool [batch, q, k]     packed rows' mask, (s_q == s_k) & (s_k > 0) of segment ids s, as
                             Encoder builds it (the splash path recovers the segment ids);
      int  [batch, length]   segment ids of packed rows, 0 = padding.
    probs_dropout: applied to the attention probabilities (plain path only); None when inactive.
    window: a sliding window on top of `mask` (ModernBERT's local layers): a query at row position
      i sees keys j with |i - j| <= window only. Examples of packed rows are contiguous, so row
      distance is distance within the example.
    """
    chosen = choose(implementation, q, dropout_active=probs_dropout is not None)
    if chosen == "splash":
        if probs_dropout is not None:
            raise ValueError("attention='splash' has no dropout on the attention probabilities: set "
                             "attention_probs_dropout_prob=0, or use attention='auto' or 'plain'")
        return splash_attention(q, k, v, segment_ids(mask), window=window)
    return plain_attention(q, k, v, mask, probs_dropout=probs_dropout, window=window)


def plain_attention(q, k, v, mask, *, probs_dropout=None, bias=None, window: int | None = None):
    """XLA attention: float32 scores and softmax, probabilities cast to v's (the compute) dtype.
    bias: float32 added to the scores before masking, broadcast against [b, h, q, k] (DeBERTa's
    relative-position terms). window: as `attend`'s."""
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=jnp.float32)  # [b, h, q, k]
    if bias is not None:
        scores = scores + bias
    allowed = _key_mask(mask)
    if window is not None:
        rows = jnp.arange(q.shape[2])[:, None] - jnp.arange(k.shape[2])[None, :]
        allowed = allowed & (jnp.abs(rows) <= window)
    # Masked keys get the most negative finite value, as Hugging Face's additive mask does,
    # so even all-padding rows stay finite.
    scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if probs_dropout is not None:
        probs = probs_dropout(probs)
    return jnp.matmul(probs, v)


def _key_mask(mask):
    """`mask` broadcast against scores [b, h, q, k]."""
    if mask.ndim == 3:
        return mask[:, None]
    if jnp.issubdtype(mask.dtype, jnp.integer):  # segment ids
        return ((mask[:, :, None] == mask[:, None, :]) & (mask[:, None, :] > 0))[:, None]
    return mask[:, None, None, :]


def segment_ids(mask):
    """int32 [batch, length] segment ids for the kernel from any form of `attend`'s mask."""
    if mask.ndim == 2:  # a padding mask (True -> 1, False -> 0) or segment ids already
        return mask.astype(jnp.int32)
    # A packed mask: token t's example is the set of keys of row t, named by its first key (+1);
    # a padding token's row is empty (0). Tokens of one example share a row, so a name.
    first_key = jnp.argmax(mask, axis=-1).astype(jnp.int32)
    return jnp.where(mask.any(axis=-1), first_key + 1, 0)


def block_sizes(length: int) -> splash.BlockSizes:
    """The largest tile of at most 512 that divides `length` (a multiple of 128), for every
    kernel (forward, dq, dkv), as MaxText's defaults do."""
    block = next(b for b in range(_MAX_BLOCK, 0, -_LANES) if length % b == 0)
    return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                             block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                             block_q_dq=block, block_kv_dq=block)


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, length: int, interpret: bool, window: int | None = None):
    # No static mask (FullMask), or a band of +-window (LocalMask): the segment ids do the rest.
    # The kernel skips the blocks a band leaves empty.
    one = (splash.FullMask((length, length)) if window is None
           else splash.LocalMask((length, length), window_size=(window, window), offset=0))
    mask = splash.MultiHeadMask([one] * heads)
    # Its block tables (jnp arrays) are made concrete, not traced: the kernel outlives the trace
    # it was first built in (this cache), and they are constants of every program that uses it.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha_single_device(mask, block_sizes=block_sizes(length), interpret=interpret)


def splash_attention(q, k, v, segments, *, window: int | None = None):
    """The splash kernel over q, k, v [batch, heads, length, head_dim] with int segment ids
    [batch, length] (and a sliding `window`, as `attend`'s); inside shard_map when the mesh has
    more than one device."""
    length = q.shape[2]
    padded = -(-length // _LANES) * _LANES
    if padded != length:  # tiles are multiples of 128: extra keys go to segment 0 (padding)
        pad = lambda t: jnp.pad(t, [(0, 0), (0, 0), (0, padded - length), (0, 0)])
        q, k, v = pad(q), pad(k), pad(v)
        segments = jnp.pad(segments, [(0, 0), (0, padded - length)])
    interpret = _interpret

    def per_device(q, k, v, segments):
        kernel = _kernel(q.shape[1], q.shape[2], interpret, window)
        return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s)))(
            q, k, v, segments)

    mesh = compile_target(q, k, v).mesh
    if mesh is not None and mesh.size > 1:
        batch_axes = _dividing_axes(mesh, BATCH_MESH_AXES, q.shape[0])
        heads_axes = _dividing_axes(mesh, (HEADS_MESH_AXIS,), q.shape[1])
        qkv_spec, segment_spec = P(batch_axes, heads_axes), P(batch_axes)
        # check_vma=False: pallas_call does not declare how its outputs vary over the mesh.
        per_device = jax.shard_map(per_device, mesh=mesh, in_specs=(qkv_spec,) * 3 + (segment_spec,),
                                   out_specs=qkv_spec, check_vma=False)
    context = per_device(q, k, v, segments)
    return context[:, :, :length] if padded != length else context


def batch_axes_dividing(mesh, dim: int):
    """The mesh's batch axes a batch of `dim` rows is split over (None: replicated)."""
    return _dividing_axes(mesh, BATCH_MESH_AXES, dim)


def _dividing_axes(mesh, candidates, dim: int):
    """The mesh axes among `candidates` (size > 1) to split a dimension of size `dim` over, or
    None (replicated) when their product does not divide it: as nli_jax.train.mesh does."""
    axes = tuple(a for a in candidates if a in mesh.axis_names and mesh.shape[a] > 1)
    if not axes or dim % math.prod(mesh.shape[a] for a in axes):
        return None
    return axes if len(axes) > 1 else axes[0]
