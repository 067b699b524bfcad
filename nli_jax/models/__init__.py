"""Flax NNX encoders (BERT, ALBERT, XLM-R) and their heads."""
from nli_jax.models.config import ConfigError, EncoderConfig
from nli_jax.models.encoder import Encoder
from nli_jax.models.models import (EncoderModel, ForMaskedLM, ForMultiAspectClassification, ForSequenceClassification,
                                   ForTokenClassification, PretrainedModel)
from nli_jax.models.presets import PAPER_PARAMETER_COUNTS, PRESETS, preset

__all__ = ["ConfigError", "EncoderConfig", "Encoder", "EncoderModel", "ForMaskedLM", "ForMultiAspectClassification",
           "ForSequenceClassification", "ForTokenClassification", "PretrainedModel", "PAPER_PARAMETER_COUNTS",
           "PRESETS", "preset", "count_parameters", "make_rngs"]


def make_rngs(seed: int):
    """Rngs for building and training a model: threefry for parameter init, and an "rbg" key
    (XLA's RngBitGenerator) for dropout, whose threefry bits cost ~20% of a BERT-base training
    step on CPU. rbg streams are deterministic for a given backend, so resumes stay exact."""
    import jax
    from flax import nnx
    return nnx.Rngs(params=seed, dropout=jax.random.key(seed, impl="rbg"))


def count_parameters(model) -> int:
    import jax
    from flax import nnx
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
