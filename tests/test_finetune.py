"""`python -m finetune.main` end to end, as a user runs it: cpu_test, real IndoNLI, device and
process counts, exact resume after SIGKILL / SIGTERM, and bad input stopping before compute."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO

CPU_TEST = "configs/indonli_large.py:cpu_test"


def command(workdir, *overrides, config=CPU_TEST):
    return [sys.executable, "-m", "finetune.main", f"--config={config}", f"--workdir={workdir}", *overrides]


def env_with(devices=None, **extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env.update(extra)
    return env


def run(workdir, *overrides, config=CPU_TEST, devices=None, timeout=600, check=True):
    proc = subprocess.run(command(workdir, *overrides, config=config), cwd=REPO, env=env_with(devices),
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["train/loss"] for r in rows}


def final_params(workdir):
    import orbax.checkpoint as ocp
    root = os.path.join(workdir, "checkpoints")
    step = max(int(p) for p in os.listdir(root) if p.isdigit())
    state = ocp.StandardCheckpointer().restore(os.path.join(root, str(step), "state"))
    import jax
    return step, jax.tree.leaves(state["params"])


def test_cpu_test_command_writes_results(tmp_path):
    start = time.time()
    run(tmp_path)
    elapsed = time.time() - start
    results = json.loads((tmp_path / "results.json").read_text())
    print(f"cpu_test run: {elapsed:.1f} s; validation accuracy {results['splits']['validation']['accuracy']:.3f}")
    assert set(results["splits"]) == {"validation", "test_lay", "test_expert", "diagnostic"}
    validation = results["splits"]["validation"]
    assert set(validation["by_label"]) == {"entailment", "neutral", "contradiction"}
    assert set(validation["by_sentence_size"]) <= {"single", "double", "multiple"}
    assert results["splits"]["diagnostic"]["by_tag"], "diagnostic accuracy per phenomenon tag"
    predictions = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    for split, report in results["splits"].items():
        rows = [p for p in predictions if p["split"] == split]
        assert len(rows) == report["count"]
        assert report["accuracy"] == pytest.approx(np.mean([p["label"] == p["prediction"] for p in rows]))
    assert (tmp_path / "tensorboard").is_dir() and (tmp_path / "train.log").read_text().count("ETA") > 3
    assert validation["accuracy"] > 0.6  # the fixture is learnable: chance is 1/3


@pytest.mark.slow  # end to end, a minute on 2 cores: python -m pytest -m slow
def test_real_indonli_tiny_model_overfits_256_pairs(shared_data, minilm_dir, tmp_path):
    """Real data: 256 IndoNLI training pairs memorised to >= 95% train accuracy (15 epochs at 3e-3:
    1.000 measured, as 30 at 2e-3); every reported accuracy equals the one recomputed from
    predictions.jsonl."""
    run(tmp_path, f"--config.data.source={shared_data / 'indonli'}", f"--config.model.tokenizer={minilm_dir}",
        "--config.data.max_train_examples=256", "--config.eval_splits=('train','validation')",
        "--config.data.max_seq_length=128", "--config.train.num_epochs=15", "--config.optimizer.lr=3e-3",
        # One evaluation, at the end: the reported (best) parameters are the final ones.
        "--config.train.eval_every_steps=240", "--config.train.log_every_steps=80",
        "--config.model.overrides.hidden_dropout_prob=0.0",
        "--config.model.overrides.attention_probs_dropout_prob=0.0", "--config.model.overrides.classifier_dropout=0.0",
        timeout=900)
    results = json.loads((tmp_path / "results.json").read_text())
    train, validation = results["splits"]["train"], results["splits"]["validation"]
    print(f"real IndoNLI: train accuracy {train['accuracy']:.3f} on {train['count']} pairs, "
          f"validation {validation['accuracy']:.3f} on {validation['count']}")
    assert train["count"] == 256 and validation["count"] == 2197
    assert train["accuracy"] >= 0.95
    predictions = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    for split, report in results["splits"].items():
        rows = [p for p in predictions if p["split"] == split]
        assert report["accuracy"] == np.mean([p["label"] == p["prediction"] for p in rows])


SHORT = ("--config.train.max_steps=12", "--config.train.log_every_steps=1", "--config.eval_splits=('validation',)")
# Float32 sums reduced in a different order across devices: per-step train losses agree to this.
LOSS_TOLERANCE = 2e-5


@pytest.mark.slow  # end to end, a minute on 2 cores: python -m pytest -m slow
def test_one_device_and_eight_devices_give_the_same_loss_curve(tmp_path):
    # Padded rows: packed ones are laid out per data-parallel shard (tests/test_packing.py).
    run(tmp_path / "one", *SHORT, "--config.data.packing=False")
    run(tmp_path / "eight", *SHORT, "--config.data.packing=False", devices=8)
    one, eight = losses(tmp_path / "one"), losses(tmp_path / "eight")
    assert sorted(one) == sorted(eight) == list(range(1, 13))
    diffs = [abs(one[s] - eight[s]) for s in one]
    print(f"1 vs 8 devices: max |loss diff| {max(diffs):.2e} over {len(diffs)} steps")
    assert max(diffs) <= LOSS_TOLERANCE
    assert "'data': 8" in (tmp_path / "eight" / "train.log").read_text()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dynamics_records(workdir):
    """{(pass, example idx): (gold probability, correct)} of a run's training dynamics."""
    from nli_jax.hooks.dynamics import read_records
    r = read_records(str(workdir))
    return {(int(p), int(i)): (float(g), float(c)) for p, i, g, c in
            zip(r["pass"], r["idx"], r["gold_probability"], r["correct"])}


def test_two_processes_of_two_devices_match_one_process(tmp_path):
    """Packed rows and length buckets: both processes pack their rows of each global batch into
    the row count and bucket that the whole batch needs (the same shapes, with no per-step
    exchange), as one process with as many data-parallel devices does (packing groups, hence
    dropout masks, follow the data-parallel size). Training dynamics of the global batch are
    recorded once, as by one process."""
    # Every batch its own bucket and row count (no shape planning, which on this fixture puts
    # every step in one shape): processes must agree on several.
    common = (*SHORT, f"--config.data.tfds_dir={tmp_path / 'tfds'}", "--config.hooks.dynamics.enabled=True",
              "--config.data.compile_cost_tokens=0")
    run(tmp_path / "single", *common, devices=4)
    port = _free_port()
    procs = [subprocess.Popen(command(tmp_path / "multi", *common) + [
        f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
        cwd=REPO, env=env_with(devices=2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    single, multi = losses(tmp_path / "single"), losses(tmp_path / "multi")
    assert sorted(single) == sorted(multi)
    diffs = [abs(single[s] - multi[s]) for s in single]
    print(f"1 process vs 2 processes x 2 devices: max |loss diff| {max(diffs):.2e}")
    assert max(diffs) <= LOSS_TOLERANCE
    assert "'data': 4" in (tmp_path / "multi" / "train.log").read_text()
    assert "training batches packed" in (tmp_path / "multi" / "train.log").read_text()
    # "process i: padded length per step sha1 <digest of the 12 lengths> (<length>: <steps>, ...)"
    digests = [out.split("padded length per step sha1 ")[1].split(";")[0] for out in outputs]
    one = (tmp_path / "single" / "train.log").read_text().split("padded length per step sha1 ")[1].split(";")[0]
    print(f"padded length per step: {digests} (one process: {one})")
    assert digests[0] == digests[1] == one
    assert one.count(":") > 1, "the fixture's batches should use more than one bucket"
    records, reference = dynamics_records(tmp_path / "multi"), dynamics_records(tmp_path / "single")
    assert sorted(records) == sorted(reference) and len(records) == 12 * 16  # every example of 12 steps, once
    assert max(abs(records[k][0] - reference[k][0]) for k in records) <= 1e-5


RESUME = ("--config.train.num_epochs=6", "--config.train.checkpoint_every_steps=20",
          "--config.train.async_checkpointing=True", "--config.eval_splits=('validation',)",
          "--config.hooks.dynamics.enabled=True")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    run(workdir, *RESUME)
    return workdir


def _start_and_signal(workdir, sig, min_step):
    proc = subprocess.Popen(command(workdir, *RESUME), cwd=REPO, env=env_with(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    root = workdir / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline:
        steps = [int(p) for p in os.listdir(root) if p.isdigit()] if root.is_dir() else []
        if steps and max(steps) >= min_step:
            break
        if proc.poll() is not None:
            pytest.fail(f"run ended before it could be interrupted: {proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert not (workdir / "results.json").exists(), "the run finished before the signal"
    return proc.returncode, stderr


def _assert_same_final_state(workdir, reference):
    step_a, a = final_params(workdir)
    step_b, b = final_params(reference)
    assert step_a == step_b == 108
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (workdir, reference))
    assert ra["history"] == rb["history"] and ra["splits"] == rb["splits"]
    # Everything results.json reports survives the interruption, the tokens trained on too.
    assert ra["train_tokens"] == rb["train_tokens"] and ra["train_tokens"]["real"] > 0
    # Training dynamics: the same records as the uninterrupted run, every example once per epoch.
    records = dynamics_records(workdir)
    assert records == dynamics_records(reference)
    # 108 steps of 16 = 5 epochs of the 300 examples (each once) and 228 examples of the 6th.
    per_epoch = [sum(1 for e, _ in records if e == epoch) for epoch in range(6)]
    assert per_epoch == [300] * 5 + [228] and len(records) == 108 * 16


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_sigkill_then_rerun_gives_identical_parameters(tmp_path, uninterrupted):
    code, _ = _start_and_signal(tmp_path, signal.SIGKILL, min_step=40)
    assert code == -signal.SIGKILL
    run(tmp_path, *RESUME)
    assert "resumed from" in (tmp_path / "train.log").read_text()
    _assert_same_final_state(tmp_path, uninterrupted)


@pytest.mark.slow  # end to end, a minute on 2 cores: python -m pytest -m slow
def test_sigterm_saves_then_rerun_gives_identical_parameters(tmp_path, uninterrupted):
    code, stderr = _start_and_signal(tmp_path, signal.SIGTERM, min_step=20)
    assert code == 143, stderr[-3000:]
    log = (tmp_path / "train.log").read_text()
    assert "SIGTERM: checkpoint saved at step" in log
    saved = int(log.split("SIGTERM: checkpoint saved at step ")[1].split(";")[0])
    assert (tmp_path / "checkpoints" / str(saved)).is_dir()
    run(tmp_path, *RESUME)
    _assert_same_final_state(tmp_path, uninterrupted)


# --- bad input: a clear error, before any compute ------------------------------------------------

def _bad_run(tmp_path, *overrides):
    proc = run(tmp_path / "work", *overrides, check=False, timeout=300)
    assert proc.returncode != 0
    assert not (tmp_path / "work" / "checkpoints").exists(), "failed after compute had started"
    return proc.stderr


def _indonli_dir(tmp_path, bad_line):
    d = tmp_path / "data"
    d.mkdir()
    good = [json.dumps({"premise": f"Kalimat nomor {i}.", "hypothesis": "Kalimat.", "label": "enc"[i % 3]})
            for i in range(40)]
    (d / "train.jsonl").write_bytes(("\n".join(good[:7]) + "\n").encode() + bad_line + b"\n" +
                                    ("\n".join(good[7:]) + "\n").encode())
    (d / "val.jsonl").write_text("\n".join(good[:5]) + "\n")
    return d


@pytest.mark.parametrize("bad,message", [
    (b'{"premise": "a", "hypothesis": "b", "label": "x"}', "train.jsonl:8: unknown label 'x'"),
    (b'{"premise": "a", "hypothesis": ', "train.jsonl:8: malformed JSON"),
    (b'{"premise": "a", "label": "e"}', "train.jsonl:8: missing field 'hypothesis'"),
    (b'{"premise": "", "hypothesis": "b", "label": "e"}', "train.jsonl:8: field 'premise' is empty"),
    ('{"premise": "caf\xe9", "hypothesis": "b", "label": "e"}'.encode("latin-1"), "train.jsonl:8: not UTF-8"),
])
def test_bad_dataset_rows_stop_before_training(tmp_path, bad, message):
    stderr = _bad_run(tmp_path, f"--config.data.source={_indonli_dir(tmp_path, bad)}",
                      f"--config.data.tfds_dir={tmp_path / 'tfds'}")
    assert message in stderr


def test_wrong_config_key_is_named(tmp_path):
    assert "learning_rat" in _bad_run(tmp_path, "--config.optimizer.learning_rat=3e-5")


def test_missing_checkpoint_directory_is_named(tmp_path):
    stderr = _bad_run(tmp_path, "--config.model.init=./no/such/indobert-dir",
                      "--config.model.tokenizer=./no/such/indobert-dir")
    assert "./no/such/indobert-dir" in stderr and "does not exist" in stderr


def test_workdir_of_a_different_config_is_refused(tmp_path):
    workdir = tmp_path / "work"
    run(workdir, "--config.train.max_steps=3", "--config.eval_splits=('validation',)")
    proc = run(workdir, "--config.train.max_steps=3", "--config.eval_splits=('validation',)",
               "--config.optimizer.lr=0.5", check=False)
    assert proc.returncode != 0 and "optimizer.lr: 0.001 -> 0.5" in proc.stderr


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_hypothesis_only_and_seeds(tmp_path):
    run(tmp_path, "--config.seeds=(1,2)", "--config.train.max_steps=6", "--config.eval_splits=('validation',)",
        config=CPU_TEST + ",hypothesis_only")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["seeds"] == [1, 2]
    summary = results["splits"]["validation"]["accuracy"]
    values = summary["values"]
    assert summary["mean"] == pytest.approx(np.mean(values)) and summary["std"] == pytest.approx(np.std(values, ddof=1))
    for seed in (1, 2):
        per_seed = json.loads((tmp_path / f"seed_{seed}" / "results.json").read_text())
        assert per_seed["hypothesis_only"] is True
    config = json.loads((tmp_path / "seed_1" / "config.json").read_text())
    assert config["task_options"]["hypothesis_only"] is True and config["train"]["seed"] == 1
