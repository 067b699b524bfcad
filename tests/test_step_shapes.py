"""Packed training steps take few shapes, each compiled once and ahead of its first step.

What a user relies on: a run plans its packed step shapes from its batches before the first
step (data.compile_cost_tokens: a shape is compiled only when it saves more tokens than that);
a batch packed into a planned, larger shape gives the same outputs; the loop compiles its
train step once per planned shape (compiled ahead in threads, then reused by the steps, not
compiled again); and the plan changes which padding rows are computed, not the training.
"""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import config_for, encoded_rows, task_for
from nli_jax.data import pipeline
from nli_jax.models import ForSequenceClassification

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAD = (("input_ids", 0), ("attention_mask", 0), ("token_type_ids", 0))
BUCKETS = (32, 64, 128)


def _batches(count=60, size=16, seed=0):
    """Example lengths of `count` batches like a tagging or pair task's at length 128."""
    rng = np.random.default_rng(seed)
    return [np.minimum(rng.gamma(4.0, 13.0, size).astype(int) + 5, 128) for _ in range(count)]


def _tokens(plan):
    return sum(rows * length for rows, length in plan.per_step)


def test_planned_shapes_trade_padding_for_compilations():
    batches = _batches()
    own = [pipeline.packed_shape(b, groups=1, buckets=BUCKETS) for b in batches]
    unplanned = pipeline.plan_packed_shapes(batches, groups=1, buckets=BUCKETS, compile_cost_tokens=0)
    assert set(unplanned.shapes) == set(own) and list(unplanned.per_step) == own and unplanned.extra_tokens == 0
    assert len(unplanned.shapes) >= 4  # the case worth planning
    previous = None
    for cost in (512, 4096, 10 ** 9):
        plan = pipeline.plan_packed_shapes(batches, groups=1, buckets=BUCKETS, compile_cost_tokens=cost)
        # Every batch fits the shape it takes; the shapes are what the steps take.
        for lengths, shape in zip(batches, plan.per_step):
            rows, length = shape
            assert pipeline.packed_needs(lengths, groups=1, buckets=BUCKETS).get(length, rows + 1) <= rows
        assert set(plan.per_step) == set(plan.shapes)
        assert plan.extra_tokens == _tokens(plan) - _tokens(unplanned)
        # Each shape dropped saved a compilation at a cost of fewer tokens than one costs.
        assert _tokens(plan) + cost * len(plan.shapes) <= _tokens(unplanned) + cost * len(unplanned.shapes)
        if previous is not None:
            assert len(plan.shapes) <= len(previous.shapes)
        previous = plan
    assert len(previous.shapes) == 1  # compilations priced beyond any padding: one shape holds every batch
    assert previous.shapes[0] == (max(n for n, _ in own), 128)


def test_a_batch_takes_the_cheapest_planned_shape_that_holds_it_across_processes():
    """Batching.pack with planned shapes: the same shape and rows whether one process packs the
    global batch or two processes pack their halves from the global lengths."""
    lengths = np.random.default_rng(3).integers(5, 60, 32)
    rows = encoded_rows(lengths)
    shapes = ((12, 128), (6, 64), (16, 64))
    needs = pipeline.packed_needs(lengths, groups=4, buckets=BUCKETS)
    expected = min(((r, c) for r, c in shapes if needs.get(c, r + 1) <= r), key=lambda s: (s[0] * s[1], s[1]))
    batching = pipeline.Batching(buckets=BUCKETS, pad_values=PAD, packing_groups=4, packed_shapes=shapes)
    whole = batching.pack(rows)
    assert whole["input_ids"].shape == (4 * expected[0], expected[1])
    halves = [pipeline.Batching(buckets=BUCKETS, pad_values=PAD, packing_groups=2, packed_shapes=shapes).pack(
        rows[p * 16:(p + 1) * 16], global_lengths=lengths) for p in range(2)]
    for key in ("input_ids", "segment_ids", "position_ids", "cls_index"):
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])


def test_a_batch_in_a_larger_planned_shape_predicts_as_padded(minilm_dir):
    """Longer rows and more of them than the batch needs (a planned shape): the real checkpoint's
    outputs are those of the padded batch."""
    model = ForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, seed=0)
    task = task_for(config_for("indonli_large:cpu_test"))
    rows = encoded_rows([40, 7, 12, 30, 3, 60, 18, 9, 22, 5, 15, 33, 11, 2, 27, 8], vocab=30000)
    own = pipeline.packed_shape([len(r["input_ids"]) for r in rows], groups=2, buckets=BUCKETS)
    planned = ((own[0] + 3, 128),)
    packed = pipeline.Batching(buckets=BUCKETS, pad_values=PAD, packing_groups=2, packed_shapes=planned).pack(rows)
    assert packed["input_ids"].shape == (2 * (own[0] + 3), 128) and own[1] == 64
    padded = pipeline.Batching(buckets=BUCKETS, pad_values=PAD).pad(rows)

    def probabilities(batch):
        return task.predict(model, {k: jnp.asarray(v) for k, v in batch.items()})["probabilities"]

    np.testing.assert_allclose(probabilities(packed), probabilities(padded), atol=2e-6)


def _run(tmp_path, shared_data, minilm_dir, name, *overrides):
    data = tmp_path / "indonli"
    if not data.exists():
        data.mkdir()
        for file, n in (("train.jsonl", 320), ("val.jsonl", 64)):
            with open(shared_data / "indonli" / file, encoding="utf-8") as f:
                (data / file).write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    workdir = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "finetune.main", "--config=configs/indonli_base.py", f"--workdir={workdir}",
         f"--config.model.init={minilm_dir}", f"--config.data.source={data}", f"--config.data.tfds_dir={tmp_path / 'tfds'}",
         "--config.data.max_seq_length=128", "--config.train.batch_size=32", "--config.train.num_epochs=1",
         "--config.train.log_every_steps=1", "--config.optimizer.warmup_steps=2", "--config.eval_splits=('validation',)", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (workdir / "train.log").read_text()
    results = json.loads((workdir / "results.json").read_text())
    losses = [json.loads(line)["train/loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()
              if "train/loss" in line]
    return log, results, losses


def test_the_loop_compiles_its_train_step_once_per_planned_shape(shared_data, minilm_dir, tmp_path):
    """A real checkpoint on real IndoNLI pairs through finetune.main: the log names the planned shapes, and the train
    step was compiled exactly once for each (ahead, in threads: a step that compiled its shape
    again would count twice)."""
    log, results, _ = _run(tmp_path, shared_data, minilm_dir, "planned", "--config.data.compile_cost_tokens=1")
    line = next(x for x in log.splitlines() if "training steps:" in x)
    shapes = int(line.split("training steps: ")[1].split()[0])
    assert shapes >= 2, line  # several shapes: compiled side by side
    assert results["compilation"]["by_function"]["jit(train_step)"] == shapes, (line, results["compilation"])


@pytest.mark.slow  # two end-to-end runs: python -m pytest -m slow
def test_planning_shapes_changes_no_loss(shared_data, minilm_dir, tmp_path):
    """One shape for every step (compilations priced high) against every batch its own shape
    (planning off): the same losses step by step and the same validation predictions."""
    one_log, one, one_losses = _run(tmp_path, shared_data, minilm_dir, "one_shape", "--config.data.compile_cost_tokens=1000000000")
    own_log, own, own_losses = _run(tmp_path, shared_data, minilm_dir, "own_shapes", "--config.data.compile_cost_tokens=0")
    assert "training steps: 1 packed step shape(s)" in one_log and "training steps:" not in own_log
    assert one["compilation"]["by_function"]["jit(train_step)"] == 1 < own["compilation"]["by_function"]["jit(train_step)"]
    assert len(one_losses) == len(own_losses) == 10
    np.testing.assert_allclose(one_losses, own_losses, rtol=1e-5)
    assert one["splits"]["validation"]["accuracy"] == own["splits"]["validation"]["accuracy"]
