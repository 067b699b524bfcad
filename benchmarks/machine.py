"""The machine a benchmark ran on, printed with every figure: CPUs differ (an Intel Xeon with
AVX-512 and AMX, an AMD EPYC with AVX2 only) and a ratio measured on one does not carry to
another. `describe()` for the JSON, `line()` for the printout."""
from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # nli_jax

# Instruction-set extensions XLA's and PyTorch's CPU kernels choose between.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def describe() -> dict:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    from nli_jax.train.host_memory import thp_mode  # what the default host allocator can use
    thp = thp_mode()
    return {"cpu": model or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "isa": [f for f in ISA_FLAGS if f in flags], "thp": thp}


def line() -> str:
    d = describe()
    return f"CPU: {d['cpu']}, {d['cores']} cores, {' '.join(d['isa']) or 'no AVX2'}, THP {d['thp'] or 'unknown'}"


if __name__ == "__main__":
    print(line())
