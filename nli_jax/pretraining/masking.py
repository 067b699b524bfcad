"""Masked-LM batches built on the fly from segment pairs (new masks every epoch), vectorised
over the batch: the pipeline's per-example work is only decoding a record.

A `MaskingRule` is the data of a masking scheme; an objective picks one (or builds a new one
with its own span-length distribution). For each row [CLS] A [SEP] B [SEP], mask_prob (15%) of
its tokens, at most max_predictions:
  - units are tokens, or whole words (a token and its following "##" pieces: unit="word");
  - a span is n consecutive units, n drawn per unit from `span_lengths` (p(n), n = 1, 2, ...):
    (1.0,) for BERT's token masking, p(n) ∝ 1/n up to 3 for ALBERT's n-grams
    (`ngram_span_lengths`), a clipped geometric distribution for SpanBERT's spans;
  - spans are tried in random order, skipping one that would exceed the budget or overlap
    (the greedy rule of BERT's and ALBERT's create_pretraining_data), all rows at once;
  - each chosen token becomes [MASK], itself or a random token in the proportions of
    `replacement` (BERT's 80% / 10% / 10%).
Random numbers are drawn for the whole global batch and sliced, so the masks of a global batch
do not depend on how many processes share it. Shapes are fixed: one compiled step.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class MaskingRule:
    """What a masked-LM batch masks, as data: the unit (token or whole word), the distribution of
    span lengths in units, the share and cap of predictions, and what a chosen token becomes."""
    unit: str = "token"  # "token" | "word" (a token and its following "##" pieces)
    span_lengths: tuple[float, ...] = (1.0,)  # p(span of n units), n = 1 .. len(span_lengths)
    mask_prob: float = 0.15
    max_predictions: int = 20
    replacement: tuple[float, float, float] = (0.8, 0.1, 0.1)  # [MASK], the token itself, a random token
    random_token_low: int = 0  # random replacements are drawn from [low, vocab_size)

    def __post_init__(self):
        if self.unit not in ("token", "word"):
            raise ValueError(f"masking unit must be 'token' or 'word', got {self.unit!r}")
        if not self.span_lengths or min(self.span_lengths) < 0 or not np.isclose(sum(self.span_lengths), 1.0):
            raise ValueError(f"span_lengths must be probabilities summing to 1, got {self.span_lengths}")
        if len(self.replacement) != 3 or min(self.replacement) < 0 or not np.isclose(sum(self.replacement), 1.0):
            raise ValueError(f"replacement must be 3 proportions summing to 1, got {self.replacement}")

    @property
    def max_span(self) -> int:
        return len(self.span_lengths)

    def mean_span(self) -> float:
        return float(np.dot(np.arange(1, self.max_span + 1), self.span_lengths))


def ngram_span_lengths(max_ngram: int) -> tuple[float, ...]:
    """ALBERT's n-gram masking: p(n) ∝ 1/n, n = 1 .. max_ngram ((1.0,): BERT's single units)."""
    p = 1.0 / np.arange(1, max_ngram + 1)
    return tuple(float(x) for x in p / p.sum())


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """A masking rule with what it needs of the vocabulary and the sequence length."""
    rule: MaskingRule = MaskingRule()
    max_seq_length: int = 128
    vocab_size: int = 30522
    cls_id: int = 2
    sep_id: int = 3
    mask_id: int = 4
    pad_id: int = 0


def continuation_table(vocab: list[str]) -> np.ndarray:
    """is_continuation[id]: the token is a "##" piece (it continues the previous word)."""
    return np.asarray([t.startswith("##") for t in vocab], dtype=bool)


def assemble(rows: list[dict], cfg: MaskingConfig):
    """[CLS] A [SEP] B [SEP] for every row: ids, token types, candidate mask, B's start."""
    B, L = len(rows), cfg.max_seq_length
    ids = np.full((B, L), cfg.pad_id, np.int32)
    types = np.zeros((B, L), np.int32)
    lengths = np.zeros(B, np.int32)
    b_start = np.full(B, L, np.int32)
    for r, row in enumerate(rows):
        a, b = row["a"], row["b"]
        n_a, n_b = len(a), len(b)
        n = n_a + n_b + (3 if n_b else 2)
        if n > L:
            raise ValueError(f"segment pair of {n} tokens exceeds max_seq_length {L}")
        ids[r, 0] = cfg.cls_id
        ids[r, 1:1 + n_a] = a
        ids[r, 1 + n_a] = cfg.sep_id
        if n_b:
            ids[r, 2 + n_a:2 + n_a + n_b] = b
            ids[r, n - 1] = cfg.sep_id
            types[r, 2 + n_a:n] = 1
            b_start[r] = 2 + n_a
        lengths[r] = n
    positions = np.arange(L)[None, :]
    candidates = (positions < lengths[:, None]) & (ids != cfg.cls_id) & (ids != cfg.sep_id)
    return ids, types, lengths, candidates, b_start


def mask_batch(rows: list[dict], rng: np.random.Generator, cfg: MaskingConfig, is_continuation: np.ndarray, *,
               row_offset: int = 0, global_rows: int | None = None, return_spans: bool = False) -> dict:
    """rows: dicts with token arrays "a", "b" and "label" (+ "idx", "weight" passed through)."""
    rule = cfg.rule
    B, L, P, N = len(rows), cfg.max_seq_length, rule.max_predictions, rule.max_span
    G = global_rows or B
    ids, types, lengths, cand, b_start = assemble(rows, cfg)
    positions = np.arange(L)[None, :]

    # Units: a new unit starts at every candidate token (or, for whole words, at every candidate
    # that is not a "##" piece, and at the start of each segment).
    if rule.unit == "word":
        previous_cand = np.concatenate([np.zeros((B, 1), bool), cand[:, :-1]], axis=1)
        starts = cand & (~is_continuation[ids] | ~previous_cand | (positions == b_start[:, None]))
    else:
        starts = cand
    unit_count = starts.sum(1)
    U = L
    # first_pos[r, u]: token position where unit u starts; for u >= unit_count (and in the extra
    # last column) one past the last candidate, so a span ending at the last unit is closed.
    order = np.argsort(~starts, axis=1, kind="stable")
    end_of_candidates = (np.where(cand, positions, -1).max(1) + 1).astype(np.int32)
    first_pos = np.where(np.arange(U)[None, :] < unit_count[:, None], order, end_of_candidates[:, None])
    first_pos = np.concatenate([first_pos, end_of_candidates[:, None]], axis=1).astype(np.int32)

    # Global draws, sliced to this process's rows.
    rows_slice = slice(row_offset, row_offset + B)
    priority = rng.random((G, U))[rows_slice]
    ngram = (rng.choice(np.arange(1, N + 1), size=(G, U), p=np.asarray(rule.span_lengths))[rows_slice]
             if N > 1 else np.ones((B, U), np.int64))
    replace_draw = rng.random((G, P))[rows_slice]
    random_tokens = rng.integers(rule.random_token_low, cfg.vocab_size, (G, P))[rows_slice]

    priority = np.where(np.arange(U)[None, :] < unit_count[:, None], priority, np.inf)
    visit = np.argsort(priority, axis=1)  # random order of each row's units
    budget = np.minimum(P, np.maximum(1, np.round(lengths * rule.mask_prob).astype(np.int64)))
    # Per iteration only O(batch) work: spans are runs of units, their token counts come from
    # prefix sums of the candidates, and overlap is checked on the (at most max_ngram) units.
    cumulative = np.concatenate([np.zeros((B, 1), np.int64), np.cumsum(cand, axis=1)], axis=1)
    chosen_units = np.zeros((B, U + N), bool)
    taken = np.zeros(B, np.int64)
    accepted_ngrams = []
    rows_index = np.arange(B)
    for t in range(int(unit_count.max(initial=0))):
        active = (t < unit_count) & (taken < budget)
        if not active.any():
            break
        u = visit[:, t]
        end_unit = np.minimum(unit_count, u + ngram[rows_index, u])
        size = cumulative[rows_index, first_pos[rows_index, end_unit]] - cumulative[rows_index, first_pos[rows_index, u]]
        overlap = np.zeros(B, bool)
        for j in range(N):
            overlap |= (u + j < end_unit) & chosen_units[rows_index, u + j]
        ok = active & (taken + size <= budget) & ~overlap
        for j in range(N):
            take = ok & (u + j < end_unit)
            chosen_units[rows_index[take], (u + j)[take]] = True
        taken += size * ok
        if return_spans:  # per try t and row: the accepted span's length in units, 0 if none
            accepted_ngrams.append(np.where(ok, end_unit - u, 0))
    unit_of = np.maximum(np.cumsum(starts, axis=1) - 1, 0)
    chosen = cand & np.take_along_axis(chosen_units, unit_of, axis=1)

    # Up to P chosen positions per row, in order; then [MASK] / same / random (80/10/10 for BERT).
    masked_positions = np.argsort(~chosen, axis=1, kind="stable")[:, :P].astype(np.int32)
    valid = np.arange(P)[None, :] < chosen.sum(1)[:, None]
    masked_positions = np.where(valid, masked_positions, 0)
    masked_ids = np.where(valid, np.take_along_axis(ids, masked_positions, axis=1), 0).astype(np.int32)
    inputs = ids.copy()
    to_mask = valid & (replace_draw < rule.replacement[0])
    to_random = valid & (replace_draw >= rule.replacement[0] + rule.replacement[1])
    r_idx = np.broadcast_to(rows_index[:, None], (B, P))
    inputs[r_idx[to_mask], masked_positions[to_mask]] = cfg.mask_id
    inputs[r_idx[to_random], masked_positions[to_random]] = random_tokens[to_random]

    out = {"input_ids": inputs, "attention_mask": (positions < lengths[:, None]).astype(np.int32),
           "token_type_ids": types, "masked_positions": masked_positions, "masked_ids": masked_ids,
           "masked_weights": valid.astype(np.float32),
           "sentence_label": np.asarray([r["label"] for r in rows], np.int32),
           "idx": np.asarray([r.get("idx", -1) for r in rows], np.int32),
           "weight": np.asarray([r.get("weight", 1.0) for r in rows], np.float32)}
    if return_spans:
        out["accepted_ngrams"] = np.stack(accepted_ngrams) if accepted_ngrams else np.zeros((0, B), np.int64)
    return out


@dataclasses.dataclass(frozen=True)
class MaskedBatching:
    """Segment pairs -> masked-LM batches: the pretraining task's batching (the members of
    nli_jax.data.pipeline.Batching). Training batches draw their random numbers for the global
    batch (`global_rows`) and keep this process's rows (`row_offset`); evaluation batches are
    masked on their own rows."""
    config: MaskingConfig
    is_continuation: np.ndarray = dataclasses.field(compare=False)
    row_offset: int
    global_rows: int
    evaluation_config: MaskingConfig  # the held-out masking (task_options.heldout_mask_prob)
    random = True
    bucketed = False  # one fixed shape
    needs_global_lengths = False
    packing_groups = 0  # segment pairs fill their rows: nothing to pack
    eval_packing_groups = 0

    def training(self, rows, *, global_lengths=None, rng=None) -> dict:
        return mask_batch(rows, rng, self.config, self.is_continuation, row_offset=self.row_offset,
                          global_rows=self.global_rows)

    def evaluation(self, rows, *, min_length: int = 0, rng=None) -> dict:
        return mask_batch(rows, rng, self.evaluation_config, self.is_continuation)
