"""Training dynamics, dataset cartography and calibration through the loop and the tools, on the
cpu_test recipe (the shipped NLI fixture): what a run records, the data map and its subsets,
training on a subset, the temperature fitted on validation and applied by evaluate, predict and
export, and bad input refused in one line before compute. (The resume and multi-process cases
are in tests/test_finetune.py; the label-noise check on real IndoNLI is slow, at the end.)"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, config_for


def _train(workdir, *assignments):
    from nli_jax.train.loop import train_and_evaluate
    return train_and_evaluate(config_for("indonli_large:cpu_test", "eval_splits=('validation','test_lay')",
                                         f"data.tfds_dir={workdir.parent / 'tfds'}", *assignments), str(workdir))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """cpu_test (6 epochs of the 300 fixture pairs) with training dynamics recorded."""
    workdir = tmp_path_factory.mktemp("dynamics") / "run"
    return workdir, _train(workdir, "hooks.dynamics.enabled=True")


def _records(workdir):
    from nli_jax.hooks.dynamics import read_records
    return read_records(str(workdir))


def test_every_training_example_is_recorded_once_per_epoch(run):
    workdir, _ = run
    records = _records(workdir)
    # 108 steps of 16 = 5 epochs of the 300 examples and 228 of the 6th.
    counts = np.bincount(records["pass"])
    assert counts.tolist() == [300] * 5 + [228]
    for epoch in range(5):
        assert sorted(records["idx"][records["pass"] == epoch]) == list(range(300))
    assert ((records["gold_probability"] >= 0) & (records["gold_probability"] <= 1)).all()
    assert set(np.unique(records["correct"])) <= {0.0, 1.0}
    # The model learns the fixture: the gold label's probability rises from the first epoch to the last.
    first, last = (records["gold_probability"][records["pass"] == e].mean() for e in (0, 4))
    assert last > first + 0.2, (first, last)


def _analyse(workdir, *flags):
    return subprocess.run([sys.executable, "-m", "nli_jax.analysis", "cartography", f"--workdir={workdir}", *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def analysed(run):
    """The cartography of the module's run, written once (`python -m nli_jax.analysis cartography`)
    for the tests that read it."""
    workdir, _ = run
    return workdir, _analyse(workdir)


def test_cartography_writes_statistics_data_map_and_subsets(analysed):
    workdir, proc = analysed
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = workdir / "cartography"
    rows = [json.loads(line) for line in (out / "cartography.jsonl").read_text().splitlines()]
    assert len(rows) == 300
    records = _records(workdir)
    for row in rows[:20]:  # the statistics are those of the records (population std, as the paper's code)
        mine = records["gold_probability"][records["idx"] == row["idx"]].astype(np.float64)
        assert row["confidence"] == pytest.approx(mine.mean(), abs=1e-6)
        assert row["variability"] == pytest.approx(mine.std(), abs=1e-6) and row["passes"] == len(mine)
    summary = json.loads((out / "summary.json").read_text())
    subsets = {r: [json.loads(line) for line in (out / f"{r}.jsonl").read_text().splitlines()]
               for r in ("easy_to_learn", "ambiguous", "hard_to_learn")}
    assert all(len(v) == 100 for v in subsets.values())
    easy = min(r["confidence"] for r in subsets["easy_to_learn"])
    hard = max(r["confidence"] for r in subsets["hard_to_learn"])
    assert easy >= hard and easy >= np.percentile([r["confidence"] for r in rows], 66)
    assert min(r["variability"] for r in subsets["ambiguous"]) >= np.percentile([r["variability"] for r in rows], 66)
    # The task's own fields, the label by name, counts per label in the summary.
    assert {"premise", "hypothesis", "id"} <= set(subsets["ambiguous"][0])
    assert subsets["ambiguous"][0]["label"] in ("entailment", "neutral", "contradiction")
    assert sum(summary["regions"]["hard_to_learn"]["per_label"].values()) == 100
    assert (out / "data_map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| hard_to_learn | 100 |" in proc.stdout


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_training_on_a_cartography_subset(analysed, tmp_path):
    workdir, proc = analysed
    assert proc.returncode == 0, proc.stderr[-3000:]
    subset = workdir / "cartography" / "ambiguous.jsonl"
    # The tiny model's ambiguous third of the fixture is one label (neutral), which a run refuses
    # unless told (planner: allow_one_label); what is tested here is the subset's way into training.
    results = _train(tmp_path / "subset", f"data.train_subset={subset}", "train.num_epochs=1",
                     "optimizer.warmup_steps=0", "data.allow_one_label=True")
    log = (tmp_path / "subset" / "train.log").read_text()
    assert "| 100 train examples, 6 steps/epoch" in log, log[:2000]
    assert results["splits"]["validation"]["count"] == 60
    inputs = json.loads((tmp_path / "subset" / "inputs.json").read_text())
    assert str(subset) in inputs["files"], "the subset file is one of the run's fingerprinted inputs"


def test_a_subset_naming_unknown_ids_is_refused_before_compute(tmp_path):
    from nli_jax.errors import RunError
    from nli_jax.train.loop import train_and_evaluate
    subset = tmp_path / "subset.txt"
    subset.write_text("1056\n1006\nno-such-pair\nalso-missing\n")
    config = config_for("indonli_large:cpu_test", f"data.train_subset={subset}", f"data.tfds_dir={tmp_path / 'tfds'}")
    with pytest.raises(RunError, match=r"data.train_subset=.*: 2 of its 4 ids are not in task 'indonli'.s training "
                                       r"split \(300 examples\), e.g. \['no-such-pair', 'also-missing'\]"):
        train_and_evaluate(config, str(tmp_path / "work"))
    assert not (tmp_path / "work" / "checkpoints").exists() and not (tmp_path / "work" / "config.json").exists()
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "1056", "task": "smsa"}) + "\n")
    config = config_for("indonli_large:cpu_test", f"data.train_subset={other}", f"data.tfds_dir={tmp_path / 'tfds'}")
    with pytest.raises(RunError, match=r"other.jsonl:1: a subset of task 'smsa', not 'indonli'"):
        train_and_evaluate(config, str(tmp_path / "work2"))


def test_dynamics_of_another_run_in_the_workdir_are_refused(run, tmp_path):
    import shutil

    from nli_jax.hooks.dynamics import DynamicsError
    workdir, _ = run
    target = tmp_path / "work"
    target.mkdir()
    shutil.copytree(workdir / "dynamics", target / "dynamics")  # copied from a run of another config
    with pytest.raises(DynamicsError, match=r"dynamics/meta.json belongs to another run or task \(config_sha256"):
        _train(target, "hooks.dynamics.enabled=True", "optimizer.lr=0.002")
    assert not (target / "config.json").exists()
    # The analysis of a run whose records are not its own.
    meta = json.loads((workdir / "dynamics" / "meta.json").read_text())
    foreign = tmp_path / "foreign"
    shutil.copytree(workdir, foreign, ignore=shutil.ignore_patterns("checkpoints", "best"))
    (foreign / "dynamics" / "meta.json").write_text(json.dumps(dict(meta, task="ocnli")))
    proc = _analyse(foreign)
    assert proc.returncode != 0 and "belongs to another run or task (task: 'ocnli' (records) vs 'indonli'" in proc.stderr


@pytest.mark.parametrize("assignments,message", [
    (("task='nerp'", "hooks.dynamics.enabled=True"),
     "--config.hooks.dynamics.enabled=True: task 'nerp' has no one prediction per example"),
    (("hooks.dynamics.every_steps=5",), "--config.hooks.dynamics.every_steps=5: records training dynamics: also"),
])
def test_dynamics_settings_a_task_cannot_record_are_refused(assignments, message):
    from nli_jax.errors import ConfigValueError
    from nli_jax.planner import build_plan
    with pytest.raises(ConfigValueError, match=message):
        build_plan(config_for("indonli_large:cpu_test", *assignments))


@pytest.mark.slow  # tens of seconds: python -m pytest -m slow
def test_every_n_steps_records_the_whole_training_split(tmp_path):
    """One-epoch runs: an evaluation of the training split every N steps, every example each time."""
    _train(tmp_path / "run", "hooks.dynamics.enabled=True", "hooks.dynamics.every_steps=6", "train.num_epochs=1",
           "optimizer.warmup_steps=0")
    records = _records(tmp_path / "run")
    assert np.bincount(records["pass"]).tolist() == [300, 300, 300]  # steps 6, 12, 18
    assert json.loads((tmp_path / "run" / "dynamics" / "meta.json").read_text())["mode"] == "every 6 steps"


# --- calibration -----------------------------------------------------------------------------

def test_results_report_calibration_and_the_temperature_fitted_on_validation(run):
    from nli_jax.metrics import calibration
    workdir, results = run
    fit = results["calibration"]
    assert fit["fitted_on"] == "validation" and fit["count"] == 60 and fit["nll_after"] <= fit["nll_before"]
    saved = json.loads((workdir / "calibration.json").read_text())
    assert saved["temperature"] == fit["temperature"] and saved["best_step"] == results["best_step"]
    records = [json.loads(line) for line in (workdir / "predictions.jsonl").read_text().splitlines()]
    for split in ("validation", "test_lay"):
        report = results["splits"][split]["calibration"]
        assert set(report["raw"]) == set(report["temperature_scaled"]) == {"ece", "mce", "brier", "nll"}
        assert (workdir / report["reliability_diagram"]).read_bytes()[:4] == b"\x89PNG"
        # The report is that of the written probabilities: recomputed from predictions.jsonl.
        rows = [r for r in records if r["split"] == split]
        gold = np.array([("entailment", "neutral", "contradiction").index(r["label"]) for r in rows])
        raw = np.array([r["probabilities"] for r in rows])
        scaled = np.array([r["calibrated_probabilities"] for r in rows])
        assert calibration.brier_score(raw, gold) == pytest.approx(report["raw"]["brier"], abs=1e-4)
        assert calibration.brier_score(scaled, gold) == pytest.approx(report["temperature_scaled"]["brier"], abs=1e-4)
        assert calibration.calibration_errors(raw, gold)[0] == pytest.approx(report["raw"]["ece"], abs=1e-4)


def _tool(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_evaluate_predict_and_export_apply_the_stored_temperature(run, tmp_path):
    workdir, results = run
    temperature = results["calibration"]["temperature"]
    proc = _tool("finetune.evaluate", f"--checkpoint={workdir}", f"--workdir={tmp_path / 'eval'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluated = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert evaluated["calibration"]["temperature"] == temperature  # applied, not fitted again
    for split in ("validation", "test_lay"):
        for kind in ("raw", "temperature_scaled"):
            for measure, value in evaluated["splits"][split]["calibration"][kind].items():
                assert value == pytest.approx(results["splits"][split]["calibration"][kind][measure], abs=1e-6)
    from nli_jax.data import fixture_path
    proc = _tool("finetune.predict", f"--checkpoint={workdir}", f"--output={tmp_path / 'pred'}",
                 f"--input=test={os.path.join(fixture_path('nli_tiny'), 'test_lay.jsonl')}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    predicted = [json.loads(line) for line in (tmp_path / "pred" / "predictions.jsonl").read_text().splitlines()]
    trained = [json.loads(line) for line in (workdir / "predictions.jsonl").read_text().splitlines()
               if json.loads(line)["split"] == "test_lay"]
    for a, b in zip(predicted, trained):
        np.testing.assert_allclose(a["calibrated_probabilities"], b["calibrated_probabilities"], atol=1e-5)
        np.testing.assert_allclose(a["probabilities"], b["probabilities"], atol=1e-5)
    proc = _tool("finetune.export", f"--checkpoint={workdir}", f"--output={tmp_path / 'hf'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["nli_jax"]["temperature"] == temperature
    # What docs/finetuning.md (Calibration) tells a transformers user: softmax(logits / temperature).
    import torch
    import transformers

    import nli_jax
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
    tokenizer = nli_jax.load_tokenizer(str(tmp_path / "hf"))
    rows = [json.loads(line) for line in open(os.path.join(fixture_path("nli_tiny"), "test_lay.jsonl"))][:8]
    batch = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        calibrated = torch.softmax(model(**batch).logits / exported["nli_jax"]["temperature"], -1).numpy()
    np.testing.assert_allclose(calibrated, [r["calibrated_probabilities"] for r in trained[:8]], atol=1e-4)


@pytest.mark.parametrize("value", [0, -1.5, float("nan"), "warm"])
def test_a_damaged_temperature_is_refused_before_compute(run, tmp_path, value):
    import shutil
    workdir, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("checkpoints"))
    saved = json.loads((copy / "calibration.json").read_text())
    (copy / "calibration.json").write_text(json.dumps(dict(saved, temperature=value)))
    proc = _tool("finetune.predict", f"--checkpoint={copy}", f"--output={tmp_path / 'pred'}",
                 f"--input=test={REPO / 'nli_jax' / 'data' / 'fixtures' / 'nli_tiny' / 'val.jsonl'}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{copy / 'calibration.json'}: temperature" in proc.stderr and "is not a finite number > 0" in proc.stderr
    assert not (tmp_path / "pred" / "predictions.jsonl").exists()


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_seeds_report_mean_and_std_of_the_calibration_measures(tmp_path):
    results = _train(tmp_path / "seeds", "seeds=(1,2)", "train.max_steps=12")
    for split in ("validation", "test_lay"):
        ece = results["splits"][split]["calibration"]["raw"]["ece"]
        values = [results["per_seed"][str(s)]["splits"][split]["calibration"]["raw"]["ece"] for s in (1, 2)]
        assert ece["values"] == values and ece["mean"] == pytest.approx(np.mean(values))
        assert ece["std"] == pytest.approx(np.std(values, ddof=1)) and not math.isnan(ece["std"])


@pytest.mark.slow  # MiniLM fine-tuned for 4 epochs on 400 real SmSA texts: a minute
def test_flipped_labels_gather_in_the_hard_to_learn_region_on_real_smsa(shared_data, minilm_dir, tmp_path):
    """The cartography paper's finding, small: 5% of 400 SmSA training texts (real, IndoNLU; their
    first 32 tokens) get a wrong label, seeded; after 4 epochs of MiniLM the flipped ones fill the
    hard-to-learn third and the lowest-confidence examples, and hardly any is easy to learn. (Measured:
    16 of the 20 in the hard third, 7 among the 20 lowest-confidence, 1 easy; at 1,000 texts of 64
    tokens, 3 minutes: 42 of 50, 25 of 50, 0.) The IndoNLI version, at a
    scale that learns (3,000 pairs), is benchmarks/experiments/dynamics_and_calibration_indonli.py:
    docs/training_dynamics_and_calibration.md. The same run's temperature, fitted on validation,
    lowers the validation NLL."""
    import random
    source = tmp_path / "src" / "smsa_doc-sentiment-prosa"
    source.mkdir(parents=True)
    original = shared_data / "indonlu" / "smsa_doc-sentiment-prosa"
    rows = [line.rstrip("\n").split("\t") for line in
            (original / "train_preprocess.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:400]]
    rng = random.Random(0)
    flipped = set(rng.sample(range(len(rows)), len(rows) // 20))
    labels = ("positive", "neutral", "negative")
    with open(source / "train_preprocess.tsv", "w", encoding="utf-8") as f:
        for i, (text, label) in enumerate(rows):
            f.write(f"{text}\t{rng.choice([l for l in labels if l != label]) if i in flipped else label}\n")
    (source / "valid_preprocess.tsv").write_text(
        "".join((original / "valid_preprocess.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:200]),
        encoding="utf-8")
    workdir = tmp_path / "run"
    command = [sys.executable, "-m", "finetune.main", "--config=configs/indonlu.py:task=smsa", f"--workdir={workdir}",
               f"--config.model.init={minilm_dir}", f"--config.data.source={tmp_path / 'src'}",
               f"--config.data.tfds_dir={tmp_path / 'tfds'}", "--config.data.max_seq_length=32",
               "--config.train.batch_size=32", "--config.train.num_epochs=4", "--config.optimizer.lr=2e-4",
               "--config.train.early_stopping_patience=0", "--config.hooks.dynamics.enabled=True",
               "--config.eval_splits=validation"]
    for args in (command, [sys.executable, "-m", "nli_jax.analysis", "cartography", f"--workdir={workdir}"]):
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1800,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
        assert proc.returncode == 0, proc.stderr[-3000:]
    maps = workdir / "cartography"

    def flipped_in(region):
        ids = [json.loads(line)["idx"] for line in (maps / f"{region}.jsonl").read_text().splitlines()]
        return sum(i in flipped for i in ids), len(ids)
    hard, hard_n = flipped_in("hard_to_learn")
    easy, easy_n = flipped_in("easy_to_learn")
    assert hard / hard_n > 1.6 * 0.05 and easy / easy_n < 0.05 / 2, (hard, hard_n, easy, easy_n)
    rows = [json.loads(line) for line in (maps / "cartography.jsonl").read_text().splitlines()]
    lowest = sorted(rows, key=lambda r: r["confidence"])[:len(flipped)]
    assert sum(r["idx"] in flipped for r in lowest) >= len(flipped) / 5  # 4 times the 5% chance gives
    validation = json.loads((workdir / "results.json").read_text())["splits"]["validation"]["calibration"]
    assert validation["temperature_scaled"]["nll"] <= validation["raw"]["nll"]


def test_records_of_a_run_an_older_nli_jax_started_are_this_runs(tmp_path):
    """A workdir whose config.json and dynamics/meta.json 5272312 wrote (train.record_dynamics=True,
    dynamics_every_steps=7, calibration=False: today hooks.dynamics / hooks.calibration) is the same
    run for today's hook: the records' identity is read against the workdir's own config.json, as the
    cartography reads it (before: today's config.json spelling gave another digest, refused)."""
    import types

    from nli_jax.hooks.dynamics import DIRECTORY, META, DynamicsError, DynamicsHook, DynamicsOptions, identity
    from nli_jax.planner import build_plan
    older = json.loads((REPO / "tests" / "fixtures" / "older_config_json" / "indonli_cpu_test_dynamics.json")
                       .read_text().replace("{REPO}", str(REPO)))
    plan = build_plan(config_for("indonli_large:cpu_test", "hooks.dynamics.enabled=True",
                                 "hooks.dynamics.every_steps=7", "hooks.calibration.enabled=False"), training=False)
    (tmp_path / "config.json").write_text(json.dumps(older))
    (tmp_path / DIRECTORY).mkdir()
    (tmp_path / DIRECTORY / META).write_text(json.dumps(dict(identity("indonli", older, 300), mode="every 7 steps")))
    run = types.SimpleNamespace(plan=plan, workdir=str(tmp_path), evaluator=None)
    options = DynamicsOptions(enabled=True, every_steps=7)
    DynamicsHook(run, range(300), options)  # accepted: the records are this run's
    (tmp_path / "config.json").write_text(json.dumps(dict(older, seeds=[5])))  # another run's config.json
    with pytest.raises(DynamicsError, match="belongs to another run or task"):
        DynamicsHook(run, range(300), options)
