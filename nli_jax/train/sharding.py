"""Models created directly in their shardings, and the shardings a run actually holds.

`create_sharded` traces the model's constructor once without computing anything
(nnx.eval_shape), derives every parameter's NamedSharding from its logical axis names, and runs
the constructor under jit with those out_shardings: each device computes only its own shard, so
no host ever holds the full unsharded parameters (with fsdp=8, one eighth per device).
Checkpoints from Hugging Face are read on the host instead and placed with `mesh.put_global`.
"""
from __future__ import annotations

from typing import Callable

import jax
from flax import nnx

from nli_jax.train import mesh as mesh_lib


def create_sharded(create: Callable[[], nnx.Module], mesh, rules):
    """(model, params as a pure dict of global arrays in their shardings, those shardings)
    for `create()`, computed on the devices: the values of an eager `create()` up to float
    rounding (about 1e-8: XLA fuses the initialisers). The model holds these same arrays, not a
    second copy; a train step that donates them leaves the model's parameters deleted until
    they are updated (as `loop.export` does)."""
    abstract = nnx.eval_shape(create)
    shardings = mesh_lib.param_shardings(abstract, mesh, rules)
    graphdef, _, _ = nnx.split(abstract, nnx.Param, ...)

    def init():
        _, params, rest = nnx.split(create(), nnx.Param, ...)
        return nnx.to_pure_dict(params), rest

    params, rest = jax.jit(init, out_shardings=(shardings, mesh_lib.replicated(mesh)))()
    # The non-parameter state (RNG keys and counts) becomes a constant of the jitted steps: one
    # local copy, since a constant spanning other processes' devices cannot be closed over.
    rest = jax.tree.map(lambda x: x.addressable_data(0), rest)
    model = nnx.merge(graphdef, nnx.State(params), rest)
    return model, params, shardings

