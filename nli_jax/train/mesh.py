"""Device mesh and the rules that map logical axis names to mesh axes.

Parameters carry logical names (vocab, embed, heads, kv, mlp, ...). A config's rules
(`config.mesh.rules`, defined in configs/finetune_common.py) decide the parallelism without
touching model code, MaxText-style:

    data parallel      mesh {data: -1}                (default)
    FSDP               mesh {data: 1, fsdp: -1}       (embed -> fsdp shards the weights)
    tensor parallel    mesh {data: -1, tensor: 4}     (heads / mlp / vocab -> tensor)
"""
from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_shape(shape, devices: int) -> dict[str, int]:
    """{axis: size} for every axis of MESH_AXES, the one -1 filled with the rest of `devices`;
    ValueError (its message without the flag) when the shape cannot be laid over them."""
    if not hasattr(shape, "keys"):
        raise ValueError("must be a dict of mesh axis sizes")
    unknown = sorted(set(shape) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axes {unknown}; expected {list(MESH_AXES)}")
    sizes = {a: shape.get(a, 1) for a in MESH_AXES}
    if any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1) for v in sizes.values()):
        raise ValueError("sizes must be positive integers, or -1 for the rest of the devices")
    if list(sizes.values()).count(-1) > 1:
        raise ValueError("at most one axis may be -1")
    known = math.prod(v for v in sizes.values() if v != -1)
    for axis, v in sizes.items():
        if v == -1:
            if devices % known:
                raise ValueError(f"{devices} devices cannot fill the other axes' {known}")
            sizes[axis] = devices // known
    if math.prod(sizes.values()) != devices:
        raise ValueError(f"the mesh needs {math.prod(sizes.values())} devices, there are {devices}")
    return sizes


def batch_axes(rules, mesh_axes) -> tuple[str, ...]:
    """The mesh axes the "batch" rule splits batches over (those the mesh has)."""
    target = dict(tuple(r) for r in rules).get("batch")
    return tuple(a for a in ((target,) if isinstance(target, str) else tuple(target or ())) if a in mesh_axes)


def data_parallel_size(sizes: dict[str, int], rules) -> int:
    """Devices a batch is split over: the product of the batch axes' sizes."""
    return math.prod(sizes[a] for a in batch_axes(rules, sizes))


def make_mesh(shape: dict[str, int] | None = None, devices: Sequence | None = None) -> Mesh:
    """A mesh over all devices with axes (data, fsdp, tensor); one size may be -1 (the rest).

    Built as jax.sharding.Mesh with Auto axis types: jax.make_mesh now defaults to Explicit
    axes, under which embedding gathers fail.
    """
    devices = list(devices if devices is not None else jax.devices())
    try:
        sizes = list(resolve_shape(dict(shape or {"data": -1}), len(devices)).values())
    except ValueError as e:
        raise ValueError(f"mesh {shape}: {e}") from None
    try:
        grid = mesh_utils.create_device_mesh(sizes, devices=devices)
    except Exception:  # non-TPU topologies with uneven host shapes
        grid = np.asarray(devices).reshape(sizes)
    axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)


def platform(mesh: Mesh) -> str:
    """The platform the mesh's devices are ("cpu", "tpu", "gpu"): decisions about the target take
    it from here, not from jax.default_backend(), which is the host's ("cpu") while compiling for
    a TPU topology ahead of time (launch.compile)."""
    return mesh.devices.flat[0].platform


def logical_to_spec(names: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh,
                    rules: Sequence[tuple[str, Any]]) -> P:
    """PartitionSpec for an array with logical axis `names`; a dimension that the mesh axes do
    not divide stays replicated, and no mesh axis is used twice."""
    if names is None:
        return P()
    table = dict(rules)
    used: set[str] = set()
    out = []
    for name, dim in zip(names, shape):
        target = table.get(name)
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
        if axes and dim % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            out.append(axes[0] if len(axes) == 1 else axes)
        else:
            out.append(None)
    return P(*out)


def undivided_dims(names: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh,
                   rules: Sequence[tuple[str, Any]]) -> list[tuple[str, int, tuple[str, ...]]]:
    """(logical name, size, mesh axes) of each dimension that its rule maps to mesh axes whose
    size does not divide it: `logical_to_spec` leaves such a dimension replicated."""
    if names is None:
        return []
    table = dict(rules)
    out = []
    for name, dim in zip(names, shape):
        target = table.get(name)
        axes = tuple(a for a in ((target,) if isinstance(target, str) else tuple(target or ()))
                     if a in mesh.shape and mesh.shape[a] > 1)
        if axes and dim % math.prod(mesh.shape[a] for a in axes):
            out.append((name, int(dim), axes))
    return out


def param_shardings(model: nnx.Module, mesh: Mesh, rules) -> dict:
    """NamedSharding for every parameter (as a pure dict, like nnx.to_pure_dict). A dimension
    the mesh does not divide (a 30,522 vocabulary over tensor:4) stays replicated, with a warning
    naming it: pad the model's dimension (a from-scratch vocabulary: model.vocab_multiple) to shard it."""
    params = nnx.state(model, nnx.Param)
    out, undivided = {}, {}
    for path, var in nnx.to_flat_state(params):
        names = var.get_metadata().get("out_sharding")
        shape = var.get_value().shape  # also on abstract models (nnx.eval_shape)
        out[path] = NamedSharding(mesh, logical_to_spec(names, shape, mesh, rules))
        for name, dim, axes in undivided_dims(names, shape, mesh, rules):
            undivided.setdefault((name, dim, axes), []).append(".".join(map(str, path)))
    for (name, dim, axes), paths in undivided.items():
        logging.getLogger("nli_jax").warning(
            "mesh %s does not divide %s=%d over %s: replicated along it in %d parameter(s) (%s)", dict(mesh.shape),
            name, dim, "x".join(axes), len(paths), ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else ""))
    return nnx.to_pure_dict(nnx.from_flat_state(out))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
    axes = batch_axes(rules, mesh.shape)
    return NamedSharding(mesh, P(axes if axes else None))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def put_global(tree, shardings):
    """Host values (identical on every process) -> global arrays with `shardings`; works
    multi-host, where device_put cannot address other processes' devices."""
    def put(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
    return jax.tree.map(put, tree, shardings)
