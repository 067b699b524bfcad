"""nli-jax: JAX/Flax NNX encoders, pretraining and fine-tuning for Indonesian and low-resource NLU."""
from nli_jax.checkpoints import CheckpointError, load_tokenizer
from nli_jax.models import (ConfigError, EncoderConfig, EncoderModel, ForMaskedLM, ForMultiAspectClassification,
                            ForSequenceClassification, ForTokenClassification, count_parameters, preset)

__version__ = "0.1.0"
__all__ = ["CheckpointError", "ConfigError", "EncoderConfig", "EncoderModel", "ForMaskedLM", "ForMultiAspectClassification",
           "ForSequenceClassification", "ForTokenClassification", "count_parameters", "from_pretrained", "load_tokenizer",
           "preset"]


def from_pretrained(path: str, *, task: str = "encoder", **kwargs):
    """Loads a Hugging Face model directory (or hub id) as an nli-jax model.

    task: "encoder", "masked_lm", "pretraining" (MLM + NSP/SOP), "sequence_classification",
    "token_classification" or "multi_aspect_classification". Save with `model.save_pretrained(path,
    tokenizer=..., label_names=...)`.
    """
    classes = {"encoder": EncoderModel, "masked_lm": ForMaskedLM, "sequence_classification": ForSequenceClassification,
               "token_classification": ForTokenClassification,
               "multi_aspect_classification": ForMultiAspectClassification}
    if task == "pretraining":
        return ForMaskedLM.from_pretrained(path, sentence_head=True, **kwargs)
    if task not in classes:
        raise ConfigError(f"unknown task {task!r}; expected one of {sorted(classes) + ['pretraining']}")
    return classes[task].from_pretrained(path, **kwargs)
