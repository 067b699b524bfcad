"""Host memory allocation for XLA:CPU runs: step temporaries on transparent huge pages.

XLA:CPU allocates an execution's temporaries as one large buffer (1.65 GB for a MiniLM-L6
training step at 32 x 128) on one of its worker threads. glibc serves a request that large with a
fresh mmap and gives it back with munmap when the step ends, so every step page-faults the whole
buffer in again, 4 KiB at a time (412,000 minor faults and 0.6 s of kernel time per 2.05 s step).

NLI_JAX_HOST_MALLOC picks what a CPU-only run does about it (`configure`, called by `cli.run`
before flags are parsed and by the benchmarks):
  hugepages (default)  glibc's allocator as it is, with its large chunks advised onto transparent
                       huge pages (the glibc.malloc.hugetlb=1 tunable, glibc >= 2.35): a fault
                       maps 2 MiB, not 4 KiB (8.0M -> 0.56M faults in a 12 x 384 x 250k fine-tuning
                       run). Tunables are read when a process starts, so the interpreter re-executes
                       itself once with GLIBC_TUNABLES set, before anything else runs. Nothing is
                       done where the kernel's THP mode is "never" (no effect) or "always" (already).
  heap                 one arena (the main heap), no mmap, no trimming: freed temporaries are reused
                       without faults, but the heap keeps every buffer it ever held and fragments:
                       peak RSS 11.8 GB against 5.6 GB in that run, and compilation (LLVM on many
                       threads, one arena) is slower. The setting of earlier versions.
  system               glibc's defaults.
Measured by benchmarks/finetune_vs_transformers.py (peak RSS per run) and benchmarks/mlm_train_step.py;
figures with their CPU in docs/performance.md. On accelerators none of this applies
(XLA's temporaries live in device memory).
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
MODES = ("hugepages", "heap", "system")
_HUGETLB = "glibc.malloc.hugetlb=1"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


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


def mode() -> str:
    """NLI_JAX_HOST_MALLOC (default hugepages); an unknown value is refused with the choices."""
    value = os.environ.get("NLI_JAX_HOST_MALLOC", "").strip().lower() or "hugepages"
    if value not in MODES:
        raise ValueError(f"NLI_JAX_HOST_MALLOC={value!r}: expected one of {', '.join(MODES)}")
    return value


def _glibc_at_least(major: int, minor: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    name, version = platform.libc_ver()
    try:
        return name == "glibc" and tuple(int(v) for v in version.split(".")[:2]) >= (major, minor)
    except ValueError:
        return False


def thp_mode() -> str:
    """The kernel's transparent-huge-page mode (always, madvise or never; "" when unknown)."""
    try:
        with open(_THP_MODE, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return ""
    chosen = [w[1:-1] for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else ""


def hugepages_applied() -> bool:
    """Whether this process's allocator advises its large chunks onto huge pages."""
    return _HUGETLB in os.environ.get("GLIBC_TUNABLES", "").split(":")


def configure() -> str:
    """Applies NLI_JAX_HOST_MALLOC on a CPU-only run (see the module docstring) and returns what
    is in effect: "hugepages", "heap" or "system". For "hugepages" this may re-execute the
    interpreter with the same command line (sys.orig_argv), so call it first thing in a program's
    main, before any output or thread; it never re-executes an interactive or embedded interpreter."""
    chosen = mode()
    if chosen == "system" or not jax_runs_on_cpu_only():
        return "system"
    if chosen == "heap":
        return "heap" if keep_temporaries_in_heap() else "system"
    if hugepages_applied():
        return "hugepages"
    argv = list(getattr(sys, "orig_argv", []))
    if (not _glibc_at_least(2, 35) or thp_mode() != "madvise" or len(argv) < 2 or not sys.argv or not sys.argv[0]
            or sys.flags.interactive):
        return "system"
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb=")]
    env = dict(os.environ, GLIBC_TUNABLES=":".join(tunables + [_HUGETLB]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
    return "hugepages"  # not reached


def keep_temporaries_in_heap() -> bool:
    """Serve all allocations from glibc's main heap, without mmap or trimming, on a CPU-only
    run (NLI_JAX_HOST_MALLOC=heap). Returns whether the setting was applied (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return True
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc" or not jax_runs_on_cpu_only():
        return False
    libc = ctypes.CDLL(None)
    # -1 is SIZE_MAX to glibc: the heap's free top is never returned to the system.
    _APPLIED = all(libc.mallopt(param, value) == 1
                   for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))
    return _APPLIED
