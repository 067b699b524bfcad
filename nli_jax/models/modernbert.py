"""ModernBERT (Warner et al., 2024; mmBERT, Marone et al., 2025, is this architecture with a Gemma
tokenizer) in Flax NNX: config.json model_type "modernbert", transformers' ModernBert* classes.

What differs from BERT, as transformers 5's modeling_modernbert.py computes it:
- embeddings: token embeddings + LayerNorm, no position or type tables;
- pre-LayerNorm layers (layer 0 has no attention norm: the embeddings' norm serves), a fused
  Wqkv and a GeGLU MLP (Wi gives 2 x intermediate: gelu(first half) * second half), no biases
  when attention_bias / mlp_bias / norm_bias are false, a final norm;
- rotary position embeddings on q and k, with global_rope_theta in global layers and
  local_rope_theta in local ones;
- layer i attends globally when i % global_attn_every_n_layers == 0 (or as config.json's
  layer_types says), else within a sliding window: |i - j| <= local_attention // 2;
- heads: ModernBertPredictionHead (dense, activation, norm) before the tied decoder (MLM) and
  before the classifier (sequence classification, over the [CLS] token or the mean of the real
  tokens: classifier_pooling; token classification).

Packed rows (nli_jax.data.pipeline.Batching.pack): each example attends to itself only, rotary
positions come from `position_ids` (restarting at each example), and the sliding window, a
distance in the row, is the distance within the example since an example's tokens are contiguous.
Each example's outputs are those of its padded row (what transformers' unpadding did).

The family's pieces (nli_jax.models.families): config.json <-> EncoderConfig (the fields BERT also
has under BERT's names, the rest in ModernBertOptions, its family_options), the encoder, the heads
by role, transformers' parameter names, and presets. With model.scan_layers, layers 1.. are one
scanned stack (layer 0 differs: no attention norm), each told by a scanned flag which attention it
has. Parameters carry the logical axis names of nli_jax.models.encoder, plus QKV (the fused
projection's q/k/v axis) and GLU (the GeGLU's input/gate axis), mapped to no mesh axis, so that
tensor parallelism splits heads and the intermediate size as in BERT.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nli_jax.checkpoints import hf
from nli_jax.errors import ConfigError
from nli_jax.models import attention, families
from nli_jax.models.config import ACTIVATIONS, EncoderConfig
from nli_jax.models.encoder import (EMBED, HEADS, HIDDEN, KV, LAYERS, MLP, VOCAB, Dropout, Embed, _SAVED, _SCAN_DETERMINISTIC,
                                    _SCAN_TRAINING, _cache_sized_rows, activation, batch_sharded, first_tokens,
                                    partitioned)
from nli_jax.models.heads import LABELS, gather_positions
from nli_jax.models.presets import PRESETS, PUBLISHED_SHAPES

MODEL_TYPE = "modernbert"
QKV, GLU = "qkv", "glu"  # logical axes of the fused q/k/v and of the GeGLU halves (no mesh rule: unsharded)
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer_types
POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class ModernBertOptions:
    """ModernBERT's config.json fields beyond EncoderConfig's (its `family_options`), with
    transformers' names and defaults. EncoderConfig holds the shared ones under BERT's names:
    hidden_act = hidden_activation, layer_norm_eps = norm_eps, hidden_dropout_prob = mlp_dropout,
    attention_probs_dropout_prob = attention_dropout (on the probabilities and on the output).
    `layer_types` None: every `global_attn_every_n_layers`-th layer global, from layer 0."""
    global_attn_every_n_layers: int = 3
    layer_types: tuple | None = None
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    local_attention: int = 128
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    decoder_bias: bool = True
    embedding_dropout: float = 0.0
    classifier_pooling: str = "cls"
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    initializer_cutoff_factor: float = 2.0

    def __post_init__(self):
        if self.classifier_pooling not in POOLINGS:
            raise ConfigError(f"unknown classifier_pooling {self.classifier_pooling!r}; expected one of {POOLINGS}")
        if self.classifier_activation not in ACTIVATIONS:
            raise ConfigError(f"unknown classifier_activation {self.classifier_activation!r}; expected one of "
                              f"{ACTIVATIONS}")
        if self.global_attn_every_n_layers < 1:
            raise ConfigError(f"global_attn_every_n_layers {self.global_attn_every_n_layers} must be >= 1")
        if self.local_attention < 2:
            raise ConfigError(f"local_attention {self.local_attention} must be >= 2 (the window is +- half of it)")
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))  # hashable
            wrong = sorted(set(self.layer_types) - {FULL, SLIDING})
            if wrong:
                raise ConfigError(f"layer_types: unknown {wrong}; expected {FULL!r} or {SLIDING!r}")

    @property
    def window(self) -> int:
        """Keys a local layer's query sees on each side (transformers' sliding_window)."""
        return self.local_attention // 2


def options(config: EncoderConfig) -> ModernBertOptions:
    return config.family_options or ModernBertOptions()


def layer_kinds(config: EncoderConfig) -> tuple[str, ...]:
    """Each layer's attention: FULL (global) or SLIDING (local window)."""
    o = options(config)
    if o.layer_types is not None:
        if len(o.layer_types) != config.num_hidden_layers:
            raise ConfigError(f"layer_types has {len(o.layer_types)} entries for num_hidden_layers "
                              f"{config.num_hidden_layers}")
        return o.layer_types
    n = o.global_attn_every_n_layers
    return tuple(FULL if i % n == 0 else SLIDING for i in range(config.num_hidden_layers))


def _period(kinds: tuple[str, ...], first_guess: int) -> int | None:
    """n such that `kinds` is "global every n-th layer from layer 0" (what transformers 4 reads), else None."""
    for n in (first_guess, *range(1, len(kinds) + 1)):
        if tuple(kinds) == tuple(FULL if i % n == 0 else SLIDING for i in range(len(kinds))):
            return n
    return None


# --- config.json ---------------------------------------------------------------------------------

# config.json name -> EncoderConfig field, for the fields every family has.
_SHARED = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
           "num_attention_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
           "hidden_activation": "hidden_act", "max_position_embeddings": "max_position_embeddings",
           "initializer_range": "initializer_range", "norm_eps": "layer_norm_eps", "pad_token_id": "pad_token_id",
           "mlp_dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
           "classifier_dropout": "classifier_dropout"}
# transformers' ModernBertConfig defaults where they differ from EncoderConfig's.
_DEFAULTS = {"vocab_size": 50368, "intermediate_size": 1152, "num_hidden_layers": 22, "hidden_activation": "gelu",
             "max_position_embeddings": 8192, "norm_eps": 1e-5, "pad_token_id": 50283, "mlp_dropout": 0.0,
             "attention_dropout": 0.0, "classifier_dropout": 0.0}


def from_hf(d: dict[str, Any]) -> dict[str, Any]:
    """EncoderConfig keyword arguments from config.json as transformers 4.48+ writes it
    (global_attn_every_n_layers, global/local_rope_theta) or 5 (layer_types, rope_parameters)."""
    kwargs: dict[str, Any] = {"model_type": MODEL_TYPE, "type_vocab_size": 1}
    for key, field in _SHARED.items():
        value = d.get(key, _DEFAULTS.get(key))
        if value is not None:
            kwargs[field] = value
    fields = {f.name for f in dataclasses.fields(ModernBertOptions)}
    own = {k: d[k] for k in fields - {"layer_types", "global_rope_theta", "local_rope_theta"} if d.get(k) is not None}
    if d.get("layer_types") is not None:
        # Kept only when no period describes them, so that both generations' files give one config.
        kinds = tuple(d["layer_types"])
        if len(kinds) != kwargs.get("num_hidden_layers"):
            raise ConfigError(f"config.json layer_types has {len(kinds)} entries for num_hidden_layers "
                              f"{kwargs.get('num_hidden_layers')}")
        period = _period(kinds, own.get("global_attn_every_n_layers", 3))
        if period:
            own["global_attn_every_n_layers"] = period
        else:
            own["layer_types"] = kinds
    rope = d.get("rope_parameters") or {}
    for kind, key in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ConfigError(f"config.json rope_parameters.{kind}.rope_type {params['rope_type']!r} is not supported "
                              "(only 'default')")
        theta = params.get("rope_theta", d.get(key))
        if theta is not None:
            own[key] = float(theta)
    if d.get("rope_scaling"):
        raise ConfigError(f"config.json rope_scaling {d['rope_scaling']!r} is not supported")
    kwargs["family_options"] = ModernBertOptions(**own)
    # Read above, or derived from the class / written by transformers: not kept in `extra`.
    read = set(_SHARED) | fields | {"model_type", "rope_parameters", "rope_scaling", "architectures",
                                    "transformers_version", "torch_dtype", "dtype", "layer_norm_eps"}
    kwargs["extra"] = {k: v for k, v in d.items() if k not in read}
    return kwargs


def to_hf(config: EncoderConfig) -> dict[str, Any]:
    """config.json that transformers 5 reads (layer_types, rope_parameters), with the keys
    transformers 4.48+ reads (global_attn_every_n_layers, global/local_rope_theta) beside them."""
    d: dict[str, Any] = dict(config.extra)
    d["model_type"] = MODEL_TYPE
    d.update({key: getattr(config, field) for key, field in _SHARED.items()})
    d["classifier_dropout"] = config.classifier_dropout_rate  # what the heads apply (None: hidden_dropout_prob)
    o = options(config)
    d.update({f.name: getattr(o, f.name) for f in dataclasses.fields(o) if f.name != "layer_types"})
    d["layer_types"] = list(layer_kinds(config))
    d["rope_parameters"] = {FULL: {"rope_type": "default", "rope_theta": o.global_rope_theta},
                            SLIDING: {"rope_type": "default", "rope_theta": o.local_rope_theta}}
    period = _period(layer_kinds(config), o.global_attn_every_n_layers)
    if period is None:
        d.pop("global_attn_every_n_layers")
    else:
        d["global_attn_every_n_layers"] = period
    d["dtype"] = "float32"
    return d


# --- building blocks --------------------------------------------------------------------------

def truncated_normal(std: float, cutoff: float):
    """transformers' init.trunc_normal_(std, a=-cutoff*std, b=cutoff*std): a normal of this std
    cut at +-cutoff std (jax's truncated_normal initializer rescales the std; this does not)."""
    def init(key, shape, dtype=jnp.float32):
        return (std * jax.random.truncated_normal(key, -cutoff, cutoff, shape, jnp.float32)).astype(dtype)
    return init


def _init(config: EncoderConfig, kind: str, *axes):
    """ModernBertPreTrainedModel._init_weights: "in" projections and embeddings at
    initializer_range, "out" projections (and the heads' dense) at initializer_range /
    sqrt(2 x layers), classifiers at hidden_size ** -0.5."""
    r = config.initializer_range
    stds = {"in": r, "out": r / np.sqrt(2.0 * config.num_hidden_layers), "final_out": config.hidden_size ** -0.5}
    std = stds[kind]
    return partitioned(truncated_normal(std, options(config).initializer_cutoff_factor), *axes)


def norm(config: EncoderConfig, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # float32 statistics, as nli_jax.models.encoder.layer_norm; no bias unless norm_bias.
    return nnx.LayerNorm(config.hidden_size, epsilon=config.layer_norm_eps, use_bias=options(config).norm_bias,
                         dtype=jnp.float32, param_dtype=jnp.float32, scale_init=partitioned(nnx.initializers.ones, EMBED),
                         bias_init=partitioned(nnx.initializers.zeros, EMBED), rngs=rngs)


def _normed(layer_norm, x, dtype):
    return layer_norm(x.astype(jnp.float32)).astype(dtype)


def rotary_tables(config: EncoderConfig, positions, theta: float):
    """(cos, sin) [batch, length, head_dim] float32 for integer `positions` [batch, length], as
    ModernBertRotaryEmbedding: inverse frequencies theta^(-2i/d), each used twice (halves)."""
    d = config.head_dim
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x, cos, sin):
    """x [batch, length, heads, head_dim] rotated by the tables [batch, length, head_dim] (float32)."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


class Embeddings(nnx.Module):
    """Token embeddings -> norm -> dropout (embedding_dropout); no positions, no token types."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.word = Embed(config.vocab_size, config.hidden_size, dtype=config.compute_dtype,
                              param_dtype=jnp.float32, embedding_init=_init(config, "in", VOCAB, EMBED), rngs=rngs)
        self.norm = norm(config, rngs=rngs)
        self.dropout = Dropout(options(config).embedding_dropout, rngs=rngs)

    def __call__(self, input_ids, *, deterministic: bool):
        x = _normed(self.norm, self.word(input_ids), self.config.compute_dtype)
        return self.dropout(x, deterministic=deterministic)


class Attention(nnx.Module):
    """Fused q/k/v projection [embed, 3, heads, kv], rotary q and k, softmax attention (windowed in
    local layers), output projection; attention_probs_dropout_prob (transformers'
    attention_dropout) on the probabilities and on the output."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        h, n, d = config.hidden_size, config.num_attention_heads, config.head_dim
        bias = options(config).attention_bias
        self.qkv = nnx.LinearGeneral(h, (3, n, d), use_bias=bias, dtype=config.compute_dtype, param_dtype=jnp.float32,
                                     kernel_init=_init(config, "in", EMBED, QKV, HEADS, KV),
                                     bias_init=partitioned(nnx.initializers.zeros, QKV, HEADS, KV), rngs=rngs)
        self.output = nnx.LinearGeneral((n, d), h, axis=(-2, -1), use_bias=bias, dtype=config.compute_dtype,
                                        param_dtype=jnp.float32, kernel_init=_init(config, "out", HEADS, KV, EMBED),
                                        bias_init=partitioned(nnx.initializers.zeros, EMBED), rngs=rngs)
        self.probs_dropout = Dropout(config.attention_probs_dropout_prob, rngs=rngs)
        self.out_dropout = Dropout(config.attention_probs_dropout_prob, rngs=rngs)

    def __call__(self, x, mask, rope, is_global, *, deterministic: bool):
        """is_global: a Python bool (layers in a loop) or a traced one (scanned layers: both
        attentions are compiled and lax.cond runs the layer's)."""
        window = options(self.config).window
        qkv = self.qkv(x)  # [b, l, 3, h, d]
        cos, sin = rope
        q, k = rotate(qkv[:, :, 0], cos, sin), rotate(qkv[:, :, 1], cos, sin)
        q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, qkv[:, :, 2]))  # [b, h, l, d], as encoder.SelfAttention
        q = q * jnp.asarray(1.0 / np.sqrt(self.config.head_dim), q.dtype)
        dropout_active = not deterministic and self.probs_dropout.rate > 0
        # The key is drawn here, not in lax.cond's branches, which must not change RNG state.
        probs_dropout = (functools.partial(self.probs_dropout, deterministic=False, rngs=self.probs_dropout.rngs())
                         if dropout_active else None)
        implementation = attention.choose(self.config.attention, q, dropout_active=dropout_active)
        rows = _cache_sized_rows(q.shape, like=q) if deterministic and implementation == "plain" else 0

        def attend(window):
            if rows:  # one CPU device, evaluation: a few rows at a time (encoder.SelfAttention)
                split = lambda t: t.reshape(t.shape[0] // rows, rows, *t.shape[1:])
                out = jax.lax.map(lambda a: attention.attend(*a, implementation="plain", window=window),
                                  (split(q), split(k), split(v), split(mask)))
                return out.reshape(q.shape)
            return attention.attend(q, k, v, mask, implementation=implementation, probs_dropout=probs_dropout,
                                    window=window)

        if isinstance(is_global, bool):
            context = attend(None if is_global else window)
        else:
            context = jax.lax.cond(is_global, lambda: attend(None), lambda: attend(window))
        out = self.output(jnp.swapaxes(context, 1, 2))
        return self.out_dropout(out, deterministic=deterministic)


class GeGLU(nnx.Module):
    """Wi [embed, 2, mlp] (input half, gate half) -> act(input) * gate -> dropout -> Wo. The halves
    have their own axis so that tensor parallelism splits both alike along "mlp"."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        h, m, bias = config.hidden_size, config.intermediate_size, options(config).mlp_bias
        self.wi = nnx.LinearGeneral(h, (2, m), use_bias=bias, dtype=config.compute_dtype, param_dtype=jnp.float32,
                                    kernel_init=_init(config, "in", EMBED, GLU, MLP),
                                    bias_init=partitioned(nnx.initializers.zeros, GLU, MLP), rngs=rngs)
        self.wo = nnx.Linear(m, h, use_bias=bias, dtype=config.compute_dtype, param_dtype=jnp.float32,
                             kernel_init=_init(config, "out", MLP, EMBED),
                             bias_init=partitioned(nnx.initializers.zeros, EMBED), rngs=rngs)
        self.dropout = Dropout(config.hidden_dropout_prob, rngs=rngs)
        self.act = activation(config.hidden_act)

    def __call__(self, x, *, deterministic: bool):
        y = self.wi(x)
        return self.wo(self.dropout(self.act(y[..., 0, :]) * y[..., 1, :], deterministic=deterministic))


class Layer(nnx.Module):
    """Pre-LayerNorm: x + attn(attn_norm(x)), then + mlp(mlp_norm(.)). `first`: transformers' layer
    0, whose attn_norm is the identity (its input is the embeddings' norm)."""

    def __init__(self, config: EncoderConfig, *, first: bool = False, rngs: nnx.Rngs):
        self.config = config
        self.attn_norm = None if first else norm(config, rngs=rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = norm(config, rngs=rngs)
        self.mlp = GeGLU(config, rngs=rngs)

    def __call__(self, x, mask, ropes, is_global, deterministic: bool):
        dtype = self.config.compute_dtype
        x = batch_sharded(x)
        y = x if self.attn_norm is None else _normed(self.attn_norm, x, dtype)
        if isinstance(is_global, bool):
            rope = ropes[FULL if is_global else SLIDING]
        else:
            rope = jax.tree.map(lambda g, s: jnp.where(is_global, g, s), ropes[FULL], ropes[SLIDING])
        x = x + batch_sharded(self.attn(y, mask, rope, is_global, deterministic=deterministic))
        y = self.mlp(_normed(self.mlp_norm, x, dtype), deterministic=deterministic)
        return batch_sharded(x + batch_sharded(y))


def _run_layer(layer: Layer, x, mask, ropes, is_global, deterministic: bool):
    return layer(x, mask, ropes, is_global, deterministic)


@functools.cache
def _layer_runner(policy: str, scanned: bool):
    """_run_layer under config.remat `policy`, as nli_jax.models.encoder.layer_runner. In a loop,
    is_global is a static Python bool; in a scan, a traced one."""
    if policy == "none":
        return _run_layer
    static = (5,) if scanned else (4, 5)
    return nnx.remat(_run_layer, static_argnums=static, policy=_SAVED.get(policy), prevent_cse=not scanned)


class ModernBertEncoder(nnx.Module):
    """Embeddings, layer 0 (`first_layer`), layers 1.. (`layers`: a list or, with scan_layers, one
    Layer with stacked parameters; they share a structure that layer 0 lacks), final norm.

    Returns (hidden [rows, length, hidden], pooled): with `add_pooler`, pooled is each example's
    [CLS] state or the mean of its real tokens (classifier_pooling; no parameters: the heads
    transform it), one row per example, packed or not; else None."""

    def __init__(self, config: EncoderConfig, *, add_pooler: bool = False, rngs: nnx.Rngs):
        self.config = config
        self.kinds = layer_kinds(config)  # ConfigError for layer_types of another depth
        self.embeddings = Embeddings(config, rngs=rngs)
        self.first_layer = Layer(config, first=True, rngs=rngs)
        rest = config.num_hidden_layers - 1
        if config.scans_layers and rest > 0:
            self.layers = _stacked_layers(config, rest, rngs)
        else:
            self.layers = nnx.List([Layer(config, rngs=rngs) for _ in range(rest)])
        self.schedule = tuple(range(rest))  # what runs from `layers` (first_layer runs before)
        self.final_norm = norm(config, rngs=rngs)
        self.pooler = options(config).classifier_pooling if add_pooler else None

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 packing=None):
        c, o = self.config, options(self.config)
        if input_ids.shape[1] > c.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                             f"{c.max_position_embeddings}")
        if packing is not None:  # [rows, q, k]: each token sees its own example; positions restart per example
            segments = packing["segment_ids"]
            mask = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
            positions = packing["position_ids"]
        else:
            mask = jnp.ones_like(input_ids, dtype=bool) if attention_mask is None else attention_mask.astype(bool)
            positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1])[None, :], input_ids.shape)
        ropes = {FULL: rotary_tables(c, positions, o.global_rope_theta),
                 SLIDING: rotary_tables(c, positions, o.local_rope_theta)}
        x = self.embeddings(input_ids, deterministic=deterministic)
        run = _layer_runner(c.remat, False)
        x = run(self.first_layer, x, mask, ropes, self.kinds[0] == FULL, deterministic)
        if c.scans_layers and self.schedule:
            x = _scan_layers(self.layers, x, mask, ropes, jnp.asarray([k == FULL for k in self.kinds[1:]]),
                             deterministic, c)
        else:
            for index in self.schedule:
                x = run(self.layers[index], x, mask, ropes, self.kinds[index + 1] == FULL, deterministic)
        x = _normed(self.final_norm, x, c.compute_dtype)
        pooled = pool(self.pooler, x, attention_mask, packing) if self.pooler is not None else None
        return x, pooled

    def attention_flops_per_token(self, sequence_length: int) -> float:
        """Training FLOPs per token of attention's scores and context (forward and backward): 12 x
        hidden x the keys a query sees, summed over layers (a local layer's window at most)."""
        span = min(sequence_length, 2 * options(self.config).window + 1)
        keys = sum(sequence_length if kind == FULL else span for kind in self.kinds)
        return 12 * self.config.hidden_size * keys


def _stacked_layers(config: EncoderConfig, count: int, rngs: nnx.Rngs) -> Layer:
    """Layers 1.. as one Layer whose parameters are stacked on a leading LAYERS axis, each drawn
    from its own split of the "params" stream (as encoder.stacked_layers, for count layers)."""
    @nnx.split_rngs(splits=count, only="params")
    @nnx.vmap(in_axes=(nnx.StateAxes({"params": 0, ...: None}),), out_axes=nnx.StateAxes({nnx.Param: 0, ...: None}),
              transform_metadata={nnx.PARTITION_NAME: LAYERS})
    def create(rngs):
        return Layer(config, rngs=rngs)
    return create(rngs)


def _scan_layers(layers: Layer, x, mask, ropes, is_global, deterministic: bool, config: EncoderConfig):
    """x through the stacked layers 1.., each told by the scanned `is_global` which attention it has."""
    run = _layer_runner(config.remat, True)

    def body(layer, x, mask, ropes, is_global):
        return run(layer, x, mask, ropes, is_global, deterministic)

    axes = (_SCAN_DETERMINISTIC if deterministic else _SCAN_TRAINING, nnx.Carry, None, None, 0)
    scan = nnx.scan(body, in_axes=axes, out_axes=nnx.Carry, transform_metadata={nnx.PARTITION_NAME: LAYERS})
    if not deterministic:  # each layer its own split of every "dropout" key (as encoder's scan)
        scan = nnx.split_rngs(splits=config.num_hidden_layers - 1, only="dropout")(scan)
    return scan(layers, x, mask, ropes, is_global)


def pool(kind: str, hidden, attention_mask=None, packing=None):
    """[examples, hidden]: each example's first token ("cls") or the mean of its real tokens
    ("mean", in float32), from padded rows or packed ones, in example order (as encoder.first_tokens)."""
    if kind == "cls":
        return first_tokens(hidden, packing)
    h32 = hidden.astype(jnp.float32)
    if packing is None:
        mask = (jnp.ones(hidden.shape[:2], jnp.float32) if attention_mask is None
                else attention_mask.astype(jnp.float32))
        return (jnp.einsum("bl,blh->bh", mask, h32) / mask.sum(-1, keepdims=True)).astype(hidden.dtype)
    # Packed: an example is the tokens of its first token's row that carry its segment id.
    cls_index, segments = packing["cls_index"], packing["segment_ids"]
    groups, length = cls_index.shape[0], hidden.shape[1]
    grouped = h32.reshape(groups, -1, hidden.shape[-1])
    segment = segments.reshape(groups, -1)
    row = jnp.arange(segment.shape[1]) // length
    own = jnp.take_along_axis(segment, cls_index, axis=1)  # [groups, examples]
    member = ((row[None, None, :] == (cls_index // length)[:, :, None])
              & (segment[:, None, :] == own[:, :, None]) & (own[:, :, None] > 0)).astype(jnp.float32)
    mean = jnp.einsum("gep,gph->geh", member, grouped) / jnp.maximum(member.sum(-1, keepdims=True), 1.0)
    return mean.reshape(-1, hidden.shape[-1]).astype(hidden.dtype)


# --- heads (by role: nli_jax.models.families; built with the default heads' arguments) ----------

class PredictionHead(nnx.Module):
    """ModernBertPredictionHead: dense (bias: classifier_bias) -> classifier_activation -> norm."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        o = options(config)
        self.dense = nnx.Linear(config.hidden_size, config.hidden_size, use_bias=o.classifier_bias,
                                dtype=config.compute_dtype, param_dtype=jnp.float32,
                                kernel_init=_init(config, "out", EMBED, HIDDEN),
                                bias_init=partitioned(nnx.initializers.zeros, HIDDEN), rngs=rngs)
        self.norm = norm(config, rngs=rngs)
        self.act = activation(o.classifier_activation)

    def __call__(self, x):
        return _normed(self.norm, self.act(self.dense(x)), self.config.compute_dtype)


def _classifier(config: EncoderConfig, outputs: int, rngs: nnx.Rngs) -> nnx.Linear:
    # transformers' classifier is an nn.Linear with its bias whatever classifier_bias says.
    return nnx.Linear(config.hidden_size, outputs, dtype=config.compute_dtype, param_dtype=jnp.float32,
                      kernel_init=_init(config, "final_out", EMBED, LABELS),
                      bias_init=partitioned(nnx.initializers.zeros, LABELS), rngs=rngs)


class MaskedLMHead(nnx.Module):
    """ModernBertForMaskedLM's head: prediction head, then the decoder tied to the token
    embeddings, + its bias (decoder_bias). `positions`: logits at those positions only."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.head = PredictionHead(config, rngs=rngs)
        self.bias = (nnx.Param(partitioned(nnx.initializers.zeros, VOCAB)(rngs.params(), (config.vocab_size,)))
                     if options(config).decoder_bias else None)

    def __call__(self, hidden, word_embeddings, positions=None):
        if positions is not None:
            hidden = gather_positions(hidden, positions)
        x = self.head(hidden)
        logits = jnp.einsum("...e,ve->...v", x, word_embeddings.astype(self.config.compute_dtype),
                            preferred_element_type=jnp.float32)
        return logits if self.bias is None else logits + self.bias[...]


class SequenceClassificationHead(nnx.Module):
    """ModernBertForSequenceClassification's: the pooled example (the encoder's classifier_pooling)
    -> prediction head -> dropout (classifier_dropout) -> classifier."""

    def __init__(self, config: EncoderConfig, num_labels: int, *, rngs: nnx.Rngs):
        self.head = PredictionHead(config, rngs=rngs)
        self.dropout = Dropout(config.classifier_dropout_rate, rngs=rngs)
        self.out = _classifier(config, num_labels, rngs)

    def __call__(self, first, pooled, *, deterministic: bool):
        del first  # the encoder's `pooled` is [CLS] or the mean, as classifier_pooling says
        return self.out(self.dropout(self.head(pooled), deterministic=deterministic)).astype(jnp.float32)


class TokenClassificationHead(nnx.Module):
    """ModernBertForTokenClassification's: every token through prediction head -> dropout -> classifier."""

    def __init__(self, config: EncoderConfig, num_labels: int, *, rngs: nnx.Rngs):
        self.head = PredictionHead(config, rngs=rngs)
        self.dropout = Dropout(config.classifier_dropout_rate, rngs=rngs)
        self.out = _classifier(config, num_labels, rngs)

    def __call__(self, hidden, *, deterministic: bool):
        return self.out(self.dropout(self.head(hidden), deterministic=deterministic)).astype(jnp.float32)


class MultiAspectHead(nnx.Module):
    """One softmax per aspect (CASA, HoASA) over the pooled example, through the prediction head as
    sequence classification. No transformers class: saved as ModernBertModel + these weights."""

    def __init__(self, config: EncoderConfig, num_aspects: int, num_labels: int, *, rngs: nnx.Rngs):
        self.num_aspects, self.num_labels = num_aspects, num_labels
        self.head = PredictionHead(config, rngs=rngs)
        self.dropout = Dropout(config.classifier_dropout_rate, rngs=rngs)
        self.out = _classifier(config, num_aspects * num_labels, rngs)

    def __call__(self, pooled, *, deterministic: bool):
        logits = self.out(self.dropout(self.head(pooled), deterministic=deterministic)).astype(jnp.float32)
        return logits.reshape(*logits.shape[:-1], self.num_aspects, self.num_labels)


# --- Hugging Face names ---------------------------------------------------------------------------
# transformers' ModernBert* state dicts: the encoder under "model." in task classes (bare in
# ModernBertModel), the heads at the top ("head.", "decoder.", "classifier."). Our layer i >= 1 is
# layers[i - 1] (first_layer is layer 0).

_LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}
_LAYER_NAMES = {("attn_norm",): ("attn_norm", 0), ("mlp_norm",): ("mlp_norm", 0), ("attn", "qkv"): ("attn.Wqkv", 1),
                ("attn", "output"): ("attn.Wo", 2), ("mlp", "wi"): ("mlp.Wi", 1), ("mlp", "wo"): ("mlp.Wo", 1)}


def encoder_name(config: EncoderConfig, rest: tuple) -> tuple[str, int]:
    """(transformers name without the base prefix, input axes of a kernel) of an encoder parameter
    path (a scanned stack seen per layer). Kernels: Wqkv [3 x heads x kv, embed] is ours
    [embed, 3, heads, kv]; Wi [2 x mlp, embed] is ours [embed, 2, mlp] (input half first)."""
    leaf = _LEAF[rest[-1]]
    if rest[0] == "embeddings":
        return {"word": "embeddings.tok_embeddings", "norm": "embeddings.norm"}[rest[1]] + "." + leaf, 0
    if rest[0] == "final_norm":
        return f"final_norm.{leaf}", 0
    index, module = (0, rest[1:-1]) if rest[0] == "first_layer" else (rest[1] + 1, rest[2:-1])
    sub, in_axes = _LAYER_NAMES[module]
    return f"layers.{index}.{sub}.{leaf}", in_axes if rest[-1] == "kernel" else 0


def head_name(config: EncoderConfig, model, rest: tuple) -> str:
    """transformers' name of a head parameter: ("mlm" | "classifier", ...) paths of the task models."""
    if rest == ("mlm", "bias"):
        return "decoder.bias"
    leaf = _LEAF[rest[-1]]
    if rest[0] in ("mlm", "classifier") and rest[1] == "head":
        return f"head.{rest[2]}.{leaf}"
    if rest[0] == "classifier" and rest[1] == "out":
        return f"classifier.{leaf}"
    raise hf.CheckpointError(f"{'.'.join(map(str, rest))}: ModernBERT has no such head in transformers (no "
                             "next-sentence / sentence-order or replaced-token head)")


# --- shapes: from-scratch presets and the published checkpoints' config.json --------------------

_PRESET = dict(model_type=MODEL_TYPE, hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               classifier_dropout=0.0, layer_norm_eps=1e-5, initializer_range=0.02, type_vocab_size=1,
               max_position_embeddings=8192)
# ModernBERT-base / -large (Warner et al., 2024, Table 4; answerdotai/ModernBERT-* config.json): global
# layers every 3rd, windows of 128, RoPE theta 160k global / 10k local. mmBERT (Marone et al., 2025):
# the base shape with the Gemma 2 vocabulary and theta 160k everywhere (JHU-CLSP/mmBERT
# configs/mmBERT-base-decay.yaml, the final phase: rotary_emb_base and local_attn_rotary_emb_base
# 160000). Vocabulary sizes are the published ones; a from-scratch run takes its tokenizer's.
_MODERNBERT = ModernBertOptions(global_rope_theta=160000.0, local_rope_theta=10000.0)
_CRAMMED = ModernBertOptions(global_attn_every_n_layers=1, decoder_bias=False)
_MMBERT = ModernBertOptions(global_rope_theta=160000.0, local_rope_theta=160000.0, classifier_pooling="mean")
PRESETS.update({
    "modernbert-base": dict(_PRESET, num_hidden_layers=22, hidden_size=768, num_attention_heads=12,
                            intermediate_size=1152, vocab_size=50368, family_options=_MODERNBERT),
    "modernbert-large": dict(_PRESET, num_hidden_layers=28, hidden_size=1024, num_attention_heads=16,
                             intermediate_size=2624, vocab_size=50368, family_options=_MODERNBERT),
    "mmbert-small": dict(_PRESET, num_hidden_layers=22, hidden_size=384, num_attention_heads=6,
                         intermediate_size=1152, vocab_size=256000, family_options=_MMBERT),
    "mmbert-base": dict(_PRESET, num_hidden_layers=22, hidden_size=768, num_attention_heads=12,
                        intermediate_size=1152, vocab_size=256000, family_options=_MMBERT),
    # CPU tests and :cpu_test configs: 4 layers (global, local, local, global), 4 heads (tensor:4
    # splits them), a window of +-8 tokens so that locality matters at max_seq_length 64.
    "tiny-modernbert": dict(_PRESET, num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                            intermediate_size=96, vocab_size=1000, max_position_embeddings=512,
                            family_options=ModernBertOptions(local_attention=16, global_rope_theta=160000.0,
                                                             local_rope_theta=10000.0)),
    # The crammed recipe (configs/pretrain/crammed.py; Cramming, Geiping & Goldstein 2022): BERT-base's
    # shape (12 x 768, 12 heads, 3,072 wide feed-forward) as a ModernBERT: pre-LayerNorm, GeGLU, no
    # biases (attention, feed-forward, norms, decoder), rotary positions, the decoder tied to the
    # embeddings, no dropout; every layer global (Cramming has no local attention). The vocabulary
    # is the run's tokenizer's (this size is BERT's).
    "crammed-base": dict(_PRESET, num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                         intermediate_size=3072, vocab_size=30522, max_position_embeddings=512,
                         family_options=_CRAMMED),
    # :cpu_learn: the shape of configs/pretrain/common.py:apply_cpu_learn's BERT (2 x 128, 2 heads, 512).
    "crammed-2layer-small": dict(_PRESET, num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                                 intermediate_size=512, vocab_size=30522, max_position_embeddings=512,
                                 family_options=_CRAMMED),
    # :cpu_test: tiny-bert's shape.
    "tiny-crammed": dict(_PRESET, num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                         vocab_size=1000, max_position_embeddings=128, family_options=_CRAMMED),
})

# jhu-clsp/mmBERT-base's config.json as transformers 4.48+ reads it (the shape launch.compile uses
# without hub access): the architecture of JHU-CLSP/mmBERT configs/mmBERT-base-decay.yaml; token ids
# (pad 0, bos 2, eos / cls / sep 1, mask 4) and heads (mean pooling) as the family's published
# configs give them (mmBERT-small's, mirrored as datalama/mmBERT-small).
MMBERT_BASE_CONFIG = {
    "architectures": ["ModernBertForMaskedLM"], "model_type": MODEL_TYPE, "vocab_size": 256000, "hidden_size": 768,
    "num_hidden_layers": 22, "num_attention_heads": 12, "intermediate_size": 1152, "hidden_activation": "gelu",
    "max_position_embeddings": 8192, "global_attn_every_n_layers": 3, "local_attention": 128,
    "global_rope_theta": 160000, "local_rope_theta": 160000, "initializer_range": 0.02,
    "initializer_cutoff_factor": 2.0, "norm_eps": 1e-05, "layer_norm_eps": 1e-05, "norm_bias": False,
    "attention_bias": False, "mlp_bias": False, "decoder_bias": True, "attention_dropout": 0.0,
    "embedding_dropout": 0.0, "mlp_dropout": 0.0, "classifier_pooling": "mean", "classifier_activation": "gelu",
    "classifier_bias": False, "classifier_dropout": 0.0, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    "cls_token_id": 1, "sep_token_id": 1, "mask_token_id": 4, "position_embedding_type": "sans_pos",
    "tie_word_embeddings": True, "deterministic_flash_attn": False,
}
PUBLISHED_SHAPES["jhu-clsp/mmBERT-base"] = MMBERT_BASE_CONFIG

families.register(families.Family(
    model_type=MODEL_TYPE, hf_prefix="ModernBert", base_model_prefix="model", encoder=ModernBertEncoder,
    from_hf=from_hf, to_hf=to_hf, encoder_name=encoder_name, head_name=head_name,
    base_model_keys=("embeddings.", "layers.", "final_norm."), head_keys=("head.", "decoder."),
    unused_keys=re.compile(r"^decoder\.weight$"),  # the tied decoder, when a checkpoint holds a copy
    base_pooler=False, classifier_pooler=True,
    heads={"masked_lm": MaskedLMHead, "sequence": SequenceClassificationHead, "token": TokenClassificationHead,
           "multi_aspect": MultiAspectHead},
    # ModernBertConfig defaults these to ModernBERT's own vocabulary; [CLS] and [SEP] open and close.
    tokenizer_ids={"cls_token_id": "cls_token_id", "sep_token_id": "sep_token_id", "bos_token_id": "cls_token_id",
                   "eos_token_id": "sep_token_id"}))
