"""Optimizer masks and schedules, exact gradient accumulation, metrics, mesh rules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs.finetune_common import MESH_RULES
from conftest import config_for, optimizer_plan, task_for
from nli_jax.losses import argmax_hits, weighted_accuracy
from nli_jax.metrics import accuracy, accuracy_by, accuracy_by_tag
from nli_jax.models import ForSequenceClassification, make_rngs, preset
from nli_jax.train import mesh as mesh_lib
from nli_jax.train.optimizers import decay_mask, learning_rate_schedule, make_optimizer
from nli_jax.train.steps import make_train_step


def test_weight_decay_skips_layernorm_and_biases():
    model = ForSequenceClassification(preset("tiny-bert"), num_labels=3, rngs=nnx.Rngs(0))
    mask = decay_mask(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    layer = mask["encoder"]["layers"][0]
    assert layer["mlp_in"]["kernel"] and layer["attention"]["query"]["kernel"]
    assert not layer["mlp_in"]["bias"] and not layer["attention_norm"]["scale"] and not layer["attention_norm"]["bias"]
    assert mask["encoder"]["embeddings"]["word"]["embedding"] and not mask["encoder"]["embeddings"]["norm"]["scale"]


def test_schedules():
    from nli_jax.schedules.classic import ExponentialPerEpochOptions
    opt = optimizer_plan(lr=1.0, schedule="exponential_per_epoch")
    s = learning_rate_schedule(opt, ExponentialPerEpochOptions(decay_rate=0.9), total_steps=30, steps_per_epoch=10,
                               warmup_steps=0)
    np.testing.assert_allclose([s(0), s(9), s(10), s(25)], [1.0, 1.0, 0.9, 0.81], rtol=1e-6)
    s = learning_rate_schedule(optimizer_plan(lr=2.0, schedule="linear"), total_steps=110, steps_per_epoch=10,
                               warmup_steps=10)
    np.testing.assert_allclose([s(0), s(5), s(10), s(60), s(110)], [0.0, 1.0, 2.0, 1.0, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="unknown schedule 'cosine-ish'; registered: constant, exponential_per_epoch"):
        learning_rate_schedule(optimizer_plan(lr=1.0, schedule="cosine-ish"), total_steps=10, steps_per_epoch=1,
                               warmup_steps=0)


def test_warmup_from_ratio_and_intervals_in_the_step_plan():
    """warmup_ratio x total steps; validation once an epoch and a checkpoint at each by default."""
    from nli_jax.planner import build_plan, step_plan
    plan = build_plan(config_for("indonli_large:cpu_test", "optimizer.warmup_steps=0", "optimizer.warmup_ratio=0.1",
                                 "train.num_epochs=3"))
    steps = step_plan(plan, 300)  # 18 steps of 16 per epoch
    assert (steps.steps_per_epoch, steps.total_steps, steps.warmup_steps) == (18, 54, 5)
    assert (steps.eval_every, steps.checkpoint_every, steps.log_every) == (18, 18, 10)
    capped = step_plan(build_plan(config_for("indonli_large:cpu_test", "train.max_steps=20")), 300)
    assert (capped.total_steps, capped.warmup_steps) == (20, 10)


def test_gradient_accumulation_equals_one_big_batch():
    task = task_for(config_for("indonli_large:cpu_test"))
    config = preset("tiny-bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = ForSequenceClassification(config, num_labels=3, rngs=make_rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx, schedule = make_optimizer(optimizer_plan(), total_steps=10, steps_per_epoch=10, warmup_steps=0)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 1000, (8, 12)).astype(np.int32), "attention_mask": np.ones((8, 12), np.int32),
             "token_type_ids": np.zeros((8, 12), np.int32), "label": rng.integers(0, 3, 8).astype(np.int32),
             "weight": np.array([1, 1, 1, 1, 1, 1, 0, 1], np.float32), "idx": np.arange(8, dtype=np.int32)}
    results = []
    for accumulation in (1, 4):
        step = jax.jit(make_train_step(graphdef, rest, task, tx, schedule, seed=0, accumulation_steps=accumulation))
        state = {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
        results.append(step(state, batch))
    (s1, m1), (s4, m4) = results
    assert float(m1["weight"]) == float(m4["weight"]) == 7
    np.testing.assert_allclose(m1["loss_sum"], m4["loss_sum"], rtol=1e-5)
    # One batch divides the loss before the backward pass, accumulation the summed gradients after
    # it: the mean gradient's norm is the same (Adam's first update below hardly sees a scale).
    np.testing.assert_allclose(m1["grad_norm"], m4["grad_norm"], rtol=1e-5)
    # Adam's first update is lr * g / (|g| + eps): where a gradient is near eps, float summation
    # order moves it by a few 1e-6; a wrong accumulation (e.g. a mean of micro-batch means with
    # the zero-weight row) moves many parameters by ~lr = 1e-3.
    for a, b in zip(jax.tree.leaves(s1["params"]), jax.tree.leaves(s4["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)


def test_argmax_hits_is_argmax_equals_label_with_ties_infinities_and_labels_out_of_range():
    rng = np.random.default_rng(0)
    logits = rng.integers(-2, 3, (400, 6)).astype(np.float32)  # small integers: many ties for the largest
    logits[::7, 0] = -np.inf
    logits[::11] = 0.0  # every entry tied: only index 0 is argmax
    labels = rng.integers(-2, 9, 400)  # some negative, some past the last index
    np.testing.assert_array_equal(np.asarray(jax.jit(argmax_hits)(logits, labels)), np.argmax(logits, -1) == labels)
    # the metric the train step sums
    correct, count = weighted_accuracy(jnp.asarray(logits), jnp.asarray(labels), jnp.ones(400))
    assert float(correct) == np.sum(np.argmax(logits, -1) == labels) and float(count) == 400


def test_accuracy_breakdowns_by_hand():
    gold, pred = [0, 1, 2, 2, 1], [0, 2, 2, 1, 1]
    assert accuracy(gold, pred) == 0.6
    assert accuracy_by(gold, pred, ["a", "a", "b", "b", "b"]) == {"a": {"accuracy": 0.5, "count": 2},
                                                                  "b": {"accuracy": 2 / 3, "count": 3}}
    tags = [["NEG"], ["NEG", "QUANT"], [], ["QUANT"], ["NEG"]]
    assert accuracy_by_tag(gold, pred, tags) == {"NEG": {"accuracy": 2 / 3, "count": 3},
                                                 "QUANT": {"accuracy": 0.0, "count": 2}}


def test_logical_rules_map_to_mesh_axes():
    devices = np.array(jax.devices() * 4)[:4] if len(jax.devices()) < 4 else jax.devices()[:4]
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(1, 2, 2), mesh_lib.MESH_AXES)
    spec = mesh_lib.logical_to_spec(("embed", "heads", "kv"), (64, 4, 16), mesh, MESH_RULES)
    assert spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    # 3 labels do not divide over 2 tensor devices: replicated.
    assert (mesh_lib.logical_to_spec(("embed", "labels"), (64, 3), mesh, MESH_RULES)
            == jax.sharding.PartitionSpec("fsdp", None))
    with pytest.raises(ValueError, match="needs 8 devices"):
        mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, devices=list(devices))
