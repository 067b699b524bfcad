"""Dropout through the jitted train step (the code that runs in production), for models built
from a preset and from a Hugging Face checkpoint; exact gradient accumulation for MLM.

A probe task wraps the real classification loss and also returns each micro-batch's loss
(rows carry a one-hot of their micro-batch), so masks can be compared between steps and
between micro-batches: with learning rate 0 and identical inputs, any difference is dropout.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from conftest import config_for, optimizer_plan, task_for
from nli_jax.models import ForMaskedLM, ForSequenceClassification, make_rngs, preset
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.steps import check_dropout_streams, make_train_step

MICRO = 2


class ProbeTask:
    """Classification cross-entropy, plus each micro-batch's loss sum in `per_slot` [MICRO]."""

    def loss_normalizers(self, batch):
        return None

    def loss(self, model, batch, deterministic):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic=deterministic)
        rows = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * batch["weight"]
        return jnp.sum(rows), jnp.sum(batch["weight"]), {"per_slot": jnp.einsum("b,bk->k", rows, batch["slot"])}


def _batch(rows_per_micro=4, length=16, seed=0):
    """MICRO identical micro-batches (rows repeated), each row tagged with its micro-batch."""
    rng = np.random.default_rng(seed)
    half = {"input_ids": rng.integers(5, 900, (rows_per_micro, length)).astype(np.int32),
            "attention_mask": np.ones((rows_per_micro, length), np.int32),
            "token_type_ids": np.zeros((rows_per_micro, length), np.int32),
            "label": rng.integers(0, 3, rows_per_micro).astype(np.int32),
            "weight": np.ones(rows_per_micro, np.float32), "idx": np.arange(rows_per_micro, dtype=np.int32)}
    batch = {k: np.concatenate([v] * MICRO) for k, v in half.items()}
    batch["slot"] = np.repeat(np.eye(MICRO, dtype=np.float32), rows_per_micro, axis=0)
    return batch


def _preset_model():
    return ForSequenceClassification(preset("tiny-bert", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
                                     num_labels=3, rngs=make_rngs(0))


def _pretrained_model(minilm_dir):
    return ForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, seed=0)


def _jitted_step(model, lr, accumulation):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx, schedule = make_optimizer(optimizer_plan(lr=lr), total_steps=100, steps_per_epoch=100, warmup_steps=0)
    step = jax.jit(make_train_step(graphdef, rest, ProbeTask(), tx, schedule, seed=3, accumulation_steps=accumulation))
    return step, {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}


# The pretrained model (MiniLM, 6 layers) takes tens of seconds per test: with -m slow.
@pytest.fixture(params=["preset", pytest.param("from_pretrained", marks=pytest.mark.slow)])
def build(request):
    if request.param == "preset":
        return _preset_model
    minilm = request.getfixturevalue("minilm_dir")
    return lambda: _pretrained_model(minilm)


def test_dropout_masks_differ_between_steps_and_micro_batches(build):
    step, state = _jitted_step(build(), lr=0.0, accumulation=MICRO)
    batch = _batch()
    losses = []
    for _ in range(3):
        state, metrics = step(state, batch)
        losses.append(np.asarray(metrics["per_slot"]))
    losses = np.stack(losses)  # [steps, micro-batches]; parameters never change (lr 0)
    # Identical inputs and parameters: only dropout masks can make these differ.
    assert len({round(float(x), 6) for x in losses[:, 0]}) == 3, f"same masks at every step: {losses[:, 0]}"
    for s in range(3):
        assert abs(losses[s, 0] - losses[s, 1]) > 1e-4, f"step {s}: same masks in both micro-batches {losses[s]}"


def test_dropout_masks_repeat_exactly_after_a_resume(build):
    batch = _batch(seed=1)
    step, state = _jitted_step(build(), lr=1e-3, accumulation=MICRO)
    uninterrupted = []
    for i in range(4):
        state, metrics = step(state, batch)
        uninterrupted.append(np.asarray(metrics["per_slot"]))
        if i == 1:
            saved = jax.device_get(state)  # what a checkpoint holds
    # A fresh process: a new model (its RNG state at construction values) and a new jitted step.
    resumed_step, _ = _jitted_step(build(), lr=1e-3, accumulation=MICRO)
    state = jax.tree.map(jnp.asarray, saved)
    for i in (2, 3):
        state, metrics = resumed_step(state, batch)
        np.testing.assert_array_equal(np.asarray(metrics["per_slot"]), uninterrupted[i])


def test_a_model_without_a_dropout_stream_is_refused():
    frozen = ForSequenceClassification(preset("tiny-bert"), num_labels=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="no 'dropout' RNG stream"):
        check_dropout_streams(frozen)
    step, state = _jitted_step(frozen, lr=0.0, accumulation=1)
    with pytest.raises(ValueError, match="would repeat one mask at every step"):
        step(state, _batch())
    # Dropout rate 0 needs no stream.
    check_dropout_streams(ForSequenceClassification(
        preset("tiny-bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0),
        num_labels=3, rngs=nnx.Rngs(0)))


def _mlm_batch(rows=8, length=24, predictions=6, seed=0):
    """Rows with different numbers of masked tokens, so micro-batch means differ from the global mean."""
    rng = np.random.default_rng(seed)
    counts = np.array([1, 6, 2, 6, 3, 5, 1, 4])[:rows]
    weights = (np.arange(predictions)[None, :] < counts[:, None]).astype(np.float32)
    return {"input_ids": rng.integers(5, 1000, (rows, length)).astype(np.int32),
            "attention_mask": np.ones((rows, length), np.int32),
            "token_type_ids": np.repeat([[0] * (length // 2) + [1] * (length - length // 2)], rows, 0).astype(np.int32),
            "masked_positions": np.sort(rng.permutation(length - 2)[:predictions] + 1)[None].repeat(rows, 0).astype(np.int32),
            "masked_ids": rng.integers(5, 1000, (rows, predictions)).astype(np.int32), "masked_weights": weights,
            "sentence_label": rng.integers(0, 2, rows).astype(np.int32),
            "weight": np.array([1, 1, 1, 1, 1, 1, 0, 1], np.float32)[:rows], "idx": np.arange(rows, dtype=np.int32)}


def _mlm_step(dropout, accumulation):
    task = task_for(config_for("pretrain.indobert_base:cpu_test"))
    model = ForMaskedLM(preset("tiny-bert", hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout),
                        sentence_head=True, rngs=make_rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx, schedule = make_optimizer(optimizer_plan(name="adamw", weight_decay=0.01), total_steps=10, steps_per_epoch=10,
                                  warmup_steps=0)
    step = jax.jit(make_train_step(graphdef, rest, task, tx, schedule, seed=0, accumulation_steps=accumulation))
    return step, {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}, (task, graphdef, rest)


def test_mlm_gradient_accumulation_equals_one_big_batch():
    batch = _mlm_batch()
    results = []
    for accumulation in (1, 4):
        step, state, _ = _mlm_step(0.0, accumulation)
        results.append(step(state, batch))
    (s1, m1), (s4, m4) = results
    assert float(m1["mlm_weight"]) == float(m4["mlm_weight"]) == float((batch["masked_weights"] * batch["weight"][:, None]).sum())
    np.testing.assert_allclose(m4["loss_sum"] / m4["weight"], m1["loss_sum"] / m1["weight"], rtol=1e-6)
    np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-5)
    # One AdamW step of lr 1e-3: float32 summation order moves a few near-zero-gradient entries
    # by < 1% of a step; a wrongly normalised loss moves them by whole steps.
    for a, b in zip(jax.tree.leaves(s1["params"]), jax.tree.leaves(s4["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # tens of seconds: python -m pytest -m slow
def test_mlm_accumulated_objective_is_the_global_mean_with_dropout_on():
    """With dropout, masks differ per micro-batch, so compare the jitted accumulated step with the
    BERT objective recomputed from each micro-batch under the same keys: sum of masked-token
    losses / all masked tokens + sum of sentence losses / all pairs."""
    batch = _mlm_batch(seed=2)
    step, state, (task, graphdef, rest) = _mlm_step(0.1, 4)
    _, metrics = step(state, batch)
    base = jax.random.fold_in(jax.random.key(0, impl="rbg"), 0)
    mlm_sum = mlm_w = s_sum = s_w = 0.0
    for i in range(4):
        micro = {k: v[2 * i:2 * i + 2] for k, v in batch.items()}
        model = nnx.merge(graphdef, state["params"], rest)
        nnx.reseed(model, dropout=jax.random.fold_in(base, i))
        _, _, sums = task.loss(model, micro, deterministic=False)
        mlm_sum += float(sums["mlm_loss_sum"])
        mlm_w += float(sums["mlm_weight"])
        s_sum += float(sums["sentence_loss_sum"])
        s_w += float(sums["sentence_weight"])
    expected = mlm_sum / mlm_w + s_sum / s_w
    np.testing.assert_allclose(float(metrics["loss_sum"] / metrics["weight"]), expected, rtol=1e-5)


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_dropout_drops_at_its_rate_and_keeps_the_expectation(rate):
    """The encoder's Dropout (16 random bits per decision): under jit, on a batch-shaped input
    with an odd last dimension, elements are dropped at `rate` (within 4 standard errors), kept
    ones are scaled so the mean is preserved, masks change with the key and rows are not copies
    of each other (both 16-bit halves of every random word are used independently)."""
    from nli_jax.models.encoder import Dropout
    layer = Dropout(rate, rngs=make_rngs(0))
    x = jnp.ones((64, 33, 129), jnp.float32)
    apply = jax.jit(lambda key: layer(x, deterministic=False, rngs=key))
    y = np.asarray(apply(jax.random.key(1, impl="rbg")))
    dropped = float((y == 0).mean())
    n = y.size
    assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / n), dropped
    np.testing.assert_allclose(np.unique(y[y != 0]), [1 / (1 - round(rate * 65536) / 65536)], rtol=1e-6)
    assert abs(float(y.mean()) - 1.0) < 4 * np.sqrt(rate / (1 - rate) / n)
    # Neighbouring elements come from the two halves of one word: no correlation between them.
    even, odd = (y[..., 0:128:2] == 0).ravel(), (y[..., 1:129:2] == 0).ravel()
    assert abs(np.corrcoef(even, odd)[0, 1]) < 0.02
    other = np.asarray(apply(jax.random.key(2, impl="rbg")))
    assert (other == 0).mean() > 0 and not np.array_equal(other == 0, y == 0)
    assert not np.array_equal(y[0] == 0, y[1] == 0)
    assert np.array_equal(np.asarray(layer(x, deterministic=True)), np.asarray(x))
