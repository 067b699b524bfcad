"""Artifact analysis (nli_jax.analysis): the measures on hand-computed examples, the CLI on real
IndoNLI train (what a researcher checks first), hypothesis-only predictions joined to examples,
and bad input failing with its location. Synthetic sentences only; real data via `shared_data`."""
import json
import math
import os
import random
import re
import subprocess
import sys

import pytest

from nli_jax.analysis import artifacts as analysis
from nli_jax.data.readers import DataError

NEGATION_WORDS = {"tidak", "bukan", "belum", "tak"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "nli_jax.analysis", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})


# --- the measures, worked out by hand ---------------------------------------------------------

def test_tokenizers():
    assert analysis.tokenize_words("Anak-anak TIDAK membeli 2 buku, kemarin!") == [
        "anak-anak", "tidak", "membeli", "2", "buku", "kemarin"]
    assert analysis.tokenize_words("¿Nunca comió él?") == ["nunca", "comió", "él"]
    assert analysis.tokenize_chinese("他没有去北京, 2020年 OK") == [
        "他", "没", "有", "去", "北", "京", "2020", "年", "ok"]
    assert analysis.tokenization_for("ocnli") == "chinese_characters"
    assert analysis.tokenization_for("indonli") == analysis.tokenization_for("inferes") == "words"


def test_overlap_measures_by_hand():
    tok = analysis.tokenize_words
    premise, hypothesis = tok("Budi membeli buku di toko"), tok("Budi tidak membeli buku")
    # types: P {budi, membeli, buku, di, toko}, H {budi, tidak, membeli, buku}: 3 shared of 6
    assert analysis.jaccard(premise, hypothesis) == 0.5
    # LCS "budi membeli buku" = 3 of the hypothesis' 4 tokens; "tidak" is the one new token
    assert analysis.lcs_ratio(premise, hypothesis) == 0.75
    assert analysis.new_token_rate(premise, hypothesis) == 0.25

    # Same words, two clauses swapped: Jaccard 1 and no new token, but only 3 of 6 in order.
    premise, hypothesis = tok("kucing itu tidur di atas meja"), tok("di atas meja kucing itu tidur")
    assert analysis.jaccard(premise, hypothesis) == 1.0
    assert analysis.lcs_ratio(premise, hypothesis) == 0.5
    assert analysis.new_token_rate(premise, hypothesis) == 0.0

    # A repeated hypothesis token: rates count occurrences, Jaccard counts types.
    premise, hypothesis = tok("anak-anak bermain di taman"), tok("anak-anak bermain bermain")
    assert analysis.jaccard(premise, hypothesis) == 0.5
    assert analysis.lcs_ratio(premise, hypothesis) == pytest.approx(2 / 3)
    assert analysis.new_token_rate(premise, tok("anak-anak berlari berlari")) == pytest.approx(2 / 3)
    assert analysis.lcs_ratio(premise, []) == analysis.new_token_rate(premise, []) == 0.0


def test_lcs_length_matches_the_dynamic_programme():
    def table_lcs(a, b):
        t = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i, x in enumerate(a):
            for j, y in enumerate(b):
                t[i + 1][j + 1] = t[i][j] + 1 if x == y else max(t[i][j + 1], t[i + 1][j])
        return t[-1][-1]

    rng = random.Random(0)
    for _ in range(500):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 12))]
        b = [rng.choice("abcde") for _ in range(rng.randint(0, 70))]  # longer than a machine word
        assert analysis.lcs_length(a, b) == table_lcs(a, b) == analysis.lcs_length(b, a)


def test_pmi_by_hand():
    # Labels 0/1/2; hypotheses [a b], [a], [c]. Counts (e, n, c): a (1,1,0), b (1,0,0), c (0,0,1).
    hypotheses, labels = [["a", "b"], ["a"], ["c"]], [0, 1, 2]
    # k = 0: p(b, e) = 1/4, p(b) = 1/4, p(e) = 2/4 -> PMI = log 2; p(a, e) = 1/4, p(a) = 2/4 -> log 1.
    top = analysis.label_word_pmi(hypotheses, labels, smoothing=0, min_count=1, top_k=5)
    assert [(e["word"], e["pmi"]) for e in top[0]] == [("b", math.log(2)), ("a", 0.0)]
    assert top[2] == [{"word": "c", "pmi": math.log(4), "count": 1, "total_count": 1, "hypothesis_share": 1.0}]
    # k = 1 on every (word, label) cell: a (2,2,1), b (2,1,1), c (1,1,2); N = 13;
    # label totals e 5, n 4, c 4; word totals a 5, b 4, c 4. PMI(w, l) = log n(w,l) N / (n(w) n(l)).
    top = analysis.label_word_pmi(hypotheses, labels, smoothing=1, min_count=1, top_k=3)
    assert [e["word"] for e in top[0]] == ["b", "a", "c"]
    assert [e["pmi"] for e in top[0]] == pytest.approx([math.log(26 / 20), math.log(26 / 25), math.log(13 / 20)])
    assert top[1][0]["word"] == "a" and top[1][0]["pmi"] == pytest.approx(math.log(26 / 20))
    assert top[2][0]["word"] == "c" and top[2][0]["pmi"] == pytest.approx(math.log(26 / 16))
    # min_count drops the words seen once (b, c) from the ranking, not from the counts.
    top = analysis.label_word_pmi(hypotheses, labels, smoothing=1, min_count=2, top_k=3)
    assert [[e["word"] for e in entries] for entries in top] == [["a"], ["a"], ["a"]]
    assert top[2][0]["pmi"] == pytest.approx(math.log(13 / 20))


def test_share_of_hypotheses_and_per_label_summaries():
    hypotheses = [["tidak", "tidak", "ada"], ["ada"], ["tidak"], ["ada", "orang"]]
    labels = [2, 2, 2, 0]
    top = analysis.label_word_pmi(hypotheses, labels, smoothing=0, min_count=1, top_k=1)
    # "tidak" occurs 3 times but in 2 of the 3 contradiction hypotheses
    assert top[2][0]["word"] == "tidak" and top[2][0]["count"] == 3 and top[2][0]["hypothesis_share"] == 2 / 3
    lengths = analysis.length_by_label([3, 1, 1, 2], labels)
    assert lengths["contradiction"]["mean"] == pytest.approx(5 / 3) and lengths["contradiction"]["median"] == 1
    assert lengths["entailment"]["histogram"] == {"2": 1} and lengths["neutral"]["mean"] is None
    assert lengths["overall"]["binned"]["1-5"] == 4
    pairs = [(["a", "b"], ["a", "b"]), (["a", "b"], ["c"]), (["a"], ["a", "x"]), (["a"], [])]
    overlap = analysis.overlap_by_label(pairs, [0, 0, 2, 2])
    assert overlap["entailment"]["jaccard"] == {"mean": 0.5, "median": 0.5}
    assert overlap["contradiction"]["n"] == 1  # the empty hypothesis is not measured
    assert overlap["overall"]["new_token_rate"]["mean"] == pytest.approx((0 + 1 + 0.5) / 3)


# --- real IndoNLI train through the command line ----------------------------------------------

def _markdown_sections(text):
    """{heading: [table rows as lists of cells]} for every '#' heading of analysis.md: the
    body rows of the first table under the heading (header and separator left out)."""
    sections, heading, lines = {}, None, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            sections[heading], table_done = [], False
        elif line.startswith("|") and heading is not None and not table_done:
            if line.startswith("|---") or (i + 1 < len(lines) and lines[i + 1].startswith("|---")):
                continue
            sections[heading].append([c.strip() for c in line.strip("|").split("|")])
            table_done = i + 1 >= len(lines) or not lines[i + 1].startswith("|")
    return sections


@pytest.fixture(scope="module")
def indonli_train_analysis(shared_data, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("indonli_analysis")
    result = run_cli("--task=indonli", f"--source={shared_data / 'indonli'}", f"--workdir={workdir}", "--top_k=10")
    assert result.returncode == 0, result.stderr
    return workdir, json.loads((workdir / "analysis.json").read_text(encoding="utf-8"))


def test_indonli_train_label_counts_equal_the_file(shared_data, indonli_train_analysis):
    _, report = indonli_train_analysis
    names = {"e": "entailment", "n": "neutral", "c": "contradiction"}
    with open(shared_data / "indonli" / "train.jsonl", encoding="utf-8") as f:
        labels = [names[json.loads(line)["label"]] for line in f if line.strip()]
    assert report["split"] == "train" and report["counts"]["overall"]["count"] == len(labels)
    for name in names.values():
        assert report["counts"][name]["count"] == labels.count(name)


def test_indonli_train_shows_the_known_artifacts(indonli_train_analysis):
    _, report = indonli_train_analysis
    contradiction_words = [e["word"] for e in report["pmi"]["contradiction"]]
    assert NEGATION_WORDS & set(contradiction_words[:3]), contradiction_words
    pmi = [e["pmi"] for e in report["pmi"]["contradiction"]]
    assert pmi == sorted(pmi, reverse=True) and pmi[-1] > 0
    assert not NEGATION_WORDS & {e["word"] for e in report["pmi"]["entailment"]}
    jaccard = {label: report["overlap"][label]["jaccard"]["mean"] for label in report["labels"]}
    assert max(jaccard, key=jaccard.get) == "entailment", jaccard
    new_tokens = {label: report["overlap"][label]["new_token_rate"]["mean"] for label in report["labels"]}
    assert min(new_tokens, key=new_tokens.get) == "entailment", new_tokens


def test_indonli_train_plots_are_pngs_linked_from_the_markdown(indonli_train_analysis):
    workdir, report = indonli_train_analysis
    markdown = (workdir / "analysis.md").read_text(encoding="utf-8")
    assert sorted(report["plots"].values()) == ["hypothesis_length.png", "overlap.png", "pmi.png"]
    for name in report["plots"].values():
        data = (workdir / name).read_bytes()
        assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 300 and height > 200 and len(data) > 10_000  # a drawn figure, not an empty canvas
        assert f"]({name})" in markdown


def test_indonli_train_markdown_agrees_with_json(indonli_train_analysis):
    workdir, report = indonli_train_analysis
    sections = _markdown_sections((workdir / "analysis.md").read_text(encoding="utf-8"))
    groups = (*report["labels"], "overall")
    assert {row[0]: int(row[1]) for row in sections["Label counts"]} == {
        g: report["counts"][g]["count"] for g in groups}
    for label in report["labels"]:
        rows = sections[label]
        assert [row[1] for row in rows] == [e["word"] for e in report["pmi"][label]]
        assert [float(row[2]) for row in rows] == [round(e["pmi"], 4) for e in report["pmi"][label]]
    overlap = {row[0]: row for row in sections["Premise–hypothesis overlap"]}
    lengths = {row[0]: row for row in sections["Hypothesis length (tokens)"]}
    for g in groups:
        assert int(overlap[g][1]) == report["overlap"][g]["n"]
        assert [float(x) for x in overlap[g][2::2]] == [
            round(report["overlap"][g][m]["mean"], 4) for m in analysis.OVERLAP_MEASURES]
        assert float(lengths[g][2]) == round(report["hypothesis_length"][g]["mean"], 2)


@pytest.mark.parametrize("task,folder", [("ocnli", "ocnli"), ("inferes", "inferes")])
def test_other_corpora_analyse(shared_data, tmp_path, task, folder):
    report = analysis.analyse(task, str(shared_data / folder), str(tmp_path), plots=False)
    assert report["counts"]["overall"]["count"] > 5000
    if task == "ocnli":
        assert report["split"] == "train_10k"  # "train" means OCNLI's largest training file present
        assert {"不", "没"} & {e["word"] for e in report["pmi"]["contradiction"][:5]}
    assert (tmp_path / "analysis.md").is_file()


# --- hypothesis-only predictions (synthetic IndoNLI-shaped data) ------------------------------

SYNTHETIC = [  # (pair_id, premise, hypothesis, label, sentence_size), our own sentences
    ("1", "Andi membeli dua buku di pasar kemarin.", "Andi membeli buku.", "e", "single"),
    ("2", "Andi membeli dua buku di pasar kemarin.", "Andi tidak pergi ke pasar.", "c", "single"),
    ("3", "Andi membeli dua buku di pasar kemarin.", "Buku itu mahal.", "n", "single"),
    ("4", "Hujan turun sejak pagi. Jalanan menjadi licin.", "Jalanan licin.", "e", "double"),
    ("5", "Hujan turun sejak pagi. Jalanan menjadi licin.", "Hari ini cerah.", "c", "double"),
    ("6", "Hujan turun sejak pagi. Jalanan menjadi licin.", "Banyak orang terjatuh.", "n", "double"),
]


def _write_indonli(folder, val_rows=SYNTHETIC, train_rows=SYNTHETIC):
    folder.mkdir(exist_ok=True)
    for name, rows in (("train.jsonl", train_rows), ("val.jsonl", val_rows)):
        with open(folder / name, "w", encoding="utf-8") as f:
            for pair_id, premise, hypothesis, label, size in rows:
                f.write(json.dumps({"pair_id": pair_id, "premise": premise, "hypothesis": hypothesis, "label": label,
                                    "annotator_type": "lay", "sentence_size": size}) + "\n")
    return folder


def _predictions(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def _right_on_entailment_only(rows, split="validation"):
    names = {"e": "entailment", "n": "neutral", "c": "contradiction"}
    wrong = {"e": "neutral", "n": "contradiction", "c": "entailment"}
    return [{"split": split, "idx": i, "id": pair_id, "label": names[label],
             "prediction": names[label] if label == "e" else wrong[label], "probabilities": [0.4, 0.3, 0.3]}
            for i, (pair_id, _, _, label, _) in enumerate(rows)]


def test_hypothesis_only_accuracy_by_label_category_and_tag(tmp_path):
    # val repeats an id, as the real val.jsonl does once: idx tells the two rows apart.
    val = [*SYNTHETIC, ("1", "Sebuah pohon tumbang di jalan.", "Jalan tertutup pohon.", "n", "single")]
    source = _write_indonli(tmp_path / "indonli", val_rows=val)
    diagnostic = [{"pair_id": 901, "premise": "Toko itu buka setiap hari.", "hypothesis": "Toko itu tidak pernah buka.",
                   "label": "c", "inference_phenomena": ["NEG"]},
                  {"pair_id": 902, "premise": "Ibu memasak nasi.", "hypothesis": "Nasi dimasak oleh ibu.",
                   "label": "e", "inference_phenomena": ["STRUCT", "MORPH"]}]
    (source / "diagnostic.jsonl").write_text(json.dumps(diagnostic), encoding="utf-8")
    rows = _right_on_entailment_only(val) + [
        {"split": "diagnostic", "idx": 0, "id": "901", "label": "contradiction", "prediction": "neutral"},
        {"split": "diagnostic", "idx": 1, "id": "902", "label": "entailment", "prediction": "entailment"}]
    (tmp_path / "run").mkdir()
    predictions = _predictions(tmp_path / "run" / "predictions.jsonl", rows)
    (tmp_path / "run" / "results.json").write_text(json.dumps({"task": "indonli", "hypothesis_only": True}))

    report = analysis.analyse("indonli", str(source), str(tmp_path / "out"), predictions=str(predictions), plots=False)
    validation = report["hypothesis_only"]["splits"]["validation"]
    assert validation["count"] == 7 and validation["accuracy"] == pytest.approx(2 / 7)
    assert {k: v["accuracy"] for k, v in validation["by_label"].items()} == {
        "entailment": 1.0, "neutral": 0.0, "contradiction": 0.0}
    assert validation["by_label"]["neutral"]["count"] == 3  # the repeated id joined to the neutral row
    assert validation["by_sentence_size"] == {"double": {"accuracy": 1 / 3, "count": 3},
                                              "single": {"accuracy": 1 / 4, "count": 4}}
    diagnostic_report = report["hypothesis_only"]["splits"]["diagnostic"]
    assert diagnostic_report["by_tag"] == {"MORPH": {"accuracy": 1.0, "count": 1}, "NEG": {"accuracy": 0.0, "count": 1},
                                           "STRUCT": {"accuracy": 1.0, "count": 1}}
    assert report["hypothesis_only"]["run"] == {"task": "indonli", "hypothesis_only": True}
    sections = _markdown_sections((tmp_path / "out" / "analysis.md").read_text(encoding="utf-8"))
    heading = next(h for h in sections if h.startswith("validation: accuracy"))
    assert "0.2857 (7 examples)" in heading
    assert ["entailment", "1.0000", "2"] in sections[heading]


def test_inferes_splits_carved_from_train_join_by_id(tmp_path):
    """InferESTask's validation (and topic_ood) are rows of the train file renumbered: joined by id."""
    source = tmp_path / "inferes"
    source.mkdir()
    rows = [("11", "El gato duerme en la casa.", "Un animal duerme.", "ent", "1", "a", "Generate"),
            ("12", "El gato duerme en la casa.", "El gato no duerme.", "cnt", "1", "a", "Rewrite"),
            ("13", "Llueve en la ciudad.", "La ciudad es grande.", "neutral", "2", "b", "Crowd"),
            ("14", "Llueve en la ciudad.", "Nunca llueve.", "cnt", "2", "b", "Generate")]
    header = "ID,Premise,Hypothesis,Label,Topic,Anno,Anno_Type\n"
    (source / "inferes_train.csv").write_text(header + "".join(",".join(r) + "\n" for r in rows), encoding="utf-8")
    predictions = _predictions(tmp_path / "predictions.jsonl", [
        {"split": "validation", "idx": 0, "id": "13", "label": "neutral", "prediction": "neutral"},
        {"split": "validation", "idx": 1, "id": "14", "label": "contradiction", "prediction": "entailment"},
        {"split": "train", "idx": 0, "id": "11", "label": "entailment", "prediction": "entailment"}])
    report = analysis.analyse("inferes", str(source), str(tmp_path / "out"), predictions=str(predictions), plots=False)
    validation = report["hypothesis_only"]["splits"]["validation"]
    assert validation["accuracy"] == 0.5
    assert validation["by_anno_type"] == {"Crowd": {"accuracy": 1.0, "count": 1},
                                          "Generate": {"accuracy": 0.0, "count": 1}}
    assert report["hypothesis_only"]["splits"]["train"]["by_topic"] == {"1": {"accuracy": 1.0, "count": 1}}


@pytest.mark.parametrize("bad_row,message", [
    ({"id": "99"}, r"no example with id '99'"),
    ({"label": "neutral"}, r"gold label 'neutral' for id '1' but the data file says 'entailment'"),
    ({"split": "test_lay"}, r"split 'test_lay' but test_lay.jsonl is not in"),
    ({"prediction": "maybe"}, r"prediction 'maybe' is not one of"),
    ({"label": None}, r"no gold label"),
    ({}, r"a second prediction for id '1' in split 'validation' \(first on line 1\)"),
    ({"split": "topic_ood", "id": "77"},
     r"no example with id '77' in split 'topic_ood' .*searched \['train', 'validation'\]"),
])
def test_a_prediction_that_does_not_match_names_file_and_line(tmp_path, bad_row, message):
    source = _write_indonli(tmp_path / "indonli")
    rows = _right_on_entailment_only(SYNTHETIC)
    rows[3] = {**rows[0], **bad_row}  # line 4
    predictions = _predictions(tmp_path / "predictions.jsonl", rows)
    with pytest.raises((DataError, FileNotFoundError), match=re.escape(f"{predictions}:4: ") + ".*" + message):
        analysis.analyse("indonli", str(source), str(tmp_path / "out"), predictions=str(predictions), plots=False)
    assert not (tmp_path / "out").exists()  # nothing half-written


# --- bad input --------------------------------------------------------------------------------

def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    source = _write_indonli(tmp_path / "indonli")
    lines = (source / "train.jsonl").read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2][:-1]  # line 3 loses its closing brace
    (source / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli("--task=indonli", f"--source={source}", f"--workdir={tmp_path / 'out'}")
    assert result.returncode != 0
    assert f"{source / 'train.jsonl'}:3: malformed JSON" in result.stderr
    # a row with an unknown label, through the corpus' own parse
    lines[2] = json.dumps({"pair_id": "3", "premise": "Ada kucing.", "hypothesis": "Ada anjing.", "label": "x"})
    (source / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{source / 'train.jsonl'}:3: unknown label 'x'")):
        analysis.analyse("indonli", str(source), str(tmp_path / "out"), plots=False)


def test_unknown_task_and_split_list_the_known_ones(tmp_path):
    source = _write_indonli(tmp_path / "indonli")
    result = run_cli("--task=indonlii", f"--source={source}", f"--workdir={tmp_path / 'out'}")
    assert result.returncode != 0
    assert "unknown NLI task 'indonlii'" in result.stderr
    for name in ("indonli", "ocnli", "inferes", "indonli_translate_train"):
        assert f"'{name}'" in result.stderr
    with pytest.raises(ValueError, match=r"unknown NLI task 'smsa'"):  # registered, but not NLI
        analysis.analyse("smsa", str(source), str(tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match=r"split 'test_lay' not found .*'diagnostic'"):
        analysis.analyse("indonli", str(source), str(tmp_path / "out"), split="test_lay")
