"""Reliability, fourth round (issue 53; docs/errors.md §18-§20): no rerun or tool destroys a
result (the seed list is part of a run; an empty path is refused by every command; one output
check for every tool that writes), parsing that cannot crash (nesting depth and number size
bounded, JSON arrays read in linear time, ranges on what sizes an allocation) and verified reads
(a checkpoint carries its run's identity and a digest of its contents). Each case runs the real
command or the real function."""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, config_for
from test_reliability_io import CPU_TEST, VAL, fake_run, one_line_error, tree

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def env_cpu():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)
    return env


def commands(cwd, *argvs, timeout=180):
    """Runs each `python -m ...` argv in `cwd` (two at a time); returns their CompletedProcesses."""
    def one(argv):
        return subprocess.run([sys.executable, "-m", *map(str, argv)], cwd=cwd, env=env_cpu(), capture_output=True,
                              text=True, timeout=timeout)
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, argvs))


# --- 18. no rerun or tool destroys a result ----------------------------------------------------

def _no_training(monkeypatch):
    from nli_jax.train import loop

    def trained(*args, **kwargs):
        raise AssertionError("a run started: the changed seed list was not refused")
    monkeypatch.setattr(loop, "run_one", trained)


def test_a_changed_seed_list_on_a_finished_run_is_refused_naming_seeds(tmp_path, monkeypatch):
    """A finished single-seed run rerun with --config.seeds="(0,1)" trained the seeds and replaced
    its results.json by their aggregate (config.json and predictions.jsonl of the old run)."""
    from nli_jax.errors import RunError
    from nli_jax.train.loop import train_and_evaluate
    run = fake_run(tmp_path / "run")
    results = (run / "results.json").read_bytes()
    _no_training(monkeypatch)
    config = config_for("indonli_large:cpu_test")
    with config.unlocked():
        config.seeds = (0, 1)
    with pytest.raises(RunError, match=r"holds a run with a different config \(seeds: \[\] -> \[0, 1\]\)"):
        train_and_evaluate(config, str(run))
    assert (run / "results.json").read_bytes() == results
    assert not any(p.name.startswith("seed_") for p in run.iterdir())


def test_a_seeds_run_records_its_seeds_and_a_rerun_with_others_is_refused(tmp_path, monkeypatch):
    """A seeds run's own config.json (W/config.json, written with the first seed's) names its seeds;
    a seeds run of an older nli-jax (no W/config.json) is known by its results.json."""
    from nli_jax import workdir as workdir_lib
    from nli_jax.errors import RunError
    from nli_jax.train.loop import train_and_evaluate
    from nli_jax.planner import build_plan
    config = config_for("indonli_large:cpu_test")
    with config.unlocked():
        config.seeds = (1, 2)
    workdir = tmp_path / "seeds"
    workdir.mkdir()
    workdir_lib.write_config(str(workdir), build_plan(config, training=False).config_json)
    (workdir / "results.json").write_text(json.dumps({"seeds": [1, 2], "splits": {}}))
    older = tmp_path / "older"
    older.mkdir()
    (older / "results.json").write_text(json.dumps({"seeds": [1, 2], "splits": {}}))
    _no_training(monkeypatch)
    with config.unlocked():
        config.seeds = (1, 3)
    for directory in (workdir, older):
        with pytest.raises(RunError, match=r"\(seeds: \[1, 2\] -> \[1, 3\]\)"):
            train_and_evaluate(config, str(directory))


def test_an_empty_path_is_refused_by_every_command(tmp_path):
    """--workdir= trained a whole run into the current directory (exit 0); predict --output=,
    evaluate --workdir=, export --output= and build_vocab --output_dir= wrote there too. Every
    launcher: cli.run, run_tool, run_offline, python -m nli_jax.analysis, the leaderboard."""
    run = fake_run(tmp_path / "run")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    config = f"--config={REPO / 'configs/indonli_large.py'}:cpu_test"
    cases = [
        (("finetune.main", config, "--workdir="), "--workdir=''"),
        (("finetune.predict", f"--checkpoint={run}", "--output=", f"--input=x={VAL}"), "--output=''"),
        (("finetune.evaluate", f"--checkpoint={run}", "--workdir="), "--workdir=''"),
        (("finetune.export", f"--checkpoint={run}", "--output="), "--output=''"),
        (("pretrain.build_vocab", f"--corpus={VAL}", "--output_dir="), "--output_dir=''"),
        (("pretrain.create_examples", "--corpus=", f"--vocab_dir={run}", f"--output_dir={tmp_path}/e"), "--corpus=''"),
        (("launch.compile", config, "--output="), "--output=''"),
        (("nli_jax.analysis", "cartography", "--workdir="), "--workdir=''"),
        (("nli_jax.leaderboard", "--format=clue_ocnli", f"--run={run}", "--output="), "--output=''"),
    ]
    for proc, (argv, flag) in zip(commands(cwd, *(argv for argv, _ in cases)), cases):
        one_line_error(proc, flag, "an empty path names the current directory")
    assert tree(cwd) == []


def test_every_tool_that_writes_refuses_a_finished_runs_files(tmp_path):
    """launch.compile --output=<run>/results.json overwrote a finished run's results;
    build_vocab and create_examples wrote into a finished run's directory."""
    run = fake_run(tmp_path / "run")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("satu dua tiga.\nempat lima.\n\nenam tujuh.\n")
    snapshot = {p: (run / p).read_bytes() if (run / p).is_file() else None for p in tree(run)}
    config = f"--config={REPO / 'configs/indonli_large.py'}:cpu_test"
    cases = [
        (("launch.compile", config, f"--output={run}/results.json"), f"--output={run}/results.json is inside"),
        (("pretrain.build_vocab", f"--corpus={corpus}", f"--output_dir={run}"), f"--output_dir={run} holds a training run"),
        (("pretrain.create_examples", f"--corpus={corpus}", f"--vocab_dir={tmp_path}", f"--output_dir={run}/examples"),
         f"--output_dir={run}/examples is inside the training run {run}"),
        (("pretrain.prepare_corpus", f"--inputs={corpus}", f"--output_dir={run}/corpus"),
         f"--output_dir={run}/corpus is inside the training run {run}"),
    ]
    for proc, (argv, message) in zip(commands(tmp_path, *(argv for argv, _ in cases)), cases):
        one_line_error(proc, message)
    assert {p: (run / p).read_bytes() if (run / p).is_file() else None for p in tree(run)} == snapshot


# --- 19. parsing that cannot crash ---------------------------------------------------------------

def _deep(levels):
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("layout", ["jsonl", "array"])
@pytest.mark.parametrize("row,message", [
    ('{"pair_id": 1, "x": ' + _deep(100_000) + '}', "nested deeper than 64 levels"),  # RecursionError before
    ('{"pair_id": 1, "x": ' + _deep(70) + '}', "nested deeper than 64 levels"),
    ('{"pair_id": ' + "7" * 5000 + '}', "an integer of 5000 digits (at most 100 are read)"),  # ValueError: 4300 digits
    ('{"label": -' + "7" * 5000 + '}', "an integer of 5000 digits (at most 100 are read)"),
], ids=["100000-deep", "70-deep", "5000-digit-id", "5000-digit-negative-label"])
def test_a_row_beyond_the_parsers_bounds_is_one_line_naming_file_and_line(tmp_path, layout, row, message):
    from nli_jax.data.readers import DataError, read_json_records
    path = tmp_path / "train.jsonl"
    good = '{"pair_id": 0, "premise": "a", "hypothesis": "b", "label": "e"}'
    path.write_text(f"{good}\n\n{row}\n" if layout == "jsonl" else f"[{good},\n\n {row}]\n")
    with pytest.raises(DataError) as info:
        list(read_json_records(str(path)))
    assert str(info.value) == f"{path}:3: {message}: not a dataset row"


def test_a_runs_own_json_beyond_the_bounds_is_refused_naming_it(tmp_path):
    from nli_jax import workdir as workdir_lib
    from nli_jax.errors import RunError
    (tmp_path / "config.json").write_text('{"a": ' + _deep(100_000) + '}')
    with pytest.raises(RunError, match=rf"{tmp_path}/config.json is unreadable \(JSONLimitError: nested deeper"):
        workdir_lib.read_config(str(tmp_path))


def test_a_json_array_file_is_read_in_linear_time_with_progress(tmp_path, monkeypatch, caplog):
    # nli-jax's logger stops propagating once a run in this worker set it up: caplog reads the root's.
    import logging as logging_
    monkeypatch.setattr(logging_.getLogger("nli_jax"), "propagate", True)
    """40k records of a JSON-array file took 66 s (every record's line counted from the file's
    start); the same rows as JSON lines took a second. A long read logs its progress."""
    import logging
    import time

    from nli_jax.data import readers
    rows = [json.dumps({"pair_id": i, "premise": "kata " * 10, "hypothesis": "x", "label": "e"}) for i in range(40_000)]
    path = tmp_path / "big.jsonl"
    path.write_text("[\n" + ",\n".join(rows) + "\n]\n")
    monkeypatch.setattr(readers._Progress, "PROGRESS_S", 0.0)
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="nli_jax"):
        examples = readers.read_validated(str(path), readers.read_json_records, lambda p, n, row: dict(row))
    seconds = time.monotonic() - start
    assert len(examples) == 40_000 and seconds < 10, seconds
    assert f"{path}: 40000 rows read (line 40001) ..." in caplog.text


@pytest.mark.parametrize("assignment,message", [
    ("model.vocab_multiple=1000000000", "model.vocab_multiple must be <= 4096"),  # aborted in XLA (rc 134)
    ("data.max_seq_length=1000000", "data.max_seq_length must be <= 65536"),
    ("data.buckets=(64, 10000000)", "data.buckets"),
    ("train.batch_size=10000000", "train.batch_size must be <= 100000"),
    ("train.keep_checkpoints=100000", "train.keep_checkpoints must be <= 1000"),
    ("data.workers=100000", "data.workers must be <= 256"),
])
def test_config_fields_that_size_an_allocation_have_a_range(assignment, message):
    from nli_jax.errors import ConfigValueError
    from nli_jax.planner import build_plan
    with pytest.raises(ConfigValueError, match=re.escape(message)):
        build_plan(config_for("indonli_large:cpu_test", assignment))


def test_the_benchmark_refuses_unknown_tasks_and_models_in_one_line(tmp_path):
    """--tasks=smsa,../../x or --model=nosuch: a 29-line traceback."""
    procs = commands(tmp_path, ("finetune.indonlu_benchmark", "--workdir=b", "--tasks=smsa,../../x", "--model=nosuch"),
                     ("finetune.indonlu_benchmark", "--workdir=b", "--seeds=1,x"))
    one_line_error(procs[0], "--model=nosuch: unknown model", "--tasks=smsa,../../x: unknown task(s) ['../../x']")
    one_line_error(procs[1], "--seeds=1,x: seeds are integers")
    assert tree(tmp_path) == []


# --- 20. verified reads: a checkpoint carries its run's identity and a digest of its arrays ------

SHORT = ("train.max_steps=4", "train.checkpoint_every_steps=2", "train.eval_every_steps=2", "train.keep_checkpoints=5",
         "eval_splits=('validation',)")


def short_config(tfds_dir, *more):
    return config_for("indonli_large:cpu_test", *SHORT, f"data.tfds_dir={tfds_dir}", *more)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished cpu_test run of 4 steps: checkpoints 2 and 4, best/ (10-15 s)."""
    from nli_jax.train.loop import train_and_evaluate
    root = tmp_path_factory.mktemp("verified")
    tfds_dir, workdir = str(root / "tfds"), root / "run"
    train_and_evaluate(short_config(tfds_dir), str(workdir))
    return workdir, tfds_dir


def copy_of(run, target):
    import shutil
    shutil.copytree(run, target, ignore=shutil.ignore_patterns(".lock"))
    return target


def flip_three_bytes(directory):
    """Three bytes of the largest array file below `directory` changed, as a bad disk does:
    orbax and tensorstore read the file without complaint."""
    largest = max((p for p in directory.rglob("*") if p.is_file() and "/d/" in str(p)), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    for offset in (len(data) // 2, len(data) // 2 + 101, len(data) // 2 + 202):
        data[offset] ^= 0x5A
    largest.write_bytes(bytes(data))



def test_flipped_bytes_in_best_are_refused_by_the_tools(trained_run, tmp_path):
    """Three bytes flipped in a file of best/: finetune.evaluate exited 0 reporting what the
    damaged parameters gave (0.333 where the intact run gives 0.967)."""
    from nli_jax import tools
    from nli_jax.train.checkpointing import CheckpointUnreadableError
    run, tfds_dir = trained_run
    damaged = copy_of(run, tmp_path / "run")
    step = next(p.name for p in (damaged / "best").iterdir() if p.name.isdigit())
    flip_three_bytes(damaged / "best" / step)
    with pytest.raises(CheckpointUnreadableError) as info:
        tools.evaluate_checkpoint(short_config(tfds_dir), str(tmp_path / "eval"), str(damaged))
    message = " ".join(str(info.value).split())
    assert f"the best parameters in {damaged}/best/{step} are unreadable (ValueError: its arrays differ from those " \
           "written (content digest sha256:" in message, message
    assert f"Rerun the run's own command: it takes step {step}'s parameters from {damaged}/checkpoints/{step}" in message
    assert not (tmp_path / "eval" / "results.json").exists()


def test_flipped_bytes_in_the_latest_checkpoint_fall_back_to_the_previous_step(trained_run, tmp_path, nli_log):
    """The same in the latest checkpoint's state: NaN at the next step (blamed on the learning
    rate), every rerun repeating it; the intact earlier step was never tried."""
    from nli_jax.train.loop import train_and_evaluate
    run, tfds_dir = trained_run
    damaged = copy_of(run, tmp_path / "run")
    flip_three_bytes(damaged / "checkpoints" / "4" / "state")
    results = train_and_evaluate(short_config(tfds_dir), str(damaged))
    moved = [line for line in nli_log if line.startswith(f"checkpoint {damaged}/checkpoints/4 is unreadable")]
    assert moved and "(ValueError: its arrays differ from those written" in moved[0], nli_log
    assert moved[0].endswith(f"moved it to {damaged}/checkpoints_unreadable/4 and resumed from step 2")
    assert sorted(os.listdir(damaged / "checkpoints")) == ["2", "4"]  # step 4 trained again from step 2
    assert results["steps"] == 4


def test_another_runs_checkpoints_are_refused_in_one_line(trained_run, tmp_path, nli_log):
    """Another run's checkpoint directory copied into a workdir: "resumed from step 90", exit 0,
    accuracy 0.50 where the run gives 0.967. Its best/ under another run: evaluated as that run's."""
    import shutil

    from nli_jax import workdir as workdir_lib
    from nli_jax import tools
    from nli_jax.train.checkpointing import ForeignCheckpointError
    from nli_jax.train.loop import train_and_evaluate
    from nli_jax.planner import build_plan
    run, tfds_dir = trained_run
    other = short_config(tfds_dir, "optimizer.lr=0.002")
    workdir = tmp_path / "other"
    workdir.mkdir()
    workdir_lib.write_config(str(workdir), build_plan(other, training=False).config_json)
    shutil.copytree(run / "checkpoints", workdir / "checkpoints")
    with pytest.raises(ForeignCheckpointError) as info:
        train_and_evaluate(other, str(workdir))
    message = " ".join(str(info.value).split())
    assert message.startswith(f"{workdir}/checkpoints/4 was written by another run (config-sha256:"), message
    assert f"than the one in {workdir} (config-sha256:" in message
    assert not any("resumed" in line for line in nli_log)
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]  # refused, not moved aside
    for name in ("checkpoints", "best"):
        shutil.rmtree(workdir / name)
    shutil.copytree(run / "best", workdir / "best")
    (workdir / "run.json").write_text(json.dumps({"state": "finished"}))
    with pytest.raises(ForeignCheckpointError, match=rf"^{workdir}/best/\d+ was written by another run"):
        tools.evaluate_checkpoint(other, str(tmp_path / "eval"), str(workdir))


def test_model_init_of_a_run_directory_starts_from_its_verified_best(trained_run, tmp_path):
    """--config.model.init=<a run's workdir> (sequential fine-tuning, tests/test_sequential.py) reads
    its best/ as the tools do, verified; flipped bytes there are refused naming the path.
    --config.model.tokenizer=<a run's workdir> names the run's export instead."""
    from nli_jax.errors import ConfigValueError, RunError
    from nli_jax.train.setup import model_inputs
    from nli_jax.planner import build_plan
    run, tfds_dir = trained_run
    assert model_inputs(build_plan(short_config(tfds_dir, f"model.init={run}"), training=False)).run_init.workdir == str(run)
    damaged = copy_of(run, tmp_path / "run")
    step = next(p.name for p in (damaged / "best").iterdir() if p.name.isdigit())
    flip_three_bytes(damaged / "best" / step)
    with pytest.raises(RunError, match=rf"^--config.model.init={damaged}: the best parameters in {damaged}/best/{step} "
                                       r"are unreadable \(ValueError: its arrays differ from those written"):
        model_inputs(build_plan(short_config(tfds_dir, f"model.init={damaged}"), training=False))
    with pytest.raises(ConfigValueError, match=rf"--config.model.tokenizer='{run}': {run} is a training run's "
                                               rf"directory .*python -m finetune.export --checkpoint={run} --output=DIR"):
        model_inputs(build_plan(short_config(tfds_dir, f"model.tokenizer={run}"), training=False))


OLD_COMMIT = "5272312"  # the last commit whose checkpoints carry neither run identity nor content digest
# Runs the old code's training until its checkpoint of step 2 is written, then ends the process
# (as a kill would: run.json stays "running").
# Code of 5272312 (the layout then: nli_jax.train.cli), run from its own tree.
OLD_RUN = """
import os, sys
from nli_jax.train import checkpointing, loop
from nli_jax.train.cli import apply_overrides
import importlib
save = checkpointing.Checkpointer.save
def save_then_die(self, step, *args, **kwargs):
    saved = save(self, step, *args, **kwargs)
    if step == 2:
        self.manager.wait_until_finished()
        os._exit(0)
    return saved
checkpointing.Checkpointer.save = save_then_die
config = importlib.import_module("configs.indonli_large").get_config("cpu_test")
apply_overrides(config, sys.argv[2:])
loop.train_and_evaluate(config, sys.argv[1])
"""


@pytest.mark.slow  # the old code's run to its step 2, then this code's resumption: about 40 s
def test_checkpoints_of_an_older_nli_jax_still_resume(tmp_path, nli_log):
    """Written by the code at commit 5272312 (no identity, no digest): resumed, logged as unverified."""
    from nli_jax.train.loop import train_and_evaluate
    if subprocess.run(["git", "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"], cwd=REPO).returncode != 0:
        pytest.skip(f"commit {OLD_COMMIT} is not in this checkout (shallow clone)")
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(["git", "archive", OLD_COMMIT], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    tfds_dir, workdir = str(tmp_path / "tfds"), tmp_path / "run"
    fixtures = REPO / "nli_jax" / "data" / "fixtures"  # the same inputs as this code's config: one run
    overrides = [*SHORT, f"data.tfds_dir={tfds_dir}", f"data.source={fixtures / 'nli_tiny'}",
                 f"model.tokenizer={fixtures / 'tiny_wordpiece'}"]
    env = dict(env_cpu(), PYTHONPATH=str(old))
    proc = subprocess.run([sys.executable, "-c", OLD_RUN, str(workdir), *overrides], cwd=old, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]
    assert "run_identity" not in (workdir / "checkpoints" / "2" / "loop" / "metadata").read_text()
    results = train_and_evaluate(config_for("indonli_large:cpu_test", *overrides), str(workdir))
    assert f"resumed from {workdir}/checkpoints at step 2" in nli_log
    assert f"{workdir}/checkpoints/2 carries no content digest (written by an older nli-jax, or by several " \
           "processes): restored unverified" in nli_log
    assert results["steps"] == 4 and sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
    assert "run_identity" in (workdir / "checkpoints" / "4" / "loop" / "metadata").read_text()


LIBRARY_USE = """
import os, sys
if sys.argv[1] == "jax_first":
    import jax
import nli_jax
from nli_jax.models import preset
import jax
import jax.numpy as jnp
jnp.ones(2).sum().block_until_ready()
print(os.environ.get("JAX_PLATFORMS"), jax.config.jax_platforms, jax.default_backend())
"""


@pytest.mark.parametrize("order", ["nli_jax_first", "jax_first"])
def test_the_library_on_a_machine_without_tpu_chips_does_not_start_libtpu(order):
    """After the README's install (libtpu included), `from nli_jax.models import ...` and any JAX
    call printed about ten lines of libtpu's initialisation errors; the command lines did not."""
    import importlib.util

    from nli_jax.cli import platforms
    if importlib.util.find_spec("libtpu") is None or platforms.tpu_chips_present():
        pytest.skip("needs libtpu installed on a machine without TPU chips")
    env = env_cpu()
    env.pop("JAX_PLATFORMS")
    proc = subprocess.run([sys.executable, "-c", LIBRARY_USE, order], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["cpu", "cpu", "cpu"], (proc.stdout, proc.stderr[-2000:])
    assert "libtpu" not in proc.stderr and "TPU" not in proc.stderr, proc.stderr[-2000:]


# --- the array_record copy of the data is verified too ------------------------------------------

def _examples(flip=0, n=60):
    return {"train": [{"idx": i, "label": (i + flip) % 3, "text": f"kalimat {i}"} for i in range(n)]}


def _version_dir(data_dir):
    return next(p for p in data_dir.rglob("1.0.0") if p.is_dir())


def test_a_cache_built_from_other_files_in_this_ones_place_is_rebuilt(tmp_path, nli_log):
    """A cache built from label-flipped IndoNLI, placed where the real IndoNLI's goes, trained on
    flipped labels (exit 0; inputs.json recorded the real file's hash)."""
    import shutil

    from nli_jax.data import records
    source = tmp_path / "train.jsonl"
    source.write_text("the same file name and bytes: the cache's directory name is the same\n")
    real, flipped = tmp_path / "real", tmp_path / "flipped"
    records.prepare_records("demo", _examples(), [str(source)], str(real))
    records.prepare_records("demo", _examples(flip=1), [str(source)], str(flipped))
    shutil.rmtree(_version_dir(real))
    shutil.copytree(_version_dir(flipped), _version_dir(flipped).as_posix().replace("/flipped/", "/real/"))
    read = records.prepare_records("demo", _examples(), [str(source)], str(real))["train"]
    assert sorted((e["idx"], e["label"]) for e in read.get_many(range(60))) == [(i, i % 3) for i in range(60)]
    assert f"{_version_dir(real)}: it was built from other examples than this run's files hold; building it again" \
        in nli_log


def test_a_truncated_cache_shard_is_rebuilt_not_a_riegeli_traceback(tmp_path, nli_log):
    from nli_jax.data import records
    source = tmp_path / "train.jsonl"
    source.write_text("x\n")
    records.prepare_records("demo", _examples(), [str(source)], str(tmp_path / "tfds"))
    shard = next(_version_dir(tmp_path / "tfds").glob("*array_record*"))
    with open(shard, "r+b") as f:
        f.truncate(100)
    read = records.prepare_records("demo", _examples(), [str(source)], str(tmp_path / "tfds"))["train"]
    assert len(read.get_many(range(60))) == 60
    assert f"{shard.parent}: its files differ from those written ({shard.name}); building it again" in nli_log


CONCURRENT_BUILD = """
import sys, time
from nli_jax.data import records
start = float(sys.argv[3])
examples = {"train": [{"idx": i, "label": i % 3, "text": "kata " * 20} for i in range(20000)]}
time.sleep(max(0.0, start - time.time()))
source = records.prepare_records("demo", examples, [sys.argv[1]], sys.argv[2])["train"]
print(len(source))
"""


def test_two_first_runs_sharing_a_fresh_tfds_dir_both_build_or_read_it(tmp_path):
    """Two first runs sharing a fresh tfds_dir (the cpu_test default is machine-wide): the second
    died in tfds with a 60-line FileExistsError."""
    import time
    source = tmp_path / "train.jsonl"
    source.write_text("x\n")
    start = str(time.time() + 8)  # both past their imports: they build at the same moment
    argv = [sys.executable, "-c", CONCURRENT_BUILD, str(source), str(tmp_path / "tfds"), start]
    procs = [subprocess.Popen(argv, cwd=REPO, env=env_cpu(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
        assert out.split()[-1] == "20000"
