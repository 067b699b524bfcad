"""The crammed recipe (configs/pretrain/crammed.py) with ModernBERT's warmup-stable-decay schedule
in place of the one-cycle triangle: a linear warmup over the first 5% of the run, the peak rate
held, then a 1-sqrt decay to 0 over the last 10% (nli_jax/schedules/wsd.py). Everything else is
the parent's, variants included (:cpu_test, :cpu_learn).

    python -m pretrain.main --config=configs/pretrain/crammed_wsd.py:cpu_test --workdir=/tmp/crammed_wsd
"""
from configs.pretrain import crammed


def get_config(arg=None):
    c = crammed.get_config(arg)
    c.optimizer.update(schedule="wsd", warmup_ratio=0.05)
    c.schedules.wsd.update(decay_fraction=0.1, decay_shape="1-sqrt", final_fraction=0.0)
    return c
