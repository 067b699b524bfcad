"""Heads on top of an `Encoder`: MLM (tied), NSP/SOP, sequence, token and multi-aspect classification."""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from nli_jax.models.config import EncoderConfig
from nli_jax.models import families
from nli_jax.models.encoder import EMBED, HIDDEN, VOCAB, Dropout, activation, dense, layer_norm, partitioned

LABELS = "labels"


def gather_positions(x, positions):
    """x[b, positions[b, p]] for every b, p: [batch, length, d] -> [batch, predictions, d]."""
    return jnp.take_along_axis(x, positions[:, :, None], axis=1)


class MaskedLMHead(nnx.Module):
    """transform (dense, act, LayerNorm) -> decoder tied to the word embeddings, + bias.

    With `positions` the logits are computed only at those positions: with at most 20
    predictions per sequence this skips most of the vocab-sized matmul.
    """

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        e = config.embed_dim
        self.transform = dense(config, config.hidden_size, e, (HIDDEN, EMBED), rngs=rngs)
        self.norm = layer_norm(config, e, EMBED, rngs=rngs)
        self.bias = nnx.Param(partitioned(nnx.initializers.zeros, VOCAB)(rngs.params(), (config.vocab_size,)))
        self.act = activation(config.hidden_act)

    def __call__(self, hidden, word_embeddings, positions=None):
        if positions is not None:
            hidden = gather_positions(hidden, positions)
        x = self.norm(self.act(self.transform(hidden)).astype(jnp.float32)).astype(self.config.compute_dtype)
        logits = jnp.einsum("...e,ve->...v", x, word_embeddings.astype(self.config.compute_dtype),
                            preferred_element_type=jnp.float32)
        return logits + self.bias[...]


class SentenceHead(nnx.Module):
    """Pooled output -> 2 classes: next-sentence (BERT) or sentence-order (ALBERT) prediction."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.classifier = dense(config, config.hidden_size, 2, (EMBED, LABELS), rngs=rngs)

    def __call__(self, pooled):
        return self.classifier(pooled).astype(jnp.float32)


class SequenceClassificationHead(nnx.Module):
    """BERT/ALBERT: dropout -> linear on the pooled [CLS].
    RoBERTa: dropout -> dense -> tanh -> dropout -> linear on <s> (its own pooler-like dense);
    ELECTRA the same with GELU instead of tanh (transformers' ElectraClassificationHead)."""

    def __init__(self, config: EncoderConfig, num_labels: int, *, rngs: nnx.Rngs):
        self.config = config
        self.dropout = Dropout(config.classifier_dropout_rate, rngs=rngs)
        own = not config.has_pooler
        self.dense = dense(config, config.hidden_size, config.hidden_size, (EMBED, HIDDEN), rngs=rngs) if own else None
        self.out = dense(config, config.hidden_size, num_labels, (EMBED, LABELS), rngs=rngs)
        self.act = activation(families.get(config.model_type).classifier_activation)

    def __call__(self, first, pooled, *, deterministic: bool):
        """first: each example's first-token hidden state (encoder.first_tokens); pooled: the pooler's output."""
        if self.dense is not None:
            x = self.dropout(first, deterministic=deterministic)
            x = self.act(self.dense(x))
        else:
            x = pooled
        x = self.dropout(x, deterministic=deterministic)
        return self.out(x).astype(jnp.float32)


class ReplacedTokenHead(nnx.Module):
    """ELECTRA's discriminator: dense -> activation -> one logit per token, "was this token
    replaced?" (transformers' ElectraDiscriminatorPredictions)."""

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.dense = dense(config, config.hidden_size, config.hidden_size, (EMBED, HIDDEN), rngs=rngs)
        self.prediction = dense(config, config.hidden_size, 1, (EMBED, LABELS), rngs=rngs)
        self.act = activation(config.hidden_act)

    def __call__(self, hidden):
        return self.prediction(self.act(self.dense(hidden)))[..., 0].astype(jnp.float32)


class TokenClassificationHead(nnx.Module):
    def __init__(self, config: EncoderConfig, num_labels: int, *, rngs: nnx.Rngs):
        self.dropout = Dropout(config.classifier_dropout_rate, rngs=rngs)
        self.out = dense(config, config.hidden_size, num_labels, (EMBED, LABELS), rngs=rngs)

    def __call__(self, hidden, *, deterministic: bool):
        return self.out(self.dropout(hidden, deterministic=deterministic)).astype(jnp.float32)


class MultiAspectHead(nnx.Module):
    """One softmax per aspect over the pooled output (CASA: 6 x 3, HoASA: 10 x 4).

    A single [hidden, aspects * labels] matrix, reshaped, so all aspects are one matmul.
    """

    def __init__(self, config: EncoderConfig, num_aspects: int, num_labels: int, *, rngs: nnx.Rngs):
        self.num_aspects, self.num_labels = num_aspects, num_labels
        self.dropout = Dropout(config.classifier_dropout_rate, rngs=rngs)
        self.out = dense(config, config.hidden_size, num_aspects * num_labels, (EMBED, LABELS), rngs=rngs)

    def __call__(self, pooled, *, deterministic: bool):
        logits = self.out(self.dropout(pooled, deterministic=deterministic)).astype(jnp.float32)
        return logits.reshape(*logits.shape[:-1], self.num_aspects, self.num_labels)
