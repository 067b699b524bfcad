"""DeBERTa-v2 and -v3 (He et al., 2021, 2023): the model family of config.json model_type
"deberta-v2" (DeBERTa-v3 and mDeBERTa-v3 checkpoints say it too), registered with
nli_jax.models.families. Everything that differs from BERT is here:

- embeddings: words, plus absolute positions only with position_biased_input (v3: none), plus
  token types only when type_vocab_size > 0 (v3: none, token_type_ids are ignored), projected
  to hidden_size without bias when embedding_size differs, LayerNorm, zeroed at padding;
- disentangled attention: content-to-content plus, as pos_att_type lists them,
  content-to-position (c2p: each query against the key of its relative position to each key)
  and position-to-content (p2c: each key against the query of the same relative position), all
  divided by sqrt(head_dim x (1 + their number)). Relative positions q - k are bucketed
  logarithmically beyond position_buckets / 2 up to max_relative_positions (-1: as
  max_position_embeddings), then clipped to the span (position_buckets, else
  max_relative_positions): one table of 2 x span relative embeddings for all layers
  (LayerNormed when norm_rel_ebd is "layer_norm"), projected in each layer by its own key and
  query projections (share_att_key) or by pos_key_proj / pos_query_proj;
- c2p and p2c are computed per distance (every query or key against the projections of the
  2 x length - 1 distances' rows, a matmul) and laid out per (query, key) pair by `skew`
  (reshapes and slices, Transformer-XL's relative shift) rather than gathered per pair: on a
  TPU the gather and its scatter-add gradient made mDeBERTa-v3-base's train step ~8x BERT-base's
  (the compiler's estimates, docs/tpu_compile.md);
- packed rows (nli_jax.tasks.common.packing_fields) use the row's distances: between two tokens
  of one example they equal those of the example's position_ids (a distance does not depend on
  where the example starts in its row), and the mask drops pairs of two examples, so packed and
  padded rows give the same outputs (tests/test_deberta.py);
- a convolution after the first layer when conv_kernel_size > 0 (DeBERTa-v2-xlarge's
  conv_kernel_size 3); in packed rows a token's window sees its own example only;
- the ContextPooler (dropout pooler_dropout, dense, pooler_hidden_act on the first token) as the
  encoder's pooler, which DebertaV2ForSequenceClassification holds outside its base model
  ("pooler.dense.*"), then dropout cls_dropout (or hidden_dropout_prob) and the classifier;
- the MLM head of DebertaV2ForMaskedLM: with legacy (transformers' default) cls.predictions.*
  (dense to embedding_size, act, LayerNorm, decoder tied to the word embeddings, bias), without
  it lm_predictions.lm_head.* (the same computation at hidden_size), the names the original
  DeBERTa checkpoints use.

mDeBERTa-v3-base's published config.json (hidden 768, 12 layers x 12 heads, intermediate 3072,
vocab_size 251000, max_position_embeddings 512, relative_attention, position_buckets 256,
max_relative_positions -1, norm_rel_ebd "layer_norm", share_att_key, pos_att_type p2c|c2p,
position_biased_input false, type_vocab_size 0, layer_norm_eps 1e-7) needs: log buckets of 256
over positions up to 512, c2p and p2c through the layers' own query and key projections (no
pos_*_proj weights), a LayerNorm on the relative table, no absolute positions or token types,
and its SentencePiece tokenizer (spm.model: nli_jax.checkpoints.load_tokenizer). It has no
`legacy` key, so its MLM head is read under the legacy names, as transformers does: its
lm_predictions.lm_head.* weights are then unused and that head starts afresh (config.json
"legacy": false reads them). tests/test_deberta.py checks the config at 2 of its 12 layers.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from nli_jax.checkpoints import hf
from nli_jax.models import attention, families
from nli_jax.models.config import ACTIVATIONS, ConfigError, EncoderConfig, hf_common, hf_fields
from nli_jax.models.encoder import (EMBED, HEADS, HIDDEN, KV, POSITION, TYPE, VOCAB, Dropout, Embed, TransformerLayer,
                                    activation, batch_sharded, dense, first_tokens, layer_norm, layer_runner, normal,
                                    padding_row_zeroed, partitioned, scan_layers, stacked_layers)

MODEL_TYPE = "deberta-v2"
POSITION_ATTENTION = ("c2p", "p2c")


@dataclasses.dataclass(frozen=True)
class DebertaOptions:
    """The config.json fields only DeBERTa has, as transformers' DebertaV2Config reads them
    (EncoderConfig.family_options)."""
    relative_attention: bool = False
    max_relative_positions: int = -1  # < 1: max_position_embeddings
    position_buckets: int = -1  # <= 0: no bucketing
    pos_att_type: tuple[str, ...] = ()
    share_att_key: bool = False
    norm_rel_ebd: str = "none"  # "layer_norm" or "none"
    position_biased_input: bool = True
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    legacy: bool = True  # the MLM head's names (transformers' LegacyDebertaV2OnlyMLMHead)

    def __post_init__(self):
        kinds = tuple(self.pos_att_type)
        object.__setattr__(self, "pos_att_type", kinds)
        unknown = [k for k in kinds if k not in POSITION_ATTENTION]
        if unknown:
            raise ConfigError(f"config.json pos_att_type {list(kinds)}: {unknown} not supported; "
                              f"DeBERTa-v2 attends with {list(POSITION_ATTENTION)}")
        if self.norm_rel_ebd not in ("none", "layer_norm"):
            raise ConfigError(f"config.json norm_rel_ebd {self.norm_rel_ebd!r}: expected 'layer_norm' or 'none'")
        for key in ("conv_act", "pooler_hidden_act"):
            if getattr(self, key) not in ACTIVATIONS:
                raise ConfigError(f"config.json {key} {getattr(self, key)!r}: expected one of {ACTIVATIONS}")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
            # transformers pads (k - 1) // 2 on each side: an even window shortens the sequence.
            raise ConfigError(f"config.json conv_kernel_size {self.conv_kernel_size}: expected 0 (no convolution) "
                              "or an odd window")

    def span(self, config: EncoderConfig) -> int:
        """Relative positions reach -span..span - 1 of the table (its rows are 2 x span)."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative(config)

    def max_relative(self, config: EncoderConfig) -> int:
        return self.max_relative_positions if self.max_relative_positions >= 1 else config.max_position_embeddings

    @property
    def rel_layer_norm(self) -> bool:
        return self.norm_rel_ebd == "layer_norm"


def options(config: EncoderConfig) -> DebertaOptions:
    """The config's DebertaOptions; without any, DebertaV2Config's defaults (no relative attention)."""
    o = config.family_options
    if o is None:
        return DebertaOptions()
    if not isinstance(o, DebertaOptions):
        raise ConfigError(f"a {MODEL_TYPE} EncoderConfig's family_options must be DebertaOptions, "
                          f"not {type(o).__name__}")
    return o


# --- relative positions --------------------------------------------------------------------

def log_bucket_position(relative: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
    """transformers' make_log_bucket_position in float32 as PyTorch computes it (ceil of a
    float32 log ratio): distances below bucket_size / 2 stay, farther ones share log-spaced
    buckets up to max_position."""
    sign = np.sign(relative)
    mid = bucket_size // 2
    abs_pos = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
    ratio = np.log(abs_pos.astype(np.float32) / np.float32(mid)) / np.log(np.float32((max_position - 1) / mid))
    log_pos = np.ceil(ratio * np.float32(mid - 1)) + np.float32(mid)
    return np.where(abs_pos <= mid, relative, (log_pos * sign)).astype(np.int64)


@functools.lru_cache(maxsize=64)
def relative_index_table(span: int, buckets: int, max_position: int, length: int) -> tuple[np.ndarray, int]:
    """(rows, first): for every distance d = q - k in -(length - 1)..length - 1, at [d + length - 1],
    the row of the relative-embedding table that c2p and p2c read (bucketed, shifted by span,
    clipped to 0..2 span - 1), counted from `first`, the first row any distance reaches."""
    distance = np.arange(-(length - 1), length, dtype=np.int64)
    if buckets > 0 and max_position > 0:
        distance = log_bucket_position(distance, buckets, max_position)
    rows = np.clip(distance + span, 0, 2 * span - 1)
    first = int(rows.min())
    return (rows - first).astype(np.int32), first


def relative_rows(config: EncoderConfig, length: int) -> tuple[np.ndarray, int, int]:
    """(rows, first, count): the table row (from `first`; `count` rows are reached) of each
    distance -(length - 1)..length - 1, as relative_index_table."""
    o = options(config)
    rows, first = relative_index_table(o.span(config), o.position_buckets, o.max_relative(config), length)
    return rows, first, int(rows.max()) + 1


def skew(x):
    """out[..., i, j] = x[..., i, j + n - 1 - i] for x [..., n, 2n - 1] (column c of row i holding
    distance c - (n - 1), or its reverse): per-distance scores laid out per (query, key) pair by
    reshapes and slices, where a gather (and its scatter-add gradient) dominated a TPU step
    (Transformer-XL's relative shift)."""
    n = x.shape[-2]
    if n == 1:
        return x
    flat = x.reshape(*x.shape[:-2], n * (2 * n - 1))
    return flat[..., n - 1:n - 1 + n * (2 * n - 2)].reshape(*x.shape[:-2], n, 2 * n - 2)[..., :n]


# --- modules -------------------------------------------------------------------------------

class DebertaEmbeddings(nnx.Module):
    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        o = options(config)
        self.config = config
        e = config.embed_dim
        def emb(n, axes, init=normal(config)):
            return Embed(n, e, dtype=config.compute_dtype, param_dtype=jnp.float32,
                             embedding_init=partitioned(init, *axes), rngs=rngs)
        self.word = emb(config.vocab_size, (VOCAB, EMBED), padding_row_zeroed(normal(config), config.pad_token_id))
        self.position = emb(config.max_position_embeddings, (POSITION, EMBED)) if o.position_biased_input else None
        self.token_type = emb(config.type_vocab_size, (TYPE, EMBED)) if config.type_vocab_size > 0 else None
        self.projection = nnx.Linear(
            e, config.hidden_size, use_bias=False, dtype=config.compute_dtype, param_dtype=jnp.float32,
            kernel_init=partitioned(normal(config), EMBED, HIDDEN), rngs=rngs) if e != config.hidden_size else None
        self.norm = layer_norm(config, config.hidden_size, EMBED, rngs=rngs)
        self.dropout = Dropout(config.hidden_dropout_prob, rngs=rngs)

    def __call__(self, input_ids, token_type_ids, token_mask, position_ids, *, deterministic: bool):
        x = self.word(input_ids)
        if self.position is not None:
            if input_ids.shape[1] > self.config.max_position_embeddings:
                raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                                 f"{self.config.max_position_embeddings}")
            x = x + self.position(position_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids)
        if self.projection is not None:
            x = self.projection(x)
        x = self.norm(x.astype(jnp.float32)).astype(self.config.compute_dtype)
        x = x * token_mask[..., None].astype(x.dtype)  # padding rows are zeros, as in transformers
        return self.dropout(x, deterministic=deterministic)


class DisentangledSelfAttention(nnx.Module):
    """Content-to-content attention plus DeBERTa's c2p and p2c relative-position terms.

    Called as attention(x, context, deterministic=...), context being (mask, relative): mask as
    nli_jax.models.attention.attend takes it; relative None or the relative table's row of each
    distance -(length - 1)..length - 1 ([2 length - 1, hidden], LayerNormed). c2p and p2c are
    computed per distance (each query or key against every distance's projection, a matmul) and
    laid out per pair by `skew`."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        o = options(config)
        self.config = config
        h, n, d = config.hidden_size, config.num_attention_heads, config.head_dim
        proj = lambda: nnx.LinearGeneral(
            h, (n, d), dtype=config.compute_dtype, param_dtype=jnp.float32,
            kernel_init=partitioned(normal(config), EMBED, HEADS, KV),
            bias_init=partitioned(nnx.initializers.zeros, HEADS, KV), rngs=rngs)
        self.query, self.key, self.value = proj(), proj(), proj()
        own = o.relative_attention and not o.share_att_key
        self.pos_key = proj() if own and "c2p" in o.pos_att_type else None
        self.pos_query = proj() if own and "p2c" in o.pos_att_type else None
        self.output = nnx.LinearGeneral(
            (n, d), h, axis=(-2, -1), dtype=config.compute_dtype, param_dtype=jnp.float32,
            kernel_init=partitioned(normal(config), HEADS, KV, EMBED),
            bias_init=partitioned(nnx.initializers.zeros, EMBED), rngs=rngs)
        self.attention_dropout = Dropout(config.attention_probs_dropout_prob, rngs=rngs)
        self.position_dropout = Dropout(config.hidden_dropout_prob, rngs=rngs)
        # transformers divides every term by sqrt(head_dim x (1 + len(pos_att_type))), even
        # without relative_attention.
        self.kinds = tuple(k for k in POSITION_ATTENTION if k in o.pos_att_type)
        self.scale = 1.0 / np.sqrt(d * (1 + len(self.kinds)))

    def __call__(self, x, context, *, deterministic: bool):
        mask, relative = context
        dtype = self.config.compute_dtype
        q, k, v = (jnp.swapaxes(p(x), 1, 2) for p in (self.query, self.key, self.value))  # [b, h, length, d]
        q = q * jnp.asarray(self.scale, q.dtype)
        bias = None
        if relative is not None and self.kinds:
            table = self.position_dropout(relative, deterministic=deterministic)  # [2 length - 1, hidden]
            bias = 0.0
            if "c2p" in self.kinds:  # query q against the key of distance q - k
                pos_key = (self.key if self.pos_key is None else self.pos_key)(table[::-1])  # distance length - 1 - c
                c2p = jnp.einsum("bhqd,rhd->bhqr", q, pos_key, preferred_element_type=jnp.float32)
                bias = bias + skew(c2p)  # [q, k] = c2p[q, k + length - 1 - q]: distance q - k
            if "p2c" in self.kinds:  # key k against the query of the same distance q - k
                pos_query = (self.query if self.pos_query is None else self.pos_query)(table)  # distance c - (length - 1)
                pos_query = pos_query * jnp.asarray(self.scale, dtype)
                p2c = jnp.einsum("bhkd,rhd->bhkr", k, pos_query, preferred_element_type=jnp.float32)
                bias = bias + jnp.swapaxes(skew(p2c), -1, -2)  # [k, q] = p2c[k, q + length - 1 - k]
        dropout_active = not deterministic and self.attention_dropout.rate > 0
        probs_dropout = functools.partial(self.attention_dropout, deterministic=False) if dropout_active else None
        context = attention.plain_attention(q, k, v, mask, probs_dropout=probs_dropout, bias=bias)
        return self.output(jnp.swapaxes(context, 1, 2))


class DebertaLayer(TransformerLayer):
    """BERT's post-LayerNorm layer around disentangled attention (transformers' DebertaV2Layer)."""
    attention_class = DisentangledSelfAttention


class ConvLayer(nnx.Module):
    """transformers' ConvLayer after the first layer: LayerNorm(layer output + act(conv(embedding
    output))), zero at padding. The window is zero-padded at the row's ends and, in packed rows,
    sees its own example's tokens only (a padded row's padding is zero already)."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        o = options(config)
        h, groups, width = config.hidden_size, o.conv_groups, o.conv_kernel_size
        if h % groups:
            raise ConfigError(f"config.json conv_groups {groups} does not divide hidden_size {h}")
        self.config, self.groups, self.width = config, groups, width
        # [width, in / groups, out]: the window axis has no logical name (never sharded).
        self.kernel = nnx.Param(partitioned(normal(config), None, EMBED, HIDDEN)(
            rngs.params(), (width, h // groups, h)))
        self.bias = nnx.Param(partitioned(nnx.initializers.zeros, HIDDEN)(rngs.params(), (h,)))
        self.norm = layer_norm(config, h, EMBED, rngs=rngs)
        self.dropout = Dropout(config.hidden_dropout_prob, rngs=rngs)
        self.act = activation(o.conv_act)

    def __call__(self, embedded, residual, segments, *, deterministic: bool):
        dtype = self.config.compute_dtype
        batch, length, h = embedded.shape
        g = self.groups
        kernel = self.kernel[...].astype(dtype).reshape(self.width, h // g, g, h // g)  # [w, in/g, group, out/g]
        x = embedded.reshape(batch, length, g, h // g)
        pad = (self.width - 1) // 2
        padded = jnp.pad(x, ((0, 0), (pad, pad), (0, 0), (0, 0)))
        padded_segments = jnp.pad(segments, ((0, 0), (pad, pad)))
        out = jnp.zeros((batch, length, g, h // g), jnp.float32)
        for offset in range(self.width):  # a few shifted matmuls: the window is 3 wide
            neighbour = padded[:, offset:offset + length]
            same = (padded_segments[:, offset:offset + length] == segments)[:, :, None, None]
            out = out + jnp.einsum("blgi,igo->blgo", jnp.where(same, neighbour, 0).astype(dtype),
                                   kernel[offset], preferred_element_type=jnp.float32)
        out = out.reshape(batch, length, h) + self.bias[...]
        token_mask = (segments > 0)[..., None]
        out = jnp.where(token_mask, out, 0.0).astype(dtype)
        out = self.act(self.dropout(out, deterministic=deterministic))
        y = self.norm((residual + out).astype(jnp.float32)).astype(dtype)
        return y * token_mask.astype(dtype)


class ContextPooler(nnx.Module):
    """The first token -> dropout (pooler_dropout) -> dense -> pooler_hidden_act."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        o = options(config)
        self.dropout = Dropout(o.pooler_dropout, rngs=rngs)
        self.dense = dense(config, config.hidden_size, config.hidden_size, (EMBED, HIDDEN), rngs=rngs)
        self.act = activation(o.pooler_hidden_act)

    def __call__(self, first, *, deterministic: bool):
        return self.act(self.dense(self.dropout(first, deterministic=deterministic)))


class DebertaEncoder(nnx.Module):
    """Embeddings, relative-position table, layers (+ ContextPooler). Returns (hidden, pooled);
    `packing` as nli_jax.models.encoder.Encoder takes it."""

    def __init__(self, config: EncoderConfig, *, add_pooler: bool = True, rngs: nnx.Rngs):
        o = options(config)
        if config.attention == "splash":
            raise ConfigError("model.attention='splash': DeBERTa's relative-position terms are a bias the splash "
                              "kernel does not take; use 'auto' or 'plain'")
        if o.conv_kernel_size and config.scan_layers:
            raise ConfigError(f"scan_layers=True with conv_kernel_size {o.conv_kernel_size}: the convolution runs "
                              "between the first layer and the rest, which one scan cannot; use scan_layers=False")
        self.config = config
        self.embeddings = DebertaEmbeddings(config, rngs=rngs)
        if o.relative_attention:
            self.relative = nnx.Embed(2 * o.span(config), config.hidden_size, dtype=config.compute_dtype,
                                      param_dtype=jnp.float32,
                                      embedding_init=partitioned(normal(config), POSITION, EMBED), rngs=rngs)
            self.relative_norm = layer_norm(config, config.hidden_size, EMBED, rngs=rngs) if o.rel_layer_norm else None
        else:
            self.relative, self.relative_norm = None, None
        self.conv = ConvLayer(config, rngs=rngs) if o.conv_kernel_size else None
        if config.scans_layers:
            self.layers = stacked_layers(config, rngs, DebertaLayer)
        else:
            self.layers = nnx.List([DebertaLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
        self.schedule = tuple(range(config.num_hidden_layers))
        self.pooler = ContextPooler(config, rngs=rngs) if add_pooler else None

    def relative_table(self, length: int):
        """The relative table's row of each distance -(length - 1)..length - 1 (LayerNormed), or None."""
        if self.relative is None:
            return None
        rows, first, count = relative_rows(self.config, length)
        table = self.relative.embedding[first:first + count]  # the rows this length reaches
        if self.relative_norm is not None:  # row-wise: norming the reachable rows is norming the table's
            table = self.relative_norm(table.astype(jnp.float32))
        return jnp.take(table, jnp.asarray(rows), axis=0).astype(self.config.compute_dtype)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 packing=None):
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids, dtype=bool)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        length = input_ids.shape[1]
        if packing is not None:  # [rows, q, k]: each token attends to its own example's tokens
            segments, position_ids = packing["segment_ids"], packing["position_ids"]
            mask = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
        else:
            segments = attention_mask.astype(jnp.int32)
            position_ids = None
            mask = attention_mask.astype(bool)
        token_mask = segments > 0
        embedded = self.embeddings(input_ids, token_type_ids, token_mask,
                                   jnp.arange(length)[None, :] if position_ids is None else position_ids,
                                   deterministic=deterministic)
        # Relative distances are the row's: between two tokens of one example they equal those of
        # its position_ids (a distance does not depend on where the example starts in its row), and
        # the mask drops pairs of two examples. So packed rows need no index of their own.
        context = (mask, self.relative_table(length))
        if self.config.scans_layers:
            x = scan_layers(self.layers, embedded, context, deterministic, self.config)
        else:
            run = layer_runner(self.config.remat, False)
            x = embedded
            for index in self.schedule:
                x = run(self.layers[index], x, context, deterministic)
                if index == 0 and self.conv is not None:
                    x = batch_sharded(self.conv(embedded, x, segments, deterministic=deterministic))
        pooled = self.pooler(first_tokens(x, packing), deterministic=deterministic) if self.pooler is not None else None
        return x, pooled

    def attention_flops_per_token(self, sequence_length: int) -> float:
        """Training FLOPs per token of attention (forward and backward): scores and context as
        BERT's (12 x layers x hidden x length), plus c2p and p2c, each a product of every query
        (key) with the 2 x length - 1 distances' projections."""
        o = options(self.config)
        kinds = sum(k in o.pos_att_type for k in POSITION_ATTENTION) if o.relative_attention else 0
        layers, hidden = self.config.num_hidden_layers, self.config.hidden_size
        return 12 * layers * hidden * sequence_length + 6 * layers * hidden * (2 * sequence_length - 1) * kinds


# --- config.json ---------------------------------------------------------------------------

# transformers' DebertaV2Config defaults, for keys a config.json leaves out.
_HF_DEFAULTS = dict(vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24,
                    intermediate_size=6144, hidden_act="gelu", hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=0,
                    initializer_range=0.02, layer_norm_eps=1e-7, pad_token_id=0)
_OPTION_KEYS = tuple(f.name for f in dataclasses.fields(DebertaOptions))


def _pos_att_type(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # "p2c|c2p", as older config.json files write it
        value = value.split("|")
    return tuple(str(v).strip().lower() for v in value if str(v).strip())


def from_hf(d: dict[str, Any]) -> dict[str, Any]:
    head_size = d.get("attention_head_size")
    if head_size is not None and head_size * d.get("num_attention_heads", 24) != d.get("hidden_size", 1536):
        raise ConfigError(f"config.json attention_head_size {head_size}: nli-jax's DeBERTa needs num_attention_heads "
                          "x attention_head_size == hidden_size")
    pooler_size = d.get("pooler_hidden_size")
    if pooler_size is not None and pooler_size != d.get("hidden_size", 1536):
        raise ConfigError(f"config.json pooler_hidden_size {pooler_size} differs from hidden_size "
                          f"{d.get('hidden_size')}: transformers' classifier would not fit it either")
    kwargs = hf_fields(d, skip=(*_OPTION_KEYS, "cls_dropout", "pooler_hidden_size", "attention_head_size"))
    for key, value in _HF_DEFAULTS.items():
        kwargs.setdefault(key, value)
    kwargs.pop("classifier_dropout", None)  # not DeBERTa's
    if d.get("cls_dropout") is not None:
        kwargs["classifier_dropout"] = d["cls_dropout"]
    values = {k: d[k] for k in _OPTION_KEYS if d.get(k) is not None}
    values["pos_att_type"] = _pos_att_type(d.get("pos_att_type"))
    if "norm_rel_ebd" in values:  # "layer_norm", "none", or "|"-joined as transformers splits it
        parts = {p.strip() for p in str(values["norm_rel_ebd"]).lower().split("|")} - {"none", ""}
        if not parts:
            values["norm_rel_ebd"] = "none"
        elif parts == {"layer_norm"}:
            values["norm_rel_ebd"] = "layer_norm"  # else left as it is: DebertaOptions names it
    kwargs["family_options"] = DebertaOptions(**values)
    if not values.get("legacy", True) and kwargs.get("embedding_size") not in (None, kwargs["hidden_size"]):
        raise ConfigError("config.json legacy false with embedding_size != hidden_size: DeBERTa's MLM head multiplies "
                          "hidden states by the word embeddings")
    return kwargs


def to_hf(config: EncoderConfig) -> dict[str, Any]:
    o = options(config)
    d = hf_common(config)
    d.update({k: getattr(o, k) for k in _OPTION_KEYS})
    d["pos_att_type"] = list(o.pos_att_type)
    d["pooler_hidden_size"] = config.hidden_size
    if config.embedding_size is not None:
        d["embedding_size"] = config.embedding_size
    if config.classifier_dropout is not None:
        d["cls_dropout"] = config.classifier_dropout
    return d


# --- parameter names -----------------------------------------------------------------------

_LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}
_EMBEDDINGS = {"word": "word_embeddings", "position": "position_embeddings", "token_type": "token_type_embeddings",
               "projection": "embed_proj", "norm": "LayerNorm"}
_LAYER = {("attention", "query"): "attention.self.query_proj", ("attention", "key"): "attention.self.key_proj",
          ("attention", "value"): "attention.self.value_proj",
          ("attention", "pos_key"): "attention.self.pos_key_proj",
          ("attention", "pos_query"): "attention.self.pos_query_proj",
          ("attention", "output"): "attention.output.dense", ("attention_norm",): "attention.output.LayerNorm",
          ("mlp_in",): "intermediate.dense", ("mlp_out",): "output.dense", ("mlp_norm",): "output.LayerNorm"}


def encoder_name(config: EncoderConfig, rest: tuple) -> tuple[str, int]:
    leaf = _LEAF[rest[-1]]
    kernel_in = 1 if rest[-1] == "kernel" else 0
    head = rest[0]
    if head == "embeddings":
        return f"embeddings.{_EMBEDDINGS[rest[1]]}.{leaf}", kernel_in
    if head == "relative":
        return "encoder.rel_embeddings.weight", 0
    if head == "relative_norm":
        return f"encoder.LayerNorm.{leaf}", 0
    if head == "conv":
        if rest[1] == "norm":
            return f"encoder.conv.LayerNorm.{leaf}", 0
        return f"encoder.conv.conv.{leaf}", families.REVERSED if rest[1] == "kernel" else 0
    if head == "pooler":  # DebertaV2ForSequenceClassification's, outside the base model
        return f"pooler.dense.{leaf}", kernel_in
    assert head == "layers", rest
    index, module = rest[1], rest[2:-1]
    if module == ("attention", "output") and kernel_in:
        kernel_in = 2  # [heads, kv, embed]
    return f"encoder.layer.{index}.{_LAYER[module]}.{leaf}", kernel_in


def head_name(config: EncoderConfig, model, rest: tuple) -> str:
    leaf = {"kernel": "weight", "bias": "bias", "scale": "weight"}[rest[-1]]
    if rest[0] == "mlm":
        if options(config).legacy:
            names = {"transform": "cls.predictions.transform.dense", "norm": "cls.predictions.transform.LayerNorm"}
            return "cls.predictions.bias" if rest == ("mlm", "bias") else f"{names[rest[1]]}.{leaf}"
        names = {"transform": "lm_predictions.lm_head.dense", "norm": "lm_predictions.lm_head.LayerNorm"}
        return "lm_predictions.lm_head.bias" if rest == ("mlm", "bias") else f"{names[rest[1]]}.{leaf}"
    if rest[0] == "classifier":
        return f"classifier.{leaf}"
    raise hf.CheckpointError(f"{MODEL_TYPE} has no {rest[0]!r} head in transformers (DebertaV2ForMaskedLM, "
                             "-ForSequenceClassification and -ForTokenClassification are nli-jax's)")


families.register(families.Family(
    model_type=MODEL_TYPE, hf_prefix="DebertaV2", base_model_prefix="deberta", encoder=DebertaEncoder,
    from_hf=from_hf, to_hf=to_hf, encoder_name=encoder_name, head_name=head_name,
    base_model_keys=("embeddings.", "encoder."),
    # The classifier's pooler, both MLM heads, and v3's replaced-token detector.
    head_keys=("pooler.", "lm_predictions.", "mask_predictions."),
    # DeBERTa-v3 checkpoints carry absolute position embeddings they never use (transformers
    # ignores them: _keys_to_ignore_on_load_unexpected).
    unused_keys=re.compile(r"embeddings\.position_embeddings\.weight$"),
    base_pooler=False, classifier_pooler=True))
