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

from configs import finetune_common
from configs.pretrain.common import pretrain_config

MASK_PROB = 0.3  # MosaicBERT's masking rate (papers.md)


def get_config(arg=None):
    options = finetune_common.parse_arg(arg)
    cpu_test = options.pop("cpu_test", False)
    cpu_learn = options.pop("cpu_learn", False)
    finetune_common.refuse_unknown_variants(options, ("cpu_test", "cpu_learn"))
    if cpu_test and cpu_learn:
        raise ValueError("crammed.py: give one of cpu_test and cpu_learn")
    c = pretrain_config("indobert-base", "cpu_learn" if cpu_learn else "cpu_test" if cpu_test else None)
    c.model.preset = "crammed-2layer-small" if cpu_learn else "tiny-crammed" if cpu_test else "crammed-base"
    # No dropout during pretraining (the preset has none; said here, where the recipe is read).
    c.model.overrides.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    c.pretrain.sentence_task = "none"
    if not (cpu_learn or cpu_test):
        c.data.max_seq_length = 128  # Cramming's length (pretrain_config's phase 1 has it too)
    c.task_options.mask_prob = MASK_PROB
    c.optimizer.update(name="adamw", lr=1e-3, b1=0.9, b2=0.98, eps=1e-12, weight_decay=0.01, grad_clip=0.5,
                       schedule="one_cycle", warmup_steps=0, warmup_ratio=0.0)
    c.schedules.one_cycle.update(start=0.25, peak=0.75)
    c.batch_ramp.update(max_accumulation=64, fraction=0.6)
    if cpu_learn:  # :cpu_learn's data, batch 64, model width and evaluation; 25 minutes
        c.train.update(budget_minutes=25.0, max_steps=1_000_000, eval_every_steps=1000, checkpoint_every_steps=1000)
        c.batch_ramp.update(max_accumulation=4)  # 64 -> 256 rows per update at 60% of the budget
    elif cpu_test:  # pretrain_config's :cpu_test (fixture corpus, 64 tokens, batch 16), 60 steps, no budget
        c.train.update(budget_minutes=0.0, max_steps=60, eval_every_steps=20, checkpoint_every_steps=20,
                       log_every_steps=10)
        c.batch_ramp.update(max_accumulation=2, fraction=0.5)  # 16 -> 32 rows per update
    else:  # micro-batches of 128 x 128 tokens, ramped to 8,192 rows (x 64) at 60% of a day
        c.train.update(batch_size=128, accumulation_steps=1, budget_minutes=1440.0, max_steps=10_000_000,
                       eval_every_steps=10_000, checkpoint_every_steps=5_000, log_every_steps=100)
    # 30% of the tokens, all of which can be predicted (the masking rule's cap at or above it).
    c.task_options.max_predictions = int(math.ceil(MASK_PROB * c.data.max_seq_length))
    return c
