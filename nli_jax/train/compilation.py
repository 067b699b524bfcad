"""JAX's persistent compilation cache for the command-line tools, and what a run compiled.

A CPU fine-tuning run compiles its train step, one eval step per bucket and a few small
programs: 20-30 s on MiniLM, more on 12 layers, in every run, seed and sweep cell. With the cache
(--compilation_cache, on by default) a program compiled once is read back in the next run.
results.json's `compilation` says how many programs a run compiled, how long that took and how
many came from the cache."""
from __future__ import annotations

import os
import threading

DEFAULT_DIR = "~/.cache/nli_jax/jax_compilation_cache"
# XLA compilation, or reading the program back from the persistent cache (JAX times both as one).
_COMPILE = "/jax/core/compile/backend_compile_duration"
_HITS, _MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"

_lock = threading.Lock()
_totals = {"programs": 0, "seconds": 0.0, "cache_hits": 0, "cache_misses": 0}
_by_function: dict[str, int] = {}  # programs compiled per jitted function name (train_step: one per shape)
_listening = False


def _on_duration(event: str, duration_secs: float, fun_name: str | None = None, **_) -> None:
    if event == _COMPILE:
        with _lock:
            _totals["programs"] += 1
            _totals["seconds"] += duration_secs
            if fun_name:
                _by_function[fun_name] = _by_function.get(fun_name, 0) + 1


def _on_event(event: str, **_) -> None:
    key = {_HITS: "cache_hits", _MISSES: "cache_misses"}.get(event)
    if key:
        with _lock:
            _totals[key] += 1


def listen() -> None:
    """Counts compilations from now on (once per process)."""
    global _listening
    if _listening:
        return
    import jax  # late: nli_jax.cli imports this module; `import nli_jax` stays without JAX
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)
    _listening = True


def totals() -> dict:
    with _lock:
        return dict(_totals, by_function=dict(_by_function))


def since(before: dict) -> dict:
    """What was compiled after `before` (a totals() snapshot), with the cache directory in use;
    `by_function`: programs per jitted function (a train step's count is its shapes)."""
    import jax  # late: nli_jax.cli imports this module; `import nli_jax` stays without JAX
    now = totals()
    out = {k: now[k] - before[k] for k in now if k != "by_function"}
    out["by_function"] = {name: n - before["by_function"].get(name, 0) for name, n in sorted(now["by_function"].items())
                          if n > before["by_function"].get(name, 0)}
    out["seconds"] = round(out["seconds"], 3)
    out["cache_dir"] = jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None
    return out


def configure_cache(directory: str | None) -> str | None:
    """JAX's persistent compilation cache in `directory` (every program, however quick to
    compile: a CPU run's are many and small); None or empty: off. The environment's
    JAX_COMPILATION_CACHE_DIR (the tests' private cache) is left as it is. Returns the directory."""
    import jax  # late: nli_jax.cli imports this module; `import nli_jax` stays without JAX
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        directory = os.environ["JAX_COMPILATION_CACHE_DIR"]
    elif not directory:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    else:
        from nli_jax import storage  # late: fsspec, as jax above
        directory = storage.makedirs(storage.under(directory))  # JAX writes its cache entries in it
        jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return directory


# XLA:CPU runs dots either through YNNPACK fusions (a dot with its elementwise and reduction
# neighbours, XLA's default) or through its own Eigen-based dot thunks. Measured on an AMD EPYC
# (avx512, 2 cores), a 12 x 384 x 250k BERT's forward at 64 x 128 / 16 x 512 took 2.27 / 2.76 s on
# Eigen dots against 2.54 / 2.90 s with YNNPACK (`NLI_JAX_CPU_FORWARD_DOTS=eigen|ynnpack python
# benchmarks/encoder_vs_torch.py --model=DIR --shapes=64x128,16x512 --rounds=2`), while the
# BERT-base MLM training step was faster with YNNPACK (1.44x PyTorch against 1.32x,
# benchmarks/mlm_train_step.py). So only the forward-only programs (evaluation and prediction)
# drop it, and only on CPU. NLI_JAX_CPU_FORWARD_DOTS=ynnpack keeps XLA's default there too.
FORWARD_DOTS_ENV = "NLI_JAX_CPU_FORWARD_DOTS"
_FORWARD_DOTS = {"eigen": {"xla_cpu_experimental_ynn_fusion_type": ""}, "ynnpack": None}


def forward_dots() -> str:
    """NLI_JAX_CPU_FORWARD_DOTS (default "eigen"); an unknown value is a ValueError naming it."""
    choice = os.environ.get(FORWARD_DOTS_ENV, "eigen")
    if choice not in _FORWARD_DOTS:
        raise ValueError(f"{FORWARD_DOTS_ENV}={choice!r}: expected one of {', '.join(_FORWARD_DOTS)}")
    return choice


def forward_compiler_options(platform: str) -> dict | None:
    """XLA compiler options for forward-only programs (jax.jit(..., compiler_options=...)) on the
    devices of `platform` (the mesh's, which is not the host's default backend when compiling for
    a TPU topology on a CPU host): Eigen dots on CPU (see above), XLA's defaults on accelerators."""
    choice = forward_dots()
    return _FORWARD_DOTS[choice] if platform == "cpu" else None
