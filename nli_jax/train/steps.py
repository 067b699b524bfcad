"""Pure, jitted train and eval steps shared by pretraining and fine-tuning.

The train state is a plain pytree {params, opt_state, step}. Dropout keys are a function of
(seed, step, micro-batch), so no RNG state needs checkpointing and a resumed run draws exactly
the masks an uninterrupted one would. Losses are sums with their weights: the gradient of a
global batch split into micro-batches (accumulation) equals the unsplit one.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from nli_jax.data.pipeline import swap_blocks
from nli_jax.tasks.base import PER_EXAMPLE

PROBES = "probes"  # the metrics' key of the run hooks' in-step probes (make_train_step)


def check_dropout_streams(model) -> None:
    """Every active Dropout must draw from an RNG stream named "dropout".

    The train step reseeds that stream from (seed, step, micro-batch). A Dropout built from
    another stream (e.g. `nnx.Rngs(seed)`, whose only stream is "default") is not reseeded: its
    key sits in the model's non-parameter state, a constant of the jitted step, and the same
    masks would be drawn at every step. Build models with `nli_jax.models.make_rngs`.
    """
    frozen = [".".join(map(str, path)) for path, module in nnx.iter_graph(model)
              if isinstance(module, nnx.Dropout) and module.rate > 0
              and getattr(module.rngs, "tag", None) != "dropout"]
    if frozen:
        raise ValueError(f"{len(frozen)} dropout layer(s) have no 'dropout' RNG stream and would repeat one mask at "
                         f"every step (first: {frozen[0]}); build the model with nli_jax.models.make_rngs(seed)")


def micro_batches(batch: dict, accumulation_steps: int, data_parallel: int) -> dict:
    """[accumulation_steps, micro-batch, ...] of every field of a batch laid out shard by shard
    over `data_parallel` devices (pipeline.shard_major): micro-batch m is [:, m] of
    [data_parallel, accumulation_steps, n], each device's rows staying on it."""
    return jax.tree.map(lambda x: swap_blocks(x, data_parallel, accumulation_steps)
                        .reshape(accumulation_steps, -1, *x.shape[1:]), batch)


def make_train_step(graphdef, rest, task, tx, schedule, *, seed: int | None, accumulation_steps: int = 1,
                    per_example: bool = False, step_param_dtype=None, data_parallel: int = 1, probes: tuple = ()):
    """The jitted-to-be train step (state, batch) -> (state, metric sums). `per_example`: the
    metrics also hold the task's per-example outcomes of this step's forward pass (with the
    batch's idx and weight), for training dynamics; otherwise XLA drops their computation.
    `probes`: run hooks' (grads, params) -> small arrays, on the mean gradients: metrics[PROBES].

    `seed=None`: the step is (state, batch, run_values) -> ..., with run_values {"seed": the
    dropout seed, "lr": a factor of the updates and of `schedule`} as inputs, not constants: a
    sweep's seeds and learning rates compile it once (and the persistent cache serves every cell).

    `step_param_dtype` (model.step_param_dtype "bfloat16"): forward and backward on a copy of the parameters
    in that dtype (gradients and collectives too), float32 master weights updated from the gradients cast back.

    With accumulation, batches come shard by shard over the `data_parallel` devices (pipeline.shard_major):
    micro-batch m is [:, m] of [data_parallel, accumulation_steps, n], each device's own rows."""
    rest = nnx.to_pure_dict(rest)  # plain arrays: merged afresh inside each trace

    def loss_and_grads(params, batch, key, *, mean: bool = False):
        if step_param_dtype is not None:
            master = params
            params = jax.tree.map(lambda p: p.astype(step_param_dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p,
                                  params)
        def loss_fn(p):
            model = nnx.merge(graphdef, p, rest)
            check_dropout_streams(model)  # at trace time: costs nothing per step
            nnx.reseed(model, dropout=key)
            loss_sum, weight, sums = task.loss(model, batch, deterministic=False)
            outcomes = sums.pop(PER_EXAMPLE, {})
            objective = loss_sum / jax.lax.stop_gradient(jnp.maximum(weight, 1.0)) if mean else loss_sum
            return objective, (loss_sum, weight, sums, outcomes)
        (_, (loss_sum, weight, sums, outcomes)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        if step_param_dtype is not None:  # accumulated and applied in the master weights' dtype
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, master)
        return grads, {"loss_sum": loss_sum, "weight": weight, **sums}, outcomes

    def train_step(state, batch, run_values=None):
        if run_values is None:
            base_key, lr_factor = jax.random.key(seed, impl="rbg"), None
        else:
            base_key, lr_factor = jax.random.key(run_values["seed"], impl="rbg"), run_values["lr"]
        params = state["params"]
        step_key = jax.random.fold_in(base_key, state["step"])
        # Denominators of losses that are means over something other than examples (MLM: masked
        # tokens), taken over the whole global batch so that accumulation changes nothing.
        normalizers = task.loss_normalizers(batch)
        if normalizers is not None:
            batch = {**batch, "loss_normalizers": normalizers}
        if accumulation_steps == 1:  # its mean's gradients: no pass dividing them after (5% of a CPU step)
            grads, sums, outcomes = loss_and_grads(params, batch, step_key, mean=True)
        else:
            split = {k: v for k, v in batch.items() if k != "loss_normalizers"}
            micro = micro_batches(split, accumulation_steps, data_parallel)
            extra = {"loss_normalizers": normalizers} if normalizers is not None else {}

            def body(carry, xs):
                index, mb = xs
                g, s, o = loss_and_grads(params, {**mb, **extra}, jax.random.fold_in(step_key, index))
                return jax.tree.map(jnp.add, carry, (g, s)), (o if per_example else None)
            zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: loss_and_grads(
                params, {**jax.tree.map(lambda x: x[0], micro), **extra}, step_key)[:2]))
            (grads, sums), outcomes = jax.lax.scan(body, zeros, (jnp.arange(accumulation_steps), micro))
            # Back in the batch's own order (shard by shard), as its idx and weight are.
            outcomes = jax.tree.map(lambda x: swap_blocks(x.reshape(-1, *x.shape[2:]), accumulation_steps,
                                                          data_parallel), outcomes)
            # Mean over the weighted examples of the whole global batch.
            grads = jax.tree.map(lambda g: g / jnp.maximum(sums["weight"], 1.0), grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        lr = schedule(state["step"])
        if lr_factor is not None:
            updates, lr = jax.tree.map(lambda u: u * lr_factor.astype(u.dtype), updates), lr * lr_factor
        new_state = {"params": optax.apply_updates(params, updates), "opt_state": opt_state, "step": state["step"] + 1}
        metrics = {**sums, "grad_norm": optax.tree.norm(grads), "lr": lr}
        if per_example:
            metrics[PER_EXAMPLE] = {**outcomes, "idx": batch["idx"], "weight": batch["weight"]}
        if probes:
            metrics[PROBES] = tuple(probe(grads, params) for probe in probes)
        return new_state, metrics

    return train_step


def make_eval_step(graphdef, rest, task):
    rest = nnx.to_pure_dict(rest)

    def eval_step(params, batch):
        model = nnx.merge(graphdef, params, rest)
        loss_sum, weight, sums = task.loss(model, batch, deterministic=True)
        # Per-example outcomes go with the predictions (one row per example), not the sums.
        predictions = {**task.predict(model, batch), **sums.pop(PER_EXAMPLE, {}), "idx": batch["idx"]}
        return {"loss_sum": loss_sum, "weight": weight, **sums}, predictions

    return eval_step
