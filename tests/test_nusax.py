"""NusaX-Senti (nli_jax/tasks/nusax.py, configs/nusax.py, finetune/nusax_benchmark.py): the
official layout read from a directory or downloaded (from 127.0.0.1 here), several languages
joined for training and others scored beside them, the paper's metric against scikit-learn, the
shared copy's 12 languages, and the benchmark through its command line (in-language table and
the transfer matrix, resumed)."""
import csv
import functools
import http.server
import json
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import REPO
from configs import nusax as nusax_config
from nli_jax.data.readers import DataError
from nli_jax.plan import DataPlan
from nli_jax.tasks import nusax

WORDS = {"positive": ["enak", "bagus", "ramah"], "neutral": ["biasa", "cukup", "lumayan"],
         "negative": ["buruk", "kotor", "mahal"]}


def write_language(directory, language, sizes=(("train.csv", 12), ("valid.csv", 6)), start=0):
    """Synthetic NusaX files: `id,text,label`, labels cycling, a quoted comma in every text."""
    folder = directory / language
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in sizes:
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "text", "label"])
            for i in range(count):
                label = nusax.LABELS[i % 3]
                writer.writerow([start + i, f"{language} {WORDS[label][i % 3]} {i}, kata {name}", label])
    return folder


def task(source, train="indonesian", evaluate=""):
    return nusax.NusaXSenti(DataPlan(source=str(source)), nusax.NusaXOptions(train_languages=train,
                                                                            eval_languages=evaluate))


def test_reads_the_layout_joins_training_languages_and_scores_others(tmp_path):
    root = tmp_path / "datasets" / "sentiment"  # the repository's root works as data.source too
    write_language(root, "javanese")
    write_language(root, "sundanese", start=100)
    write_language(root, "madurese", sizes=(("train.csv", 3), ("valid.csv", 4), ("test.csv", 5)))
    splits = task(tmp_path, train="javanese,sundanese", evaluate="madurese,javanese").load()
    assert sorted(splits) == ["test_madurese", "train", "validation", "validation_javanese", "validation_madurese"]
    train = list(splits["train"])
    assert len(train) == 24 and [e["idx"] for e in train] == list(range(24))
    assert [e["language"] for e in train] == ["javanese"] * 12 + ["sundanese"] * 12
    assert train[12]["id"] == "100" and train[1]["text"] == "javanese cukup 1, kata train.csv"
    assert len(splits["validation"]) == 12 and len(splits["validation_madurese"]) == 4
    assert len(splits["test_madurese"]) == 5 and "test" not in splits  # the trained languages have no test.csv
    assert {e["label"] for e in splits["validation_javanese"]} == set(nusax.LABELS)


def test_an_unknown_label_or_missing_split_is_refused_with_its_file(tmp_path):
    folder = write_language(tmp_path, "javanese")
    lines = (folder / "valid.csv").read_text(encoding="utf-8").splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0] + ",mixed"
    (folder / "valid.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{folder / 'valid.csv'}:5: unknown label 'mixed'"):
        task(tmp_path, train="javanese").load()
    with pytest.raises(FileNotFoundError, match="no folder .*balinese"):
        task(tmp_path, train="balinese").load()
    (folder / "train.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"train.csv not found \(split 'train' is required\)"):
        task(tmp_path, train="javanese").load()


def test_unknown_languages_are_refused_by_the_options_and_the_config():
    assert nusax.NusaXOptions(train_languages="javanese,klingon").problems() == [
        "--config.task_options.train_languages='javanese,klingon': unknown language(s) ['klingon']; NusaX has "
        + ", ".join(nusax.LANGUAGES) + " (or 'all')"]
    assert "listed twice" in nusax.NusaXOptions(eval_languages="ngaju,ngaju").problems()[0]
    with pytest.raises(ValueError, match="unknown NusaX language 'jawa'"):
        nusax_config.get_config("lang=jawa")


def test_config_variants_give_in_language_cross_lingual_and_multi_source_runs():
    jv = nusax_config.get_config("lang=javanese")
    assert jv.task == "nusax" and jv.task_options.train_languages == "javanese" and jv.eval_splits == ("validation",
                                                                                                       "test")
    zero_shot = nusax_config.get_config("lang=indonesian,transfer")
    assert zero_shot.task_options.eval_languages == "all"
    assert {f"validation_{l}" for l in nusax.LANGUAGES} <= set(zero_shot.eval_splits)
    multi = nusax_config.get_config("target=madurese")
    assert multi.task_options.train_languages.split(",") == [l for l in nusax.LANGUAGES if l != "madurese"]
    assert multi.eval_splits == ("validation", "test", "validation_madurese", "test_madurese")


def test_download_from_a_local_server(tmp_path):
    """The download path for users (data.source empty), served from 127.0.0.1: train and valid
    are required, test.csv is taken where it is published."""
    served = tmp_path / "served"
    write_language(served, "javanese", sizes=(("train.csv", 6), ("valid.csv", 3), ("test.csv", 4)))
    write_language(served, "ngaju")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        target = nusax.download(str(tmp_path / "dl"), ["javanese", "ngaju"], base_url=base)
        assert sorted(p.name for p in (tmp_path / "dl" / "javanese").iterdir()) == ["test.csv", "train.csv",
                                                                                      "valid.csv"]
        assert sorted(p.name for p in (tmp_path / "dl" / "ngaju").iterdir()) == ["train.csv", "valid.csv"]
        assert {k: len(v) for k, v in nusax.load_language(target, "javanese").items()} == {
            "train": 6, "validation": 3, "test": 4}
        with pytest.raises(FileNotFoundError, match="could not download .*/balinese/train.csv"):
            nusax.download(str(tmp_path / "dl"), ["balinese"], base_url=base)
    finally:
        server.shutdown()


def test_the_report_is_the_papers_macro_f1_with_accuracy_and_each_labels_f1():
    from sklearn.metrics import accuracy_score, f1_score
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 3, 200)
    predicted = np.where(rng.random(200) < 0.6, gold, rng.integers(0, 3, 200))
    bound = nusax.NusaXSenti(DataPlan(), nusax.NusaXOptions())
    report = bound.report("validation", [{"label": nusax.LABELS[g]} for g in gold], {"prediction": predicted})
    assert report["f1"] == pytest.approx(f1_score(gold, predicted, average="macro"), abs=1e-12)
    assert report["accuracy"] == pytest.approx(accuracy_score(gold, predicted), abs=1e-12)
    per_label = f1_score(gold, predicted, average=None, labels=[0, 1, 2])
    assert [report["by_label"][l]["f1"] for l in nusax.LABELS] == pytest.approx(per_label, abs=1e-12)
    assert [report["by_label"][l]["count"] for l in nusax.LABELS] == np.bincount(gold).tolist()


def test_the_shared_copy_has_the_12_languages_aligned(shared_data):
    root = shared_data / "nusax" / "sentiment"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == list(nusax.LANGUAGES)
    directory = nusax.language_directory(str(shared_data / "nusax"))
    ids = None
    for language in nusax.LANGUAGES:
        splits = nusax.load_language(directory, language)
        assert {k: len(v) for k, v in splits.items()} == {"train": 500, "validation": 100}, language
        assert {e["label"] for e in splits["train"]} == set(nusax.LABELS)
        # The same sentences in every language: the same ids and labels, row by row.
        rows = [(e["id"], e["label"]) for e in splits["train"] + splits["validation"]]
        assert ids is None or rows == ids, language
        ids = rows


def _benchmark(workdir, vocab, *extra):
    return subprocess.run([sys.executable, "-m", "finetune.nusax_benchmark", "--cpu_test", f"--workdir={workdir}",
                           "--languages=indonesian,javanese", "--seeds=1,2", "--override=train.max_steps=30",
                           f"--override=model.tokenizer={vocab}", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_benchmark_writes_the_language_table_and_the_transfer_matrix_and_resumes(shared_data, tmp_path):
    from nli_jax.pretraining.vocab import train_vocabulary
    source = shared_data / "nusax" / "sentiment"
    text = tmp_path / "text.txt"  # a vocabulary of the training text: the tiny model then learns in 30 steps
    text.write_text("\n".join(row["text"] for language in ("indonesian", "javanese") for row in
                              csv.DictReader(open(source / language / "train.csv", encoding="utf-8"))) + "\n",
                    encoding="utf-8")
    vocab = train_vocabulary([str(text)], str(tmp_path / "vocab"), vocab_size=2000)
    proc = _benchmark(tmp_path / "bench", vocab, f"--source={source}", "--transfer")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = list(csv.reader(open(tmp_path / "bench" / "table.csv", encoding="utf-8")))
    assert table[0] == ["split", "indonesian", "javanese", "average"] and table[1][0] == "validation"
    run = json.loads((tmp_path / "bench" / "transfer" / "javanese" / "seed_2" / "results.json").read_text())
    assert run["train_languages"] == ["javanese"] and run["splits"]["validation"]["count"] == 100
    assert run["splits"]["validation_javanese"]["f1"] == run["splits"]["validation"]["f1"]  # the same split
    f1 = [run["splits"][f"validation_{l}"]["f1"] for l in nusax.LANGUAGES]
    matrix = list(csv.reader(open(tmp_path / "bench" / "transfer.csv", encoding="utf-8")))
    assert matrix[0] == ["split", "source \\ target", *nusax.LANGUAGES, "average"]
    assert [r[1] for r in matrix[1:]] == ["indonesian", "javanese"]
    other = json.loads((tmp_path / "bench" / "transfer" / "javanese" / "seed_1" / "results.json").read_text())
    assert any(a != other["splits"][f"validation_{l}"]["f1"] for a, l in zip(f1, nusax.LANGUAGES))  # seeds differ
    mean = [(a + other["splits"][f"validation_{l}"]["f1"]) / 2 for a, l in zip(f1, nusax.LANGUAGES)]
    assert [float(x) for x in matrix[2][2:14]] == pytest.approx([100 * m for m in mean], abs=0.006)
    assert (tmp_path / "bench" / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    again = _benchmark(tmp_path / "bench", vocab, f"--source={source}", "--transfer")  # finished runs are read back
    assert again.returncode == 0 and "total: 0 s" in again.stdout, again.stderr[-2000:]


def test_the_benchmark_multi_source_mode_trains_on_the_other_11_and_scores_the_target(shared_data, tmp_path):
    from finetune import nusax_benchmark
    text, failures = nusax_benchmark.run_benchmark("base", str(tmp_path / "bench"), str(shared_data / "nusax" / "sentiment"),
                                                   ["madurese"], ["train.max_steps=2"], cpu_test=True, seeds=[1],
                                                   multi_source=True)
    assert not failures
    run = json.loads((tmp_path / "bench" / "multi_source" / "madurese" / "seed_1" / "results.json").read_text())
    assert run["train_languages"] == [l for l in nusax.LANGUAGES if l != "madurese"] and run["eval_languages"] == ["madurese"]
    assert run["splits"]["validation"]["count"] == 1100 and run["splits"]["validation_madurese"]["count"] == 100
    table = list(csv.reader(open(tmp_path / "bench" / "multi_source.csv", encoding="utf-8")))
    assert table[0] == ["split", "madurese", "average"]
    assert float(table[1][1]) == pytest.approx(100 * run["splits"]["validation_madurese"]["f1"], abs=0.006)
    assert "multi-source" in text and not (tmp_path / "bench" / "table.md").exists()
    joined_and_own = {"splits": {"validation": {"f1": 0.1}, "validation_madurese": {"f1": 0.7}}}
    assert nusax_benchmark.as_target_scores({"madurese": {1: joined_and_own}})["madurese"][1]["splits"] == {
        "validation": {"f1": 0.7}}  # the target's own split, not the 11 languages' joined validation
