"""The contamination check (nli_jax/data/overlap.py, the run hook nli_jax/hooks/overlap.py, the
command `python -m nli_jax.analysis overlap`): what counts as overlap, the counts on the shared
copies (IndoNLI train vs validation, SmSA train vs NusaX-Indonesian), a run refused before
compute in one line naming both files, and with data.allow_overlap the clean score beside the
full one."""
import csv
import json
import subprocess
import sys
import time

import pytest

from conftest import REPO
from nli_jax.data import overlap
from test_nusax import write_language

LONG = "the quick brown fox jumps over the lazy dog near the river bank"


def test_exact_matches_and_shared_8_word_sequences_after_normalisation():
    index = overlap.TrainingIndex([{"text": LONG}, {"text": "Makanan enak!"}])
    assert index.match({"text": "MAKANAN   enak"}) == "exact"  # case, spacing and punctuation do not count
    assert index.match({"text": "Ｍakanan enak."}) == "exact"  # NFKC: a full-width letter is the letter
    assert index.match({"text": "yesterday the quick brown fox jumps over the lazy dog, twice"}) == "ngram"
    assert index.match({"text": "the quick brown fox jumps over the lazy"}) == "ngram"  # 8 words
    assert index.match({"text": "the quick brown fox jumps over the cat"}) is None  # 7 shared words
    assert index.match({"text": "makanan enak sekali"}) is None


def test_a_pair_overlaps_only_when_each_of_its_fields_is_found():
    """IndoNLI's validation pairs reuse training premises with new hypotheses: not overlap."""
    index = overlap.TrainingIndex([{"premise": LONG, "hypothesis": "A fox jumps."}])
    assert index.match({"premise": LONG, "hypothesis": "A dog sleeps."}) is None
    assert index.match({"premise": LONG + " today", "hypothesis": "a fox JUMPS"}) == "ngram"
    assert index.match({"premise": LONG, "hypothesis": "A fox jumps"}) == "exact"
    result = overlap.compare(index, [{"premise": LONG, "hypothesis": "A dog sleeps."},
                                     {"premise": LONG, "hypothesis": "a fox jumps"}])
    assert (result.count, result.exact, result.ngram, result.positions) == (2, 1, 0, (1,))
    assert result.describe() == "1 of 2 examples (50.0%): 1 exact, 0 more sharing a 8-word sequence"


def test_indonli_train_against_validation_on_the_shared_copy(shared_data):
    from nli_jax.data import nli
    from nli_jax.tasks.indonli import INDONLI
    examples = nli.load_examples(INDONLI, str(shared_data / "indonli"))
    start = time.perf_counter()
    result = overlap.compare(overlap.TrainingIndex(examples["train"]), examples["validation"])
    seconds = time.perf_counter() - start
    assert (result.count, result.exact, result.ngram) == (2197, 0, 58)
    assert result.share < 0.15 and seconds < 5, seconds  # under the refusal threshold, and cheap


def test_smsa_train_against_nusax_indonesian_on_the_shared_copy(shared_data):
    from nli_jax.data import indonlu
    from nli_jax.tasks import nusax
    smsa = indonlu.load_examples(indonlu.TASKS["smsa"], str(shared_data / "indonlu" / "smsa_doc-sentiment-prosa"))
    index = overlap.TrainingIndex(smsa["train"])
    indonesian = nusax.load_language(nusax.language_directory(str(shared_data / "nusax")), "indonesian")
    got = {split: overlap.compare(index, examples) for split, examples in indonesian.items()}
    assert (got["train"].exact, got["train"].ngram) == (145, 261)  # of 500
    assert (got["validation"].exact, got["validation"].ngram) == (25, 49)  # of 100


def _run(tmp_path, data, *extra):
    return subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/nusax.py:lang=javanese,cpu_test",
                           f"--workdir={tmp_path / 'run'}", f"--config.data.source={data}",
                           "--config.train.max_steps=6", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.fixture
def leaky_nusax(tmp_path):
    """Synthetic NusaX files whose validation split repeats 3 of its 6 sentences from training."""
    folder = write_language(tmp_path / "data", "javanese", sizes=(("train.csv", 30), ("valid.csv", 6)), start=0)
    train = list(csv.reader(open(folder / "train.csv", encoding="utf-8")))
    valid = list(csv.reader(open(folder / "valid.csv", encoding="utf-8")))
    valid[1][1], valid[3][1], valid[5][1] = train[10][1].upper(), train[20][1] + "!", train[29][1]
    with open(folder / "valid.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(valid)
    return tmp_path / "data", folder


def test_a_run_whose_validation_split_overlaps_training_is_refused_before_compute(leaky_nusax, tmp_path):
    data, folder = leaky_nusax
    proc = _run(tmp_path, data)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert (f"{folder / 'valid.csv'} overlaps the training examples ({folder / 'train.csv'}): 3 of 6 examples "
            "(50.0%): 3 exact, 0 more sharing a 8-word sequence, above the 15% a run accepts") in last, proc.stderr[-2000:]
    assert "--config.data.allow_overlap=True" in last
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_with_allow_overlap_the_clean_score_is_reported_beside_the_full_one(leaky_nusax, tmp_path):
    from nli_jax.metrics import precision_recall_f1
    data, _ = leaky_nusax
    proc = _run(tmp_path, data, "--config.data.allow_overlap=True")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["overlap"]["validation"] == {"count": 6, "exact": 3, "shared_8gram": 0, "overlapping": 3,
                                                "share": 0.5, "train_split": "train"}
    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    clean = [r for r in records if r["split"] == "validation" and r["idx"] in (0, 2, 4)]
    expected = precision_recall_f1([r["label"] for r in clean], [r["prediction"] for r in clean])
    report = results["splits"]["validation"]
    assert report["count"] == 6 and report["clean"]["count"] == 3
    assert report["clean"]["f1"] == pytest.approx(expected["f1"], abs=1e-12)
    assert "final validation without its 3 overlapping examples" in (tmp_path / "run" / "train.log").read_text()


def test_the_command_compares_files_and_writes_the_counts(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text(f"{LONG}\tpositive\nMakanan enak!\tpositive\n", encoding="utf-8")
    folder = tmp_path / "other"
    folder.mkdir()
    with open(folder / "valid.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["id", "text", "label"], [1, "makanan ENAK", "positive"],
                                 [2, "so " + LONG, "neutral"], [3, "lain sekali", "negative"]])
    proc = subprocess.run([sys.executable, "-m", "nli_jax.analysis", "overlap", str(train), str(folder / "valid.csv"),
                           f"--output={tmp_path / 'counts.json'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{folder / 'valid.csv'} vs {train}: 2 of 3 examples (66.7%): 1 exact, 1 more" in proc.stdout
    counts = json.loads((tmp_path / "counts.json").read_text())[str(folder / "valid.csv")]
    assert (counts["exact"], counts["shared_8gram"], counts["train_examples"]) == (1, 1, 2)
    bad = subprocess.run([sys.executable, "-m", "nli_jax.analysis", "overlap", str(train), "validation"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "validation: no such file (a split name needs --task)" in bad.stderr
