"""The crammed recipe (configs/pretrain/crammed.py) with ModernBERT's warmup-stable-decay schedule
in place of the one-cycle triangle: a linear warmup over the first 5% of the run, the peak rate
held, then a 1-sqrt decay to 0 over the last 10% (nli_jax/schedules/wsd.py). Everything else is
the parent's, variants included (:cpu_test, :cpu_learn).

    python -m pretrain.main --config=configs/pretrain/crammed_wsd.py:cpu_test --workdir=/tmp/crammed_wsd
"""
from configs import recipes
from configs.pretrain import crammed

get_config = recipes.derive(crammed, {"optimizer.schedule": "wsd", "optimizer.warmup_ratio": 0.05,
                                      "schedules.wsd.decay_fraction": 0.1, "schedules.wsd.decay_shape": "1-sqrt",
                                      "schedules.wsd.final_fraction": 0.0}, name="configs/pretrain/crammed_wsd.py")
