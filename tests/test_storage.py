"""gs:// everywhere, against a real GCS server on 127.0.0.1 (gcp-storage-emulator, see
tests/gcs_emulator.py): the storage layer itself, a fine-tuning cpu_test run with its workdir and
dataset cache in a bucket (the CLI in a subprocess, as a user runs it), gs:// paths that cannot
work (missing bucket, endpoint that does not answer, unsupported scheme) refused in seconds
before compute and naming the path; slow: every input and output in the bucket, SIGKILL and
rerun equal to an uninterrupted local run, pretraining, and two processes without a shared disk."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import gcs_emulator
from conftest import REPO

BUCKET = "nli-test-bucket"
CPU_TEST = "configs/indonli_large.py:cpu_test"
PRETRAIN_CPU_TEST = "configs/pretrain/indobert_base.py:cpu_test"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    proc, url = gcs_emulator.start(buckets=(BUCKET, "other-bucket"), cwd=tmp_path_factory.mktemp("emulator"))
    with pytest.MonkeyPatch.context() as patch:  # this process reads the bucket too
        patch.setenv("STORAGE_EMULATOR_HOST", url)
        yield url
    proc.kill()
    proc.wait()


def cli(module, config, workdir, *overrides, url, cwd, extra_env=None, timeout=600, devices=None):
    env = gcs_emulator.env(url, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO),
                           **(extra_env or {}))
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.run([sys.executable, "-m", module, f"--config={REPO / config}", f"--workdir={workdir}",
                           *overrides], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def read(url_path):
    from nli_jax import storage
    return storage.read_text(url_path)


def test_storage_layer_on_the_emulator(emulator, tmp_path):
    from nli_jax import storage
    root = f"gs://{BUCKET}/layer"
    storage.write_text(storage.under(root, "a", "config.json"), '{"x": 1}')
    assert storage.read_text(f"{root}/a/config.json") == '{"x": 1}'
    assert storage.isfile(f"{root}/a/config.json") and not storage.isfile(f"{root}/a")
    assert storage.isdir(f"{root}/a") and not storage.exists(f"{root}/missing")
    assert storage.listdir(f"{root}/a") == ["config.json"] and storage.listdir(f"{root}/missing") == []
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "f.txt").write_text("1")
    (tmp_path / "d" / "g.txt").write_text("2")
    storage.copytree(str(tmp_path / "d"), storage.under(root, "d"))
    assert storage.walk_files(f"{root}/d") == ["g.txt", "sub/f.txt"]
    assert storage.glob(f"{root}/d/*.txt") == [f"{root}/d/g.txt"]
    local = storage.local_copy(f"{root}/d")
    assert open(os.path.join(local, "sub", "f.txt")).read() == "1"
    assert storage.origin(os.path.join(local, "sub", "f.txt")) == f"{root}/d/sub/f.txt"
    storage.move(f"{root}/d", storage.under(root, "e"))
    assert storage.walk_files(f"{root}/e") == ["g.txt", "sub/f.txt"] and not storage.exists(f"{root}/d")
    with storage.open_append(storage.under(root, "train.log")) as f:
        f.write("line 1\n")
    storage.sync()
    assert storage.read_text(f"{root}/train.log") == "line 1\n"
    with pytest.raises(storage.StorageError, match="unsupported URL scheme s3://.*gs://"):
        storage.path("s3://bucket/x")
    # Another process (another host) writes after this one listed: no stale listing hides it.
    assert not storage.isfile(f"{root}/e/written_elsewhere")
    subprocess.run([sys.executable, "-c", "from nli_jax import storage; "
                    f"storage.write_text(storage.under('{root}', 'train.log'), 'line 1\\nline 2\\n'); "
                    f"storage.write_text(storage.under('{root}', 'e', 'written_elsewhere'), 'x')"],
                   env=dict(os.environ, PYTHONPATH=str(REPO)), check=True)
    assert storage.read_text(f"{root}/train.log") == "line 1\nline 2\n"
    assert storage.isfile(f"{root}/e/written_elsewhere")


def test_finetune_cpu_test_with_workdir_on_gcs(emulator, tmp_path):
    """The issue's command (python -m finetune.main ... cpu_test --workdir=gs://...): everything
    lands in the bucket, nothing in the current directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    workdir = f"gs://{BUCKET}/quick"
    start = time.time()
    proc = cli("finetune.main", CPU_TEST, workdir, "--config.train.num_epochs=1",
               f"--config.data.tfds_dir=gs://{BUCKET}/tfds", url=emulator, cwd=cwd)
    elapsed = time.time() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(f"cpu_test with workdir on the emulator: {elapsed:.1f} s")
    assert os.listdir(cwd) == [], "nothing may be written under the current directory"
    objects = gcs_emulator.list_objects(emulator, BUCKET)
    names = {o[len("quick/"):] for o in objects if o.startswith("quick/")}
    for name in ("config.json", "inputs.json", "train.log", "metrics.jsonl", "results.json", "predictions.jsonl"):
        assert name in names, f"{name} missing from {sorted(names)[:20]}"
    assert any(n.startswith("tensorboard/events.out.tfevents") for n in names)
    assert any(n.startswith("checkpoints/") and n.endswith("commit_success.txt") for n in names)
    assert any(n.startswith("best/") for n in names)
    assert any(o.startswith("tfds/indonli/") for o in objects), "the prepared dataset is cached in the bucket"
    results = json.loads(read(f"{workdir}/results.json"))
    assert set(results["splits"]) == {"validation", "test_lay", "test_expert", "diagnostic"}
    predictions = read(f"{workdir}/predictions.jsonl").splitlines()
    assert len(predictions) == sum(r["count"] for r in results["splits"].values())
    assert read(f"{workdir}/train.log").count("ETA") == 2  # steps 10 and 18 of one epoch
    assert [json.loads(line)["step"] for line in read(f"{workdir}/metrics.jsonl").splitlines()] == [10, 18]


def _refused(proc, *fragments):
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") or " error: " in last, proc.stderr[-3000:]  # logged once train.log is open
    for fragment in fragments:
        assert fragment in last, last
    assert "Traceback" not in proc.stderr and "step 1/" not in proc.stderr


@pytest.mark.parametrize("workdir, fragments", [
    ("gs://no-such-bucket/run", ("--workdir", "gs://no-such-bucket/run", "bucket gs://no-such-bucket does not exist")),
    ("s3://bucket/run", ("--workdir", "s3://bucket/run", "unsupported URL scheme s3://", "gs://bucket/path")),
    ("http://example.com/run", ("unsupported URL scheme http://", "local paths and gs://")),
])
def test_unusable_workdir_is_refused_before_compute(emulator, tmp_path, workdir, fragments):
    start = time.time()
    proc = cli("finetune.main", CPU_TEST, workdir, url=emulator, cwd=tmp_path)
    _refused(proc, *fragments)
    assert time.time() - start < 30
    assert os.listdir(tmp_path) == [], "no local directory named after the URL"


def test_missing_bucket_of_model_init_and_data_source_is_named(emulator, tmp_path):
    workdir = f"gs://{BUCKET}/kept"
    from nli_jax import storage
    storage.write_text(storage.under(workdir, "notes.txt"), "written before")
    proc = cli("finetune.main", CPU_TEST, workdir, "--config.model.init=gs://absent-bucket/model",
               url=emulator, cwd=tmp_path)
    _refused(proc, "--config.model.init", "gs://absent-bucket/model", "does not exist")
    proc = cli("finetune.main", CPU_TEST, workdir, "--config.data.source=gs://absent-bucket/indonli",
               url=emulator, cwd=tmp_path)
    _refused(proc, "--config.data.source", "gs://absent-bucket/indonli")
    proc = cli("finetune.main", CPU_TEST, workdir, f"--config.model.init=gs://{BUCKET}/no/model",
               url=emulator, cwd=tmp_path)
    _refused(proc, f"model directory 'gs://{BUCKET}/no/model' does not exist")
    assert storage.read_text(f"{workdir}/notes.txt") == "written before", "nothing already written is lost"
    assert set(storage.listdir(workdir)) <= {"notes.txt", "train.log"}, "a refused run leaves at most train.log"


def test_endpoint_that_does_not_answer_fails_in_seconds(tmp_path):
    dead = f"http://127.0.0.1:{gcs_emulator.free_port()}"
    start = time.time()
    proc = cli("finetune.main", CPU_TEST, f"gs://{BUCKET}/run", url=dead, cwd=tmp_path, timeout=120)
    elapsed = time.time() - start
    _refused(proc, "--workdir", f"gs://{BUCKET}/run", dead)
    print(f"dead endpoint refused after {elapsed:.1f} s")
    assert elapsed < 45  # the 15 s probe plus the interpreter and JAX start-up on 2 busy cores
    assert os.listdir(tmp_path) == []


def test_prepare_corpus_and_build_vocab_read_and_write_gcs(emulator, tmp_path):
    """The corpus tools, which read with plain open() in worker processes: inputs downloaded from
    the bucket, outputs uploaded once complete, nothing under the current directory."""
    from nli_jax import storage
    from nli_jax.data import fixture_path
    storage.copytree(fixture_path("corpus_tiny"), storage.under(f"gs://{BUCKET}", "tools", "raw"))
    env = gcs_emulator.env(emulator, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    prepared = subprocess.run([sys.executable, "-m", "pretrain.prepare_corpus", f"--inputs=gs://{BUCKET}/tools/raw/*.txt",
                               f"--output_dir=gs://{BUCKET}/tools/corpus", "--shards=2", "--workers=1"],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    shards = storage.glob(f"gs://{BUCKET}/tools/corpus/*.txt")
    assert len(shards) == 2 and sum(len(storage.read_text(f)) for f in shards) > 1000
    vocab = subprocess.run([sys.executable, "-m", "pretrain.build_vocab", f"--corpus=gs://{BUCKET}/tools/corpus/*.txt",
                            f"--output_dir=gs://{BUCKET}/tools/vocab", "--vocab_size=300"],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert vocab.returncode == 0, vocab.stderr[-2000:]
    tokens = storage.read_text(f"gs://{BUCKET}/tools/vocab/vocab.txt").split("\n")
    assert tokens[:1] == ["[PAD]"] and "[MASK]" in tokens and len([t for t in tokens if t]) > 100

    # create_examples into the bucket: each shard uploaded as it finishes, its marker last, so a
    # rerun in a new process (new scratch, new downloads) keeps the shards the bucket holds complete.
    examples = f"gs://{BUCKET}/tools/examples"
    cmd = [sys.executable, "-m", "pretrain.create_examples", f"--corpus=gs://{BUCKET}/tools/corpus/*.txt",
           f"--vocab_dir=gs://{BUCKET}/tools/vocab", f"--output_dir={examples}", "--max_seq_length=32", "--workers=1"]
    first = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    built = {name: storage.read_bytes(f"{examples}/{name}") for name in storage.listdir(examples)}
    assert {"train-00000.array_record", "heldout-00001.array_record", "shard-00001.json", "examples.json"} <= set(built)
    # As a run killed before shard 1's marker was uploaded leaves the bucket.
    storage.remove(f"{examples}/shard-00001.json")
    storage.remove(f"{examples}/examples.json")
    rerun = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    meta = json.loads(storage.read_text(f"{examples}/examples.json"))
    assert meta["reused_shards"] == 1 and meta["counts"] == json.loads(built["examples.json"])["counts"]
    assert {name: storage.read_bytes(f"{examples}/{name}") for name in built if name.endswith(".array_record")} == {
        name: data for name, data in built.items() if name.endswith(".array_record")}
    assert os.listdir(cwd) == []


# --- slow: every path in the bucket ---------------------------------------------------------

E2E = ("--config.train.num_epochs=8", "--config.train.checkpoint_every_steps=18",
       "--config.eval_splits=('validation','test_lay')")


def _tiny_checkpoint(directory):
    """A Hugging Face directory of a tiny BERT classifier with the fixture's vocabulary."""
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import fixture_path
    from nli_jax.models import ForSequenceClassification, make_rngs, preset
    tokenizer = load_tokenizer(fixture_path("tiny_wordpiece"))
    model = ForSequenceClassification(preset("tiny-bert", vocab_size=len(tokenizer)), num_labels=3,
                                      rngs=make_rngs(0))
    model.save_pretrained(str(directory), tokenizer=tokenizer, label_names=["entailment", "neutral", "contradiction"])
    return directory


def _scratch_env(root, name):
    """Own HOME and temporary directory: nothing is shared with another process but the bucket."""
    home, tmp = root / f"{name}_home", root / f"{name}_tmp"
    home.mkdir()
    tmp.mkdir()
    return {"HOME": str(home), "TMPDIR": str(tmp)}


def _wait_for_checkpoint(url, prefix, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = [o for o in gcs_emulator.list_objects(url, BUCKET)
                if o.startswith(f"{prefix}/checkpoints/") and o.count("/") == 3 and o.endswith("/commit_success.txt")]
        if done:
            return done
        if proc.poll() is not None:
            pytest.fail(f"run ended before its first checkpoint: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    pytest.fail("no checkpoint within the time limit")


@pytest.mark.slow
def test_everything_on_gcs_sigkill_rerun_matches_a_local_run(emulator, tmp_path):
    from nli_jax import storage
    from nli_jax.data import fixture_path
    model = _tiny_checkpoint(tmp_path / "model")
    inputs = f"gs://{BUCKET}/e2e_inputs"
    storage.copytree(str(model), storage.under(inputs, "model"))
    storage.copytree(fixture_path("nli_tiny"), storage.under(inputs, "indonli"))

    local = tmp_path / "local"
    proc = cli("finetune.main", CPU_TEST, local, *E2E, f"--config.model.init={model}",
               f"--config.data.source={fixture_path('nli_tiny')}", f"--config.data.tfds_dir={tmp_path / 'tfds'}",
               url=emulator, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    workdir = f"gs://{BUCKET}/e2e"
    gs_args = (*E2E, f"--config.model.init={inputs}/model", f"--config.data.source={inputs}/indonli",
               f"--config.data.tfds_dir=gs://{BUCKET}/e2e_tfds")
    # A short lease: the killed run's lock expires in seconds, not the default 300.
    env = gcs_emulator.env(emulator, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), NLI_JAX_LOCK_LEASE_S="8",
                           **_scratch_env(tmp_path, "gs"))
    env.pop("XLA_FLAGS", None)
    killed = subprocess.Popen([sys.executable, "-m", "finetune.main", f"--config={REPO / CPU_TEST}",
                               f"--workdir={workdir}", *gs_args], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    _wait_for_checkpoint(emulator, "e2e", killed)
    deadline = time.time() + 2 * storage.SYNC_EVERY_S
    while time.time() < deadline and not (storage.exists(f"{workdir}/train.log")
                                          and "ETA" in storage.read_text(f"{workdir}/train.log")):
        time.sleep(0.2)  # the log reaches the bucket while the run goes (uploaded every few seconds)
    live_log = storage.read_text(f"{workdir}/train.log")
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert not storage.exists(f"{workdir}/results.json"), "the run finished before SIGKILL"
    assert "ETA" in live_log, "the log is in the bucket while the run goes"

    rerun = [sys.executable, "-m", "finetune.main", f"--config={REPO / CPU_TEST}", f"--workdir={workdir}", *gs_args]
    # Pod hosts share no disk: a killed holder's lock on gs:// stands until its lease expires; the
    # rerun is refused in one line until then, and takes the lock over after.
    holder = json.loads(storage.read_text(f"{workdir}/.lock"))
    if holder["expires"] > time.time() + 1:
        early = subprocess.run(rerun, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert early.returncode == 1 and f"{workdir} is in use" in early.stderr, early.stderr[-2000:]
    time.sleep(max(0.0, holder["expires"] - time.time()) + 0.5)
    proc = subprocess.run(rerun, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = storage.read_text(f"{workdir}/train.log")
    assert "took over the expired lock" in proc.stderr + log and "resumed from" in log
    ours, reference = json.loads(storage.read_text(f"{workdir}/results.json")), json.loads((local / "results.json").read_text())
    assert ours["splits"] == reference["splits"] and ours["history"] == reference["history"]
    assert storage.read_text(f"{workdir}/predictions.jsonl") == (local / "predictions.jsonl").read_text()
    inputs_json = json.loads(storage.read_text(f"{workdir}/inputs.json"))
    assert all(p.startswith(f"{inputs}/") for p in [*inputs_json["model.init"], *inputs_json["data"]]), \
        "the fingerprint names the bucket's files, not a scratch copy"
    assert os.listdir(cwd) == [], "nothing may be written under the current directory"


@pytest.mark.slow
def test_pretraining_with_corpus_tokenizer_and_workdir_on_gcs(emulator, tmp_path):
    from nli_jax import storage
    from nli_jax.data import fixture_path
    storage.copytree(fixture_path("corpus_tiny"), storage.under(f"gs://{BUCKET}", "pre_inputs", "corpus"))
    storage.copytree(fixture_path("tiny_wordpiece"), storage.under(f"gs://{BUCKET}", "pre_inputs", "vocab"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    workdir = f"gs://{BUCKET}/pretrain"
    proc = cli("pretrain.main", PRETRAIN_CPU_TEST, workdir, "--config.train.max_steps=60",
               f"--config.pretrain.corpus=('gs://{BUCKET}/pre_inputs/corpus/*.txt',)",
               f"--config.model.tokenizer=gs://{BUCKET}/pre_inputs/vocab", url=emulator, cwd=cwd,
               extra_env=_scratch_env(tmp_path, "p"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    names = storage.walk_files(workdir)
    assert {"examples/examples.json", "examples/train-00000.array_record", "export/config.json",
            "export/model.safetensors", "results.json", "train.log", "metrics.jsonl"} <= set(names), names
    meta = json.loads(storage.read_text(f"{workdir}/examples/examples.json"))
    assert meta["corpus"] == [f"gs://{BUCKET}/pre_inputs/corpus/corpus.txt"]
    assert meta["vocab_dir"] == f"gs://{BUCKET}/pre_inputs/vocab"
    assert json.loads(storage.read_text(f"{workdir}/results.json"))["splits"]["heldout"]["mlm_accuracy"] > 0
    assert os.listdir(cwd) == []


@pytest.mark.slow
def test_two_processes_without_a_shared_disk(emulator, tmp_path):
    """Two processes, each with its own HOME, temporary directory and current directory, share
    only the bucket: process 0 builds the pretraining examples there and both read them; both
    save and restore the checkpoints; the parameters, sharded over fsdp across the two
    processes, are gathered for the export."""
    from nli_jax import storage
    from nli_jax.data import fixture_path
    storage.copytree(fixture_path("corpus_tiny"), storage.under(f"gs://{BUCKET}", "mp_inputs", "corpus"))
    storage.copytree(fixture_path("tiny_wordpiece"), storage.under(f"gs://{BUCKET}", "mp_inputs", "vocab"))
    workdir = f"gs://{BUCKET}/multiprocess"
    args = ("--config.train.max_steps=40", "--config.train.checkpoint_every_steps=20",
            "--config.mesh.shape.data=1", "--config.mesh.shape.fsdp=4",
            f"--config.pretrain.corpus=('gs://{BUCKET}/mp_inputs/corpus/*.txt',)",
            f"--config.model.tokenizer=gs://{BUCKET}/mp_inputs/vocab")

    def run_both(name):
        port = gcs_emulator.free_port()
        procs = []
        for i in range(2):
            cwd = tmp_path / f"{name}_cwd{i}"
            cwd.mkdir()
            env = gcs_emulator.env(emulator, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
                                   XLA_FLAGS="--xla_force_host_platform_device_count=2",
                                   **_scratch_env(tmp_path, f"{name}{i}"))
            procs.append((cwd, subprocess.Popen(
                [sys.executable, "-m", "pretrain.main", f"--config={REPO / PRETRAIN_CPU_TEST}", f"--workdir={workdir}",
                 *args, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
                cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        outputs = [p.communicate(timeout=600)[0] for _, p in procs]
        for (cwd, p), out in zip(procs, outputs):
            assert p.returncode == 0, out[-4000:]
            assert os.listdir(cwd) == [], f"process wrote under its current directory: {os.listdir(cwd)}"
        return outputs

    first = run_both("first")
    assert "'fsdp': 4" in first[0]
    assert "examples" in storage.listdir(workdir)
    names = storage.walk_files(workdir)
    assert "checkpoints/40/commit_success.txt" in names and "export/model.safetensors" in names
    # Process 0 wrote the shared files; both wrote their part of each checkpoint.
    assert any(n.startswith("checkpoints/40/state/ocdbt.process_1/") for n in names), names
    assert "data/process_1-of-2.json" in "\n".join(n[len("checkpoints/40/"):] for n in names)
    exported = storage.local_copy(f"{workdir}/export")
    from safetensors.numpy import load_file
    weights = load_file(os.path.join(exported, "model.safetensors"))
    assert weights and all(w.size for w in weights.values())

    second = run_both("second")  # the same command again: both processes restore step 40
    log = storage.read_text(f"{workdir}/train.log")
    assert f"resumed from {workdir}/checkpoints at step 40" in log, (log[-2000:], second[0][-3000:])
    assert "resumed from" in second[1], "process 1 restored from the bucket too"
