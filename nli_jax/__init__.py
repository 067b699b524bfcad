"""nli-jax: JAX/Flax NNX encoders, pretraining and fine-tuning for Indonesian and low-resource NLU.

The public names below are imported on first use (PEP 562), not with the package: a command
line tool imports nli_jax.cli first and may re-execute its interpreter before anything
else runs (nli_jax.cli.host_memory), and importing JAX and Flax here would cost every CPU run
that second ~1 s of imports.
"""
from __future__ import annotations

import importlib

from nli_jax.cli import platforms as _platforms

# As the command lines do: on a machine without TPU chips, JAX is not let try libtpu (installed by
# the README's install), whose failed start-up prints about ten lines to stderr.
_platforms.skip_absent_tpu()

__version__ = "0.1.0"
_EXPORTS = {"CheckpointError": "nli_jax.checkpoints", "load_tokenizer": "nli_jax.checkpoints",
            **{name: "nli_jax.models" for name in (
                "ConfigError", "EncoderConfig", "EncoderModel", "ForMaskedLM", "ForMultiAspectClassification",
                "ForSequenceClassification", "ForTokenClassification", "count_parameters", "preset")}}
__all__ = sorted([*_EXPORTS, "from_pretrained"])


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'nli_jax' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])


def from_pretrained(path: str, *, task: str = "encoder", **kwargs):
    """Loads a Hugging Face model directory (or hub id) as an nli-jax model.

    task: "encoder", "masked_lm", "pretraining" (MLM + NSP/SOP), "sequence_classification",
    "token_classification" or "multi_aspect_classification". Save with `model.save_pretrained(path,
    tokenizer=..., label_names=...)`.
    """
    # late: JAX and Flax, not for `import nli_jax` (the module's docstring)
    from nli_jax.models import (ConfigError, EncoderModel, ForMaskedLM, ForMultiAspectClassification,
                                ForSequenceClassification, ForTokenClassification)
    classes = {"encoder": EncoderModel, "masked_lm": ForMaskedLM, "sequence_classification": ForSequenceClassification,
               "token_classification": ForTokenClassification,
               "multi_aspect_classification": ForMultiAspectClassification}
    if task == "pretraining":
        return ForMaskedLM.from_pretrained(path, sentence_head=True, **kwargs)
    if task not in classes:
        raise ConfigError(f"unknown task {task!r}; expected one of {sorted(classes) + ['pretraining']}")
    return classes[task].from_pretrained(path, **kwargs)
