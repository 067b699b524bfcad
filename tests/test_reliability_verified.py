"""Reliability, fourth round (issue 53; docs/errors.md §18-§20): no rerun or tool destroys a
result (the seed list is part of a run; an empty path is refused by every command; one output
check for every tool that writes), parsing that cannot crash (nesting depth and number size
bounded, JSON arrays read in linear time, ranges on what sizes an allocation) and verified reads
(a checkpoint carries its run's identity and a digest of its contents). Each case runs the real
command or the real function."""
import json
import os
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
    from nli_jax.train.planner import build_plan
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
