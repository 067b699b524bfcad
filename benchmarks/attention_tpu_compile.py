"""The TPU compiler's view of the encoder's attention, splash against plain, on a CPU host: each is
lowered and compiled for an abstract TPU topology (no TPU needed) as forward + backward of the sum
of its outputs, batch-sharded over the topology's devices; prints the compiled temp memory and
XLA's cost model (flops, optimal_seconds) per device.

    python -m benchmarks.attention_tpu_compile                         # v4 2x2x1 and v3 2x2, BERT-large
    python -m benchmarks.attention_tpu_compile --lengths 128 --chips v4

XLA's cost model does not see inside a Pallas kernel (a custom call; splash declares no cost
estimate), so its flops and optimal_seconds count only the XLA ops around the kernel; temp
memory is the compiler's own allocation and compares directly (ratios: splash's temp memory as
a share of plain's, where plain needs any).
"""
from __future__ import annotations

import os

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# Compiling only: other processes on this host may hold libtpu's lockfile, which guards real chips.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402

from benchmarks import harness  # noqa: E402

TOPOLOGIES = {  # name -> get_topology_desc arguments (4 devices each)
    "v4": dict(topology_name="v4:2x2x1", chip_config_name="megacore", chips_per_host_bounds=(2, 2, 1)),
    "v3": dict(topology_name="v3:2x2", chip_config_name="default"),
}


def topology_mesh(chip: str):
    import jax
    import numpy as np
    from jax.experimental import topologies
    topology = topologies.get_topology_desc(platform="tpu", num_slices=1, **TOPOLOGIES[chip])
    devices = np.array(topology.devices)
    return jax.sharding.Mesh(devices.reshape(len(devices), 1, 1), ("data", "fsdp", "tensor"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)


def compile_attention(mesh, implementation: str, *, batch_per_device: int, heads: int, length: int,
                      head_dim: int, dtype: str = "bfloat16"):
    """The compiled forward + backward (of the sum of the outputs) of attention over padded rows."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from nli_jax.models import attention

    def loss(q, k, v, mask):
        return attention.attend(q, k, v, mask, implementation=implementation).astype(jnp.float32).sum()

    batch = batch_per_device * mesh.devices.size
    sharded = NamedSharding(mesh, P(("data", "fsdp")))
    qkv = jax.ShapeDtypeStruct((batch, heads, length, head_dim), jnp.dtype(dtype), sharding=sharded)
    mask = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=sharded)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), in_shardings=(sharded,) * 4)
    return step.lower(qkv, qkv, qkv, mask).compile()


def measure(compiled) -> dict:
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"temp_bytes": memory.temp_size_in_bytes, "argument_bytes": memory.argument_size_in_bytes,
            "output_bytes": memory.output_size_in_bytes, "flops": cost.get("flops"),
            "bytes_accessed": cost.get("bytes accessed"),
            "optimal_seconds": cost.get("optimal_seconds")}


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--chips", nargs="+", default=["v4", "v3"], choices=sorted(TOPOLOGIES))
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512])
    parser.add_argument("--batch_per_device", type=int, default=32)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    print(harness.line(), flush=True)
    rows, ratios = [], {}
    for chip in args.chips:
        mesh = topology_mesh(chip)
        for length in args.lengths:
            row = {"chip": chip, "length": length}
            for implementation in ("plain", "splash"):
                try:
                    compiled = compile_attention(mesh, implementation, batch_per_device=args.batch_per_device,
                                                 heads=args.heads, length=length, head_dim=args.head_dim,
                                                 dtype=args.dtype)
                except Exception as e:  # Mosaic refuses some chip x dtype pairs (v3: bfloat16)
                    row[implementation] = {"error": str(e).splitlines()[0][:300]}
                    continue
                row[implementation] = measure(compiled)
                row[implementation]["has_kernel"] = "tpu_custom_call" in compiled.as_text()
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'chip':4} {'len':>4} {'plain temp MiB':>15} {'splash temp MiB':>16} {'plain opt s':>12} {'splash opt s':>13}")
    for r in rows:
        if any("error" in r[i] for i in ("plain", "splash")):
            print(f"{r['chip']:4} {r['length']:4d} {'compile error (see the JSON line)':>60}")
            continue
        p, s = r["plain"], r["splash"]
        if p["temp_bytes"]:
            ratios[f"{r['chip']}_{r['length']}_splash_over_plain_temp_bytes"] = s["temp_bytes"] / p["temp_bytes"]
        print(f"{r['chip']:4} {r['length']:4d} {p['temp_bytes'] / 2**20:15.1f} {s['temp_bytes'] / 2**20:16.1f} "
              f"{p['optimal_seconds']:12.3e} {s['optimal_seconds']:13.3e}")
    harness.write_result(args.json, {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "rows": rows},
                         ratios=ratios)
    return rows


if __name__ == "__main__":
    main()
