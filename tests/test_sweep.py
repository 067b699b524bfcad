"""`python -m finetune.sweep` end to end on the cpu_test variant (a 2 x 2 grid of very short runs):
the tables against numpy over the cells' results.json, resuming without rerunning, a failed cell,
bad input failing once before any compute; nli_jax.tables, the lr selection and the IndoNLU
benchmark's seed averages on hand-written numbers."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

CPU_TEST = "configs/indonli_large.py:cpu_test"
# One compiled shape (pad_to_max_length) and 4 steps: ~10 s a cell.
SHORT = ("--config.train.num_epochs=1", "--config.train.max_steps=4", "--config.data.pad_to_max_length=True")
LRS, SEEDS = "3e-3,1e-4", "1,2"
SPLITS = ["validation", "test_lay", "test_expert", "diagnostic"]


def sweep(workdir, *overrides, lrs=LRS, seeds=SEEDS):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "finetune.sweep", f"--config={CPU_TEST}", f"--workdir={workdir}",
                           f"--lrs={lrs}", f"--seeds={seeds}", *SHORT, *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    tfds = f"--config.data.tfds_dir={root / 'tfds'}"
    proc = sweep(root / "grid", tfds)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / "grid", tfds


def cell_results(workdir):
    """{(lr dir, seed dir): results.json} read straight from the cells."""
    out = {}
    for lr_dir in sorted(os.listdir(workdir)):
        if lr_dir.startswith("lr_"):
            for seed_dir in sorted(os.listdir(workdir / lr_dir)):
                path = workdir / lr_dir / seed_dir / "results.json"
                if path.is_file():
                    out[lr_dir, seed_dir] = json.loads(path.read_text())
    return out


def csv_rows(workdir):
    import csv
    with open(workdir / "table.csv", newline="") as f:
        return list(csv.reader(f))


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_table_rows_are_numpy_mean_std_over_seeds_and_the_best_lr_is_selected(finished_sweep):
    workdir, _ = finished_sweep
    results = cell_results(workdir)
    assert sorted(results) == [(f"lr_{lr}", f"seed_{s}") for lr in ("0.0001", "0.003") for s in (1, 2)]
    for lr_dir, seed_dir in results:  # each cell trained with its own lr and seed
        config = json.loads((workdir / lr_dir / seed_dir / "config.json").read_text())
        assert (f"lr_{config['optimizer']['lr']:g}", f"seed_{config['train']['seed']}") == (lr_dir, seed_dir)
    header, *rows = csv_rows(workdir)
    assert header == ["model", "lr", "seeds"] + SPLITS + ["selected"]
    assert [r[1] for r in rows] == ["0.003", "0.0001"] and [r[2] for r in rows] == ["2/2", "2/2"]
    means = {}
    for row in rows:
        cells = [results[f"lr_{row[1]}", f"seed_{s}"] for s in (1, 2)]
        assert {c["primary_metric"] for c in cells} == {"accuracy"}
        for split, text in zip(SPLITS, row[3:-1]):
            values = [100 * c["splits"][split]["accuracy"] for c in cells]
            assert text == f"{np.mean(values):.2f} ({np.std(values, ddof=1):.2f})"
        means[row[1]] = np.mean([c["splits"]["validation"]["accuracy"] for c in cells])
        assert "| " + " | ".join(row) + " |" in (workdir / "table.md").read_text()
    best = max(means, key=means.get)  # the first of equal means, as in --lrs order
    assert [r[1] for r in rows if r[-1] == "*"] == [best]
    summary = json.loads((workdir / "sweep.json").read_text())
    assert f"{summary['selected_lr']:g}" == best and summary["primary_metric"] == "accuracy"
    for cell in summary["cells"]:
        assert cell["status"] == "finished"
        own = results[f"lr_{cell['lr']:g}", f"seed_{cell['seed']}"]
        assert cell["splits"] == {s: own["splits"][s]["accuracy"] for s in SPLITS}
    assert f"selected lr: {best} " in (workdir / "table.md").read_text()


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_rerun_skips_finished_cells(finished_sweep):
    workdir, tfds = finished_sweep
    paths = [workdir / f"lr_{lr}" / f"seed_{s}" / "results.json" for lr in ("0.003", "0.0001") for s in (1, 2)]
    before = [p.stat().st_mtime_ns for p in paths]
    table = (workdir / "table.md").read_text()
    proc = sweep(workdir, tfds)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [p.stat().st_mtime_ns for p in paths] == before
    assert proc.stderr.count(": skipped (results.json present)") == 4
    assert "task indonli |" not in proc.stderr  # the loop's first log line: no run started
    assert (workdir / "table.md").read_text() == table


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_a_failed_cell_is_reported_and_the_others_finish(finished_sweep, tmp_path):
    # The finished 2 x 2 grid extended by lr 1e-3, whose seed 2 directory holds another cell's
    # config: the loop's workdir check refuses it (a real failure, after seed 1 trained).
    source, tfds = finished_sweep
    workdir = tmp_path / "grid"
    shutil.copytree(source, workdir)
    (workdir / "lr_0.001" / "seed_2").mkdir(parents=True)
    shutil.copy(workdir / "lr_0.003" / "seed_1" / "config.json", workdir / "lr_0.001" / "seed_2" / "config.json")
    proc = sweep(workdir, tfds, lrs="3e-3,1e-4,1e-3")
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert proc.stderr.count(": skipped (results.json present)") == 4
    summary = json.loads((workdir / "sweep.json").read_text())
    status = {(f"{c['lr']:g}", c["seed"]): c["status"] for c in summary["cells"]}
    assert status.pop(("0.001", 2)) == "failed" and set(status.values()) == {"finished"}
    failed = next(c for c in summary["cells"] if c["status"] == "failed")
    assert "different config" in failed["error"] and "optimizer.lr: 0.003 -> 0.001" in failed["error"]
    assert (workdir / "lr_0.001" / "seed_1" / "results.json").is_file()
    assert not (workdir / "lr_0.001" / "seed_2" / "results.json").exists()
    header, *rows = csv_rows(workdir)
    assert [(r[1], r[2]) for r in rows] == [("0.003", "2/2"), ("0.0001", "2/2"), ("0.001", "1/2")]
    single = json.loads((workdir / "lr_0.001" / "seed_1" / "results.json").read_text())
    assert rows[2][3] == f"{100 * single['splits']['validation']['accuracy']:.2f}"  # one seed: no spread
    assert "failed: lr 0.001 seed 2: WorkdirConfigError: workdir" in (workdir / "table.md").read_text()


def test_unknown_config_key_fails_before_any_cell(tmp_path):
    proc = sweep(tmp_path / "grid", "--config.optimizer.learning_rat=3e-5")
    assert proc.returncode != 0 and "learning_rat" in proc.stderr
    assert not (tmp_path / "grid").exists() or not any(p.startswith("lr_") for p in os.listdir(tmp_path / "grid"))


def test_missing_data_fails_once_before_any_compute(tmp_path):
    missing = tmp_path / "no_such_indonli"
    proc = sweep(tmp_path / "grid", f"--config.data.source={missing}", f"--config.data.tfds_dir={tmp_path / 'tfds'}")
    assert proc.returncode == 1
    assert f"data directory {missing} does not exist" in proc.stderr
    assert proc.stderr.count("failed before its training began; stopping") == 1
    # The canary's directory is gone (nothing was computed) and no other cell started.
    assert [p for p in os.listdir(tmp_path / "grid")] == ["sweep.log"]


def test_format_mean_std_on_hand_written_numbers():
    from nli_jax import tables
    assert tables.format_mean_std([0.80, 0.90]) == "85.00 (7.07)"  # sample std: sqrt(2 * 0.05^2 / 1)
    assert tables.format_mean_std([0.8, 0.9, 0.85, 0.8]) == "83.75 (4.79)"
    assert tables.format_mean_std([0.8421]) == "84.21"  # one run: no spread to show
    assert tables.format_mean_std([]) == ""
    assert tables.format_mean_std([1.5, 2.5], scale=1, digits=1) == "2.0 (0.7)"
    summary = tables.mean_std([0.1, 0.2, 0.6])
    assert summary["n"] == 3 and summary["mean"] == pytest.approx(0.3)
    assert summary["std"] == pytest.approx(np.sqrt(((0.2) ** 2 + 0.1 ** 2 + 0.3 ** 2) / 2))
    assert tables.mean_std([0.5])["std"] == 0.0  # as aggregate_seeds writes a single seed


def test_markdown_and_csv_writers(tmp_path):
    from nli_jax import storage, tables
    header, rows = ["model", "dev"], [["a", "85.00 (7.07)"], ["b, c", ""]]
    text = tables.write_markdown(storage.under(tmp_path, "t.md"), header, rows, title="Title", notes=["note"])
    assert text == "Title\n\n| model | dev |\n|---|---|\n| a | 85.00 (7.07) |\n| b, c |  |\n\nnote\n"
    assert (tmp_path / "t.md").read_text() == text
    tables.write_csv(storage.under(tmp_path, "t.csv"), header, rows)
    assert (tmp_path / "t.csv").read_bytes() == b'model,dev\r\na,85.00 (7.07)\r\n"b, c",\r\n'


def _cell(lr, seed, validation=None, status="finished"):
    cell = {"lr": lr, "seed": seed, "status": status}
    if status == "finished":
        cell.update(primary_metric="accuracy", splits={"validation": validation, "test_lay": validation - 0.1})
    return cell


def test_selection_is_by_mean_validation_over_finished_seeds_ties_to_the_first():
    from conftest import config_for
    from finetune.sweep import summarize
    from nli_jax.planner import build_plan
    config = build_plan(config_for("indonli_large", "eval_splits=('validation','test_lay')",
                                   "model.init=/ckpt/indobert-large-p2/"), training=False)
    cells = [_cell(1e-5, 1, 0.70), _cell(1e-5, 2, 0.80),  # mean 0.75
             _cell(3e-5, 1, 0.90), _cell(3e-5, 2, 0.50),  # mean 0.70 despite the best single run
             _cell(1e-6, 1, status="failed"), _cell(1e-6, 2, status="pending")]
    summary = summarize(config, cells, [1e-5, 3e-5, 1e-6], [1, 2])
    assert summary["selected_lr"] == 1e-5 and summary["model"] == "indobert-large-p2"
    assert summary["splits"] == ["validation", "test_lay"]
    assert [r["seeds_finished"] for r in summary["rows"]] == [2, 2, 0]
    assert summary["rows"][1]["splits"]["test_lay"]["mean"] == pytest.approx(0.6)
    cells[0]["splits"]["validation"] = 0.60  # now 0.70 = 0.70: the lr listed first wins
    assert summarize(config, cells, [1e-5, 3e-5, 1e-6], [1, 2])["selected_lr"] == 1e-5
    cells[0]["splits"]["validation"] = 0.59
    assert summarize(config, cells, [1e-5, 3e-5, 1e-6], [1, 2])["selected_lr"] == 3e-5


def test_a_finished_cell_of_another_config_is_not_reused(tmp_path):
    import ml_collections
    from finetune.sweep import run_cell
    config = ml_collections.ConfigDict({"task": "indonli", "optimizer": {"lr": 1e-5}})
    (tmp_path / "results.json").write_text(json.dumps({"primary_metric": "accuracy", "splits": {}}))
    (tmp_path / "config.json").write_text(json.dumps({"task": "indonli", "optimizer": {"lr": 3e-5}}))
    outcome = run_cell(config, str(tmp_path))
    assert outcome["status"] == "failed" and "optimizer.lr: 3e-05 -> 1e-05" in outcome["error"]
    with pytest.raises(ValueError, match="different config"):  # the canary: the sweep stops
        run_cell(config, str(tmp_path), canary=True)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    assert run_cell(config, str(tmp_path))["status"] == "skipped"


def test_benchmark_table_averages_each_seed_then_over_seeds():
    from finetune import indonlu_benchmark as bench
    f1 = {"emot": (0.60, 0.70), "smsa": (0.80, 0.90), "casa": (0.50, 0.50), "hoasa": (0.70, 0.90),
          "wrete": (0.40, 0.50)}
    runs = {t: {seed: {"splits": {"validation": {"f1": v[i]}}} for i, seed in enumerate((1, 2))} for t, v in f1.items()}
    runs["posp"] = {1: {"splits": {"validation": {"f1": 0.9}}}}  # one seed of seven tasks: no seq avg
    header, rows = bench.table(runs)
    (row,) = rows
    cells = dict(zip(header, row))
    assert cells["EmoT"] == "65.00 (7.07)" and cells["CASA"] == "50.00 (0.00)" and cells["POSP"] == "90.00"
    per_seed = [np.mean([v[i] for v in f1.values()]) * 100 for i in (0, 1)]  # 60.0 and 70.0
    assert cells["cls avg"] == f"{np.mean(per_seed):.2f} ({np.std(per_seed, ddof=1):.2f})" == "65.00 (7.07)"
    assert cells["seq avg"] == "" and cells["BaPOS"] == ""
    header, (row,) = bench.table({t: {None: r[1]} for t, r in runs.items()})  # without --seeds: as before
    cells = dict(zip(header, row))
    assert cells["EmoT"] == "60.00" and cells["cls avg"] == "60.00" and cells["POSP"] == "90.00"


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_benchmark_seeds_failed_seed_is_reported_not_fatal(shared_data, tmp_path):
    from finetune import indonlu_benchmark as bench
    workdir = tmp_path / "bench"
    # Seed 3's directory holds a foreign config: the loop refuses it after seeds 1 and 2 trained.
    (workdir / "smsa" / "seed_3").mkdir(parents=True)
    (workdir / "smsa" / "seed_3" / "config.json").write_text(json.dumps({"task": "emot"}))
    overrides = ["train.max_steps=3", "data.pad_to_max_length=True", "eval_splits=('validation',)",
                 f"data.tfds_dir={tmp_path / 'tfds'}"]
    text, failures = bench.run_benchmark("scratch", str(workdir), str(shared_data / "indonlu"), ["smsa"],
                                         overrides, cpu_test=True, seeds=[1, 2, 3])
    assert len(failures) == 1 and failures[0].startswith("SmSA seed 3: WorkdirConfigError")
    values = [100 * json.loads((workdir / "smsa" / f"seed_{s}" / "results.json").read_text())
              ["splits"]["validation"]["f1"] for s in (1, 2)]
    assert [json.loads((workdir / "smsa" / f"seed_{s}" / "config.json").read_text())["train"]["seed"]
            for s in (1, 2)] == [1, 2]
    row = dict(zip(*csv_rows(workdir)[:2]))
    assert row["split"] == "validation" and row["SmSA"] == f"{np.mean(values):.2f} ({np.std(values, ddof=1):.2f})"
    assert "failed: SmSA seed 3" in text and "mean (std) over seeds 1, 2, 3" in text
    assert not (workdir / "smsa" / "results.json").exists() and not (workdir / "test_predictions").exists()
