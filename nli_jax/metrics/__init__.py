"""Metrics as the benchmarks define them."""
from nli_jax.metrics.classification import (accuracy, accuracy_by, accuracy_by_tag, precision_recall_f1,
                                            precision_recall_f1_by_label)
from nli_jax.metrics.sequence import chunks, conll_scores

__all__ = ["accuracy", "accuracy_by", "accuracy_by_tag", "precision_recall_f1", "precision_recall_f1_by_label",
           "chunks", "conll_scores"]
