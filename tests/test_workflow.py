"""Evaluate, predict and export without training, through the command lines a researcher runs:
a finished run's best parameters (or a Hugging Face checkpoint) evaluated on other files with
the training run's breakdowns, label-named predictions for unlabelled files, and fine-tuned
exports that transformers loads and that predict what nli-jax predicts."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

FIXTURE = REPO / "nli_jax" / "data" / "fixtures" / "nli_tiny"
CPU_TEST = "configs/indonli_large.py:cpu_test"


def _cli(module, *args, check=True, timeout=600):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def _jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run") / "indonli"
    _cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={workdir}", "--config.train.num_epochs=3",
         "--config.export_best=True", f"--config.data.tfds_dir={workdir.parent / 'tfds'}")
    return workdir


def _unlabelled_copy(source, destination):
    rows = _jsonl(source)
    with open(destination, "w", encoding="utf-8") as f:
        for row in rows:
            row.pop("label")
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rows


def _close(a, b, rel=1e-6):
    """a == b, floats within `rel`, recursively."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float):
        return b == pytest.approx(a, rel=rel, abs=1e-12)
    return a == b


def test_evaluate_reproduces_the_runs_final_evaluation_and_adds_files(finished_run, tmp_path):
    trained = json.loads((finished_run / "results.json").read_text())
    out = tmp_path / "eval"
    _cli("finetune.evaluate", f"--checkpoint={finished_run}", f"--workdir={out}",
         f"--file=val_again={FIXTURE / 'val.jsonl'}")
    evaluated = json.loads((out / "results.json").read_text())

    def same_report(a, b, exact=True):  # the loss is a float32 sum whose order may differ
        assert a.pop("loss") == pytest.approx(b.pop("loss"), rel=1e-5)
        for report in (a, b):  # each split's own reliability diagram file
            report["calibration"] = {k: v for k, v in report["calibration"].items() if k != "reliability_diagram"}
        assert a == b if exact else _close(a, b)
    for split in ("validation", "test_lay", "test_expert", "diagnostic"):
        same_report(dict(evaluated["splits"][split]), dict(trained["splits"][split]))
    # A file given by path is a split of its own, with the same breakdowns as validation. Its
    # examples share evaluation rows in another arrangement, and XLA:CPU's Eigen dots (the
    # evaluation programs' on CPU) round a row's products by where it sits: calibration's floats
    # agree to ~1e-9, not bit for bit; counts, accuracy and every breakdown are equal.
    same_report(dict(evaluated["splits"]["val_again"]), dict(trained["splits"]["validation"]), exact=False)
    assert set(evaluated["splits"]["diagnostic"]["by_tag"]) == set(trained["splits"]["diagnostic"]["by_tag"])
    ours = [r for r in _jsonl(out / "predictions.jsonl") if r["split"] == "validation"]
    theirs = [r for r in _jsonl(finished_run / "predictions.jsonl") if r["split"] == "validation"]
    assert ours == theirs


def test_predict_labels_unlabelled_input_with_names(finished_run, tmp_path):
    gold = _unlabelled_copy(FIXTURE / "val.jsonl", tmp_path / "pairs.jsonl")
    out = tmp_path / "pred"
    proc = _cli("finetune.predict", f"--checkpoint={finished_run}", f"--output={out}",
                f"--input=mine={tmp_path / 'pairs.jsonl'}")
    assert f"{len(gold)} predictions written" in proc.stdout
    predicted = _jsonl(out / "predictions.jsonl")
    trained = [r for r in _jsonl(finished_run / "predictions.jsonl") if r["split"] == "validation"]
    assert [r["split"] for r in predicted] == ["mine"] * len(gold)
    assert all(r["label"] is None for r in predicted)
    assert [r["id"] for r in predicted] == [str(g["pair_id"]) for g in gold]
    assert [r["prediction"] for r in predicted] == [r["prediction"] for r in trained]
    np.testing.assert_allclose([r["probabilities"] for r in predicted], [r["probabilities"] for r in trained], atol=2e-6)


def test_export_loads_in_transformers_and_predicts_the_same(finished_run):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    export = finished_run / "export_best"
    model = AutoModelForSequenceClassification.from_pretrained(export).eval()
    assert model.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
    assert model.config.label2id == {"entailment": 0, "neutral": 1, "contradiction": 2}
    tokenizer = AutoTokenizer.from_pretrained(export)
    ours = [r for r in _jsonl(finished_run / "predictions.jsonl") if r["split"] == "validation"]
    rows = _jsonl(FIXTURE / "val.jsonl")
    batch = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True, truncation=True,
                      max_length=64, return_tensors="pt")
    with torch.no_grad():
        probabilities = torch.softmax(model(**batch).logits, -1).numpy()
    assert [model.config.id2label[int(i)] for i in probabilities.argmax(-1)] == [r["prediction"] for r in ours]
    np.testing.assert_allclose(probabilities, [r["probabilities"] for r in ours], atol=1e-5)


def test_export_command_writes_the_best_parameters(finished_run, tmp_path):
    _cli("finetune.export", f"--checkpoint={finished_run}", f"--output={tmp_path / 'hf'}")
    from safetensors.numpy import load_file
    a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(finished_run / "export_best" / "model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["id2label"]["2"] == "contradiction"


def test_evaluate_and_predict_refuse_bad_input_before_compute(finished_run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"premise": "Ani makan.", "hypothesis": "Ani lapar."}\n{"premise": "Budi tidur."\n', encoding="utf-8")
    proc = _cli("finetune.predict", f"--checkpoint={finished_run}", f"--output={tmp_path / 'p'}", f"--input={bad}",
                check=False)
    assert proc.returncode != 0 and f"{bad}:2" in proc.stderr
    assert not (tmp_path / "p" / "predictions.jsonl").exists()
    # A labelled split with an unknown label names file and line.
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"premise": "Ani makan.", "hypothesis": "Ani lapar.", "label": "maybe"}\n', encoding="utf-8")
    proc = _cli("finetune.evaluate", f"--checkpoint={finished_run}", f"--workdir={tmp_path / 'e'}",
                f"--file=x={wrong}", check=False)
    assert proc.returncode != 0 and f"{wrong}:1" in proc.stderr and "unknown label 'maybe'" in proc.stderr
    # A config whose model differs from the run's is refused, naming the key.
    proc = _cli("finetune.evaluate", f"--checkpoint={finished_run}", f"--workdir={tmp_path / 'e2'}",
                "--override=model.preset=tiny-albert", check=False)
    assert proc.returncode != 0 and "model.preset" in proc.stderr and "tiny-albert" in proc.stderr
    # Neither a run nor a Hugging Face directory.
    proc = _cli("finetune.evaluate", f"--config={CPU_TEST}", f"--checkpoint={tmp_path / 'nowhere'}",
                f"--workdir={tmp_path / 'e3'}", check=False)
    assert proc.returncode != 0 and "nowhere" in proc.stderr and "neither a run directory" in proc.stderr
    # An unknown override key.
    proc = _cli("finetune.evaluate", f"--checkpoint={finished_run}", f"--workdir={tmp_path / 'e4'}",
                "--override=train.batchsize=8", check=False)
    assert proc.returncode != 0 and "train.batchsize" in proc.stderr
    for name in ("e", "e2", "e4"):
        assert not (tmp_path / name / "results.json").exists()


def _subset(source_dir, destination, counts):
    destination.mkdir(parents=True, exist_ok=True)
    for name, n in counts.items():
        with open(source_dir / name, encoding="utf-8") as f:
            lines = [next(f) for _ in range(n)]
        (destination / name).write_text("".join(lines), encoding="utf-8")
    return destination


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_real_checkpoint_fine_tuned_on_indonli_exports_to_transformers(shared_data, minilm_dir, tmp_path):
    """A real BERT checkpoint fine-tuned a few steps on real IndoNLI pairs: the export gives
    transformers' BertForSequenceClassification nli-jax's predictions on the validation pairs."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    data = _subset(shared_data / "indonli", tmp_path / "indonli", {"train.jsonl": 64, "val.jsonl": 96})
    run = tmp_path / "run"
    _cli("finetune.main", "--config=configs/indonli_base.py", f"--workdir={run}", f"--config.model.init={minilm_dir}",
         f"--config.data.source={data}", f"--config.data.tfds_dir={tmp_path / 'tfds'}", "--config.data.max_seq_length=128",
         "--config.train.batch_size=16", "--config.train.num_epochs=1", "--config.optimizer.lr=5e-5",
         "--config.train.async_checkpointing=False", "--config.eval_splits=('validation',)", "--config.export_best=True")
    model = BertForSequenceClassification.from_pretrained(run / "export_best").eval()
    assert model.config.id2label[2] == "contradiction"
    tokenizer = AutoTokenizer.from_pretrained(run / "export_best")
    rows = _jsonl(data / "val.jsonl")
    ours = _jsonl(run / "predictions.jsonl")
    with torch.no_grad():
        batch = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True,
                          truncation="longest_first", max_length=128, return_tensors="pt")
        probabilities = torch.softmax(model(**batch).logits, -1).numpy()
    assert [model.config.id2label[int(i)] for i in probabilities.argmax(-1)] == [r["prediction"] for r in ours]
    np.testing.assert_allclose(probabilities, [r["probabilities"] for r in ours], atol=1e-4)


def _head_lines(source, destination, n, *, sentences=False):
    """The first n lines (or blank-line separated sentences) of a real file, into tmp."""
    text = source.read_text(encoding="utf-8")
    if sentences:
        blocks = [b for b in text.split("\n\n") if b.strip()][:n]
        destination.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
        return len(blocks)
    lines = text.splitlines(keepends=True)[:n]
    destination.write_text("".join(lines), encoding="utf-8")
    return len(lines)


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_indonlu_benchmark_writes_the_leaderboard_files_and_predict_matches(shared_data, tmp_path):
    """SmSA and NERP from real files (validation copied as a stand-in test file: the labelled test
    files are not shared): the benchmark writes the submission files, and finetune.predict on the
    same text without labels gives the same predictions."""
    source = tmp_path / "indonlu"
    counts = {}
    for task, folder, ext, sentences in (("smsa", "smsa_doc-sentiment-prosa", "tsv", False),
                                         ("nerp", "nerp_ner-prosa", "txt", True)):
        (source / folder).mkdir(parents=True)
        real = shared_data / "indonlu" / folder
        _head_lines(real / f"train_preprocess.{ext}", source / folder / f"train_preprocess.{ext}", 160, sentences=sentences)
        for name in ("valid", "test"):
            counts[task] = _head_lines(real / f"valid_preprocess.{ext}", source / folder / f"{name}_preprocess.{ext}", 40,
                                       sentences=sentences)
    workdir = tmp_path / "bench"
    proc = _cli("finetune.indonlu_benchmark", "--cpu_test", "--tasks=smsa,nerp", f"--source={source}",
                f"--workdir={workdir}", f"--override=data.tfds_dir='{tmp_path / 'tfds'}'", "--override=train.max_steps=6")
    assert "leaderboard submission" in proc.stdout
    smsa_rows = (workdir / "submission" / "smsa" / "pred.txt").read_text(encoding="utf-8").splitlines()
    assert smsa_rows[0] == "index,label" and len(smsa_rows) == counts["smsa"] + 1
    assert [r.split(",")[0] for r in smsa_rows[1:]] == [str(i) for i in range(counts["smsa"])]
    assert {r.split(",", 1)[1] for r in smsa_rows[1:]} <= {"positive", "neutral", "negative"}
    nerp_rows = (workdir / "submission" / "nerp" / "pred.txt").read_text(encoding="utf-8").splitlines()
    assert nerp_rows[0] == "index,label" and len(nerp_rows) == counts["nerp"] + 1
    assert (workdir / "submission" / "nerp.zip").is_file()

    # Unlabelled input in the task's own format: SmSA text only, NERP one token per line.
    smsa_text = tmp_path / "smsa_unlabelled.tsv"
    smsa_text.write_text("".join(line.split("\t")[0] + "\n" for line in
                                 (source / "smsa_doc-sentiment-prosa" / "test_preprocess.tsv").read_text().splitlines()))
    nerp_tokens = tmp_path / "nerp_unlabelled.txt"
    nerp_tokens.write_text("\n".join(line.rsplit("\t", 1)[0] if line.strip() else "" for line in
                                     (source / "nerp_ner-prosa" / "test_preprocess.txt").read_text().split("\n")))
    for task, path in (("smsa", smsa_text), ("nerp", nerp_tokens)):
        _cli("finetune.predict", f"--checkpoint={workdir / task}", f"--output={tmp_path / ('pred_' + task)}",
             f"--input=test={path}")
        predicted = _jsonl(tmp_path / f"pred_{task}" / "predictions.jsonl")
        benchmark = [r for r in _jsonl(workdir / task / "predictions.jsonl") if r["split"] == "test"]
        assert len(predicted) == counts[task]
        assert [r["prediction"] for r in predicted] == [r["prediction"] for r in benchmark], task
