"""Flax NNX encoders (BERT, ALBERT, XLM-R, ELECTRA, ...) and their heads."""
# Every model family module registers its model_types (nli_jax.models.families) when imported:
# all of them are imported here, before anything builds a model.
import jax

from flax import nnx

from nli_jax.models import bert  # noqa: F401  (registers bert, albert, roberta, xlm-roberta, electra)
from nli_jax.models import deberta  # noqa: F401  (registers deberta-v2)
from nli_jax.models import modernbert  # noqa: F401  (registers modernbert)
from nli_jax.models.config import ConfigError, EncoderConfig
from nli_jax.models.encoder import Encoder, make_rngs
from nli_jax.models.models import (EncoderModel, ForMaskedLM, ForMultiAspectClassification, ForSequenceClassification,
                                   ForTokenClassification)
from nli_jax.models.pretrained import PretrainedModel
from nli_jax.models.presets import PAPER_PARAMETER_COUNTS, PRESETS, preset

__all__ = ["ConfigError", "EncoderConfig", "Encoder", "EncoderModel", "ForMaskedLM", "ForMultiAspectClassification",
           "ForSequenceClassification", "ForTokenClassification", "PretrainedModel", "PAPER_PARAMETER_COUNTS",
           "PRESETS", "preset", "count_parameters", "make_rngs"]


def count_parameters(model) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
