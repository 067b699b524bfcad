"""Masked-LM inputs built on the fly from a segment pair (a new mask every epoch).

[CLS] A [SEP] B [SEP], then mask_prob (15%) of the tokens, at most max_predictions:
  - units are tokens, or whole words (a token and its following "##" pieces) with whole_word;
  - with max_ngram > 1 (ALBERT) a unit is an n-gram of n consecutive units, n drawn with
    p(n) ∝ 1/n for n = 1..max_ngram;
  - units are taken in random order, skipping one that would exceed the budget or overlap;
  - each chosen token becomes [MASK] 80%, itself 10%, a random token 10%.
Outputs have fixed shapes (max_seq_length, max_predictions): one compiled step on TPU.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    max_seq_length: int = 128
    max_predictions: int = 20
    mask_prob: float = 0.15
    whole_word: bool = False
    max_ngram: int = 1
    vocab_size: int = 30522
    cls_id: int = 2
    sep_id: int = 3
    mask_id: int = 4
    pad_id: int = 0
    random_token_low: int = 0  # random replacements are drawn from [low, vocab_size)

    def ngram_probabilities(self) -> np.ndarray:
        p = 1.0 / np.arange(1, self.max_ngram + 1)
        return p / p.sum()


def continuation_table(vocab: list[str]) -> np.ndarray:
    """is_continuation[id]: the token is a "##" piece (it continues the previous word)."""
    return np.asarray([t.startswith("##") for t in vocab], dtype=bool)


def mask_pair(a: np.ndarray, b: np.ndarray, label: int, rng: np.random.Generator, cfg: MaskingConfig,
              is_continuation: np.ndarray) -> dict:
    n_a, n_b = len(a), len(b)
    ids = np.empty(n_a + n_b + (3 if n_b else 2), np.int32)
    ids[0] = cfg.cls_id
    ids[1:1 + n_a] = a
    ids[1 + n_a] = cfg.sep_id
    if n_b:
        ids[2 + n_a:2 + n_a + n_b] = b
        ids[-1] = cfg.sep_id
    length = len(ids)
    types = np.zeros(length, np.int32)
    types[2 + n_a:] = 1

    # Candidate units: runs of positions (whole words, or single tokens).
    candidates = np.ones(length, bool)
    candidates[0] = candidates[1 + n_a] = candidates[length - 1] = False
    positions = np.flatnonzero(candidates)
    if cfg.whole_word:
        starts = ~is_continuation[ids[positions]]
        starts[0] = True
        # A segment boundary always starts a new word.
        if n_b:
            starts[positions == 2 + n_a] = True
        unit_of = np.cumsum(starts) - 1
    else:
        unit_of = np.arange(len(positions))
    n_units = int(unit_of[-1]) + 1 if len(positions) else 0
    unit_start = np.searchsorted(unit_of, np.arange(n_units + 1))  # unit u = positions[unit_start[u]:unit_start[u+1]]

    budget = min(cfg.max_predictions, max(1, int(round(length * cfg.mask_prob))))
    chosen = np.zeros(length, bool)
    taken = 0
    ngrams = rng.choice(np.arange(1, cfg.max_ngram + 1), size=n_units, p=cfg.ngram_probabilities()) \
        if cfg.max_ngram > 1 else np.ones(n_units, np.int64)
    for u in rng.permutation(n_units):
        if taken >= budget:
            break
        end_unit = min(n_units, u + int(ngrams[u]))
        span = positions[unit_start[u]:unit_start[end_unit]]
        if taken + len(span) > budget or chosen[span].any():
            continue
        chosen[span] = True
        taken += len(span)

    masked_positions = np.flatnonzero(chosen).astype(np.int32)
    masked_ids = ids[masked_positions].copy()
    r = rng.random(len(masked_positions))
    replaced = ids.copy()
    replaced[masked_positions[r < 0.8]] = cfg.mask_id
    random_slots = masked_positions[r >= 0.9]
    replaced[random_slots] = rng.integers(cfg.random_token_low, cfg.vocab_size, len(random_slots))

    L, P = cfg.max_seq_length, cfg.max_predictions
    if length > L:
        raise ValueError(f"segment pair of {length} tokens exceeds max_seq_length {L}")
    out = {"input_ids": np.full(L, cfg.pad_id, np.int32), "attention_mask": np.zeros(L, np.int32),
           "token_type_ids": np.zeros(L, np.int32), "masked_positions": np.zeros(P, np.int32),
           "masked_ids": np.zeros(P, np.int32), "masked_weights": np.zeros(P, np.float32),
           "sentence_label": np.int32(label)}
    out["input_ids"][:length] = replaced
    out["attention_mask"][:length] = 1
    out["token_type_ids"][:length] = types
    k = len(masked_positions)
    out["masked_positions"][:k] = masked_positions
    out["masked_ids"][:k] = masked_ids
    out["masked_weights"][:k] = 1.0
    return out
