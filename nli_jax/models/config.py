"""Encoder configuration shared by every model family (nli_jax.models.families).

Field names follow Hugging Face's config.json so that import and export are a direct copy;
`from_hf_dict` / `to_hf_dict` hand the differences to the family of the config's model_type
(its `from_hf` / `to_hf`, built on `hf_fields` / `hf_common`). A family's own fields live in
`family_options`, a frozen dataclass of the family's.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from nli_jax.errors import ConfigError  # noqa: F401  (re-exported: nli_jax.models.ConfigError)
from nli_jax.models import families
from nli_jax.plan import REMAT_POLICIES, remat_policy_name

# Hugging Face activation names -> ours. "gelu" is the exact erf form; "gelu_new" and
# "gelu_pytorch_tanh" are the tanh approximation.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")

# The choices of EncoderConfig.attention (nli_jax.models.attention has the implementations).
ATTENTION_IMPLEMENTATIONS = ("plain", "splash", "auto")
# How nli-jax computes, not what the model is: never read from or written to a Hugging Face
# config.json (from_hf_dict / to_hf_dict).
NLI_JAX_FIELDS = ("dtype", "remat", "scan_layers", "attention")

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # ALBERT, ELECTRA and DeBERTa: factorised embeddings. None means "as hidden_size".
    embedding_size: int | None = None
    # Dropout before a classification head; None means hidden_dropout_prob (as in BERT).
    classifier_dropout: float | None = None
    # Compute dtype; parameters are always float32.
    dtype: str = "float32"
    # What each layer keeps for the backward pass, the rest being recomputed (long sequences,
    # big models): one of REMAT_POLICIES (nli_jax.models.encoder.layer_runner). True / False,
    # as older configs say, mean "full" / "none".
    remat: str = "none"
    # Run the stack of identical layers as one nnx.scan over parameters with a leading "layers"
    # axis: XLA compiles one layer instead of num_hidden_layers. ALBERT keeps its loop over
    # shared layers (`scans_layers`).
    scan_layers: bool = False
    # Attention kernel (nli_jax.models.attention): "plain" XLA, "splash" (Pallas, TPU), or "auto":
    # splash when compiling for a TPU without attention-probability dropout, plain otherwise.
    attention: str = "auto"
    # The family's own fields (a frozen dataclass of its module, e.g. DeBERTa's relative
    # attention); None for the BERT-like families. Compared and hashed with the rest: two shapes
    # never share a compiled program.
    family_options: Any = None
    # Hugging Face fields we do not use but keep for a faithful export (bos/eos ids, ...).
    extra: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        families.get(self.model_type)  # ConfigError naming the known model types
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"unknown hidden_act {self.hidden_act!r}; expected one of {ACTIVATIONS}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}")
        object.__setattr__(self, "remat", remat_policy_name(self.remat))  # frozen: normalised once, here
        if self.remat not in REMAT_POLICIES:
            raise ConfigError(f"unknown remat {self.remat!r}; expected one of {REMAT_POLICIES} (or True / False)")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(f"unknown attention {self.attention!r}; expected one of {ATTENTION_IMPLEMENTATIONS}")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; expected one of {tuple(_DTYPES)}")
        self.layer_schedule()  # a family that shares layers checks its options against the depth

    # --- derived properties -------------------------------------------------------------
    @property
    def positions_after_padding(self) -> bool:
        """Positions count from pad_token_id + 1, padding tokens take the padding index (the family's
        positions_after_padding: RoBERTa, XLM-R)."""
        return families.get(self.model_type).positions_after_padding

    @property
    def has_pooler(self) -> bool:
        """Whether sequence classification reads the encoder's pooled output (the family's
        classifier_pooler): RoBERTa and ELECTRA classify from the first token with a head of their own."""
        return families.get(self.model_type).classifier_pooler

    @property
    def embed_dim(self) -> int:
        """Width of the embedding tables (ALBERT's factorised E, else hidden_size)."""
        return self.embedding_size or self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def position_offset(self) -> int:
        """pad_token_id + 1 where positions count after the padding index (RoBERTa), else 0."""
        return self.pad_token_id + 1 if self.positions_after_padding else 0

    @property
    def classifier_dropout_rate(self) -> float:
        return self.hidden_dropout_prob if self.classifier_dropout is None else self.classifier_dropout

    def layer_schedule(self) -> tuple[int, ...]:
        """Which unique layer runs at each depth: one layer per depth, unless the family shares
        layers across depth (its Family.layer_schedule: ALBERT's groups)."""
        shared = families.get(self.model_type).layer_schedule
        return shared(self) if shared is not None else tuple(range(self.num_hidden_layers))

    @property
    def scans_layers(self) -> bool:
        """Whether the encoder scans its layers: scan_layers, except in a family that shares layers
        across depth (ALBERT), whose few unique layers run by `layer_schedule` in a loop (one
        compiled layer per unique layer already)."""
        return self.scan_layers and families.get(self.model_type).layer_schedule is None

    @property
    def num_unique_layers(self) -> int:
        return max(self.layer_schedule(), default=-1) + 1

    def replace(self, **changes) -> "EncoderConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown EncoderConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    # --- Hugging Face config.json -------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **overrides) -> "EncoderConfig":
        if "model_type" not in d:
            raise ConfigError("config.json has no 'model_type'")
        model_type = d["model_type"]
        if model_type not in families.model_types():
            raise ConfigError(f"unsupported model_type {model_type!r} in config.json; nli-jax supports "
                              f"{families.model_types()}")
        shared = {f.name for f in dataclasses.fields(cls)}
        own = {k: v for k, v in overrides.items() if k not in shared}  # the family's options: its config.json keys
        kwargs = families.get(model_type).from_hf({**d, **own})
        missed = sorted(k for k in own if not hasattr(kwargs.get("family_options"), k))
        if missed:
            raise ConfigError(f"unknown EncoderConfig field(s) {missed} (nor {model_type} options)")
        kwargs.update({k: v for k, v in overrides.items() if k in shared})
        return cls(**kwargs)

    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        d = families.get(self.model_type).to_hf(self)
        if architectures:
            d["architectures"] = list(architectures)
        return d


# config.json keys no family reads: written by transformers, or derived from the class.
_HF_BOOKKEEPING = ("architectures", "transformers_version", "torch_dtype")


def hf_fields(d: dict[str, Any], *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """EncoderConfig keyword arguments from a config.json dict `d`: model_type, every field
    config.json names as EncoderConfig does (Nones left out), and `extra`: the keys nli-jax does
    not read (neither those fields nor `skip`), kept for a faithful export."""
    names = {f.name for f in dataclasses.fields(EncoderConfig)} - {"extra", "family_options", *NLI_JAX_FIELDS,
                                                                     "model_type"}
    kwargs: dict[str, Any] = {"model_type": d["model_type"]}
    kwargs.update({name: d[name] for name in names if name in d and d[name] is not None})
    ignored = names | set(NLI_JAX_FIELDS) | {"model_type", *_HF_BOOKKEEPING, *skip}
    kwargs["extra"] = {k: v for k, v in d.items() if k not in ignored}
    return kwargs


def hf_common(config: EncoderConfig) -> dict[str, Any]:
    """The config.json fields every family writes alike, over the config's `extra`."""
    d: dict[str, Any] = dict(config.extra)
    d.update(
        model_type=config.model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        initializer_range=config.initializer_range,
        layer_norm_eps=config.layer_norm_eps,
        pad_token_id=config.pad_token_id,
        dtype="float32",
    )
    return d
