"""The host allocator setting for XLA:CPU step temporaries (nli_jax.cli.host_memory), through cli.run.

Each case is a fresh process (glibc reads its tunables at start; mallopt reaches only threads
that have not allocated yet), running a jitted function with a 64 MB temporary under `cli.run`,
as finetune.main and pretrain.main run theirs, and counting the minor page faults of repeated calls.
"""
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from nli_jax.cli import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, resource, sys
    from nli_jax import cli
    from nli_jax.cli import host_memory

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
        print(json.dumps({"applied": host_memory._APPLIED, "hugepages": host_memory.hugepages_applied(),
                          "faults_per_call": faults}))

    cli.run(main)
""")


def run_script(**env):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO, **env}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment,
                         timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_cli_heap_mode_keeps_step_temporaries_in_the_heap():
    heap = run_script(NLI_JAX_HOST_MALLOC="heap")
    system = run_script(NLI_JAX_HOST_MALLOC="system")
    assert heap["applied"] and not system["applied"] and not system["hugepages"]
    # glibc's default: the temporaries are a fresh mmap each call, faulted in page by page
    # (64 MB = 16,384 pages). Kept in the heap, repeated calls fault (almost) nothing.
    assert system["faults_per_call"] > 16_000, system
    assert heap["faults_per_call"] < 1_000, heap


@pytest.mark.skipif(not GLIBC or not host_memory._glibc_at_least(2, 35), reason="glibc >= 2.35 (malloc hugetlb tunable)")
def test_cli_default_puts_step_temporaries_on_huge_pages():
    """The default re-executes the command with glibc.malloc.hugetlb=1 where the kernel's THP mode
    is madvise: the 64 MB temporary is faulted in 2 MiB at a time (32 faults, not 16,384)."""
    if host_memory.thp_mode() != "madvise":
        pytest.skip(f"the kernel's transparent-huge-page mode is {host_memory.thp_mode() or 'unknown'!r}, not madvise: "
                    "the default changes nothing here")
    default = run_script(NLI_JAX_HOST_MALLOC="", GLIBC_TUNABLES="")
    assert default["hugepages"] and not default["applied"], default
    assert default["faults_per_call"] < 2_000, default


def test_an_unknown_host_malloc_mode_is_one_line_before_compute():
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO, "NLI_JAX_HOST_MALLOC": "tcmalloc"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: NLI_JAX_HOST_MALLOC='tcmalloc': expected one of hugepages, heap, system"]


def test_not_applied_off_cpu(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert not host_memory.jax_runs_on_cpu_only()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_memory.jax_runs_on_cpu_only()
