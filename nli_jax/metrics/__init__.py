"""Metrics as the benchmarks define them."""
from nli_jax.metrics.classification import accuracy, accuracy_by, accuracy_by_tag

__all__ = ["accuracy", "accuracy_by", "accuracy_by_tag"]
