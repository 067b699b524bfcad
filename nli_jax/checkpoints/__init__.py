"""Hugging Face checkpoint import/export."""
from nli_jax.checkpoints.hf import (CheckpointError, from_pretrained, load_tokenizer, load_weights, read_config,
                                    save_pretrained, state_dict)

__all__ = ["CheckpointError", "from_pretrained", "load_tokenizer", "load_weights", "read_config", "save_pretrained",
           "state_dict"]
