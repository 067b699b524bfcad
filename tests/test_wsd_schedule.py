"""The warmup-stable-decay schedule (nli_jax/schedules/wsd.py, configs/pretrain/crammed_wsd.py):
the rate at every step against the formula written out here, and a pretraining run of the config
whose logged learning rate follows it step by step."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO


def expected(step, *, lr, total, warmup, decay_fraction, shape, final):
    """ModernBERT's trapezoid, written from its definition: 0 -> lr over the warmup, lr, then the
    decay's shape over the last decay_fraction of the run down to final x lr."""
    if step < warmup:
        return lr * step / warmup
    start = max(warmup, total - round(decay_fraction * total))
    if step < start:
        return lr
    p = min(1.0, (step - start) / max(1, total - start))
    value = {"linear": 1 - p, "cosine": (1 + np.cos(np.pi * p)) / 2, "1-sqrt": 1 - np.sqrt(p)}[shape]
    return lr * (final + (1 - final) * value)


@pytest.mark.parametrize("shape,final,warmup", [("1-sqrt", 0.0, 10), ("cosine", 0.1, 0), ("linear", 0.0, 37)])
def test_the_rate_at_every_step_is_the_trapezoid(shape, final, warmup):
    from configs.pretrain import crammed_wsd
    from nli_jax.train.optimizers import learning_rate_schedule
    from nli_jax.train.planner import build_plan
    config = crammed_wsd.get_config("cpu_test")
    config.schedules.wsd.update(decay_shape=shape, final_fraction=final, decay_fraction=0.25)
    plan = build_plan(config, training=False)
    assert (plan.optimizer.schedule, plan.schedule.decay_shape) == ("wsd", shape)
    rate = learning_rate_schedule(plan.optimizer, plan.schedule, total_steps=400, steps_per_epoch=10,
                                  warmup_steps=warmup)
    got = np.array([float(rate(s)) for s in range(401)])
    want = np.array([expected(s, lr=1e-3, total=400, warmup=warmup, decay_fraction=0.25, shape=shape, final=final)
                     for s in range(401)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)  # float32 rates
    assert plan.schedule.decay_start(400, warmup) == 300 and got[299] == pytest.approx(1e-3)  # the pre-decay step


def test_its_options_are_checked_where_they_are_declared():
    from configs.pretrain import crammed_wsd
    from nli_jax.errors import ConfigValueError
    from nli_jax.train.planner import build_plan
    config = crammed_wsd.get_config("cpu_test")
    config.schedules.wsd.update(decay_shape="square", decay_fraction=0.0)
    with pytest.raises(ConfigValueError, match=r"schedules.wsd.decay_fraction must be > 0.*; "
                                               r"--config.schedules.wsd.decay_shape='square': .*must be one of"):
        build_plan(config, training=False)


def test_a_run_of_the_recipe_logs_the_schedule_at_every_step(tmp_path):
    workdir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pretrain.main", "--config=configs/pretrain/crammed_wsd.py:cpu_test",
                           f"--workdir={workdir}", "--config.train.max_steps=20", "--config.train.log_every_steps=1",
                           "--config.train.eval_every_steps=20", "--config.train.checkpoint_every_steps=20",
                           f"--config.data.tfds_dir={tmp_path / 'tfds'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = {row["step"]: row["train/lr"] for row in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
              if "train/lr" in row}
    # The step's rate is the schedule at the step's count before it (step s logs the rate of s - 1).
    want = {s: expected(s - 1, lr=1e-3, total=20, warmup=1, decay_fraction=0.1, shape="1-sqrt", final=0.0)
            for s in range(1, 21)}
    assert sorted(logged) == list(range(1, 21))
    np.testing.assert_allclose([logged[s] for s in want], list(want.values()), rtol=1e-5, atol=1e-12)
    assert json.loads((workdir / "config.json").read_text())["schedules"]["wsd"]["decay_shape"] == "1-sqrt"
