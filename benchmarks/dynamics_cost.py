"""What recording training dynamics costs: the loop's own jitted train step
(nli_jax.train.compiled_step.initial_state_and_step) built with and without per-example outputs
(hooks.dynamics), timed in alternating rounds on the same real batches, plus the
recorder's host-side work per step (its fetch and write at each checkpoint).

    python -m benchmarks.dynamics_cost                      # MiniLM-L6, IndoNLI pairs, batch 32, length 128
    python -m benchmarks.dynamics_cost --model=tiny         # the cpu_test shape: a smoke run

The run is set up as finetune.main sets it up (the plan of configs/indonli_base.py, the task's
packed batches from the real training file); each side gets a fresh state from the same
parameters. A timed call is a round over the --steps batches (and, with dynamics, the recorder's
write of what it recorded); the side that goes first alternates. Prints min / median / max step
time per side and the ratio, with the CPU model.
"""
from __future__ import annotations

import functools
import os
import tempfile

from benchmarks import harness


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--model", default="", help="Hugging Face BERT directory (default: MiniLM-L6); 'tiny': cpu_test")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from nli_jax.cli import host_memory
    host_memory.configure()  # as the command line does (may re-execute the interpreter)
    print(harness.line(), flush=True)  # ratios differ between CPUs
    import jax
    import numpy as np

    from configs import indonli_base
    from nli_jax.data import pipeline
    from nli_jax.hooks import dynamics
    from nli_jax import planner
    from nli_jax.train.compiled_step import initial_state_and_step
    from nli_jax.train.optimizers import make_optimizer
    from nli_jax.train.setup import prepare, training_examples

    config = indonli_base.get_config("cpu_test" if args.model == "tiny" else None)
    if args.model != "tiny":
        config.model.init = args.model or harness.require_minilm()
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
        state, step = initial_state_and_step(run.steps, jax.device_put(params, run.param_shardings), tx, schedule,
                                             per_example=per_example)
        recorder = (dynamics.Recorder(os.path.join(work, "run"), dynamics.identity("indonli", {}, len(train_source)),
                                      global_batch=args.batch) if per_example else None)
        sides[name] = functools.partial(steps_round, {"step": step, "state": state, "recorder": recorder, "rounds": 0},
                                        batches)
    # The first round (warm-up) compiles each side's step.
    timings = harness.time_sides(sides, rounds=args.rounds)
    out = {"model": "tiny" if args.model == "tiny" else "MiniLM-L6", "batch": args.batch,
           "max_seq_length": plan.data.max_seq_length, "rounds": args.rounds, "steps": args.steps, "sides": {}}
    for name, timing in timings.items():  # a round's seconds per step
        per_step = harness.summary([t / len(batches) for t in timing.times])
        out["sides"][name] = dict(per_step, examples_per_s=args.batch / per_step["median_s"],
                                  first_round_s=timing.first_s)
    ratio = out["sides"]["with"]["median_s"] / out["sides"]["without"]["median_s"]
    print(f"{out['model']}, batch {args.batch} x {out['max_seq_length']}, "
          f"{args.rounds} rounds x {args.steps} steps")
    for name in ("without", "with"):
        o = out["sides"][name]
        print(f"  {name} training dynamics: step {o['min_s']:.3f} / {o['median_s']:.3f} / "
              f"{o['max_s']:.3f} s (min / median / max), {o['examples_per_s']:.1f} examples/s")
    print(f"  ratio with / without (step time): {ratio:.3f}")
    harness.write_result(args.json, out, ratios={"with_over_without_step_s": ratio})


def steps_round(side: dict, batches: list) -> None:
    """One round of the loop's step over `batches`; with a recorder, what it records and a
    checkpoint's write of it."""
    import jax

    from nli_jax.tasks.base import PER_EXAMPLE
    side["rounds"] += 1
    for i, batch in enumerate(batches):
        side["state"], metrics = side["step"](side["state"], batch)
        outcomes = metrics.pop(PER_EXAMPLE, None)
        if side["recorder"] is not None:
            side["recorder"].training_step((side["rounds"] - 1) * len(batches) + i + 1, outcomes)
    jax.block_until_ready((side["state"], metrics))
    if side["recorder"] is not None:
        side["recorder"].write(side["rounds"])


if __name__ == "__main__":
    main()
