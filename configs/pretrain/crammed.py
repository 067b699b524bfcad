"""The crammed recipe: Cramming's (Geiping & Goldstein, 2022) and MosaicBERT's (Portes et al., 2023)
lessons as a config of the masked-LM objective (nli_jax/tasks/pretraining.py), on a ModernBERT-shaped
model (nli_jax/models/modernbert.py's crammed-* presets) that exports as transformers'
ModernBertForMaskedLM.

Model (the preset's family fields): pre-LayerNorm, GeGLU feed-forward, no biases (attention,
feed-forward, norms, decoder), rotary positions, every layer global, the decoder tied to the
token embeddings; no dropout in pretraining (model.overrides, set here). Objective: MLM loss at
the masked positions only, no sentence task, 30% of the tokens masked (MosaicBERT; 80/10/10
replacement), sequence 128. Training (the papers' numbers, /work/shared/reference/papers.md, and
Cramming's published bert-o4 recipe): AdamW at 1e-3 (decay 0.01, not on norms), a one-cycle
(triangle) schedule over the run (optimizer.schedule "one_cycle", Cramming's budget-triangle2: from
a quarter of the peak rate, schedules.one_cycle.start, up to the peak at schedules.one_cycle.peak =
75% of the run, then down to 0; no warmup beside it), the batch ramped by
accumulation (batch_ramp.max_accumulation micro-batches per update, reached at
batch_ramp.fraction of the run: 128 x 64 = 8,192 at 60%), gradient clipping at 0.5, and a
wall-clock budget (train.budget_minutes: Cramming's day, 1,440 minutes) over which the schedule and
the ramp are laid (nli_jax/train/budget.py).

    python -m pretrain.main --config=configs/pretrain/crammed.py --workdir=runs/crammed \\
        --config.model.tokenizer=VOCAB_DIR --config.pretrain.corpus="('/data/corpus/*.txt',)"
    python -m pretrain.main --config=configs/pretrain/crammed.py:cpu_test --workdir=/tmp/crammed
    python -m pretrain.main --config=configs/pretrain/crammed.py:cpu_learn --workdir=runs/crammed_cpu \\
        --config.model.tokenizer=VOCAB_DIR --config.pretrain.corpus="('/data/id_corpus_sample/*.txt',)"

:cpu_learn is configs/pretrain/indobert_base.py:cpu_learn's run (the same data, 32-token segments,
batch 64, 2 x 128 model, the same vocabulary) with this recipe's choices: the comparison of issue 41
(benchmarks/experiments/crammed_vs_bert.py).
"""
import math

from configs import recipes
from configs.pretrain import indobert_base

MASK_PROB = 0.3  # MosaicBERT's masking rate (papers.md)

get_config = recipes.derive(
    indobert_base,  # its corpus, examples and evaluation; everything the recipe changes is below
    {
        # No dropout during pretraining (the presets have none; said here, where the recipe is read).
        "model.overrides.hidden_dropout_prob": 0.0, "model.overrides.attention_probs_dropout_prob": 0.0,
        "pretrain.sentence_task": "none",
        "task_options.mask_prob": MASK_PROB,
        "optimizer.name": "adamw", "optimizer.lr": 1e-3, "optimizer.b1": 0.9, "optimizer.b2": 0.98,
        "optimizer.eps": 1e-12, "optimizer.weight_decay": 0.01, "optimizer.grad_clip": 0.5,
        "optimizer.schedule": "one_cycle", "optimizer.warmup_steps": 0, "optimizer.warmup_ratio": 0.0,
        "schedules.one_cycle.start": 0.25, "schedules.one_cycle.peak": 0.75,
        "batch_ramp.max_accumulation": 64, "batch_ramp.fraction": 0.6,
    },
    variants={
        # :cpu_learn's data, batch 64, model width and evaluation; 25 minutes, 64 -> 256 rows per update at
        # 60% of the budget.
        "cpu_learn": {"model.preset": "crammed-2layer-small", "train.budget_minutes": 25.0, "train.max_steps": 1_000_000,
                      "train.eval_every_steps": 1000, "train.checkpoint_every_steps": 1000,
                      "batch_ramp.max_accumulation": 4},
        # The parent's :cpu_test (fixture corpus, 64 tokens, batch 16), 60 steps, no budget; 16 -> 32 rows per update.
        "cpu_test": {"model.preset": "tiny-crammed", "train.budget_minutes": 0.0, "train.max_steps": 60,
                     "train.eval_every_steps": 20, "train.checkpoint_every_steps": 20, "train.log_every_steps": 10,
                     "batch_ramp.max_accumulation": 2, "batch_ramp.fraction": 0.5},
    },
    # Micro-batches of 128 x 128 tokens (Cramming's length, the parent's phase 1), ramped to 8,192 rows
    # (x 64) at 60% of a day.
    default={"model.preset": "crammed-base", "train.batch_size": 128, "train.accumulation_steps": 1,
             "train.budget_minutes": 1440.0, "train.max_steps": 10_000_000, "train.eval_every_steps": 10_000,
             "train.checkpoint_every_steps": 5_000, "train.log_every_steps": 100},
    # 30% of the tokens, all of which can be predicted (the masking rule's cap at or above it).
    derived={"task_options.max_predictions": lambda c: int(math.ceil(MASK_PROB * c.data.max_seq_length))},
    passes=("cpu_test", "cpu_learn"), name="configs/pretrain/crammed.py")
