"""Losses shared by pretraining and fine-tuning. All return (sum of losses, sum of weights) so
gradient accumulation and multi-device reduction stay exact: the mean is taken once, at the end."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def weighted_cross_entropy(logits, labels, weights=None):
    """Softmax cross-entropy in float32. labels: int [...], weights: [...] (0 = ignore)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    if weights is None:
        weights = jnp.ones_like(losses)
    weights = weights.astype(jnp.float32)
    return jnp.sum(losses * weights), jnp.sum(weights)


def argmax_hits(logits, labels):
    """argmax(logits, -1) == labels (the first index of the largest value, as jnp.argmax picks it),
    computed without argmax: the label's logit is the row's largest and no earlier entry equals
    it. XLA:CPU runs argmax's (value, index) reduction one element at a time: over a 30k
    vocabulary it cost 8x the softmax cross-entropy and 17% of the crammed :cpu_learn MLM step
    (benchmarks.step_profile); these reductions vectorise. A label outside [0, V) is never hit; a
    row holding NaN hits nothing."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    target = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1, mode="fill",
                                 fill_value=jnp.nan)
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    tied_earlier = jnp.any((logits == top) & (index < labels[..., None]), axis=-1)
    # take_along_axis reads a negative label from the end: it names no index here.
    return (target[..., 0] == top[..., 0]) & ~tied_earlier & (labels >= 0)


def weighted_accuracy(logits, labels, weights=None):
    correct = argmax_hits(logits, labels).astype(jnp.float32)
    if weights is None:
        weights = jnp.ones_like(correct)
    weights = weights.astype(jnp.float32)
    return jnp.sum(correct * weights), jnp.sum(weights)

