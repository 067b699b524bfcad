"""The BERT-like families: BERT, ALBERT, RoBERTa, XLM-R and ELECTRA, one `Encoder`
(nli_jax/models/encoder.py) whose differences are their Family fields (ALBERT's layers shared
across depth: AlbertOptions and its layer schedule; RoBERTa's positions; ELECTRA's head
activation) and factorised embeddings (embedding_size). Here: their options, config.json fields
and Hugging Face parameter names, registered with nli_jax.models.families.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from nli_jax.checkpoints import hf
from nli_jax.models import families
from nli_jax.models.config import ConfigError, EncoderConfig, hf_common, hf_fields
from nli_jax.models.encoder import Encoder


# --- ALBERT's own options --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AlbertOptions:
    """ALBERT's config.json fields beyond EncoderConfig's (its `family_options`): layers shared
    across depth, `num_hidden_groups` groups of `inner_group_num` layers each."""
    num_hidden_groups: int = 1
    inner_group_num: int = 1


ALBERT_OPTION_KEYS = tuple(f.name for f in dataclasses.fields(AlbertOptions))


def albert_options(config: EncoderConfig) -> AlbertOptions:
    options = config.family_options or AlbertOptions()
    if not isinstance(options, AlbertOptions):
        raise ConfigError(f"an albert EncoderConfig's family_options must be AlbertOptions, not "
                          f"{type(options).__name__}")
    return options


def albert_layer_schedule(config: EncoderConfig) -> tuple[int, ...]:
    """Depth i runs every inner layer of group i // (num_hidden_layers // num_hidden_groups),
    exactly as Hugging Face's AlbertTransformer does."""
    o = albert_options(config)
    if o.num_hidden_groups < 1 or o.inner_group_num < 1 or config.num_hidden_layers % o.num_hidden_groups:
        raise ConfigError(f"num_hidden_layers {config.num_hidden_layers} is not divisible by num_hidden_groups "
                          f"{o.num_hidden_groups} (inner_group_num {o.inner_group_num}: at least 1)")
    per_group = config.num_hidden_layers // o.num_hidden_groups
    return tuple(depth // per_group * o.inner_group_num + j
                 for depth in range(config.num_hidden_layers) for j in range(o.inner_group_num))


# --- config.json ---------------------------------------------------------------------------

def from_hf(d: dict[str, Any]) -> dict[str, Any]:
    model_type = d["model_type"]
    kwargs = hf_fields(d, skip=("classifier_dropout_prob", "position_embedding_type", *ALBERT_OPTION_KEYS))
    if model_type == "albert":
        kwargs.setdefault("classifier_dropout", d.get("classifier_dropout_prob"))
        kwargs.setdefault("hidden_act", "gelu_new")  # HF AlbertConfig default
        kwargs["family_options"] = AlbertOptions(**{k: d[k] for k in ALBERT_OPTION_KEYS if d.get(k) is not None})
    if model_type not in ("albert", "electra"):
        kwargs.pop("embedding_size", None)
    if model_type in ("xlm-roberta", "roberta"):
        kwargs.setdefault("pad_token_id", 1)
        kwargs.setdefault("layer_norm_eps", 1e-5)
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"position_embedding_type {d['position_embedding_type']!r} is not supported (only 'absolute')")
    return kwargs


def to_hf(config: EncoderConfig) -> dict[str, Any]:
    d = hf_common(config)
    d["position_embedding_type"] = "absolute"
    if (config.model_type == "albert"):
        d.update(embedding_size=config.embed_dim, **dataclasses.asdict(albert_options(config)),
                 classifier_dropout_prob=config.classifier_dropout_rate)
    else:
        d["classifier_dropout"] = config.classifier_dropout
    if (config.model_type == "electra"):
        d["embedding_size"] = config.embed_dim
    return d


# --- parameter names -----------------------------------------------------------------------

def encoder_name(config: EncoderConfig, rest: tuple) -> tuple[str, int]:
    """HF name (without the base-model prefix) and input-axis count for an encoder path."""
    leaf = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}[rest[-1]]
    kernel_in = 1 if rest[-1] == "kernel" else 0
    head = rest[0]
    if head == "embeddings":
        table = {"word": "word_embeddings", "position": "position_embeddings",
                 "token_type": "token_type_embeddings", "norm": "LayerNorm"}[rest[1]]
        return f"embeddings.{table}.{leaf}", 0
    if head == "embedding_projection":
        if (config.model_type == "electra"):
            return f"embeddings_project.{leaf}", kernel_in
        return f"encoder.embedding_hidden_mapping_in.{leaf}", kernel_in
    if head == "pooler":
        return (f"pooler.{leaf}" if (config.model_type == "albert") else f"pooler.dense.{leaf}"), kernel_in
    assert head == "layers", rest
    index, module = rest[1], rest[2:-1]
    if (config.model_type == "albert"):
        group, inner = divmod(index, albert_options(config).inner_group_num)
        base = f"encoder.albert_layer_groups.{group}.albert_layers.{inner}."
        sub = {("attention", "query"): "attention.query", ("attention", "key"): "attention.key",
               ("attention", "value"): "attention.value", ("attention", "output"): "attention.dense",
               ("attention_norm",): "attention.LayerNorm", ("mlp_in",): "ffn", ("mlp_out",): "ffn_output",
               ("mlp_norm",): "full_layer_layer_norm"}[module]
    else:
        base = f"encoder.layer.{index}."
        sub = {("attention", "query"): "attention.self.query", ("attention", "key"): "attention.self.key",
               ("attention", "value"): "attention.self.value", ("attention", "output"): "attention.output.dense",
               ("attention_norm",): "attention.output.LayerNorm", ("mlp_in",): "intermediate.dense",
               ("mlp_out",): "output.dense", ("mlp_norm",): "output.LayerNorm"}[module]
    if module == ("attention", "output") and kernel_in:
        kernel_in = 2  # [heads, kv, embed]
    return base + sub + "." + leaf, kernel_in


def head_name(config: EncoderConfig, model, rest: tuple) -> str:
    """HF name of a head parameter, as transformers' task classes name it."""
    t = config.model_type
    leaf = {"kernel": "weight", "bias": "bias", "scale": "weight"}[rest[-1]]
    if rest[0] == "mlm":
        if rest == ("mlm", "bias"):
            return {"bert": "cls.predictions.bias", "albert": "predictions.bias",
                    "electra": "generator_lm_head.bias"}.get(t, "lm_head.bias")
        module = rest[1]
        if t == "electra":
            return {"transform": "generator_predictions.dense", "norm": "generator_predictions.LayerNorm"}[module] + "." + leaf
        if t == "bert":
            return {"transform": "cls.predictions.transform.dense", "norm": "cls.predictions.transform.LayerNorm"}[module] + "." + leaf
        if t == "albert":
            return {"transform": "predictions.dense", "norm": "predictions.LayerNorm"}[module] + "." + leaf
        return {"transform": "lm_head.dense", "norm": "lm_head.layer_norm"}[module] + "." + leaf
    if rest[0] == "sentence":
        if t == "bert":
            return f"cls.seq_relationship.{leaf}"
        if t == "albert":
            return f"sop_classifier.classifier.{leaf}"
        raise hf.CheckpointError(f"{t} has no next-sentence/sentence-order head in transformers")
    if rest[0] == "discriminator":
        return {"dense": "discriminator_predictions.dense",
                "prediction": "discriminator_predictions.dense_prediction"}[rest[1]] + "." + leaf
    if rest[0] == "classifier":
        if model.hf_roberta_classifier and not config.has_pooler:
            return {"dense": "classifier.dense", "out": "classifier.out_proj"}[rest[1]] + "." + leaf
        return f"classifier.{leaf}"
    raise KeyError(rest)


# --- the families --------------------------------------------------------------------------

_BASE_MODEL_KEYS = ("embeddings.", "embeddings_project.", "encoder.", "pooler.")
for _model_type, _hf_prefix, _base_model_prefix in (("bert", "Bert", "bert"), ("albert", "Albert", "albert"),
                                                    ("xlm-roberta", "XLMRoberta", "roberta"),
                                                    ("roberta", "Roberta", "roberta"), ("electra", "Electra", "electra")):
    # RoBERTa and ELECTRA classify from the first token with a head of their own; ELECTRA's base
    # model has no pooler.
    families.register(families.Family(
        model_type=_model_type, hf_prefix=_hf_prefix, base_model_prefix=_base_model_prefix, encoder=Encoder,
        from_hf=from_hf, to_hf=to_hf, encoder_name=encoder_name, head_name=head_name,
        base_model_keys=_BASE_MODEL_KEYS, base_pooler=_model_type != "electra",
        classifier_pooler=_model_type not in ("xlm-roberta", "roberta", "electra"),
        layer_schedule=albert_layer_schedule if _model_type == "albert" else None,
        positions_after_padding=_model_type in ("xlm-roberta", "roberta"),
        classifier_activation="gelu" if _model_type == "electra" else "tanh",
        sentence_head=_model_type not in ("xlm-roberta", "roberta")))
