"""The warmup-stable-decay schedule (nli_jax/schedules/wsd.py, configs/pretrain/crammed_wsd.py):
the rate at every step against the formula written out here, and a pretraining run of the config
whose logged learning rate follows it step by step."""
import json
import os
import signal
import subprocess
import sys
import time

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
    from nli_jax.planner import build_plan
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
    from nli_jax.planner import build_plan
    config = crammed_wsd.get_config("cpu_test")
    config.schedules.wsd.update(decay_shape="square", decay_fraction=0.0)
    with pytest.raises(ConfigValueError, match=r"schedules.wsd.decay_fraction must be > 0.*; "
                                               r"--config.schedules.wsd.decay_shape='square': .*must be one of"):
        build_plan(config, training=False)


def _pretrain(workdir, variant, *flags, popen=False):
    command = [sys.executable, "-m", "pretrain.main", f"--config=configs/pretrain/crammed_wsd.py:{variant}",
               f"--workdir={workdir}", f"--config.data.tfds_dir={workdir.parent / 'tfds'}", *flags]
    if popen:
        return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((workdir / "results.json").read_text())


def test_the_decay_alone_is_the_annealing_runs_schedule():
    from configs.pretrain import crammed_wsd
    from nli_jax.train.optimizers import learning_rate_schedule
    from nli_jax.planner import build_plan
    config = crammed_wsd.get_config("cpu_test,anneal")
    config.model.init = "/a/pre_decay/export"  # required by the variant; nothing is read
    plan = build_plan(config, training=False)
    assert plan.schedule.decay_only and plan.schedule.milestones(6, 0) == {} and plan.pretrain.continued
    rate = learning_rate_schedule(plan.optimizer, plan.schedule, total_steps=6, steps_per_epoch=6, warmup_steps=0)
    np.testing.assert_allclose([float(rate(s)) for s in range(7)], [1e-3 * (1 - np.sqrt(s / 6)) for s in range(7)],
                               rtol=1e-5, atol=1e-12)
    assert (plan.task_options.mask_prob, plan.task_options.heldout_mask_prob, plan.train.max_steps) == (0.05, 0.15, 6)


def test_a_run_of_the_recipe_logs_the_schedule_at_every_step_and_exports_its_pre_decay_parameters(tmp_path):
    workdir = tmp_path / "run"
    results = _pretrain(workdir, "cpu_test", "--config.train.max_steps=20", "--config.train.log_every_steps=1",
                        "--config.train.eval_every_steps=20", "--config.train.checkpoint_every_steps=20")
    logged = {row["step"]: row["train/lr"] for row in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
              if "train/lr" in row}
    # The step's rate is the schedule at the step's count before it (step s logs the rate of s - 1).
    want = {s: expected(s - 1, lr=1e-3, total=20, warmup=1, decay_fraction=0.1, shape="1-sqrt", final=0.0)
            for s in range(1, 21)}
    assert sorted(logged) == list(range(1, 21))
    np.testing.assert_allclose([logged[s] for s in want], list(want.values()), rtol=1e-5, atol=1e-12)
    assert json.loads((workdir / "config.json").read_text())["schedules"]["wsd"]["decay_shape"] == "1-sqrt"
    # The decay starts at step 18 of 20: its parameters are exported (and that step checkpointed).
    assert results["milestones"]["pre_decay"]["step"] == 18 and (workdir / "checkpoints" / "18").is_dir()
    assert (workdir / "pre_decay" / "model.safetensors").is_file()
    # An annealing run from them: the decay alone, logged step by step.
    anneal = _pretrain(tmp_path / "anneal", "cpu_test,anneal", f"--config.model.init={workdir / 'pre_decay'}",
                       "--config.train.log_every_steps=1")
    logged = {row["step"]: row["train/lr"] for row in map(json.loads, (tmp_path / "anneal" / "metrics.jsonl")
                                                          .read_text().splitlines()) if "train/lr" in row}
    assert anneal["steps"] == 6 and "milestones" not in anneal
    np.testing.assert_allclose([logged[s] for s in range(1, 7)], [1e-3 * (1 - np.sqrt((s - 1) / 6)) for s in range(1, 7)],
                               rtol=1e-5)


@pytest.mark.slow  # three annealing runs of the command line, about a minute on 2 cores
def test_a_killed_annealing_run_resumes_to_the_export_an_uninterrupted_one_writes(tmp_path):
    start = tmp_path / "start"
    _pretrain(start, "cpu_test", "--config.train.max_steps=10", "--config.train.eval_every_steps=10",
              "--config.train.checkpoint_every_steps=10")
    flags = (f"--config.model.init={start / 'pre_decay'}", "--config.train.max_steps=30",
             "--config.train.checkpoint_every_steps=5", "--config.train.eval_every_steps=1000")
    killed = tmp_path / "killed"
    proc = _pretrain(killed, "cpu_test,anneal", *flags, popen=True)
    root, deadline = killed / "checkpoints", time.time() + 300
    while time.time() < deadline:
        saved = [int(p) for p in os.listdir(root) if p.isdigit()] if root.is_dir() else []
        if saved and max(saved) >= 10:
            break
        if proc.poll() is not None:
            pytest.fail(f"run ended before it could be killed: {proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL and not (killed / "results.json").exists()
    resumed = _pretrain(killed, "cpu_test,anneal", *flags)
    assert "resumed from" in (killed / "train.log").read_text()
    reference = _pretrain(tmp_path / "reference", "cpu_test,anneal", *flags)
    assert resumed["steps"] == reference["steps"] == 30 and resumed["splits"] == reference["splits"]
    from safetensors.numpy import load_file
    a, b = (load_file(str(d / "export" / "model.safetensors")) for d in (killed, tmp_path / "reference"))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
