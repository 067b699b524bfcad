"""Pretraining from a Hugging Face checkpoint (phase 2, or continued pretraining of any BERT or
ALBERT model): which vocabulary the examples are tokenised with, and what the task can continue.

The model itself is built by the shared path (`from_pretrained`): the checkpoint's config.json
gives the shape, its MLM head (BERT `cls.predictions.*`, ALBERT `predictions.*`) is loaded when
present and otherwise initialised as BERT does, the decoder tied to the word embeddings.
"""
from __future__ import annotations

import os

from nli_jax import storage
from nli_jax.checkpoints.hf import CONFIG_NAME, read_config, resolve_directory
from nli_jax.errors import RunError
from nli_jax.plan import ModelPlan

# Families whose MLM and sentence heads transformers' *ForPreTraining classes name as ours do.
CONTINUABLE_MODEL_TYPES = ("bert", "albert")


def vocabulary_dir(model: ModelPlan) -> str:
    """The directory whose vocab.txt tokenises the corpus: model.tokenizer, else model.init's
    (the checkpoint's own tokenizer). Empty when neither is set."""
    path = model.tokenizer_path
    return resolve_directory(path) if path else ""


def check_checkpoint(model: ModelPlan, building_examples: bool, model_types=CONTINUABLE_MODEL_TYPES,
                     objective: str = "MLM with an NSP/SOP head, exported as *ForPreTraining") -> None:
    """Refuses, before examples are built or weights read, a model.init pretraining cannot
    continue: a model_type other than the objective's (`model_types`: BERT/ALBERT for MLM,
    ELECTRA for replaced-token detection), or (when the examples are built from the corpus
    here) a tokenizer without the WordPiece vocab.txt the example builder reads."""
    init = model.init
    if not init:
        return
    directory = resolve_directory(init)
    model_type = read_config(directory).get("model_type")
    if model_type not in model_types:
        raise RunError(f"--config.model.init={init!r}: {storage.origin(os.path.join(directory, CONFIG_NAME))} has model_type "
                       f"{model_type!r}; pretraining continues only {' or '.join(model_types)} checkpoints "
                       f"({objective})")
    if building_examples:
        vocab_dir = vocabulary_dir(model)
        if not os.path.isfile(os.path.join(vocab_dir, "vocab.txt")):
            key = "tokenizer" if model.tokenizer else "init"
            found = sorted(os.listdir(vocab_dir)) if os.path.isdir(vocab_dir) else []
            raise RunError(f"--config.model.{key}={getattr(model, key)!r}: {storage.origin(vocab_dir)} has no vocab.txt (found "
                           f"{found or 'nothing'}): the corpus is tokenised into examples with a WordPiece vocab.txt, "
                           "as BERT and IndoBERT checkpoints ship it; SentencePiece-only tokenizers are not supported")
