"""nli_jax.profiling: a compiled program's thunks timed by jax's profiler and given to the Python
function and line that traced them (the loop's step: tests/test_benchmarks.py::test_step_profile)."""
import inspect
import os

import jax
import jax.numpy as jnp

from nli_jax import profiling

HERE = os.path.dirname(os.path.abspath(__file__))


def _inner(x, w):
    return jnp.tanh(x @ w)


def _outer(x, w):
    return _inner(x, w).sum() * 2.0


def test_a_programs_time_goes_to_the_function_and_line_that_traced_it(tmp_path):
    x, w = jnp.full((192, 256), 0.01), jnp.full((256, 320), 0.02)
    compiled = jax.jit(jax.value_and_grad(_outer, argnums=1)).lower(x, w).compile()
    program = profiling.parse_program(compiled.as_text())

    # Every dot was traced at _inner's product, called from _outer: the stack, outer frames included.
    product_line = inspect.getsourcelines(_inner)[1] + 1
    dots = [i for body in program.computations.values() for i in body if i.opcode == "dot"]
    assert dots
    for dot in dots:
        frames = program.stacks[dot.frame]
        assert [(f.function, f.file) for f in frames[:2]] == [("_inner", __file__), ("_outer", __file__)], frames
        assert frames[0].line == product_line
    assert any("transpose(" in d.op_name for d in dots)  # the backward's product (x^T g) is there too

    with jax.profiler.trace(str(tmp_path)):
        for _ in range(3):
            jax.block_until_ready(compiled(x, w))
    seconds = profiling.thunk_seconds(str(tmp_path), program.instructions)
    attribution = profiling.attribute(program, seconds, root=HERE)
    assert attribution.by_function[("test_profiling.py:_inner", "forward")] > 0
    assert attribution.by_function[("test_profiling.py:_inner", "backward")] > 0
    assert attribution.by_line[f"test_profiling.py:{product_line} (_inner)"] > 0
    # A dot fused with its neighbours (XLA:CPU's YNNPACK fusions) is counted as the dot.
    fused_dots = [i for i in program.instructions.values() if i.opcode == "fusion" and any(
        inner.opcode == "dot" for c in i.calls for inner in program.computations[c])]
    assert fused_dots and all(program.origin(f.name).opcode == "dot" for f in fused_dots)
    assert attribution.by_kind["dot"] >= sum(seconds[f.name] for f in fused_dots) > 0
    assert abs(sum(attribution.by_function.values()) - attribution.total) < 1e-9
    # Under another root nothing is found: all of it is XLA's own or outside.
    elsewhere = profiling.attribute(program, seconds, root=os.path.join(HERE, "fixtures"))
    assert elsewhere.unattributed == elsewhere.total > 0
