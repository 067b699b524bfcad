"""Model families: what a config.json `model_type` means to nli-jax, in one table.

A family is one module of nli_jax/models/ that builds its encoder, maps its config.json and its
Hugging Face parameter names, and calls `register(Family(...))` once per model_type when it is
imported (nli_jax/models/bert.py: bert, albert, roberta, xlm-roberta, electra;
nli_jax/models/deberta.py: deberta-v2). The package nli_jax.models imports every family module,
so the table is full before any model is built. The task models (models.py), EncoderConfig's
config.json I/O (config.py) and checkpoint naming (pretrained.py) ask this table; none of them
names a model_type. A new family is its module, one import line in nli_jax/models/__init__.py,
and configs.

`Family` fields (plain values and functions):

  model_type          config.json's "model_type" (the key)
  hf_prefix           transformers' class prefix: hf_prefix + "ForSequenceClassification", ...
  base_model_prefix   transformers' base_model_prefix: task classes save the encoder's weights as
                      "<base_model_prefix>.embeddings...", base-model classes without it
  encoder             the encoder class, built as encoder(config, *, add_pooler, rngs). Its
                      __call__(input_ids, attention_mask=None, token_type_ids=None, *,
                      deterministic=True, packing=None) returns (hidden [rows, length, hidden],
                      pooled [examples, hidden] or None without a pooler). `packing` (the
                      {segment_ids, position_ids, cls_index} of nli_jax.tasks.common.packing_fields)
                      holds several examples per row: each attends to itself only, its positions
                      are position_ids, and pooled has one row per example (encoder.first_tokens;
                      token outputs are read back per example by encoder.example_tokens). The
                      module has `config`, `embeddings.word` (an nnx.Embed: the MLM decoder is tied
                      to it), `embeddings` (its parameters are not per-token FLOPs), `layers` and
                      `schedule` (as Encoder's), and attention_flops_per_token(length).
  from_hf(d)          config.json dict -> EncoderConfig keyword arguments (config.hf_fields does
                      the fields every family shares; the family's own go in `family_options`, a
                      frozen dataclass of its own, compared and hashed with the config; what
                      nli-jax does not use goes in `extra`, written back on export)
  to_hf(config)       EncoderConfig -> config.json dict (without "architectures")
  encoder_name(config, path) -> (name, input axes)
                      the Hugging Face name of an encoder parameter (path: its nnx path inside the
                      encoder, a scanned encoder's layers one by one) without the base-model
                      prefix, and how many leading axes of our kernel are input axes (0 for
                      embeddings, biases and norms; Linear weights are [out, in] in transformers;
                      REVERSED: transformers' layout is ours with every axis reversed, as a
                      convolution's [out, in, width] against our [width, in, out])
  head_name(config, model, path) -> name
                      the Hugging Face name of a head parameter (path: its nnx path in the task
                      model), as transformers' task classes name it
  base_model_keys     name prefixes of the base model's own weights, which the task classes
                      save under base_model_prefix (a DeBERTa ContextPooler's "pooler." is not)
  head_keys           name prefixes of transformers' task heads of this family besides the
                      common ones (pretrained._HEAD_PREFIXES): unused, not unexpected, when a
                      checkpoint of another head loads
  unused_keys         a regular expression of checkpoint names the family's models never use
                      (buffers, tied copies); None for none beyond the common ones
  base_pooler         whether the base model (EncoderModel's default) has a pooler
  classifier_pooler   whether sequence classification reads the encoder's pooled output
                      (BERT's pooler, DeBERTa's ContextPooler) rather than the first token through
                      a dense layer of the head's own (RoBERTa, ELECTRA)
  heads               head classes the family replaces, by role ("masked_lm", "sequence",
                      "token", "multi_aspect"), built with the default head's arguments
                      (nli_jax.models.heads); empty: the defaults
  layer_schedule      config -> which unique layer runs at each depth, for a family whose layers
                      are shared across depth (ALBERT); it raises ConfigError for a config its
                      options cannot schedule. None: one layer per depth (and model.scan_layers
                      may scan them)
  positions_after_padding
                      whether positions count from pad_token_id + 1 and padding tokens take the
                      padding index (RoBERTa, XLM-R), rather than from 0
  classifier_activation
                      the activation of the classification head's own dense layer (a family
                      without classifier_pooler): "tanh", or ELECTRA's "gelu"
  sentence_head       whether transformers has a pretraining class with BERT's sentence (NSP)
                      head for the family (RoBERTa and XLM-R have none)
  tokenizer_ids       config.json keys of special-token ids that transformers' config class
                      defaults to its own vocabulary's (ModernBERT: cls 50281, sep 50282), each
                      with the tokenizer attribute that gives it: an export with a tokenizer
                      writes them when the config does not carry them (a model built from scratch)
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping

from nli_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    hf_prefix: str
    base_model_prefix: str
    encoder: type
    from_hf: Callable[[dict], dict]
    to_hf: Callable[[Any], dict]
    encoder_name: Callable[[Any, tuple], tuple[str, int]]
    head_name: Callable[[Any, Any, tuple], str]
    base_model_keys: tuple[str, ...] = ("embeddings.", "encoder.", "pooler.")
    head_keys: tuple[str, ...] = ()
    unused_keys: re.Pattern | None = None
    base_pooler: bool = True
    classifier_pooler: bool = True
    heads: Mapping[str, type] = dataclasses.field(default_factory=dict)
    tokenizer_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)
    layer_schedule: Callable[[Any], tuple[int, ...]] | None = None
    positions_after_padding: bool = False
    classifier_activation: str = "tanh"
    sentence_head: bool = True

    def in_base_model(self, name: str) -> bool:
        """Whether a Hugging Face weight name (without prefix) belongs to the base model."""
        return name.startswith(self.base_model_keys)


REVERSED = -1  # encoder_name's input-axes value for a kernel stored with every axis reversed

_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.model_type in _FAMILIES:
        raise ValueError(f"model_type {family.model_type!r} is registered twice")
    _FAMILIES[family.model_type] = family
    return family


def model_types() -> tuple[str, ...]:
    return tuple(_FAMILIES)


def get(model_type: str) -> Family:
    if model_type not in _FAMILIES:
        raise ConfigError(f"unknown model_type {model_type!r}; expected one of {model_types()}")
    return _FAMILIES[model_type]


def encoder_classes() -> tuple[type, ...]:
    """Every family's encoder class (each once)."""
    return tuple(dict.fromkeys(f.encoder for f in _FAMILIES.values()))
