"""The run's train step as the loop runs it: the train state and its shardings on the mesh, the
pure step (nli_jax.train.steps) under jit with the seed and peak learning rate as inputs (runs that
differ only in them share one program), compiled ahead for the shapes the run's batches take, and
the run's training batches. The loop's own; benchmarks and launch.compile use the same.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import optax

from nli_jax.data import pipeline
from nli_jax.train import mesh as mesh_lib
from nli_jax.train.checkpointing import abstract_like
from nli_jax.train.reporting import log
from nli_jax.train.setup import RunSetup, StepSetup
from nli_jax.train.steps import make_train_step


def initial_state_and_step(steps: StepSetup, params, tx, schedule, *, per_example: bool = False, probes: tuple = ()):
    """The train state {params, opt_state, step} in its shardings, and the jitted train step
    (state donated; `per_example`: its metrics hold the examples' outcomes, for a hook such as
    training dynamics; `probes`: the hooks' in-step probes). The seed and the peak learning rate (for a tx made with
    make_optimizer(unit_peak=True)) are inputs of the compiled step, not constants: runs that
    differ only in them share its program. The loop's own; benchmarks time it."""
    replicated = mesh_lib.replicated(steps.mesh)
    shardings = train_state_shardings(tx, params, steps.param_shardings, steps.mesh)
    opt_state = jax.jit(tx.init, out_shardings=shardings["opt_state"])(params)
    state = {"params": params, "opt_state": opt_state, "step": mesh_lib.put_global(np.int32(0), replicated)}
    return state, train_step_for(steps, tx, schedule, params, per_example=per_example, probes=probes)


def train_step_for(steps: StepSetup, tx, schedule, params, *, per_example: bool = False,
                   probes: tuple = ()) -> "TrainStep":
    """The jitted train step of `tx` and `schedule` (compiled at its first call) with the run's
    seed and peak learning rate bound (initial_state_and_step's; `params` may be abstract)."""
    replicated = mesh_lib.replicated(steps.mesh)
    shardings = train_state_shardings(tx, params, steps.param_shardings, steps.mesh)
    compiled = jit_train_step(steps, tx, schedule, shardings, per_example=per_example, probes=probes)
    run_values = {"seed": mesh_lib.put_global(np.uint32(steps.plan.seed), replicated),
                  "lr": mesh_lib.put_global(np.float32(steps.plan.optimizer.lr), replicated)}
    return TrainStep(compiled, run_values)


def train_state_shardings(tx, params, param_shardings, mesh) -> dict:
    """Shardings of the train state {params, opt_state, step}: Adam's moments follow their
    parameter's sharding; counts and other scalars are replicated. `params` may be abstract."""
    replicated = mesh_lib.replicated(mesh)
    opt_shardings = optax.tree_map_params(
        tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, params), param_shardings,
        transform_non_params=lambda _: replicated, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    return {"params": param_shardings, "opt_state": opt_shardings, "step": replicated}


def jit_train_step(steps: StepSetup, tx, schedule, state_shardings, *, per_example: bool = False,
                   probes: tuple = ()):
    """The run's train step under jit: (state, batch, run_values {seed, lr}) -> (state, metrics),
    state donated; micro-batches, their layout and the step's parameter dtype from the plan. The
    one the loop runs and launch.compile compiles for a TPU topology."""
    batch, dtype = steps.plan.batch, steps.plan.model.step_param_dtype
    replicated = mesh_lib.replicated(steps.mesh)
    return jax.jit(make_train_step(steps.graphdef, steps.rest, steps.task, tx, schedule, seed=None,
                                   accumulation_steps=batch.accumulation, per_example=per_example, probes=probes,
                                   step_param_dtype=None if dtype == "float32" else dtype,
                                   data_parallel=batch.accumulation_shards),
                   in_shardings=(state_shardings, steps.batch_sharding, replicated),
                   out_shardings=(state_shardings, replicated), donate_argnums=(0,))


class TrainStep:
    """The jitted train step with the run's seed and learning rate bound: step(state, batch) ->
    (state, metrics). `compile_ahead` compiles it for the shapes the run's batches will take,
    in background threads, before they are needed (XLA compiles with the GIL released, so two
    shapes compile side by side on two cores); a step then waits for its shape's compilation
    rather than starting a second one."""

    def __init__(self, jitted, run_values: dict):
        self.jitted, self.run_values = jitted, run_values
        self._ahead: dict = {}  # shape key -> Future of its compilation

    def __call__(self, state, batch):
        pending = self._ahead.pop(_shape_key(batch), None) if self._ahead else None
        if pending is not None:
            pending.result()  # its compilation's error, if any, is raised here
        return self.jitted(state, batch, self.run_values)

    def compile_ahead(self, state, batches: list[dict]) -> None:
        """Compiles the step for each batch's shapes (global arrays; in order of first use).
        The programs land in the jit's own cache (and the persistent cache, when on)."""
        if len(batches) < 2:
            return  # one shape: the first step compiles it as soon as anything could
        abstract_state = abstract_like(state)
        # Tracing holds the GIL: shapes traced side by side all finish late. One at a time (in
        # order of first use), the first shape's XLA compilation starts after one trace.
        tracing = threading.Lock()

        def compile_shape(abstract):
            with tracing:
                lowered = self.jitted.lower(abstract_state, abstract, self.run_values)
            return lowered.compile()

        pool = ThreadPoolExecutor(max_workers=min(len(batches), os.cpu_count() or 1),
                                  thread_name_prefix="compile_ahead")
        for batch in batches:
            self._ahead[_shape_key(batch)] = pool.submit(compile_shape, abstract_like(batch))
        pool.shutdown(wait=False)


def _shape_key(batch: dict) -> tuple:
    return tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))


def train_batches(run: RunSetup, train_source, total_steps: int | None = None) -> pipeline.TrainingBatches:
    """This process's rows of each global training batch (a checkpointable grain iterable).
    Several processes: each pads (or packs) its rows to the shape the whole global batch needs,
    known from every example's length (gathered once here), so shapes agree with no per-step exchange.
    Packed batches: the run's step shapes are planned from those lengths (data.compile_cost_tokens)."""
    batch, pc, pi = run.plan.batch, run.plan.batch.processes, run.plan.batch.process_index
    plans_shapes = run.batching.packing_groups and run.plan.data.compile_cost_tokens > 0
    lengths = (pipeline.encoded_lengths(train_source, run.encode, pi, pc)
               if (pc > 1 and run.batching.needs_global_lengths) or plans_shapes else None)
    batches = pipeline.training_batches(train_source, run.encode, run.batching, local_batch_size=batch.local_batch,
                                        seed=run.plan.seed, num_epochs=run.plan.train.num_epochs, process_index=pi,
                                        process_count=pc, lengths=lengths,
                                        compile_cost_tokens=run.plan.data.compile_cost_tokens, steps=total_steps,
                                        micro_batches=batch.accumulation, shards=batch.accumulation_shards // pc)
    if batches.plan is not None:
        log.info("training steps: %s (data.compile_cost_tokens=%d)", batches.plan.describe(),
                 run.plan.data.compile_cost_tokens)
    return batches


def one_batch_per_shape(run: RunSetup, batches: pipeline.TrainingBatches, step: int, total_steps: int) -> list[dict]:
    """A global batch of each packed shape the steps from `step` on will take, in order of first
    use (none when the shapes were not planned)."""
    if batches.plan is None:
        return []
    remaining = batches.plan.per_step[step:total_steps]
    first = {}
    for offset, shape in enumerate(remaining):
        first.setdefault(shape, step + offset)
    return [pipeline.to_global(batches.batches[b], run.batch_sharding) for b in first.values()]
