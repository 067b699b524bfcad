"""BERT / ALBERT / XLM-R encoders in Flax NNX.

One `Encoder` covers the three families; the differences are all in `EncoderConfig`:
ALBERT factorises the embeddings (E -> H projection) and shares layers across depth,
XLM-R/RoBERTa numbers positions from pad_token_id + 1.

Every parameter carries logical axis names (vocab, embed, heads, kv, mlp, ...) as metadata;
`nli_jax.train` maps them to mesh axes with rules, so model code never mentions the mesh.
Parameters are float32; activations use `config.dtype`; softmax and LayerNorm statistics are
computed in float32.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nli_jax.models import attention, families
from nli_jax.models.config import EncoderConfig

# Logical axis names used on parameters. Activations use "batch" and "length" as well.
VOCAB, EMBED, HIDDEN, HEADS, KV, MLP, POSITION, TYPE, NORM = (
    "vocab", "embed", "hidden", "heads", "kv", "mlp", "position", "token_type", "norm")


def partitioned(init, *axes):
    """An initializer whose parameter carries logical axis names.

    eager_sharding=False: the names are metadata only; the trainer shards by its rules.
    """
    return nnx.with_partitioning(init, axes, eager_sharding=False)


def normal(config: EncoderConfig):
    return nnx.initializers.normal(stddev=config.initializer_range)


def padding_row_zeroed(init, row: int):
    """`init` with row `row` of the table zeroed: transformers' nn.Embedding(padding_idx=row) as
    its `_init_weights` leaves it (BERT, ALBERT, RoBERTa, ELECTRA, DeBERTa word tables; RoBERTa's
    positions). The row's input gradient is zero either way (padding is masked out as a key and
    its outputs are not scored); only the starting value differed (tests/test_initialisation.py)."""
    def initialise(key, shape, dtype=jnp.float32):
        table = init(key, shape, dtype)
        if not 0 <= row < shape[0]:
            return table
        keep = np.ones((shape[0],) + (1,) * (len(shape) - 1), np.float32)
        keep[row] = 0.0
        return table * jnp.asarray(keep, table.dtype)
    return initialise


def activation(name: str):
    if name == "gelu":
        return functools.partial(jax.nn.gelu, approximate=False)
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return functools.partial(jax.nn.gelu, approximate=True)
    return {"relu": jax.nn.relu, "silu": jax.nn.silu, "swish": jax.nn.silu, "tanh": jnp.tanh}[name]


def dense(config: EncoderConfig, din: int, dout: int, axes: tuple[str, str], *, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        din, dout, dtype=config.compute_dtype, param_dtype=jnp.float32,
        kernel_init=partitioned(normal(config), *axes), bias_init=partitioned(nnx.initializers.zeros, axes[1]),
        rngs=rngs)


def layer_norm(config: EncoderConfig, dim: int, axis: str, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # LayerNorm in float32: bf16 statistics lose too much precision.
    return nnx.LayerNorm(
        dim, epsilon=config.layer_norm_eps, dtype=jnp.float32, param_dtype=jnp.float32,
        scale_init=partitioned(nnx.initializers.ones, axis), bias_init=partitioned(nnx.initializers.zeros, axis),
        rngs=rngs)


def make_rngs(seed: int) -> nnx.Rngs:
    """Rngs for building and training a model: threefry for parameter init, and an "rbg" key
    (XLA's RngBitGenerator) for dropout, whose threefry bits cost ~20% of a BERT-base training
    step on CPU. rbg streams are deterministic for a given backend, so resumes stay exact. The
    train step reseeds the "dropout" stream every step (nli_jax.train.steps)."""
    return nnx.Rngs(params=seed, dropout=jax.random.key(seed, impl="rbg"))


_BITS = 16  # random bits per dropout decision: two decisions per 32-bit draw


class Dropout(nnx.Dropout):
    """nnx.Dropout whose masks take 16 random bits per element, compared as integers.

    nnx.Dropout draws a 32-bit word per element and turns it into a float uniform; on XLA:CPU
    that generator and conversion were a quarter of a MiniLM training step (jax.profiler:
    `rng_bit_generator` plus the bits-to-float fusion, 1.4 s of 4.6 s of op time at 32 x 128).
    Splitting each word into two 16-bit halves halves the generator's work and drops the
    conversion. An element is dropped with probability round(rate * 65536) / 65536 (0.1 ->
    0.100006) and kept ones are scaled by the inverse of the exact keep probability, so the
    expectation is preserved. Same "dropout" stream, reseeded by the train step as before.
    """

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None):
        deterministic = self.deterministic if deterministic is None else deterministic
        threshold = int(round(self.rate * (1 << _BITS)))
        if deterministic is None or self.broadcast_dims or not inputs.shape or not 0 < threshold < (1 << _BITS):
            # nnx's own: its error for a missing `deterministic`, broadcast masks, scalars, and
            # rates that 16 bits cannot tell from 0 or 1.
            return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
        if self.rate == 0.0 or deterministic:
            return inputs
        stream = rngs if rngs is not None else self.rngs
        if isinstance(stream, nnx.Rngs):
            key = stream[self.rng_collection]()
        elif isinstance(stream, nnx.RngStream):
            key = stream()
        else:
            key = stream
        keep_prob = 1.0 - threshold / (1 << _BITS)
        *lead, last = inputs.shape
        # Words over the leading dims and half the last: a batch-sharded input keeps its layout.
        words = jax.random.bits(key, (*lead, (last + 1) // 2), jnp.uint32)
        halves = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(*lead, 2 * ((last + 1) // 2))[..., :last]
        keep = halves >= jnp.uint16(threshold)
        return jax.lax.select(keep, inputs / jnp.asarray(keep_prob, inputs.dtype), jnp.zeros_like(inputs))


# Tables of at most this many rows (token types) are read by a one-hot contraction.
ONE_HOT_MAX_ROWS = 16


class Embed(nnx.Embed):
    """nnx.Embed that reads rows from the float32 table and casts them to the compute dtype, as
    torch.autocast leaves embeddings in float32, so that the gradient's scatter-add accumulates in
    float32. nnx.Embed casts the table first: its gradient is a bfloat16 scatter-add, which loses
    the sum's precision and which XLA emits on GPUs as a compare-and-swap loop (BERT-base MLM,
    64 x 128 on an H200: 96 of a 106 ms step, 79 of them the token-type table's 8,192 rows into 2).
    Tables of at most ONE_HOT_MAX_ROWS rows are read by a one-hot contraction, whose gradient is a
    matmul, not a scatter; values are the table's exactly either way."""

    def __call__(self, inputs, out_sharding=None):
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        table = self.embedding[...]
        if self.num_embeddings <= ONE_HOT_MAX_ROWS:
            one_hot = jax.nn.one_hot(inputs, self.num_embeddings, dtype=table.dtype)
            rows = jnp.einsum("...v,ve->...e", one_hot, table, precision=jax.lax.Precision.HIGHEST)
        else:
            rows = jnp.take(table, inputs, axis=0)
        return rows.astype(self.dtype) if self.dtype is not None else rows


class Embeddings(nnx.Module):
    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        e = config.embed_dim
        def emb(n, axes, init=normal(config)):
            return Embed(n, e, dtype=config.compute_dtype, param_dtype=jnp.float32,
                             embedding_init=partitioned(init, *axes), rngs=rngs)
        self.word = emb(config.vocab_size, (VOCAB, EMBED), padding_row_zeroed(normal(config), config.pad_token_id))
        self.position = emb(config.max_position_embeddings, (POSITION, EMBED),
                            padding_row_zeroed(normal(config), config.pad_token_id) if config.positions_after_padding
                            else normal(config))
        self.token_type = emb(config.type_vocab_size, (TYPE, EMBED))
        self.norm = layer_norm(config, e, EMBED, rngs=rngs)
        self.dropout = Dropout(config.hidden_dropout_prob, rngs=rngs)

    def position_ids(self, input_ids, packing=None):
        c = self.config
        if packing is not None:  # packed rows: positions restart at each example
            positions, segments = packing["position_ids"], packing["segment_ids"]
            return jnp.where(segments > 0, positions + c.position_offset, c.pad_token_id) if c.positions_after_padding else positions
        if c.positions_after_padding:
            # As Hugging Face's create_position_ids_from_input_ids: padding tokens keep the
            # padding index, real tokens count up from pad_token_id + 1.
            not_pad = (input_ids != c.pad_token_id).astype(jnp.int32)
            return jnp.cumsum(not_pad, axis=1) * not_pad + c.pad_token_id
        return jnp.broadcast_to(jnp.arange(input_ids.shape[1])[None, :], input_ids.shape)

    def __call__(self, input_ids, token_type_ids, *, deterministic: bool, packing=None):
        if input_ids.shape[1] + self.config.position_offset > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings} (offset {self.config.position_offset})")
        x = self.word(input_ids) + self.position(self.position_ids(input_ids, packing)) + self.token_type(token_type_ids)
        x = self.norm(x.astype(jnp.float32)).astype(self.config.compute_dtype)
        return self.dropout(x, deterministic=deterministic)


class SelfAttention(nnx.Module):
    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        h, n, d = config.hidden_size, config.num_attention_heads, config.head_dim
        proj = lambda: nnx.LinearGeneral(
            h, (n, d), dtype=config.compute_dtype, param_dtype=jnp.float32,
            kernel_init=partitioned(normal(config), EMBED, HEADS, KV),
            bias_init=partitioned(nnx.initializers.zeros, HEADS, KV), rngs=rngs)
        self.query, self.key, self.value = proj(), proj(), proj()
        self.output = nnx.LinearGeneral(
            (n, d), h, axis=(-2, -1), dtype=config.compute_dtype, param_dtype=jnp.float32,
            kernel_init=partitioned(normal(config), HEADS, KV, EMBED),
            bias_init=partitioned(nnx.initializers.zeros, EMBED), rngs=rngs)
        self.attention_dropout = Dropout(config.attention_probs_dropout_prob, rngs=rngs)

    def __call__(self, x, attention_mask, *, deterministic: bool):
        # Head-major [batch, heads, length, kv] operands make both attention products plain
        # batched matmuls (batch dims leading, contraction minor). The "bqhd,bkhd->bhqk" einsum
        # made XLA:CPU transpose inside each product and ran attention at half PyTorch's speed
        # (benchmarks/encoder_vs_torch.py); on accelerators the three transposes are cheap.
        q, k, v = (jnp.swapaxes(p(x), 1, 2) for p in (self.query, self.key, self.value))
        q = q * jnp.asarray(1.0 / np.sqrt(self.config.head_dim), q.dtype)
        # The mask is [b, k] (padding), or [b, q, k] for packed rows (each query sees its own
        # example's keys only); nli_jax.models.attention.attend says how each path reads it.
        dropout_active = not deterministic and self.attention_dropout.rate > 0  # rate 0: the identity
        probs_dropout = functools.partial(self.attention_dropout, deterministic=False) if dropout_active else None
        implementation = attention.choose(self.config.attention, q, dropout_active=dropout_active)
        rows = _cache_sized_rows(q.shape, like=q) if deterministic and implementation == "plain" else 0
        if rows:
            # Evaluation on one CPU device: a few batch rows at a time, so each [rows, heads, q, k]
            # block of scores stays in cache (2.4x faster at 32 x 512). Not in training: the
            # map's backward pass is slower than the batched one.
            split = lambda t: t.reshape(t.shape[0] // rows, rows, *t.shape[1:])
            context = jax.lax.map(lambda a: attention.attend(*a, implementation="plain"),
                                  (split(q), split(k), split(v), split(attention_mask)))
            context = context.reshape(q.shape)
        else:
            context = attention.attend(q, k, v, attention_mask, implementation=implementation,
                                       probs_dropout=probs_dropout)
        return self.output(jnp.swapaxes(context, 1, 2))  # [b, q, h, kv]


_SCORES_BLOCK_BYTES = 4 << 20  # about a core's L2 plus a share of L3 on the CPUs we measured


def _cache_sized_rows(shape, like=None) -> int:
    """Batch rows per attention block for cache-friendly evaluation on a single CPU device, or 0
    (one batched product) elsewhere: accelerators, sharded batches, blocks that fit anyway. The
    target is that of `like` (its mesh, or the mesh in context), not jax.default_backend(),
    which is "cpu" while a CPU host compiles for TPUs."""
    target = attention.compile_target(*(() if like is None else (like,)))
    if target.platform != "cpu" or target.device_count != 1:
        return 0
    batch, heads, length, _ = shape
    per_row = heads * length * length * 4
    if batch * per_row <= _SCORES_BLOCK_BYTES:
        return 0
    target = max(1, _SCORES_BLOCK_BYTES // per_row)
    return max(r for r in range(1, min(batch, target) + 1) if batch % r == 0)


class TransformerLayer(nnx.Module):
    """Post-LayerNorm transformer layer (BERT and ALBERT share this shape; DeBERTa's is this with
    its own `attention_class`, whose second argument is whatever the encoder passes its layers)."""
    attention_class = SelfAttention

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.attention = self.attention_class(config, rngs=rngs)
        self.attention_norm = layer_norm(config, config.hidden_size, EMBED, rngs=rngs)
        self.mlp_in = dense(config, config.hidden_size, config.intermediate_size, (EMBED, MLP), rngs=rngs)
        self.mlp_out = dense(config, config.intermediate_size, config.hidden_size, (MLP, EMBED), rngs=rngs)
        self.mlp_norm = layer_norm(config, config.hidden_size, EMBED, rngs=rngs)
        self.dropout = Dropout(config.hidden_dropout_prob, rngs=rngs)
        self.act = activation(config.hidden_act)

    def __call__(self, x, attention_mask, deterministic: bool):
        dtype = self.config.compute_dtype
        x = batch_sharded(x)
        attn = batch_sharded(self.attention(x, attention_mask, deterministic=deterministic))
        attn = self.dropout(attn, deterministic=deterministic)
        x = self.attention_norm((attn + x).astype(jnp.float32)).astype(dtype)
        y = batch_sharded(self.mlp_out(self.act(self.mlp_in(x))))
        y = self.dropout(y, deterministic=deterministic)
        return batch_sharded(self.mlp_norm((y + x).astype(jnp.float32)).astype(dtype))


def batch_sharded(x):
    """Hidden states [batch, length, hidden] split over the mesh's batch axes only, when compiled
    over a mesh (else unchanged). With FSDP the weights' hidden ("embed") dimension is split over
    the fsdp axis, and XLA, left to choose, split the activations' hidden dimension too and moved
    them at every layer: a 4 x 256 BERT's step on a v4-8 with fsdp:4 held 2.11 GiB of temporaries
    with 57 all-reduces and 56 all-to-alls, against 0.61 GiB data-parallel (launch.compile)."""
    mesh = attention.compile_target(x).mesh
    if mesh is None or mesh.size == 1:
        return x
    axes = attention.batch_axes_dividing(mesh, x.shape[0])
    spec = jax.sharding.PartitionSpec(axes, *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))


def _run_layer(layer: TransformerLayer, x, attention_mask, deterministic: bool):
    return layer(x, attention_mask, deterministic)


_run_layer_remat = nnx.remat(_run_layer, static_argnums=(3,))

# model.remat policies that save some intermediates (jax.checkpoint_policies); "full" saves none.
_SAVED = {"dots_saveable": jax.checkpoint_policies.dots_saveable,
          "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


@functools.cache
def layer_runner(policy: str, scanned: bool):
    """_run_layer under `policy` (config.remat, one of nli_jax.plan.REMAT_POLICIES), in a Python
    loop or as a scan's body. A scan's loop boundary already keeps XLA from merging the recomputation
    with the forward pass, so prevent_cse (extra barriers) is off there, as jax.checkpoint advises."""
    if policy == "none":
        return _run_layer
    if policy == "full" and not scanned:
        return _run_layer_remat  # what remat=True has always run
    return nnx.remat(_run_layer, static_argnums=(3,), policy=_SAVED.get(policy), prevent_cse=not scanned)


# Scanned layers (config.scans_layers): Params carry a leading axis with this logical name (mapped to
# no mesh axis by the rules); the "dropout" stream of each layer's Dropouts keeps a scalar key,
# reseeded by the train step like any other, and is split across the layers at each training call.
LAYERS = "layers"
_SCAN_TRAINING = nnx.StateAxes({(nnx.Param, "dropout"): 0, ...: None})
_SCAN_DETERMINISTIC = nnx.StateAxes({nnx.Param: 0, ...: None})


def stacked_layers(config: EncoderConfig, rngs: nnx.Rngs, layer=None) -> nnx.Module:
    """One `layer` (a class built as layer(config, rngs=...); TransformerLayer by default) whose
    parameters are num_hidden_layers layers' stacked, each drawn from its own split of the
    "params" stream."""
    layer = layer or TransformerLayer

    @nnx.split_rngs(splits=config.num_hidden_layers, only="params")
    @nnx.vmap(in_axes=(nnx.StateAxes({"params": 0, ...: None}),), out_axes=nnx.StateAxes({nnx.Param: 0, ...: None}),
              transform_metadata={nnx.PARTITION_NAME: LAYERS})
    def create(rngs):
        return layer(config, rngs=rngs)
    return create(rngs)


def scan_layers(layers: nnx.Module, x, attention_mask, deterministic: bool, config: EncoderConfig):
    """x through stacked `layers` (stacked_layers) as one nnx.scan. `attention_mask` is whatever
    every layer takes besides x (the same for each layer: any pytree), passed to layer(x,
    attention_mask, deterministic)."""
    run = layer_runner(config.remat, True)

    def body(layer, x, attention_mask):
        return run(layer, x, attention_mask, deterministic)

    if deterministic:  # no dropout: the RNG streams stay as they are and evaluation programs split nothing
        body = nnx.scan(body, in_axes=(_SCAN_DETERMINISTIC, nnx.Carry, None), out_axes=nnx.Carry,
                        transform_metadata={nnx.PARTITION_NAME: LAYERS})
    else:
        # Each layer draws its masks from its own split of every "dropout" key (other masks per
        # layer); the split advances the stream, so successive calls differ as in the loop.
        body = nnx.split_rngs(splits=config.num_hidden_layers, only="dropout")(
            nnx.scan(body, in_axes=(_SCAN_TRAINING, nnx.Carry, None), out_axes=nnx.Carry,
                     transform_metadata={nnx.PARTITION_NAME: LAYERS}))
    return body(layers, x, attention_mask)


def first_tokens(x, packing=None):
    """Each example's first-token ([CLS] / <s>) hidden state: x[:, 0], or for packed rows
    (nli_jax.data.pipeline.Batching.pack) the token at each example's `cls_index` in its group's
    rows flattened: [examples, hidden] in example order either way."""
    if packing is None:
        return x[:, 0]
    cls_index = packing["cls_index"]  # [groups, examples per group]
    grouped = x.reshape(cls_index.shape[0], -1, x.shape[-1])
    return jnp.take_along_axis(grouped, cls_index[:, :, None], axis=1).reshape(-1, x.shape[-1])


def example_tokens(x, cls_index, length: int):
    """[examples, length, ...]: each example's first `length` token outputs, read from packed rows
    (x [rows, row length, ...]; cls_index [groups, examples per group] as in first_tokens), in
    example order: the padded layout. Positions past an example's end hold its row's next tokens
    (or the group's last one); the caller masks them, as it masks padding."""
    groups = cls_index.shape[0]
    grouped = x.reshape(groups, -1, *x.shape[2:])
    index = jnp.minimum(cls_index[:, :, None] + jnp.arange(length)[None, None, :], grouped.shape[1] - 1)
    picked = grouped[jnp.arange(groups)[:, None], index.reshape(groups, -1)]  # [groups, examples x length, ...]
    return picked.reshape(-1, length, *x.shape[2:])


class Encoder(nnx.Module):
    """Embeddings + transformer stack (+ optional pooler). Returns (hidden_states, pooled).

    `packing` ({segment_ids, position_ids, cls_index} of nli_jax.data.pipeline.Batching.pack):
    rows hold several examples; attention stays inside each, positions restart at each, and
    `pooled` has one row per example rather than per row."""

    def __init__(self, config: EncoderConfig, *, add_pooler: bool = True, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = Embeddings(config, rngs=rngs)
        if config.embed_dim != config.hidden_size:
            self.embedding_projection = dense(config, config.embed_dim, config.hidden_size, (EMBED, HIDDEN), rngs=rngs)
        else:
            self.embedding_projection = None
        if config.scans_layers:
            self.layers = stacked_layers(config, rngs)
        else:
            self.layers = nnx.List([TransformerLayer(config, rngs=rngs) for _ in range(config.num_unique_layers)])
        self.schedule = config.layer_schedule()
        self.pooler = dense(config, config.hidden_size, config.hidden_size, (EMBED, HIDDEN), rngs=rngs) if add_pooler else None

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 packing=None):
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids, dtype=bool)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        attention_mask = attention_mask.astype(bool)
        if packing is not None:  # [rows, q, k]: each token attends to its own example's tokens
            segments = packing["segment_ids"]
            attention_mask = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
        x = self.embeddings(input_ids, token_type_ids, deterministic=deterministic, packing=packing)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)
        if self.config.scans_layers:
            x = scan_layers(self.layers, x, attention_mask, deterministic, self.config)
        else:
            run = layer_runner(self.config.remat, False)
            for index in self.schedule:
                x = run(self.layers[index], x, attention_mask, deterministic)
        pooled = jnp.tanh(self.pooler(first_tokens(x, packing))) if self.pooler is not None else None
        return x, pooled

    def attention_flops_per_token(self, sequence_length: int) -> float:
        """Training FLOPs per token of attention's scores and context (forward and backward)."""
        return 12 * self.config.num_hidden_layers * self.config.hidden_size * sequence_length


# --- scanned <-> per-layer parameters ---------------------------------------------------------
# The one place that knows how a scanned encoder's stacked parameters correspond to a loop's
# per-layer ones: {path: value} flat mappings (nnx.to_flat_state paths), where a loop's layer i
# is (..., "layers", i, *rest) and a scan's stacked array is (..., "layers", *rest) with layer i at
# [i]. Hugging Face import/export (nli_jax.models.pretrained) and tests convert through these.

def _stacked_position(path) -> int | None:
    """Index of "layers" in a stacked parameter's path ("layers" followed by a name, not an index)."""
    for i, part in enumerate(path[:-1]):
        if part == LAYERS and isinstance(path[i + 1], str):
            return i
    return None


def unstack_layers(flat: dict) -> dict:
    """Stacked layer parameters -> one entry per layer (value[i]; ShapeDtypeStructs lose the
    leading axis). Everything else, and a loop's per-layer paths, pass through."""
    out = {}
    for path, value in flat.items():
        at = _stacked_position(path)
        if at is None:
            out[path] = value
            continue
        for i in range(value.shape[0]):
            layer = (jax.ShapeDtypeStruct(value.shape[1:], value.dtype) if isinstance(value, jax.ShapeDtypeStruct)
                     else value[i])
            out[(*path[:at + 1], i, *path[at + 1:])] = layer
    return out


def stack_layers(flat: dict) -> dict:
    """Per-layer parameters (..., "layers", i, *rest) -> one array per (..., "layers", *rest), the
    layers stacked in index order along a new leading axis. Everything else passes through."""
    out, groups = {}, {}
    for path, value in flat.items():
        at = next((i for i, part in enumerate(path[:-1]) if part == LAYERS and isinstance(path[i + 1], int)), None)
        if at is None:
            out[path] = value
        else:
            groups.setdefault((*path[:at + 1], *path[at + 2:]), {})[path[at + 1]] = value
    for path, layers in groups.items():
        if sorted(layers) != list(range(len(layers))):
            raise ValueError(f"{'.'.join(map(str, path))}: layers {sorted(layers)} are not 0..{len(layers) - 1}")
        values = [layers[i] for i in range(len(layers))]
        if all(isinstance(v, jax.ShapeDtypeStruct) for v in values):
            out[path] = jax.ShapeDtypeStruct((len(values), *values[0].shape), values[0].dtype)
        else:
            out[path] = jnp.stack([jnp.asarray(v) for v in values])
    return out


def training_flops_per_token(model: nnx.Module, sequence_length: int) -> float:
    """Training FLOPs per token (forward and backward) of every encoder `model` holds (ELECTRA's
    generator and discriminator; shared embeddings once): 6 x the parameters a token passes
    through outside the embedding tables (an ALBERT layer shared across depth counted at every
    depth it runs), plus each encoder's attention_flops_per_token (BERT's: 12 x layers x hidden x
    length, scores and context, forward and backward), the count behind the papers' MFU
    figures. Works on abstract models. Encoders: every family's (nli_jax.models.families)."""
    def size(module) -> int:
        return sum(x.size for _, x in nnx.to_flat_state(nnx.state(module, nnx.Param)))
    modules = [node for _, node in nnx.iter_graph(model)]  # each shared module once
    encoders = [m for m in modules if isinstance(m, families.encoder_classes())]
    # ELECTRA's generator and discriminator hold one Embeddings module: counted once.
    embedding_params = sum(size(e) for e in {id(m.embeddings): m.embeddings for m in encoders}.values())
    layer_params = sum(size(m.layers) for m in encoders)
    # A scanned stack runs each of its stacked layers once; a loop runs layers[index] per depth.
    applied_layer_params = sum(size(m.layers) if m.config.scans_layers else
                               sum(size(m.layers[index]) for index in m.schedule) for m in encoders)
    attention = sum(m.attention_flops_per_token(sequence_length) for m in encoders)
    outside = size(model) - embedding_params - layer_params
    return 6 * (outside + applied_layer_params) + attention
