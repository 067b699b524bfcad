"""Model shapes from the IndoNLU paper (Tables 2 and 20), plus tiny shapes for CPU tests.

Vocabulary sizes are the paper's (30,522 BERT, 30,000 ALBERT). The hub's IndoBERT-base
checkpoints use a 50,000 vocabulary; a checkpoint's config.json always wins over a preset.
"""
from __future__ import annotations

import dataclasses

from nli_jax.models.bert import AlbertOptions
from nli_jax.models.config import ConfigError, EncoderConfig
from nli_jax.models.deberta import DebertaOptions

_BERT = dict(model_type="bert", hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
             max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02, vocab_size=30522)
_ALBERT = dict(model_type="albert", hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02, vocab_size=30000,
               embedding_size=128, family_options=AlbertOptions(), classifier_dropout=0.1)

_ELECTRA = dict(model_type="electra", hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02, vocab_size=30522)

# DeBERTa-v3's attention (mDeBERTa-v3-base's config.json): relative positions in 256 log buckets,
# keys shared with the content, no absolute positions, no token types.
_DEBERTA_V3 = dict(model_type="deberta-v2", hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                   max_position_embeddings=512, type_vocab_size=0, initializer_range=0.02, layer_norm_eps=1e-7,
                   family_options=DebertaOptions(relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
                                                 share_att_key=True, pos_att_type=("p2c", "c2p"),
                                                 position_biased_input=False))

PRESETS: dict[str, dict] = {
    "indobert-base": dict(_BERT, num_hidden_layers=12, num_attention_heads=12, hidden_size=768, intermediate_size=3072),
    "indobert-large": dict(_BERT, num_hidden_layers=24, num_attention_heads=16, hidden_size=1024, intermediate_size=4096),
    "indobert-lite-base": dict(_ALBERT, num_hidden_layers=12, num_attention_heads=12, hidden_size=768,
                               intermediate_size=3072),
    "indobert-lite-large": dict(_ALBERT, num_hidden_layers=24, num_attention_heads=16, hidden_size=1024,
                                intermediate_size=4096),
    # The IndoNLU paper's from-scratch baseline: 2 layers of BERT-base width.
    "scratch-2layer": dict(_BERT, num_hidden_layers=2, num_attention_heads=12, hidden_size=768, intermediate_size=3072),
    # A small BERT for pretraining experiments on one CPU machine (benchmarks/experiments/pretrain_id_corpus.py).
    "small-bert": dict(_BERT, num_hidden_layers=4, num_attention_heads=4, hidden_size=256, intermediate_size=1024),
    # The scratch baseline's depth at a width one CPU machine can train on all 12 IndoNLU tasks.
    "scratch-2layer-small": dict(_BERT, num_hidden_layers=2, num_attention_heads=4, hidden_size=256,
                                 intermediate_size=1024),
    # ELECTRA's discriminators (Clark et al., 2020, Table 6); the base shape with a 30,522 vocabulary.
    "electra-small": dict(_ELECTRA, num_hidden_layers=12, num_attention_heads=4, hidden_size=256,
                          intermediate_size=1024, embedding_size=128),
    "electra-base": dict(_ELECTRA, num_hidden_layers=12, num_attention_heads=12, hidden_size=768,
                         intermediate_size=3072, embedding_size=768),
    # Tiny shapes for CPU tests and the cpu_test configs.
    "tiny-bert": dict(_BERT, num_hidden_layers=2, num_attention_heads=2, hidden_size=64, intermediate_size=128,
                      vocab_size=1000, max_position_embeddings=128),
    # tiny-bert with 4 heads of 16, so that tensor:4 shards the attention heads (mesh tests).
    "tiny-bert-4heads": dict(_BERT, num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128,
                             vocab_size=1000, max_position_embeddings=128),
    "tiny-electra": dict(_ELECTRA, num_hidden_layers=2, num_attention_heads=2, hidden_size=64, intermediate_size=128,
                         embedding_size=32, vocab_size=1000, max_position_embeddings=128),
    "tiny-albert": dict(_ALBERT, num_hidden_layers=2, num_attention_heads=2, hidden_size=64, intermediate_size=128,
                        embedding_size=32, vocab_size=1000, max_position_embeddings=128),
    # DeBERTa-v3's attention at tiny-bert-4heads' shape (configs/indonli_mdeberta.py:cpu_test); 32
    # buckets, so that its 64-token rows reach the log-bucketed distances.
    "tiny-deberta-v3": dict(_DEBERTA_V3, num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                            intermediate_size=128, vocab_size=1000, max_position_embeddings=128,
                            family_options=dataclasses.replace(_DEBERTA_V3["family_options"], position_buckets=32)),
}

# Parameter counts reported by the IndoNLU paper (Table 2).
PAPER_PARAMETER_COUNTS = {"indobert-base": 124.5e6, "indobert-large": 335.2e6,
                          "indobert-lite-base": 11.7e6, "indobert-lite-large": 17.7e6}


def preset(name: str, **overrides) -> EncoderConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    base = dict(PRESETS[name])
    shared = {f.name for f in dataclasses.fields(EncoderConfig)}
    own = {k: overrides.pop(k) for k in list(overrides) if k not in shared}  # the family's options
    if own:
        options = overrides.get("family_options", base.get("family_options"))
        missed = sorted(k for k in own if not (dataclasses.is_dataclass(options) and hasattr(options, k)))
        if missed:
            raise ConfigError(f"unknown EncoderConfig field(s) {missed} (nor options of preset {name!r}'s family)")
        overrides["family_options"] = dataclasses.replace(options, **own)
    return EncoderConfig(**{**base, **overrides})


# The config.json shapes of the hub checkpoints nli-jax's configs name, as their model cards
# publish them: `launch.compile` compiles a fine-tuning run for a TPU topology from these without
# hub access. A run always reads the checkpoint's own config.json.
_HF_BERT = dict(model_type="bert", hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2,
                layer_norm_eps=1e-12, pad_token_id=0)
_HF_BASE = dict(num_hidden_layers=12, num_attention_heads=12, hidden_size=768, intermediate_size=3072)
_HF_LARGE = dict(num_hidden_layers=24, num_attention_heads=16, hidden_size=1024, intermediate_size=4096)
_HF_ALBERT = dict(model_type="albert", hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2,
                  embedding_size=128, num_hidden_groups=1, inner_group_num=1, vocab_size=30000, pad_token_id=0)
_HF_XLMR = dict(model_type="xlm-roberta", hidden_act="gelu", max_position_embeddings=514, type_vocab_size=1,
                layer_norm_eps=1e-5, pad_token_id=1, vocab_size=250002)
PUBLISHED_SHAPES: dict[str, dict] = {
    "indobenchmark/indobert-large-p2": dict(_HF_BERT, **_HF_LARGE, vocab_size=30522),
    "indobenchmark/indobert-base-p2": dict(_HF_BERT, **_HF_BASE, vocab_size=50000),
    "indobenchmark/indobert-base-p1": dict(_HF_BERT, **_HF_BASE, vocab_size=50000),
    "indobenchmark/indobert-lite-large-p2": dict(_HF_ALBERT, **_HF_LARGE),
    "indobenchmark/indobert-lite-base-p2": dict(_HF_ALBERT, **_HF_BASE),
    "FacebookAI/xlm-roberta-large": dict(_HF_XLMR, **_HF_LARGE),
    "FacebookAI/xlm-roberta-base": dict(_HF_XLMR, **_HF_BASE),
    "hfl/chinese-roberta-wwm-ext-large": dict(_HF_BERT, **_HF_LARGE, vocab_size=21128),
    "google-bert/bert-base-chinese": dict(_HF_BERT, **_HF_BASE, vocab_size=21128),
    "dccuchile/bert-base-spanish-wwm-cased": dict(_HF_BERT, **_HF_BASE, vocab_size=31002),
    "google-bert/bert-base-multilingual-cased": dict(_HF_BERT, **_HF_BASE, vocab_size=119547),
    "google-bert/bert-base-multilingual-uncased": dict(_HF_BERT, **_HF_BASE, vocab_size=105879),
    "microsoft/mdeberta-v3-base": dict(_HF_BASE, model_type="deberta-v2", hidden_act="gelu", vocab_size=251000,
                                       max_position_embeddings=512, relative_attention=True, position_buckets=256,
                                       norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                                       layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False,
                                       type_vocab_size=0),
}
