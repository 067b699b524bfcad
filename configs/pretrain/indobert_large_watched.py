"""indobert-large pretraining (configs/pretrain/indobert_large.py, every variant) with its layers
watched: each layer's parameter and gradient norms in TensorBoard every 100 steps, and loss
spikes (a step's loss above 3x the median of the 100 before it) logged and counted in
results.json (nli_jax/hooks/layer_norms.py). For the large model's instabilities: a spike's step
and the layer whose gradient norm jumped with it.

    python -m pretrain.main --config=configs/pretrain/indobert_large_watched.py:phase=1 --workdir=runs/large_p1
"""
from configs import recipes
from configs.pretrain import indobert_large

get_config = recipes.derive(indobert_large, {"hooks.layer_norms.enabled": True, "hooks.layer_norms.every_steps": 100,
                                             "hooks.layer_norms.spike_factor": 3.0, "hooks.layer_norms.window": 100},
                            name="configs/pretrain/indobert_large_watched.py")
