"""Packed training batches (data.packing): several examples per row, each attending to itself.

What a user relies on: a packed batch trains exactly as the padded one (same logits, loss and
update through the loop's jitted step, real checkpoint, to float32 summation tolerance); every
example is in the batch once, its first token where `cls_index` says; processes agree on shapes
with no communication; the command line packs and computes on fewer tokens.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import config_for, encoded_rows, optimizer_plan, task_for
from nli_jax.data import pipeline
from nli_jax.models import ForMultiAspectClassification, ForSequenceClassification, make_rngs, preset
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.steps import make_train_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAD = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}
BUCKETS = (16, 32, 64)


def _batching(groups=1, pad=PAD):
    return pipeline.Batching(buckets=BUCKETS, pad_values=tuple(pad.items()), packing_groups=groups)


def test_first_fit_decreasing_keeps_every_item_once_within_capacity():
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 65, rng.integers(1, 40))
        bins = pipeline.first_fit_decreasing(lengths, 64)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
        # first fit decreasing uses at most 11/9 OPT + 1 bins; OPT >= total / capacity
        assert len(bins) <= 11 / 9 * np.ceil(lengths.sum() / 64) + 1


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_pack_batch_places_every_example_once_with_its_own_positions(groups):
    lengths = [40, 7, 12, 30, 3, 64, 18, 9, 22, 5, 15, 33, 11, 2, 27, 8]
    rows = encoded_rows(lengths)
    batch = _batching(groups).pack(rows)
    rows_total, length = batch["input_ids"].shape
    assert length == 64 and rows_total % groups == 0 and rows_total < len(rows)
    per_group = len(rows) // groups
    flat = {k: batch[k].reshape(groups, -1) for k in ("input_ids", "token_type_ids", "segment_ids", "position_ids",
                                                        "attention_mask")}
    for e, row in enumerate(rows):
        g, start = e // per_group, int(batch["cls_index"][e // per_group, e % per_group])
        n = len(row["input_ids"])
        assert start % length + n <= length  # inside one row
        np.testing.assert_array_equal(flat["input_ids"][g, start:start + n], row["input_ids"])
        np.testing.assert_array_equal(flat["token_type_ids"][g, start:start + n], row["token_type_ids"])
        np.testing.assert_array_equal(flat["position_ids"][g, start:start + n], np.arange(n))
        segment = flat["segment_ids"][g, start]
        assert segment > 0 and (flat["segment_ids"][g, start:start + n] == segment).all()
    # Nothing else is real; per-example fields stay in example order.
    assert batch["attention_mask"].sum() == (batch["segment_ids"] > 0).sum() == sum(lengths)
    np.testing.assert_array_equal(batch["idx"], np.arange(len(rows)))
    np.testing.assert_array_equal(batch["weight"], [r["weight"] for r in rows])


def test_processes_agree_on_the_packed_shape_from_the_global_lengths():
    lengths = np.random.default_rng(3).integers(5, 60, 32)
    rows = encoded_rows(lengths)
    whole = _batching(4).pack(rows)
    # Two processes, two groups each: the same shapes, and together the same rows.
    halves = [_batching(2).pack(rows[p * 16:(p + 1) * 16], global_lengths=lengths) for p in range(2)]
    assert halves[0]["input_ids"].shape == halves[1]["input_ids"].shape
    for key in ("input_ids", "segment_ids", "position_ids", "cls_index"):
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])


def test_row_counts_come_in_a_few_sizes():
    """Rows are rounded up to an eighth of the batch: a handful of compiled shapes per bucket."""
    rng = np.random.default_rng(0)
    shapes = {pipeline.packed_shape(rng.integers(20, 128, 32), groups=1, buckets=(32, 64, 128))
              for _ in range(200)}
    assert all(rows % 4 == 0 for rows, _ in shapes) and len(shapes) <= 4


INDONLI = task_for(config_for("indonli_large:cpu_test"))


def _padded(rows):
    return _batching().pad(rows)


@pytest.fixture(scope="module")
def minilm_classifier(minilm_dir):
    return ForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, seed=0)


def _logits(model, batch):
    return INDONLI.predict(model, {k: jnp.asarray(v) for k, v in batch.items()})["probabilities"]


def test_packed_logits_equal_the_padded_ones_on_a_real_checkpoint(minilm_classifier):
    rows = encoded_rows([40, 7, 12, 30, 3, 64, 18, 9, 22, 5, 15, 33, 11, 2, 27, 8], vocab=30000)
    packed = _batching(2).pack(rows)
    np.testing.assert_allclose(_logits(minilm_classifier, packed), _logits(minilm_classifier, _padded(rows)),
                               atol=2e-6)


@pytest.mark.parametrize("family", ["roberta", "multi_aspect"])
def test_packed_outputs_equal_the_padded_ones(family):
    """RoBERTa numbers positions from pad + 1 and pools <s> in its head; multi-aspect heads
    read the pooler."""
    rows = encoded_rows([20, 5, 31, 9, 14, 3, 26, 12])
    if family == "roberta":
        config = preset("tiny-bert", model_type="xlm-roberta", pad_token_id=1, max_position_embeddings=80,
                        type_vocab_size=1)
        model = ForSequenceClassification(config, num_labels=3, rngs=make_rngs(0))
        for r in rows:
            r["token_type_ids"][:] = 0
        pad = dict(PAD, input_ids=1)
    else:
        model = ForMultiAspectClassification(preset("tiny-bert"), num_aspects=4, num_labels=3, rngs=make_rngs(0))
        pad = PAD
    packed = _batching(1, pad).pack(rows)
    padded = _batching(1, pad).pad(rows)
    assert packed["input_ids"].shape[0] < len(rows)
    run = lambda b: model(jnp.asarray(b["input_ids"]), jnp.asarray(b["attention_mask"]),
                          jnp.asarray(b["token_type_ids"]), deterministic=True,
                          packing=None if "segment_ids" not in b else {k: jnp.asarray(b[k]) for k in
                                                                        ("segment_ids", "position_ids", "cls_index")})
    np.testing.assert_allclose(run(packed), run(padded), atol=2e-6)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_packed_step_of_the_loop_equals_the_padded_step(minilm_dir, accumulation):
    """The jitted train step (loss, gradient norm, Adam update) on a real checkpoint with dropout
    off: packing changes which zeros are computed, not the result. With gradient accumulation
    the loop packs one group per micro-batch (BatchPlan.packing_groups), which the step splits."""
    model = ForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, seed=0, config_overrides={
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "classifier_dropout": 0.0})
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx, schedule = make_optimizer(optimizer_plan(lr=1e-4, grad_clip=1.0), total_steps=10, steps_per_epoch=10,
                                  warmup_steps=0)
    rows = encoded_rows([40, 7, 12, 30, 3, 64, 18, 9, 22, 5, 15, 33, 11, 2, 27, 8], seed=1, vocab=30000)
    out = []
    for batch, steps in ((_padded(rows), 1),
                         (_batching(accumulation).pack(rows), accumulation)):
        step = jax.jit(make_train_step(graphdef, rest, INDONLI, tx, schedule, seed=0,
                                       accumulation_steps=steps))
        state = {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
        out.append(step(state, batch))
    (padded_state, padded_metrics), (packed_state, packed_metrics) = out
    assert float(packed_metrics["weight"]) == float(padded_metrics["weight"]) == 13
    np.testing.assert_allclose(packed_metrics["loss_sum"], padded_metrics["loss_sum"], rtol=1e-5)
    np.testing.assert_allclose(packed_metrics["grad_norm"], padded_metrics["grad_norm"], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(packed_state["params"]), jax.tree.leaves(padded_state["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_the_command_line_trains_on_packed_rows(tmp_path):
    """cpu_test through finetune.main: packing is on by default for IndoNLI and computes on
    fewer padded tokens than the same run with --config.data.packing=False."""
    ratios = {}
    for packing in (True, False):
        workdir = tmp_path / f"packing_{packing}"
        proc = subprocess.run(
            [sys.executable, "-m", "finetune.main", "--config=configs/indonli_large.py:cpu_test",
             f"--workdir={workdir}", f"--config.data.packing={packing}", "--config.train.num_epochs=1",
             f"--config.data.tfds_dir={tmp_path / 'tfds'}",
             # every batch its own shape: the padding packing saves, not what the shape plan adds back
             "--config.data.compile_cost_tokens=0"],
            cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        log = (workdir / "train.log").read_text()
        line = next(x for x in log.splitlines() if "padded tokens per real token" in x)
        ratios[packing] = float(line.split(";")[-1].split()[0])
        results = json.loads((workdir / "results.json").read_text())
        assert results["splits"]["validation"]["count"] > 0
    assert ratios[True] < 0.5 * ratios[False], ratios
