"""XLA:CPU step temporaries kept in the heap (nli_jax.train.host_memory), through cli.run.

Each case is a fresh process (the allocator setting only reaches threads that have not
allocated yet), running a jitted function with a 64 MB temporary under `cli.run`, as
finetune.main and pretrain.main run theirs, and counting the minor page faults of repeated calls.
"""
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from nli_jax.train import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, resource, sys
    from nli_jax.train import cli, host_memory

    def main(argv):
        import jax, jax.numpy as jnp
        @jax.jit
        def step(x, w, v):
            # A [8192, 2048] float32 temporary (64 MB) between two matmuls.
            return (jnp.tanh(x @ w) @ v).sum()
        x, w, v = jnp.ones((8192, 256)) / 256, jnp.ones((256, 2048)), jnp.ones((2048, 8))
        step(x, w, v).block_until_ready()
        step(x, w, v).block_until_ready()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            step(x, w, v).block_until_ready()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
        print(json.dumps({"applied": host_memory._APPLIED, "faults_per_call": faults}))

    cli.run(main)
""")


def run_script(**env):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO, **env}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment,
                         timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's allocator only")
def test_cli_keeps_step_temporaries_in_the_heap():
    tuned = run_script()
    system = run_script(NLI_JAX_HOST_MALLOC="system")
    assert tuned["applied"] and not system["applied"]
    # glibc's default: the temporaries are a fresh mmap each call, faulted in page by page
    # (64 MB = 16,384 pages). Kept in the heap, repeated calls fault (almost) nothing.
    assert system["faults_per_call"] > 16_000, system
    assert tuned["faults_per_call"] < 1_000, tuned


def test_not_applied_off_cpu(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert not host_memory.jax_runs_on_cpu_only()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_memory.jax_runs_on_cpu_only()
