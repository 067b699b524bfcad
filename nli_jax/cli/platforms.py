"""Which JAX platforms a command line tries, decided before JAX starts.

With the TPU compiler installed (`libtpu`, the `tpu` extra that launch.compile needs), JAX tries
to start a TPU backend in every process; on a machine without TPU chips that costs libtpu's
start-up and prints several lines of its failure to stderr before JAX falls back to the CPU. A
command line run on such a machine (no TPU chip on the PCI bus, no GPU plugin installed, and
JAX_PLATFORMS unset) therefore asks for the CPU alone, as JAX itself would end up using.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips' PCI vendor id (what JAX's hardware_utils looks for)
_GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin")


def tpu_chips_present() -> bool:
    for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(path) as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def skip_absent_tpu() -> bool:
    """Sets JAX_PLATFORMS=cpu when libtpu is installed on a machine with no TPU chip and no GPU
    plugin (before JAX starts a backend); True when it did. Called by the command lines and by
    `import nli_jax` (the library: `from nli_jax.models import ...`, then any JAX call). When JAX
    was imported first, its platforms setting is changed as well, as long as no backend started."""
    if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return False
    if tpu_chips_present() or any(importlib.util.find_spec(p) is not None for p in _GPU_PLUGINS):
        return False
    jax = sys.modules.get("jax")
    if jax is not None:
        if _backends_started() or getattr(jax.config, "jax_platforms", None):
            return False  # too late, or the user chose
        jax.config.update("jax_platforms", "cpu")
    os.environ["JAX_PLATFORMS"] = "cpu"
    return True


def _backends_started() -> bool:
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(xla_bridge, "_backends", None))
