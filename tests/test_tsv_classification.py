"""Text classification from TSV files with a label-mapping file (nli_jax/tasks/tsv_classification.py,
configs/tsv_classification.py), added as one module and one config: it trains and evaluates
through the command line on real text (IndoNLU SmSA's review sentences, their three sentiments
mapped onto two classes by the map), and refuses a label the map lacks, naming file and line,
before any compute."""
import json
import subprocess
import sys

import pytest

from conftest import REPO

LABEL_MAP = "positive\tpositive\nnegative\tnot_positive\nneutral\tnot_positive\n"


@pytest.fixture
def smsa_as_tsv(shared_data, tmp_path):
    """SmSA's text<TAB>label files as this task reads them (train.tsv, dev.tsv), a label map and a
    WordPiece vocabulary trained on the training text."""
    from nli_jax.pretraining.vocab import train_vocabulary
    smsa = shared_data / "indonlu" / "smsa_doc-sentiment-prosa"
    if not (smsa / "train_preprocess.tsv").is_file():
        pytest.skip(f"IndoNLU SmSA not found in {smsa}")
    data = tmp_path / "data"
    data.mkdir()
    train = (smsa / "train_preprocess.tsv").read_text(encoding="utf-8").splitlines()[:640]
    dev = (smsa / "valid_preprocess.tsv").read_text(encoding="utf-8").splitlines()[:160]
    (data / "train.tsv").write_text("\n".join(train) + "\n", encoding="utf-8")
    (data / "dev.tsv").write_text("\n".join(dev) + "\n", encoding="utf-8")
    (data / "labels.tsv").write_text(LABEL_MAP, encoding="utf-8")
    (tmp_path / "text.txt").write_text("\n".join(line.split("\t")[0] for line in train) + "\n", encoding="utf-8")
    vocab = train_vocabulary([str(tmp_path / "text.txt")], str(tmp_path / "vocab"), vocab_size=2000)
    return data, vocab, dev


def _run(tmp_path, data, vocab, *extra):
    return subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/tsv_classification.py:cpu_test",
                           f"--workdir={tmp_path / 'run'}", f"--config.data.source={data}",
                           f"--config.task_options.label_map={data / 'labels.tsv'}", f"--config.model.tokenizer={vocab}",
                           f"--config.data.tfds_dir={tmp_path / 'tfds'}", "--config.train.num_epochs=3", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_trains_and_evaluates_on_real_text_through_the_command_line(smsa_as_tsv, tmp_path):
    data, vocab, dev = smsa_as_tsv
    proc = _run(tmp_path, data, vocab)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    validation = results["splits"]["validation"]
    assert results["task"] == "tsv_classification" and results["primary_metric"] == "f1"
    assert validation["count"] == 160 and {"accuracy", "f1", "precision", "recall"} <= set(validation)
    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    # Gold labels are the map's names, in the file's order; predictions use the same two classes.
    expected = [{"positive": "positive"}.get(line.split("\t")[1], "not_positive") for line in dev]
    assert [r["label"] for r in records] == expected
    assert {r["prediction"] for r in records} <= {"positive", "not_positive"}
    print(f"validation accuracy {validation['accuracy']:.3f}, macro-F1 {validation['f1']:.3f}")
    assert validation["accuracy"] > 0.6  # above the majority class (0.58 positive) after 3 epochs


def test_a_label_the_map_lacks_is_refused_by_file_and_line_before_compute(smsa_as_tsv, tmp_path):
    data, vocab, dev = smsa_as_tsv
    lines = (data / "dev.tsv").read_text(encoding="utf-8").splitlines()
    lines[6] = lines[6].rsplit("\t", 1)[0] + "\tmixed"
    (data / "dev.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = _run(tmp_path, data, vocab)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert f"{data / 'dev.tsv'}:7: label 'mixed' is not in" in last, proc.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_label_map_is_required(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/tsv_classification.py:cpu_test",
                           f"--workdir={tmp_path / 'run'}", f"--config.data.source={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "--config.task_options.label_map=''" in proc.stderr.strip().splitlines()[-1]
