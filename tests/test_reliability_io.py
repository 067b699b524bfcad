"""Reliability, third round (issue 42, items 1, 3 and 5; docs/errors.md §12-§14): one way to write
(every file through nli_jax.storage's writer: never through a link inside its directory, never
outside it; one output-path check for every tool), one gate for every read (a FIFO, device or
directory where a file is expected is one line, at once), and one line, always, for what the
machine refuses (a read-only file system, a full disk, too many open files) and the last
tracebacks. Each case runs the real command or the real function."""
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, config_for

CPU_TEST = "configs/indonli_large.py:cpu_test"
FIXTURES = REPO / "nli_jax" / "data" / "fixtures"
VAL = FIXTURES / "nli_tiny" / "val.jsonl"


def env_cpu(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)
    env.update(extra)
    return env


# Limits for one command, set by a small launcher that then execs it (no preexec_fn in a process
# that runs JAX's threads). SIGXFSZ ignored: a write past the file-size limit fails with EFBIG.
LIMITS = ("import os, resource, signal, sys; nofile, fsize = int(sys.argv[1]), int(sys.argv[2]); "
          "nofile and resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)); "
          "fsize and signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
          "fsize and resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize)); os.execv(sys.argv[3], sys.argv[3:])")


def cli(module, *args, timeout=120, nofile=None, fsize=None, prefix=(), **env):
    limits = [sys.executable, "-c", LIMITS, str(nofile or 0), str(fsize or 0)] if nofile or fsize else []
    command = [*prefix, *limits, sys.executable, "-m", module, *[str(a) for a in args]]
    return subprocess.run(command, cwd=REPO, env=env_cpu(**env), capture_output=True, text=True, timeout=timeout)


def one_line_error(proc, *fragments):
    """Exit status 1 and one `error: ...` line naming every fragment, no traceback, no usage."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "USAGE" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def victim(tmp_path, name="victim.txt"):
    """A file outside every workdir that a link points to: it must never change."""
    path = tmp_path / "elsewhere" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("precious\n")
    return path


def fake_run(path, task_config="indonli_large:cpu_test"):
    """A directory that holds a finished training run as a tool sees one (config.json, run.json,
    results.json, predictions.jsonl, checkpoints/ and best/), without training one."""
    from nli_jax.planner import build_plan
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(build_plan(config_for(task_config), training=False).config_json))
    (path / "run.json").write_text(json.dumps({"state": "finished"}))
    (path / "results.json").write_text(json.dumps({"task": "indonli", "splits": {}}))
    (path / "predictions.jsonl").write_text(json.dumps({"split": "test", "idx": 0, "id": "0",
                                                        "prediction": "neutral"}) + "\n")
    (path / "checkpoints").mkdir()
    (path / "best").mkdir()
    return path


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# --- 12. one way to write --------------------------------------------------------------------

def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    """W/.lock a symlink to another file: it was truncated and rewritten with the holder's JSON (rc 0)."""
    target = victim(tmp_path)
    workdir = tmp_path / "run"
    workdir.mkdir()
    os.symlink(target, workdir / ".lock")
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={workdir}")
    one_line_error(proc, f"{workdir}/.lock is a symbolic link (to {target})", "does not write through links")
    assert target.read_text() == "precious\n"
    assert tree(workdir) == [".lock"]


@pytest.mark.parametrize("name,kind", [("train.log", "file"), ("metrics.jsonl", "file"), ("best", "dir"),
                                       ("checkpoints", "dir"), ("tensorboard", "dir")])
def test_run_files_that_are_links_are_refused_before_compute(tmp_path, name, kind):
    """train.log / metrics.jsonl symlinked elsewhere were appended to; best/ or checkpoints/ a link
    out of the workdir had orbax write there. Refused when the command takes its workdir."""
    from nli_jax import storage
    from nli_jax.train.loop import train_and_evaluate
    target = victim(tmp_path) if kind == "file" else tmp_path / "elsewhere_dir"
    if kind == "dir":
        target.mkdir()
    workdir = tmp_path / "run"
    workdir.mkdir()
    os.symlink(target, workdir / name)
    start = time.time()
    with pytest.raises(storage.UnsafePathError, match=rf"{workdir}/{name} is a symbolic link \(to {target}\)"):
        train_and_evaluate(config_for("indonli_large:cpu_test", f"data.tfds_dir={tmp_path / 'tfds'}"), str(workdir))
    assert time.time() - start < 10, "refused before anything is computed"
    if kind == "file":
        assert target.read_text() == "precious\n"
    else:
        assert list(target.iterdir()) == []
    assert not (workdir / "config.json").exists() and not (workdir / "run.json").exists()


def test_a_split_name_with_a_path_is_one_line_and_writes_nothing(tmp_path):
    """finetune.evaluate --file=../../x=F put the split name into reliability_<split>.png, written
    outside the workdir (its parents created)."""
    out = tmp_path / "a" / "b" / "eval"
    proc = cli("finetune.evaluate", "--checkpoint=/no/such/run", f"--workdir={out}", f"--file=../../x={VAL}")
    one_line_error(proc, f"--file=../../x={VAL}: split name '../../x' cannot be part of a file name",
                   "one path component")
    assert tree(tmp_path) == []


def test_the_writer_takes_one_path_component_per_name(tmp_path):
    from nli_jax import storage
    from nli_jax.hooks import calibration as calibrate
    for name in ("..", "../x", "a/b", "", ".", "x\0y"):
        with pytest.raises(storage.UnsafePathError, match="one path component"):
            storage.under(tmp_path, name)
    with pytest.raises(TypeError, match=r"storage.under\(directory, name"):
        storage.write_text(str(tmp_path / "plain.txt"), "x")  # a write names its directory
    with pytest.raises(storage.UnsafePathError, match="split name '../../x' cannot be part of a file name"):
        calibrate.report(_task_with_probabilities(), _evaluation("../../x"), None, str(tmp_path / "w"))
    assert tree(tmp_path) == []
    storage.write_text(storage.under(tmp_path, "sub", "ok.txt"), "fine")
    assert (tmp_path / "sub" / "ok.txt").read_text() == "fine"


def _task_with_probabilities():
    import numpy as np

    class Task:
        name = "t"

        def calibration_inputs(self, examples, predictions):
            return np.array([[2.0, 0.0], [0.0, 2.0]]), np.array([0, 1])
    return Task()


def _evaluation(split):
    import collections
    return collections.namedtuple("E", "split examples predictions")(split, None, None)


def test_the_writer_never_writes_through_a_link_below_its_directory(tmp_path):
    from nli_jax import storage
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "sub")
    for write in (lambda p: storage.write_text(p, "x"), lambda p: storage.open_output(p).close(),
                  lambda p: storage.open_append(p).close(), storage.makedirs, storage.output_file):
        with pytest.raises(storage.UnsafePathError, match=rf"{root}/sub is a symbolic link \(to {outside}\)"):
            write(storage.under(root, "sub", "f.txt"))
    os.symlink(outside / "target.txt", root / "file.txt")
    with pytest.raises(storage.UnsafePathError, match="file.txt is a symbolic link"):
        storage.write_bytes(storage.under(root, "file.txt"), b"x")
    assert list(outside.iterdir()) == []
    # The directory a write is given may itself be a link (a workdir on another disk).
    os.symlink(outside, tmp_path / "linked_root")
    storage.write_text(storage.under(tmp_path / "linked_root", "ok.txt"), "fine")
    assert (outside / "ok.txt").read_text() == "fine"


def test_an_export_into_a_directory_holding_a_link_is_refused(tmp_path):
    from nli_jax import storage
    from nli_jax.models import ForSequenceClassification, make_rngs, preset
    target = victim(tmp_path, "weights.bin")
    export = tmp_path / "export"
    export.mkdir()
    os.symlink(target, export / "model.safetensors")
    model = ForSequenceClassification(preset("tiny-bert"), num_labels=3, rngs=make_rngs(0))
    with pytest.raises(storage.UnsafePathError, match=r"export/model.safetensors is a symbolic link"):
        model.save_pretrained(str(export))
    assert target.read_text() == "precious\n"


# Every raw write left in nli-jax's own code, with why it is not the storage layer's: each goes
# into a directory or file the storage layer checked first, or into memory.
ALLOWED_WRITERS = {
    ("nli_jax/checkpoints/hf.py", "save_file(weights, storage.output_file("),  # safetensors: a checked file
    ("nli_jax/checkpoints/hf.py", "tokenizer.save_pretrained(path)"),  # transformers: output_dir(entries=True)
    ("nli_jax/train/reporting.py", "SummaryWriter(storage.output_dir("),  # TensorBoard: a checked directory
    ("nli_jax/pretraining/examples.py", "ArrayRecordWriter(storage.output_file("),  # array_record: a checked file
    ("nli_jax/pretraining/vocab.py", "tempfile.TemporaryDirectory(dir=output_dir)"),  # a fresh name of its own
    ("nli_jax/pretraining/vocab.py", "tempfile.TemporaryDirectory()"),  # SentencePiece's model, in /tmp
    ("nli_jax/metrics/calibration.py", "fig.savefig(buffer"),  # into memory, then storage.write_bytes
    ("nli_jax/analysis/artifacts.py", "fig.savefig(png"),
    ("nli_jax/analysis/cartography.py", "fig.savefig(buffer"),
    ("nli_jax/hooks/dynamics.py", "np.savez(buffer"),
    ("nli_jax/pretraining/examples.py", "os.open(path, os.O_RDONLY)"),  # read-only, to fsync what was written
    ("nli_jax/pretraining/vocab_extension.py", "tempfile.TemporaryDirectory(dir=output_dir)"),  # a fresh name of its own
    ("finetune/nusax_benchmark.py", "fig.savefig(buffer"),  # into memory, then storage.write_bytes
    ("nli_jax/zero_shot.py", 'tempfile.mkdtemp(prefix="nli_jax_zero_shot_")'),  # a fresh private directory
}
WRITE_PATTERN = re.compile(
    r"\bopen\([^)]*['\"][wax]b?\+?['\"]|os\.open\(|FileHandler\(|os\.makedirs\(|shutil\.(copy|move|copytree)|"
    r"os\.(replace|rename)\(|(?<!storage)\.write_text\(|(?<!storage)\.write_bytes\(|savefig\(|np\.save|"
    r"SummaryWriter\(|ArrayRecordWriter\(|"
    r"save_file\(|tokenizer\.save_pretrained\(|mkstemp|mkdtemp|TemporaryDirectory|\.mkdir\(")


def test_every_file_is_written_through_the_storage_writer():
    """One way to write: no module of nli-jax (the library, finetune, pretrain, launch) opens a file
    for writing, creates a directory or hands a path to another writer except through
    nli_jax/storage.py's writer (storage.under(...) paths) or as listed in ALLOWED_WRITERS."""
    found = []
    for package in ("nli_jax", "finetune", "pretrain", "launch"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel == "nli_jax/storage.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                code = line.split("#")[0]
                if code.strip().startswith(('"', "'")) or not WRITE_PATTERN.search(code):
                    continue
                if not any(rel == file and fragment in code for file, fragment in ALLOWED_WRITERS):
                    found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "writes outside nli_jax.storage's writer:\n" + "\n".join(found)


# --- 12. one output-path check for every tool ------------------------------------------------

def test_a_leaderboard_file_over_a_runs_predictions_is_one_line(tmp_path):
    """nli_jax.leaderboard --output=<run>/predictions.jsonl replaced the run's predictions."""
    run = fake_run(tmp_path / "run")
    before = (run / "predictions.jsonl").read_bytes()
    proc = cli("nli_jax.leaderboard", "--format=clue_ocnli", f"--run={run}", f"--output={run}/predictions.jsonl")
    one_line_error(proc, f"--output={run}/predictions.jsonl")
    assert (run / "predictions.jsonl").read_bytes() == before


def test_predict_into_a_runs_best_is_one_line(tmp_path):
    """finetune.predict --output=<run>/best wrote predictions.jsonl, train.log and .lock into best/."""
    run = fake_run(tmp_path / "run")
    proc = cli("finetune.predict", f"--checkpoint={run}", f"--output={run}/best", f"--input=test={VAL}")
    one_line_error(proc, f"--output={run}/best would write into {run}/best, which the run {run} writes itself")
    assert tree(run / "best") == []


def test_every_tool_refuses_an_output_inside_another_run(tmp_path):
    """The one check (nli_jax.workdir.check_tool_output) in each tool's own entry point, before it
    reads or writes anything: evaluate, predict, export, leaderboard (both formats), the analyses,
    the sweep and the IndoNLU benchmark."""
    from finetune import indonlu_benchmark, sweep
    from nli_jax import leaderboard
    from nli_jax.analysis import artifacts, cartography
    from nli_jax.errors import RunError
    from nli_jax import tools
    reads, other = fake_run(tmp_path / "reads"), fake_run(tmp_path / "other")
    snapshot = tree(tmp_path)
    config = config_for("indonli_large:cpu_test")
    inside = str(other / "mine")
    calls = {
        "finetune.evaluate": lambda: tools.evaluate_checkpoint(config, inside, str(reads)),
        "finetune.predict": lambda: tools.predict_files(config, inside, str(reads), {"x": str(VAL)}),
        "finetune.export": lambda: tools.export_checkpoint(config, str(reads), inside),
        "leaderboard indonlu": lambda: leaderboard.indonlu_submission({"smsa": str(reads)}, inside, tasks=["smsa"]),
        "leaderboard clue_ocnli": lambda: leaderboard.ocnli_submission(str(reads), inside + "/x.json"),
        "analysis artifacts": lambda: artifacts.analyse("indonli", str(FIXTURES / "nli_tiny"), inside),
        "analysis cartography": lambda: cartography.cartography(str(reads), inside),
        "finetune.sweep": lambda: sweep.run_sweep(config, inside, [1e-3], [1]),
        "indonlu_benchmark": lambda: indonlu_benchmark.run_benchmark("scratch", inside, "", ["smsa"]),
    }
    for name, call in calls.items():
        with pytest.raises(RunError, match=rf"={re.escape(inside)}(/x.json)? is inside the training run {other}"):
            call()
    assert tree(tmp_path) == snapshot, "nothing read into or written"


def test_a_tool_may_write_in_a_directory_of_its_own_inside_the_run_it_reads(tmp_path):
    """README: `finetune.evaluate --checkpoint=R --workdir=R/eval`; cartography's R/cartography.
    The run itself, its own names and another run stay refused."""
    from nli_jax.errors import RunError
    from nli_jax.workdir import check_tool_output
    run = fake_run(tmp_path / "run")
    for own in ("eval", "cartography", "submission/ocnli_50k_predict.json"):
        check_tool_output(str(run / own), "--workdir", reads=[str(run)])
    for name in ("results.json", "best", "checkpoints/4", "seed_1/x", "reliability_validation.png", "tensorboard"):
        with pytest.raises(RunError, match="which the run .* writes itself"):
            check_tool_output(str(run / name), "--output", reads=[str(run)])
    with pytest.raises(RunError, match=r"is the --checkpoint it reads"):
        check_tool_output(str(run), "--output", reads=[str(run)])
    with pytest.raises(RunError, match=r"holds a training run"):
        check_tool_output(str(run), "--output", reads=[str(tmp_path / "elsewhere")])


# --- 13. one gate for every read ---------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A tiny Hugging Face directory (config.json, model.safetensors, the fixture tokenizer)."""
    from nli_jax import load_tokenizer
    from nli_jax.data import fixture_path
    from nli_jax.models import ForSequenceClassification, make_rngs, preset
    path = tmp_path_factory.mktemp("hf") / "model"
    ForSequenceClassification(preset("tiny-bert"), num_labels=3, rngs=make_rngs(0)).save_pretrained(
        str(path), tokenizer=load_tokenizer(fixture_path("tiny_wordpiece")))
    return path


def _not_a_file(path, kind):
    path.unlink()
    if kind == "device":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


EXPECTED = {"device": "(a link to /dev/zero) is a device, not a regular file: not read",
            "fifo": "is a FIFO, not a regular file: not read", "directory": "is a directory, not a regular file"}


def within_a_second(function):
    """`function`'s exception, which must come within a second (a FIFO's open would block forever:
    it runs in a daemon thread)."""
    outcome = {}

    def target():
        try:
            function()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e
    start = time.time()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "blocked: the path was opened before it was checked"
    assert time.time() - start < 1.0, time.time() - start
    return outcome.get("error")


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_model_weights_that_are_not_a_file_are_one_line_at_once(hf_model, tmp_path, kind):
    """model.safetensors -> /dev/zero or a FIFO hung the run: inputs.json's fingerprint opened it first."""
    model = tmp_path / "model"
    shutil.copytree(hf_model, model)
    _not_a_file(model / "model.safetensors", kind)
    start = time.time()
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={tmp_path / 'run'}",
               f"--config.model.init={model}", f"--config.data.tfds_dir={tmp_path / 'tfds'}", timeout=60)
    one_line_error(proc, f"{model}/model.safetensors", EXPECTED[kind])
    assert time.time() - start < 45
    if kind != "device":  # the functions that read a model directory, each through the gate
        from nli_jax.checkpoints.hf import read_weights
        from nli_jax.train import inputs
        functions = [lambda: read_weights(str(model))]
        if kind == "fifo":  # (the fingerprint lists files: a directory is not one of them)
            functions.append(lambda: inputs.fingerprint(model_dir=str(model)))
        for function in functions:
            assert EXPECTED[kind] in str(within_a_second(function))


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer.json", "tokenizer_config.json"])
def test_a_tokenizer_file_that_is_a_fifo_is_refused_at_once(hf_model, tmp_path, name):
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.train import inputs
    model = tmp_path / "model"
    shutil.copytree(hf_model, model)
    _not_a_file(model / name, "fifo")
    for function in (lambda: load_tokenizer(str(model)), lambda: inputs.tokenizer_files(str(model))):
        error = within_a_second(function)
        assert f"{model}/{name} is a FIFO, not a regular file" in str(error), error


def test_a_corpus_glob_matching_a_fifo_is_one_line(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(FIXTURES / "corpus_tiny" / "corpus.txt", corpus / "a.txt")
    os.mkfifo(corpus / "b.txt")
    for module, flags in (("pretrain.build_vocab", ["--vocab_size=200"]), ("pretrain.prepare_corpus", []),
                          ("pretrain.create_examples", [f"--vocab_dir={FIXTURES / 'tiny_wordpiece'}"])):
        flag = "--inputs" if module == "pretrain.prepare_corpus" else "--corpus"
        proc = cli(module, f"{flag}={corpus}/*.txt", f"--output_dir={tmp_path / 'out'}", *flags, timeout=60)
        one_line_error(proc, f"{corpus}/b.txt is a FIFO, not a regular file")
        assert not (tmp_path / "out").exists()
    from nli_jax.tasks.pretraining import _corpus_files  # pretrain.main's corpus (fingerprinted first)
    assert "is a FIFO" in str(within_a_second(lambda: _corpus_files([f"{corpus}/*.txt"])))


def test_a_train_subset_that_is_a_fifo_is_refused_at_once(tmp_path):
    from nli_jax.train import inputs
    subset = tmp_path / "subset.jsonl"
    os.mkfifo(subset)
    error = within_a_second(lambda: inputs.fingerprint(files=[str(subset)]))
    assert f"{subset} is a FIFO, not a regular file" in str(error)
    from nli_jax.train.setup import read_subset
    assert "is a FIFO" in str(within_a_second(lambda: read_subset(str(subset), "indonli")))


def test_a_config_file_that_is_a_fifo_is_one_line(tmp_path):
    """ml_collections imports the config file: a FIFO blocked the import forever."""
    config = tmp_path / "config.py"
    os.mkfifo(config)
    proc = cli("finetune.main", f"--config={config}:cpu_test", f"--workdir={tmp_path / 'run'}", timeout=60)
    one_line_error(proc, f"--config={config}:cpu_test: {config} is a FIFO, not a regular file")


@pytest.mark.parametrize("index,entry", [("model.safetensors.index.json", "../outside.safetensors"),
                                         ("model.safetensors.index.json", "/etc/hostname"),
                                         ("pytorch_model.bin.index.json", "sub/pytorch_model-1.bin")])
def test_a_shard_index_names_only_files_of_its_directory(hf_model, tmp_path, index, entry):
    from nli_jax.checkpoints.hf import CheckpointError, read_weights
    model = tmp_path / "model"
    shutil.copytree(hf_model, model)
    (model / "model.safetensors").unlink()
    (model / index).write_text(json.dumps({"weight_map": {"bert.pooler.dense.bias": entry}}))
    with pytest.raises(CheckpointError, match=rf"{index}: its weight_map names '{re.escape(entry)}', not a file of"):
        read_weights(str(model))


# --- 14. one line, always --------------------------------------------------------------------

def _namespace(*setup):
    """`unshare -m` (a private mount namespace: a read-only bind or a small tmpfs, seen by the
    command alone) with the mount commands `setup`, or a skip where this machine does not allow it."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m needs CAP_SYS_ADMIN): "
                    "a read-only or full file system cannot be made for one command")
    script = " && ".join([*setup, 'exec "$@"'])
    return ["unshare", "-m", "sh", "-c", script, "sh"]


def _read_only(directory):
    return _namespace(f"mount --bind {directory} {directory}", f"mount -o remount,ro,bind {directory}")


def test_a_new_run_on_a_read_only_file_system_is_one_line(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={parent}/run", prefix=_read_only(parent))
    one_line_error(proc, f"cannot write {parent}/run: read-only file system")


def test_a_rerun_on_a_read_only_file_system_is_one_line(tmp_path):
    run = fake_run(tmp_path / "run")
    before = tree(run)
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={run}", prefix=_read_only(run))
    one_line_error(proc, f"cannot write {run}/.lock: read-only file system")
    assert tree(run) == before


@pytest.mark.slow  # a cpu_test run to its first checkpoint: about a minute on 2 busy cores
def test_a_full_disk_is_one_line_without_orbax_tracebacks(tmp_path):
    """A 900 KiB file system fills at the first checkpoint: the right line came after 100-400 lines of
    orbax's tracebacks (its background writers log them)."""
    small = tmp_path / "small"
    small.mkdir()
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={small}/run", "--config.train.max_steps=20",
               f"--config.data.tfds_dir={tmp_path / 'tfds'}", timeout=300,
               prefix=_namespace(f"mount -t tmpfs -o size=900k tmpfs {small}"))
    one_line_error(proc, f"no space left on the device of {small}/run", "while writing the checkpoint of step")
    assert len(proc.stderr.splitlines()) < 20, proc.stderr[-3000:]
    assert "RESOURCE_EXHAUSTED" not in proc.stderr


@pytest.mark.slow  # the same, compiled without the cache (its entries pass the limit too)
def test_a_file_size_limit_is_one_line(tmp_path):
    """The same without a file system to fill: writes past `ulimit -f` fail with EFBIG."""
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={tmp_path / 'run'}", "--config.train.max_steps=20",
               f"--config.data.tfds_dir={tmp_path / 'tfds'}", "--compilation_cache=", timeout=300, fsize=300_000,
               JAX_COMPILATION_CACHE_DIR="")
    one_line_error(proc, f"{tmp_path / 'run'}", "file too large")
    assert len(proc.stderr.splitlines()) < 20, proc.stderr[-3000:]


def test_environment_errors_are_one_line_naming_the_file(capsys, monkeypatch):
    from nli_jax.cli import _reporting_input_errors
    # No run's log here: a run set up earlier in this worker (a module's fixture) left a handler
    # bound to the stderr of its own test, where this one's line would go instead of this test's.
    monkeypatch.setattr(logging.getLogger("nli_jax"), "handlers", [])
    cases = {errno.EROFS: "cannot write /w/x: read-only file system", errno.ENOSPC: "cannot write /w/x: no space left",
             errno.EMFILE: "cannot open /w/x: too many open files (this process may open",
             errno.EACCES: "/w/x: permission denied"}
    for number, message in cases.items():
        def main(argv, number=number):
            raise OSError(number, os.strerror(number), "/w/x")
        with pytest.raises(SystemExit) as exit_:
            _reporting_input_errors(main)([])
        assert exit_.value.code == 1
        assert capsys.readouterr().err.strip().startswith(f"error: {message}")

    def bug(argv):
        raise OSError(errno.EINVAL, "a bug keeps its traceback")
    with pytest.raises(OSError):
        _reporting_input_errors(bug)([])


def test_what_libraries_print_about_a_full_disk_is_dropped(capsys):
    """orbax logs each background writer's ENOSPC with its traceback (absl, 100-400 lines), and
    tensorstore's completions of the abandoned writes raise on orbax's closed event loop (through
    sys.unraisablehook): both are dropped, other records and errors are kept."""
    import logging

    from nli_jax.errors import EnvironmentLogFilter
    from nli_jax.cli import _quiet_closed_loops
    keep = logging.LogRecord("absl", logging.ERROR, "future.py", 387, "a real problem", None, None)
    try:
        raise ValueError("RESOURCE_EXHAUSTED: Error writing \"opt_state\": Failed to write 547570 bytes to file 24: "
                         "No space left on device [os_error_code='28']")
    except ValueError:
        orbax = logging.LogRecord("absl", logging.ERROR, "future.py", 387, "_SignalingThread.run() raised an exception: "
                                  "RESOURCE_EXHAUSTED", None, sys.exc_info())
    assert EnvironmentLogFilter().filter(keep) and not EnvironmentLogFilter().filter(orbax)
    seen = []
    hook = _quiet_closed_loops(seen.append)
    for value in (RuntimeError("Event loop is closed"), RuntimeError("something else")):
        hook(type("Unraisable", (), {"exc_value": value})())
    assert [str(u.exc_value) for u in seen] == ["something else"]


def test_a_log_file_on_a_full_disk_is_one_warning_not_a_traceback_per_line(tmp_path, capsys):
    import logging

    from nli_jax import storage
    handler = storage.LogFile(storage.under(tmp_path, "train.log"))
    logger = logging.getLogger("nli_jax.test_full_log")
    logger.addHandler(handler)
    logger.propagate = False

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    handler.stream.write = full
    try:
        for i in range(3):
            logger.error("line %d", i)
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.count("warning: ") == 1 and "Traceback" not in err and "--- Logging error ---" not in err, err
    assert f"{tmp_path}/train.log stopped taking log lines: no space left on the device (free some space" in err


def test_a_sweep_over_a_cut_cell_results_json_is_one_line(tmp_path):
    """A rerun over a cell whose results.json was cut: a JSONDecodeError traceback (after the cells
    before it had trained)."""
    from finetune.sweep import lr_name, with_lr_and_seed
    from nli_jax.planner import config_dict
    cells = tmp_path / "sweep" / f"lr_{lr_name(1e-3)}"
    cell = cells / "seed_2"
    cell.mkdir(parents=True)
    (cell / "config.json").write_text(json.dumps(config_dict(with_lr_and_seed(config_for("indonli_large:cpu_test"),
                                                                              1e-3, 2))))
    (cell / "results.json").write_text('{"splits": {"validation": {"accu')
    proc = cli("finetune.sweep", f"--config={CPU_TEST}", "--lrs=1e-3", "--seeds=1,2", f"--workdir={tmp_path / 'sweep'}",
               f"--config.data.tfds_dir={tmp_path / 'tfds'}", timeout=300)
    one_line_error(proc, f"{cell}/results.json is unreadable (JSONDecodeError", "move it away and rerun the sweep")
    assert not (cells / "seed_1").exists(), "refused before the first cell ran"


def test_build_vocab_on_a_binary_file_is_one_line(tmp_path):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"kata\n" + bytes(range(255, -1, -1)) * 64)  # "stream did not contain valid UTF-8"
    proc = cli("pretrain.build_vocab", f"--corpus={binary}", f"--output_dir={tmp_path / 'vocab'}", "--vocab_size=100")
    one_line_error(proc, f"{binary}:2: not UTF-8", "not a text corpus")
    assert not (tmp_path / "vocab" / "vocab.txt").exists()


@pytest.mark.parametrize("task,length", [("nsp", 3), ("sop", 4), ("none", 3)])
def test_create_examples_too_short_is_one_line(tmp_path, task, length):
    """--max_seq_length=3: `ValueError: empty range for randrange() (2, 1, -1)` from a worker."""
    proc = cli("pretrain.create_examples", f"--corpus={FIXTURES / 'corpus_tiny' / 'corpus.txt'}",
               f"--vocab_dir={FIXTURES / 'tiny_wordpiece'}", f"--output_dir={tmp_path / 'examples'}",
               f"--max_seq_length={length}", f"--sentence_task={task}")
    one_line_error(proc, f"--max_seq_length={length}: too short for --sentence_task={task}")
    assert not (tmp_path / "examples").exists()


def test_prepare_corpus_with_more_shards_than_open_files_is_one_line(tmp_path):
    """--shards=30000 with a 20,000-file limit: every worker died on EMFILE, tracebacks in the parent."""
    proc = cli("pretrain.prepare_corpus", f"--inputs={FIXTURES / 'corpus_tiny' / 'corpus.txt'}",
               f"--output_dir={tmp_path / 'corpus'}", "--shards=3000", nofile=1024)
    one_line_error(proc, "--shards=3000: a worker holds one bucket file per shard open", "(1024, ulimit -Hn)")
    assert not (tmp_path / "corpus").exists()


def test_pretraining_on_more_corpus_files_than_open_files_is_one_line(tmp_path):
    """20,000 corpus files: the examples' readers (two per corpus file) ran out of file descriptors."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = (FIXTURES / "corpus_tiny" / "corpus.txt").read_text().split("\n\n")
    for i in range(160):
        (corpus / f"part-{i:04d}.txt").write_text("\n\n".join(lines[i % len(lines): i % len(lines) + 3]) + "\n")
    proc = cli("pretrain.main", "--config=configs/pretrain/indobert_base.py:cpu_test", f"--workdir={tmp_path / 'run'}",
               f"--config.pretrain.corpus=('{corpus}/*.txt',)", "--config.pretrain.workers=1", timeout=300, nofile=256)
    one_line_error(proc, "cannot open", "too many open files (this process may open 256 files")


def test_a_config_variant_typo_is_one_short_line():
    """--config=configs/indonli_large.py:cpu_tset printed a 786-character line holding a flattened traceback."""
    proc = cli("finetune.main", "--config=configs/indonli_large.py:cpu_tset", "--workdir=/tmp/never_written")
    line = one_line_error(proc, "--config=configs/indonli_large.py:cpu_tset: unknown variant(s) cpu_tset "
                                "(did you mean cpu_test?); this config file knows: cpu_test, hypothesis_only")
    assert len(line) < 200 and "Traceback" not in line and "File " not in line
    proc = cli("pretrain.main", "--config=configs/pretrain/indobert_base.py:phase=3", "--workdir=/tmp/never_written")
    one_line_error(proc, "--config=configs/pretrain/indobert_base.py:phase=3: phase must be 1 or 2, got 3")
    assert not os.path.exists("/tmp/never_written")
