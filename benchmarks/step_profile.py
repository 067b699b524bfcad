"""Where the loop's MLM training step spends its time, by the source line and function that made
each operation: a profile of the compiled step, not of a copy.

    python -m benchmarks.step_profile --model=modernbert-base --batch=8 --seq=128 --torch
    python -m benchmarks.step_profile --model=crammed-2layer-small --batch=64 --seq=32 --predictions=5 \\
        --recipe=crammed:cpu_learn --torch     # :cpu_learn's step, batch ramp included
    python -m benchmarks.step_profile --model=tiny-crammed --batch=4 --seq=16 --steps=2   # smoke run

The step is benchmarks.mlm_train_step's nli-jax side (nli_jax.train.compiled_step, the state donated)
on the same batch; `--recipe` takes the plan (optimizer, clipping, batch ramp) from a pretraining
config instead of configs/pretrain/indobert_base.py's optimizer at a constant rate (a ramped step
is profiled at the run's start, where every step applies its update). nli_jax.profiling gives each
executed thunk's time to the function of this repository that traced it (`nli_jax/models/
modernbert.py:GeGLU.__call__`), forward and backward apart, and to its source line. Thunks run
on the step's threads side by side: their summed time is printed beside the wall time of as
many steps run without the profiler.

With `--torch`, transformers' model of the same config in the same process, profiled by
torch.profiler over the same number of steps: its self CPU time per aten operation and input
shapes, and per kind (matmuls, log-softmax and loss, attention, layer norm, copies, optimizer,
other), beside nli-jax's per-kind totals (dots, copies, other); and one float32 product of the
step's q/k/v shape alone in XLA and in PyTorch, in GFLOP/s against the CPU's peak: the frameworks'
matrix kernels differ per CPU kind.
"""
from __future__ import annotations

import collections
import importlib
import os
import statistics
import tempfile
import time

# As mlm_train_step and the command line do, before JAX runs anything.
from nli_jax.cli import host_memory  # noqa: E402

HOST_MALLOC = host_memory.configure()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.mlm_train_step import (add_step_arguments, loop_state_and_step, make_batch, pretraining_plan,  # noqa: E402
                                      torch_step_fn)
from nli_jax.data import pipeline  # noqa: E402
from nli_jax.models import ForMaskedLM, make_rngs, preset  # noqa: E402
from nli_jax.planner import build_plan  # noqa: E402
from nli_jax.profiling import Attribution, attribute, parse_program, thunk_seconds  # noqa: E402


def plan_for(recipe: str, lr: float):
    """The plan of the step: "bert" (mlm_train_step's: configs/pretrain/indobert_base.py's optimizer at a
    constant rate), else a pretraining config `name[:variant]` of configs/pretrain (its optimizer,
    schedule and batch ramp)."""
    if recipe == "bert":
        return pretraining_plan(lr)
    name, _, variant = recipe.partition(":")
    config = importlib.import_module(f"configs.pretrain.{name}").get_config(variant or None)
    config.model.tokenizer = "unused"  # the step needs no tokenizer; the plan needs one named
    config.pretrain.corpus = ("unused",)
    return build_plan(config)


def profile_loop_step(model, plan, batch, *, steps: int, warmup: int = 2):
    """(Attribution over `steps` profiled steps, wall seconds of `steps` unprofiled steps):
    the loop's own step compiled once, then run without and with jax's profiler on `batch`."""
    state, step, batch_sharding = loop_state_and_step(model, plan)
    batch = pipeline.to_global(batch, batch_sharding)
    compiled = step.jitted.lower(state, batch, step.run_values).compile()
    program = parse_program(compiled.as_text())
    holder = [state]

    def run():
        holder[0], metrics = compiled(holder[0], batch, step.run_values)
        jax.block_until_ready((holder[0], metrics))

    for _ in range(warmup):
        run()
    wall = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        wall.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(steps):
                run()
        seconds = thunk_seconds(trace_dir, set(program.instructions))
    return attribute(program, seconds), wall


def torch_profile(config, plan, batch, *, steps: int, warmup: int = 2) -> tuple[dict[str, float], list[float]]:
    """(self CPU seconds per aten operation and input shapes over `steps` steps, wall seconds of
    `steps` unprofiled steps) of transformers' model of `config` (mlm_train_step's PyTorch side)."""
    run, convert, torch = torch_step_fn(config, plan.optimizer)
    inputs = convert(batch)
    for _ in range(warmup):
        run(inputs)
    wall = []
    for _ in range(steps):
        start = time.perf_counter()
        run(inputs)
        wall.append(time.perf_counter() - start)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            run(inputs)
    # By operation and input shapes: the decoder's product over the vocabulary is its own row.
    return {f"{e.key} {e.input_shapes}" if e.input_shapes else e.key: e.self_cpu_time_total * 1e-6
            for e in prof.key_averages(group_by_input_shape=True)}, wall


# aten operations by kind, for the side-by-side totals.
TORCH_KINDS = (("log-softmax / loss", ("log_softmax", "nll_loss", "cross_entropy")),
               ("dot", ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "_mkldnn", "mkldnn")),
               ("attention", ("attention", "softmax", "_efficient")),
               ("layer norm", ("layer_norm",)),
               ("copy / transpose", ("copy_", "contiguous", "clone", "transpose", "permute", "cat", "_to_copy")),
               ("optimizer", ("_foreach", "_fused_adam", "Optimizer", "lerp_", "addcdiv_", "addcmul_",
                              "linalg_vector_norm", "clamp")))


def torch_kind(op: str) -> str:
    name = op.split(" ")[0].removeprefix("aten::")
    for kind, words in TORCH_KINDS:
        if any(w in name for w in words):
            return kind
    return "other"


def gemm_peers(m: int, k: int, n: int, *, repeats: int = 10) -> dict[str, float]:
    """GFLOP/s of one float32 [m, k] x [k, n] product in XLA (jax.jit of jnp.dot) and in PyTorch
    (torch.mm: MKL, as this PyTorch is built), median of `repeats`: how far apart the two
    frameworks' matrix kernels are on this CPU."""
    import torch  # only with --torch: the peer's kernels
    a, b = np.random.default_rng(0).standard_normal((2, max(m, k), max(k, n)), dtype=np.float32)
    a, b = a[:m, :k].copy(), b[:k, :n].copy()
    dot = jax.jit(jax.numpy.dot)
    ja, jb, ta, tb = jax.numpy.asarray(a), jax.numpy.asarray(b), torch.from_numpy(a), torch.from_numpy(b)
    calls = {"xla": lambda: jax.block_until_ready(dot(ja, jb)), "pytorch": lambda: torch.mm(ta, tb)}
    timings = harness.time_sides(calls, rounds=repeats, calls=1, warmup=2)
    return {side: 2 * m * k * n / t.median / 1e9 for side, t in timings.items()}


def largest(seconds: dict) -> list:
    """(name, seconds) pairs, the largest first."""
    return sorted(seconds.items(), key=lambda kv: -kv[1])


def report(title: str, attribution: Attribution, wall: list[float], steps: int, top: int) -> dict:
    median = statistics.median(wall)
    threads = os.cpu_count()
    print(f"{title}: median step {median:.4f} s unprofiled; thunks {attribution.total / steps:.4f} s per step "
          f"summed over the threads ({attribution.total / steps / (median * threads):.0%} of {threads} threads x the "
          f"step); unattributed {attribution.unattributed / max(attribution.total, 1e-12):.1%}")
    functions = collections.defaultdict(lambda: {"forward": 0.0, "backward": 0.0})
    for (function, direction), s in attribution.by_function.items():
        functions[function][direction or "forward"] += s
    rows = sorted(functions.items(), key=lambda kv: -sum(kv[1].values()))
    print(f"  {'function (innermost frame in the repository)':70s} {'share':>6s} {'ms/step':>8s} "
          f"{'fwd':>7s} {'bwd':>7s}")
    for function, parts in rows:
        total = sum(parts.values())
        print(f"  {function:70s} {total / attribution.total:6.1%} {1e3 * total / steps:8.2f} "
              f"{1e3 * parts['forward'] / steps:7.2f} {1e3 * parts['backward'] / steps:7.2f}")
    print("  by kind: " + ", ".join(f"{k} {v / attribution.total:.1%}" for k, v in
                                     largest(attribution.by_kind)))
    print("  top source lines:")
    for line, s in largest(attribution.by_line)[:top]:
        print(f"    {s / attribution.total:6.1%} {1e3 * s / steps:8.2f} ms  {line}")
    return {"median_step_s": median, "step_times_s": wall, "thunk_s_per_step": attribution.total / steps,
            "unattributed_share": attribution.unattributed / max(attribution.total, 1e-12),
            "functions": {f: {d: v / steps for d, v in parts.items()} for f, parts in rows},
            "kinds": {k: v / steps for k, v in attribution.by_kind.items()},
            "lines": {k: v / steps for k, v in largest(attribution.by_line)[:top]}}


def main():
    parser = harness.parser(__doc__)
    add_step_arguments(parser, model="modernbert-base")
    parser.add_argument("--recipe", default="bert",
                        help='"bert" (mlm_train_step\'s plan) or configs/pretrain/NAME.py as NAME[:variant]')
    parser.add_argument("--steps", type=int, default=5, help="steps timed, then as many profiled")
    parser.add_argument("--top", type=int, default=15, help="source lines listed")
    parser.add_argument("--torch", action="store_true", help="profile transformers' model of the config too")
    args = parser.parse_args()
    print(f"{harness.line()}; host allocator: {HOST_MALLOC}", flush=True)

    config = preset(args.model, max_position_embeddings=max(512, args.seq))
    plan = plan_for(args.recipe, args.lr)
    batch = make_batch(config.vocab_size, args.batch, args.seq, args.predictions)
    model = ForMaskedLM(config, sentence_head=False, rngs=make_rngs(0))
    attribution, wall = profile_loop_step(model, plan, batch, steps=args.steps)
    title = f"nli-jax loop step, {args.model}, {args.batch} x {args.seq}, recipe {args.recipe}"
    result = {"model": args.model, "batch": args.batch, "seq": args.seq, "recipe": args.recipe, "steps": args.steps,
              "jax": jax.__version__, "host_allocator": HOST_MALLOC,
              "nli_jax": report(title, attribution, wall, args.steps, args.top)}
    ratios = {}
    if args.torch:
        ops, torch_wall = torch_profile(config, plan, batch, steps=args.steps)
        total, median = sum(ops.values()), statistics.median(torch_wall)
        kinds = collections.defaultdict(float)
        for op, s in ops.items():
            kinds[torch_kind(op)] += s
        print(f"transformers + PyTorch, same config and batch: median step {median:.4f} s unprofiled; "
              f"self CPU {total / args.steps:.4f} s per step")
        print("  by kind: " + ", ".join(f"{k} {v / total:.1%}" for k, v in largest(kinds)))
        for op, s in largest(ops)[:args.top]:
            print(f"    {s / total:6.1%} {1e3 * s / args.steps:8.2f} ms  {op}")
        result["pytorch"] = {"median_step_s": median, "step_times_s": torch_wall,
                             "self_cpu_s_per_step": total / args.steps,
                             "kinds": {k: v / args.steps for k, v in kinds.items()},
                             "ops": {k: v / args.steps for k, v in largest(ops)[:args.top]}}
        ratio = ratios["nli_jax_over_pytorch_tokens_per_s"] = median / result["nli_jax"]["median_step_s"]
        print(f"  ratio nli-jax over PyTorch (tokens/s, unprofiled medians): {ratio:.2f}x")
        shape = (args.batch * args.seq, config.hidden_size, 3 * config.hidden_size)  # the q, k, v product
        gemm = gemm_peers(*shape)
        peak = harness.cpu_peak()
        result["gemm"] = {"shape": shape, "gflops": gemm, "cpu_peak": peak}
        ratios["xla_over_pytorch_gemm_gflops"] = gemm["xla"] / gemm["pytorch"]
        print(f"float32 GEMM {shape[0]} x {shape[1]} x {shape[2]} alone: XLA {gemm['xla']:.0f} GFLOP/s, PyTorch "
              f"{gemm['pytorch']:.0f} GFLOP/s ({ratios['xla_over_pytorch_gemm_gflops']:.2f}x); FP32 peak "
              f"{peak['gflops']:.0f} GFLOP/s ({peak['formula']})")
    harness.write_result(args.json, result, ratios=ratios)


if __name__ == "__main__":
    main()
