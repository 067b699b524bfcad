"""Host memory allocation for XLA:CPU runs: keep each step's temporaries in the heap.

XLA:CPU allocates an execution's temporaries as one buffer (1.65 GB for a MiniLM-L6 training
step at 32 x 128) with posix_memalign on one of its worker threads. glibc serves a request that
large in a thread's arena with a fresh mmap and gives it back with munmap when the step ends,
so every step page-faults and the kernel zeroes the whole buffer again: 412,000 minor faults
and 0.6 s of kernel time per 2.05 s step. With one arena (the main heap, which grows without
bound), no mmap and no trimming, the freed buffer is reused by the next step: 1.73 s, no
faults (`benchmarks/finetune_vs_transformers.py` measures the whole run).

One arena serialises allocation across threads, which slows the Rust tokenizer's parallel
batch encoding by half or more, so the corpus tools do not use this; training, evaluation and
prediction tokenise once, single-threaded, before any step. It is applied only when JAX will
run on the CPU (on accelerators XLA's temporaries live in device memory) and only to threads
that have not allocated yet, so it must come before JAX runs anything: `cli.run` calls it
before parsing flags. NLI_JAX_HOST_MALLOC=system turns it off.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_APPLIED = False


def jax_runs_on_cpu_only() -> bool:
    """Whether JAX will pick the CPU, judged without initialising a backend: JAX_PLATFORMS when
    set, else whether an accelerator plugin (libtpu, a jax_plugins entry point) is installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return all(p.strip() == "cpu" for p in platforms.split(",") if p.strip())
    if importlib.util.find_spec("libtpu") is not None:
        return False
    # JAX finds PJRT plugins (jax-cuda12-plugin, ...) as modules of the jax_plugins namespace
    # package and as entry points of that group.
    namespace = importlib.util.find_spec("jax_plugins")
    if namespace is not None and any(pkgutil.iter_modules(namespace.submodule_search_locations or [])):
        return False
    try:
        return not importlib.metadata.entry_points(group="jax_plugins")
    except Exception:  # noqa: BLE001 - unreadable distribution metadata: assume an accelerator
        return False


def keep_temporaries_in_heap() -> bool:
    """Serve all allocations from glibc's main heap, without mmap or trimming, on a CPU-only
    run. Returns whether the setting was applied (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return True
    if (os.environ.get("NLI_JAX_HOST_MALLOC", "").lower() == "system" or not sys.platform.startswith("linux")
            or platform.libc_ver()[0] != "glibc" or not jax_runs_on_cpu_only()):
        return False
    libc = ctypes.CDLL(None)
    # -1 is SIZE_MAX to glibc: the heap's free top is never returned to the system.
    _APPLIED = all(libc.mallopt(param, value) == 1
                   for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
    return _APPLIED
