"""Hugging Face model directories as files (config.json, weights, tokenizer). The models map
weights onto themselves with nli_jax.models.pretrained."""
from nli_jax.checkpoints.hf import CheckpointError, load_tokenizer, read_config, read_weights, resolve_directory

__all__ = ["CheckpointError", "load_tokenizer", "read_config", "read_weights", "resolve_directory"]
