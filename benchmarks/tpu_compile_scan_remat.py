"""Compiling IndoBERT-large (24 layers, bf16) for a TPU v3-8 on this CPU host, with the layers
scanned or not (model.scan_layers) and each remat policy (model.remat): XLA compile seconds, the
program's temporary memory per device (memory_analysis().temp_size_in_bytes) and the compiler's
estimate of its run time (cost_analysis()["optimal_seconds"]). No TPU needed: libtpu compiles for a
topology description (jax.experimental.topologies). The program: forward and backward of a mean
squared MLM-logit loss, batch 32 per device x 128 tokens, data-parallel over the 8 cores.

    python -m benchmarks.tpu_compile_scan_remat --variant=loop:none --variant=scan:full ...
    python -m benchmarks.tpu_compile_scan_remat --preset=tiny-bert --length=16 --per_device_batch=1 \
        --variant=loop:none --variant=scan:full                          # a smoke run

One process per variant, one at a time: a compile of the unscanned model takes minutes on 2 cores.
The first --variant is the reference: the ratios are each other variant's compile seconds and
temporary memory over its own.

Measured 2026-11-26 on this project's 2-core AMD EPYC host (shared with another session's compiles),
jax 0.10.2, libtpu 0.0.42.1; temp = memory_analysis().temp_size_in_bytes per device:

    layers  remat                               compile s   temp GB
    loop    none                                  121.5       4.03
    loop    full                                   92.1       1.57
    scan    none                                   64.3      10.15
    scan    full                                   51.4       1.54
    scan    dots_with_no_batch_dims_saveable       33.2       4.04
    scan    dots_saveable                          33.6       5.08

A scan without remat keeps every intermediate of its body per layer for the backward pass (2.5x the
loop's temporaries, where XLA recomputes cheap ones itself): scan with a remat policy. This libtpu's
cost_analysis()["optimal_seconds"] is negative for every variant (-4 to -145), so it is not reported.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import harness


def compile_variant(preset_name: str, scan: bool, remat: str, per_device: int, length: int) -> dict:
    """Forward and backward of the MLM model lowered and compiled for an abstract v3-8 (in a fresh
    process: the caller's runs this module with --_variant)."""
    os.environ["TPU_SKIP_MDS_QUERY"] = "1"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec as P

    from configs.finetune_common import MESH_RULES
    from nli_jax.models import ForMaskedLM, make_rngs, preset
    from nli_jax.train import mesh as mesh_lib

    topo = topologies.get_topology_desc(platform="tpu", topology_name="v3:2x2", chip_config_name="default",
                                        chips_per_host_bounds=(2, 2, 1), num_slices=1)
    mesh = jax.sharding.Mesh(np.array(topo.devices).reshape(8, 1, 1), ("data", "fsdp", "tensor"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)
    config = preset(preset_name, dtype="bfloat16", remat=remat, scan_layers=scan)
    abstract = nnx.eval_shape(lambda: ForMaskedLM(config, rngs=make_rngs(0)))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    shardings = mesh_lib.param_shardings(abstract, mesh, MESH_RULES)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nnx.to_pure_dict(params), shardings)
    rest = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())),
                        nnx.to_pure_dict(rest))
    ids = jax.ShapeDtypeStruct((8 * per_device, length), jnp.int32, sharding=NamedSharding(mesh, P("data")))

    def step(params, rest, ids):
        def loss(p):
            model = nnx.merge(graphdef, p, rest)
            logits = model(ids, deterministic=False)["mlm_logits"]
            return jnp.mean(jnp.square(logits.astype(jnp.float32)))
        return jax.value_and_grad(loss)(params)

    start = time.perf_counter()
    lowered = jax.jit(step, out_shardings=(NamedSharding(mesh, P()), shardings)).lower(params, rest, ids)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"scan": scan, "remat": remat, "lower_s": lower_s, "compile_s": compile_s,
            "temp_bytes": int(memory.temp_size_in_bytes), "argument_bytes": int(memory.argument_size_in_bytes),
            "optimal_seconds": float(cost.get("optimal_seconds", float("nan")))}


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--variant", action="append", default=[], help="scan|loop:<remat policy>, repeatable")
    parser.add_argument("--preset", default="indobert-large")
    parser.add_argument("--per_device_batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--_variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._variant:
        layout, remat = args._variant.split(":")
        print("RESULT" + json.dumps(compile_variant(args.preset, layout == "scan", remat, args.per_device_batch,
                                                    args.length)))
        return
    if not args.variant:
        parser.error("give at least one --variant")
    print(harness.line(), flush=True)
    # ALLOW_MULTIPLE_LIBTPU_LOAD: compiling needs no TPU, so another process's libtpu lock need not stop it.
    env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a cached program would time nothing
    results, ratios = {}, {}
    for variant in args.variant:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.tpu_compile_scan_remat", f"--_variant={variant}",
                               f"--preset={args.preset}", f"--per_device_batch={args.per_device_batch}",
                               f"--length={args.length}"], cwd=harness.REPO, env=env, capture_output=True, text=True)
        if proc.returncode:
            print(f"{variant}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results[variant] = json.loads(proc.stdout.split("RESULT", 1)[1])
        print(json.dumps(results[variant]), flush=True)
    reference = results.get(args.variant[0])
    print(f"\n{'layers':6} {'remat':34} {'compile s':>9} {'temp MB':>9}")
    for variant, r in results.items():
        print(f"{variant.split(':')[0]:6} {r['remat']:34} {r['compile_s']:9.1f} {r['temp_bytes'] / 1e6:9.1f}")
        if reference and variant != args.variant[0]:
            ratios[f"{variant}_over_{args.variant[0]}_compile_s"] = r["compile_s"] / reference["compile_s"]
            if reference["temp_bytes"]:
                ratios[f"{variant}_over_{args.variant[0]}_temp_bytes"] = r["temp_bytes"] / reference["temp_bytes"]
    harness.write_result(args.json, {"preset": args.preset, "topology": "v3-8", "per_device_batch": args.per_device_batch,
                                     "length": args.length, "variants": results}, ratios=ratios)
    if len(results) < len(args.variant):
        sys.exit(f"{len(args.variant) - len(results)} variant(s) failed")


if __name__ == "__main__":
    main()
