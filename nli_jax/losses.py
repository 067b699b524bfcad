"""Losses shared by pretraining and fine-tuning. All return (sum of losses, sum of weights) so
gradient accumulation and multi-device reduction stay exact: the mean is taken once, at the end."""
from __future__ import annotations

import jax.numpy as jnp
import optax


def weighted_cross_entropy(logits, labels, weights=None):
    """Softmax cross-entropy in float32. labels: int [...], weights: [...] (0 = ignore)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    if weights is None:
        weights = jnp.ones_like(losses)
    weights = weights.astype(jnp.float32)
    return jnp.sum(losses * weights), jnp.sum(weights)


def weighted_accuracy(logits, labels, weights=None):
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    if weights is None:
        weights = jnp.ones_like(correct)
    weights = weights.astype(jnp.float32)
    return jnp.sum(correct * weights), jnp.sum(weights)

