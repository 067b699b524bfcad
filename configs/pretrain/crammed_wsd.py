"""The crammed recipe (configs/pretrain/crammed.py) with ModernBERT's warmup-stable-decay schedule
in place of the one-cycle triangle: a linear warmup over the first 5% of the run, the peak rate
held, then a 1-sqrt decay to 0 over the last 10% (nli_jax/schedules/wsd.py). The parameters at the
decay's start are exported to <workdir>/pre_decay/. Everything else is the parent's, variants
included (:cpu_test, :cpu_learn).

`anneal`: the decay alone, from a pre-decay export (model.init) on whatever corpus you give
(pretrain.corpus: another mixture, new languages), as ModernBERT's pre-decay checkpoints are meant
to be used: no warmup, the peak rate decayed over a tenth of the parent's steps (and budget),
masking at mmBERT's decay-phase rate (5%; papers.md), held-out masks at 15% so that the pre-decay
run and the annealing run are scored on the same question.

    python -m pretrain.main --config=configs/pretrain/crammed_wsd.py:cpu_test --workdir=/tmp/crammed_wsd
    python -m pretrain.main --config=configs/pretrain/crammed_wsd.py:cpu_test,anneal --workdir=/tmp/anneal \\
        --config.model.init=/tmp/crammed_wsd/pre_decay --config.pretrain.corpus="('/data/local/*.txt',)"
"""
from configs import recipes
from configs.pretrain import crammed

get_config = recipes.derive(
    crammed,
    {"optimizer.schedule": "wsd", "optimizer.warmup_ratio": 0.05, "schedules.wsd.decay_fraction": 0.1,
     "schedules.wsd.decay_shape": "1-sqrt", "schedules.wsd.final_fraction": 0.0},
    variants={"anneal": {
        "schedules.wsd.decay_only": True, "optimizer.warmup_ratio": 0.0, "optimizer.warmup_steps": 0,
        "pretrain.continued": True,  # model.init is required: the pre-decay export
        "train.max_steps": lambda c: max(1, c.train.max_steps // 10),
        "train.budget_minutes": lambda c: c.train.budget_minutes / 10,
        "task_options.mask_prob": 0.05, "task_options.heldout_mask_prob": 0.15,
    }},
    passes=("cpu_test", "cpu_learn"), name="configs/pretrain/crammed_wsd.py")
