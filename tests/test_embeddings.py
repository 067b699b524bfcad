"""Embedding lookups read the float32 tables and cast the rows (nli_jax.models.encoder.Embed), as
torch.autocast does: under bfloat16 compute the gradient into a table is accumulated in float32,
never scattered in bfloat16 (on an H200 that scatter was 96 of BERT-base's 106 ms MLM step), and
small tables (token types) are read by a one-hot contraction, with no scatter at all.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs.pretrain import indobert_base
from nli_jax.data import pipeline
from nli_jax.models import ForMaskedLM, make_rngs, preset
from nli_jax.models.encoder import ONE_HOT_MAX_ROWS, Embed
from nli_jax.planner import build_plan
from nli_jax.tasks import create_task
from nli_jax.train import mesh as mesh_lib
from nli_jax.train.compiled_step import initial_state_and_step
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.setup import StepSetup

SCATTER = re.compile(r"= (\w+)\[([\d,]*)\]\S* scatter\(")


def _pretraining_plan():
    config = indobert_base.get_config("phase=1")
    config.model.tokenizer = "unused"  # the step needs no tokenizer; the plan needs one named
    config.pretrain.corpus = ("unused",)
    return build_plan(config)


def _mlm_batch(vocab: int, batch: int, length: int, predictions: int) -> dict:
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, (batch, length)).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(np.arange(1, length - 1), predictions, replace=False))
                          for _ in range(batch)]).astype(np.int32)
    return dict(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=(np.arange(length) > length // 2)
                .astype(np.int32)[None].repeat(batch, 0), masked_positions=positions,
                masked_ids=np.take_along_axis(ids, positions, axis=1), masked_weights=np.ones((batch, predictions), np.float32),
                weight=np.ones((batch,), np.float32))


def _train_step_hlo(model_name: str) -> str:
    """The HLO of the pretraining loop's own jitted train step (bfloat16 compute) as lowered, before
    any backend's passes: what a GPU or TPU compiles (XLA:CPU itself turns bfloat16 scatters into
    float32 ones, so the CPU's optimised program cannot show the difference)."""
    config = preset(model_name, dtype="bfloat16")
    model = ForMaskedLM(config, sentence_head=False, rngs=make_rngs(0))
    plan = _pretraining_plan()
    mesh = mesh_lib.make_mesh(plan.mesh.shape_dict)
    batch_sharding = mesh_lib.batch_sharding(mesh, plan.mesh.rules)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    param_shardings = mesh_lib.param_shardings(model, mesh, plan.mesh.rules)
    params = mesh_lib.put_global(nnx.to_pure_dict(params), param_shardings)
    tx, schedule = make_optimizer(plan.optimizer, total_steps=100, steps_per_epoch=100, warmup_steps=0)
    steps = StepSetup(plan, create_task(plan), graphdef, rest, param_shardings, batch_sharding, mesh)
    state, step = initial_state_and_step(steps, params, tx, schedule)
    batch = pipeline.to_global(_mlm_batch(config.vocab_size, 4, 32, 5), batch_sharding)
    return step.jitted.lower(state, batch, step.run_values).as_text(dialect="hlo")


@pytest.mark.parametrize("model_name", ["tiny-bert", "tiny-modernbert", "tiny-deberta-v3"])
def test_train_step_scatters_embedding_gradients_in_float32_only(model_name):
    """Every scatter into an embedding table in the bfloat16 train step accumulates float32, and none
    writes into a table of at most ONE_HOT_MAX_ROWS rows (BERT's and DeBERTa's token types)."""
    # Scatters into [rows, width] tables; the MLM head's gather of masked positions scatters into
    # [batch, length, width] activations (unique positions: no accumulation) and is not a table's.
    tables = [(dtype, [int(n) for n in shape.split(",")]) for dtype, shape in SCATTER.findall(_train_step_hlo(model_name))
              if shape.count(",") == 1]
    assert tables, "the step reads word embeddings by a gather: their gradient is a scatter"
    assert all(dtype == "f32" for dtype, _ in tables), tables
    small = [shape for _, shape in tables if shape[0] <= ONE_HOT_MAX_ROWS]
    assert not small, f"a small table's gradient is scattered: {small}"


@pytest.mark.parametrize("rows", [2, 300])  # the one-hot path and the gather path
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_lookup_values_are_nnx_embed_values_exactly(rows, dtype):
    ours = Embed(rows, 24, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    flax_embed = nnx.Embed(rows, 24, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (3, 17), 0, rows)
    got, want = jax.jit(lambda m, i: m(i))(ours, ids), jax.jit(lambda m, i: m(i))(flax_embed, ids)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("rows", [2, 300])
def test_bfloat16_lookup_gradient_is_the_float32_sum(rows):
    """8,192 positions into the table, bfloat16 compute: each row's gradient is the float32 sum of
    its positions' cotangents (relative 1e-5; nnx.Embed's bfloat16 scatter-add is off by about 1e-2)."""
    embed = Embed(rows, 16, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (64, 128), 0, rows)
    cotangent = jax.random.normal(jax.random.key(2), (64, 128, 16)).astype(jnp.bfloat16) + 1.0

    graphdef, params = nnx.split(embed)

    def pulled(params):
        return jnp.sum(nnx.merge(graphdef, params)(ids).astype(jnp.float32) * cotangent.astype(jnp.float32))
    grad = np.asarray(jax.jit(jax.grad(pulled))(params)["embedding"][...])
    want = np.zeros((rows, 16), np.float64)
    np.add.at(want, np.asarray(ids).reshape(-1), np.asarray(cotangent, np.float64).reshape(-1, 16))
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-3)
