"""Peak host memory of creating a model on 8 fake CPU devices: sharded init with fsdp=8 against
data=8 (every device a full replica), one fresh subprocess per case (ru_maxrss).

    python -m benchmarks.sharded_init_memory                      # indobert-large, 3 labels
    python -m benchmarks.sharded_init_memory --preset=indobert-base --devices=8

Fake CPU devices live in host memory, so the device buffers count in the RSS: data=8 holds 8
copies, fsdp=8 one copy cut in 8. "sharded init" is the loop's path for a model from scratch
(nli_jax.train.sharding.create_sharded: jit with out_shardings, each device computes its own
shard); "host init" creates the model eagerly on the host and then places it (mesh.put_global, as
Hugging Face checkpoints are loaded): the full unsharded model on the host plus the device copies.
The loop uses sharded init when the mesh shards parameters (fsdp, tensor) and host init for
pure data parallelism, so "data=8, host init" is what a data=8 run does. (Sharded init on data=8
would run the whole initialiser on each of the 8 fake devices at once, about 3x the parameters
each: --data_sharded adds that case, on a machine with the memory.)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks import harness


def run_case(preset_name: str, shape: dict, devices: int, how: str) -> dict:
    """One case, in this (fresh) process: the model created, its parameters placed; the peak RSS."""
    import resource

    import jax
    jax.config.update("jax_num_cpu_devices", devices)
    from flax import nnx

    from configs.finetune_common import MESH_RULES
    from nli_jax.models import ForSequenceClassification, make_rngs, preset
    from nli_jax.train import mesh as mesh_lib
    from nli_jax.train.sharding import create_sharded

    def create():
        return ForSequenceClassification(preset(preset_name), num_labels=3, rngs=make_rngs(0))
    mesh = mesh_lib.make_mesh(shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if how == "sharded":
        model, params, _ = create_sharded(create, mesh, MESH_RULES)
    else:
        model = create()
        shardings = mesh_lib.param_shardings(model, mesh, MESH_RULES)
        params = mesh_lib.put_global(nnx.to_pure_dict(nnx.state(model, nnx.Param)), shardings)
    jax.block_until_ready(params)
    leaves = jax.tree.leaves(params)
    return {"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "rss_before_kib": before,
            "param_bytes": sum(x.nbytes for x in leaves),
            "bytes_on_device_0": sum(s.data.nbytes for x in leaves for s in x.addressable_shards
                                     if s.device == jax.devices()[0])}


def measure(preset: str, shape: dict, devices: int, how: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.sharded_init_memory", f"--preset={preset}",
                           f"--devices={devices}", f"--_case={json.dumps([shape, how])}"], cwd=harness.REPO,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{preset} {shape} {how}: exit status {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--preset", default="indobert-large")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--data_sharded", action="store_true", help="also data=N with sharded init (much memory)")
    parser.add_argument("--_case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._case:
        shape, how = json.loads(args._case)
        print(json.dumps(run_case(args.preset, shape, args.devices, how)))
        return
    print(harness.line(), flush=True)  # ratios differ between CPUs
    n = args.devices
    cases = [(f"fsdp={n}, sharded init", {"data": 1, "fsdp": n}, "sharded"),
             (f"data={n}, host init then placed", {"data": n}, "host"),
             (f"fsdp={n}, host init then placed", {"data": 1, "fsdp": n}, "host")]
    if args.data_sharded:
        cases.append((f"data={n}, sharded init", {"data": n}, "sharded"))
    results = {}
    for name, shape, how in cases:
        r = measure(args.preset, shape, n, how)
        results[name] = r
        print(f"{args.preset} on {n} CPU devices, {name}: peak RSS {r['peak_rss_kib'] / 2**20:.2f} GiB "
              f"(before init {r['rss_before_kib'] / 2**20:.2f} GiB; parameters {r['param_bytes'] / 2**30:.2f} GiB, "
              f"{r['bytes_on_device_0'] / 2**30:.3f} GiB on device 0)", flush=True)
    fsdp, data = results[cases[0][0]]["peak_rss_kib"], results[cases[1][0]]["peak_rss_kib"]
    print(f"peak RSS fsdp={n} / data={n}: {fsdp / data:.3f}")
    harness.write_result(args.json, {"preset": args.preset, "devices": n, "cases": results},
                         ratios={f"fsdp{n}_sharded_over_data{n}_host_peak_rss": fsdp / data})
    return results


if __name__ == "__main__":
    main()
