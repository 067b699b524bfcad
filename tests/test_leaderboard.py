"""Leaderboard submission files (nli_jax.leaderboard) from synthetic predictions.jsonl files.

All predictions here are made up (tokens w0, w1, ...; random labels); nothing is taken from a
dataset. The expected formats are those documented in nli_jax/leaderboard.py's docstring.
"""
import ast
import csv
import io
import json
import os
import random
import re
import subprocess
import sys
import zipfile

import pytest

from nli_jax import leaderboard as lb
from nli_jax.data.nli import NLI_LABELS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prediction(fmt, rng, words):
    if fmt.kind == "label":
        return rng.choice(fmt.labels)
    if fmt.kind == "aspects":  # keys in random order: the columns must follow the header, not the dict
        return {a: rng.choice(fmt.labels) for a in rng.sample(fmt.aspects, len(fmt.aspects))}
    return [rng.choice(fmt.labels) for _ in range(words)]


def _records(task, n, rng, split="test", lengths=None):
    """predictions.jsonl rows as the task classes write them (common.py / tasks/indonlu.py), with
    gold labels absent or None as in a predict run on a masked test set."""
    fmt = lb.INDONLU_FORMATS[task]
    rows = []
    for i in range(n):
        words = lengths[i] if lengths else rng.randint(1, 6)
        row = {"split": split, "idx": i, "prediction": _prediction(fmt, rng, words)}
        if fmt.kind == "label":
            row.update(id=i, label=None, probabilities=[round(1 / len(fmt.labels), 6)] * len(fmt.labels))
        elif fmt.kind == "aspects":
            row["labels"] = None
        else:
            row.update(tokens=[f"w{k}" for k in range(words)], tags=None)
        rows.append(row)
    return rows


def _write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _benchmark_workdir(root, n=7, seed=0, tasks=lb.INDONLU_TASKS):
    """<root>/<task>/predictions.jsonl for each task: validation rows too, test rows out of order."""
    rng = random.Random(seed)
    rows_by_task = {}
    for task in tasks:
        test = _records(task, n, rng)
        rows = _records(task, 3, rng, split="validation") + test
        rng.shuffle(rows)
        _write_jsonl(os.path.join(root, task, "predictions.jsonl"), rows)
        rows_by_task[task] = test
    return rows_by_task


def _run_cli(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "nli_jax.leaderboard", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


# --- IndoNLU --------------------------------------------------------------------------------------

def test_indonlu_cli_writes_all_twelve_tasks(tmp_path):
    runs, out = str(tmp_path / "runs"), str(tmp_path / "submission")
    expected = _benchmark_workdir(runs, n=7)
    # 7 rows per task, not the official test sets' sizes: refused unless said so.
    refused = _run_cli("--format=indonlu", f"--runs={runs}", f"--output={out}")
    assert refused.returncode == 1 and "7 test rows" in refused.stderr and "442" in refused.stderr, refused.stderr
    assert not os.path.exists(out)
    result = _run_cli("--format=indonlu", f"--runs={runs}", f"--output={out}",
                      "--expected_rows=" + ",".join(f"{t}=7" for t in lb.INDONLU_TASKS))
    assert result.returncode == 0, result.stderr
    printed = result.stdout.split()
    assert printed == [p for t in lb.INDONLU_TASKS for p in (os.path.join(out, t, "pred.txt"),
                                                              os.path.join(out, f"{t}.zip"))]
    assert sorted(os.listdir(out)) == sorted(list(lb.INDONLU_TASKS) + [f"{t}.zip" for t in lb.INDONLU_TASKS])
    for task in lb.INDONLU_TASKS:
        fmt = lb.INDONLU_FORMATS[task]
        data = open(os.path.join(out, task, "pred.txt"), "rb").read()
        with zipfile.ZipFile(os.path.join(out, f"{task}.zip")) as z:
            assert z.namelist() == ["pred.txt"]  # pred.txt at the zip root, nothing else
            assert z.read("pred.txt") == data
        table = list(csv.reader(io.StringIO(data.decode("utf-8"))))
        assert table[0] == list(fmt.header)
        assert len(table) == 1 + 7  # header + the 7 test rows; validation rows are not written
        for i, (cells, record) in enumerate(zip(table[1:], expected[task])):
            assert cells[0] == str(i)  # index = idx, in test-file order
            if fmt.kind == "label":
                assert cells[1:] == [record["prediction"]]
            elif fmt.kind == "aspects":
                assert dict(zip(fmt.header[1:], cells[1:])) == record["prediction"]
            else:
                assert len(cells) == 2 and ast.literal_eval(cells[1]) == record["prediction"]


# The submission examples (IndoNLP/indonlu submission_examples/, commit c199ba24) have 10 rows each
# (index 0..9), a header line, ',' as delimiter, '\n' line ends. Label tasks: `index,label` then
# `<index>,<label name>`. CASA / HoASA: `index,<aspect>,...` (the header below) then one label name
# per aspect, unquoted. Tagging tasks: `index,label` then `<index>,"['<tag>', '<tag>', ...]"`, the
# list in Python repr (single quotes, ', ' between tags) and the cell double-quoted.
EXAMPLE_HEADERS = {
    "absa-prosa_test.csv": "index,fuel,machine,others,part,price,service",
    "absa-airy_test.csv": "index,ac,air_panas,bau,general,kebersihan,linen,service,sunrise_meal,tv,wifi",
}
LABEL_ROW = re.compile(r"^\d+,[A-Za-z_]+$")
TAG_ROW = re.compile(r"^\d+,\"\[(?:'[^',\s]+', )+'[^',\s]+'\]\"$")


def test_indonlu_files_have_the_structure_of_the_submission_examples(tmp_path):
    rng = random.Random(1)
    runs = {}
    for task in lb.INDONLU_TASKS:
        path = str(tmp_path / "runs" / task / "predictions.jsonl")
        _write_jsonl(path, _records(task, 10, rng, lengths=[2 + i % 5 for i in range(10)]))
        runs[task] = path
    out = str(tmp_path / "out")
    lb.indonlu_submission(runs, out)
    for task in lb.INDONLU_TASKS:
        fmt = lb.INDONLU_FORMATS[task]
        data = open(os.path.join(out, task, "pred.txt"), "rb").read()
        assert b"\r" not in data and data.endswith(b"\n")
        lines = data.decode("utf-8").split("\n")[:-1]
        assert len(lines) == 11
        assert lines[0] == EXAMPLE_HEADERS.get(fmt.example, "index,label"), fmt.example
        assert [line.split(",", 1)[0] for line in lines[1:]] == [str(i) for i in range(10)]
        for line in lines[1:]:
            if fmt.kind == "tags":
                assert TAG_ROW.match(line), (fmt.example, line)
            elif fmt.kind == "aspects":
                assert re.match(r"^\d+(,[a-z_]+){%d}$" % len(fmt.aspects), line), (fmt.example, line)
            else:
                assert LABEL_ROW.match(line), (fmt.example, line)


def test_indonlu_cells_are_written_byte_for_byte_like_the_examples(tmp_path):
    rows = [{"split": "test", "idx": 0, "prediction": ["B-PERSON", "I-PERSON", "O"], "tokens": ["a", "b", "c"]},
            {"split": "test", "idx": 1, "prediction": ["O"], "tokens": ["a"]}]
    header, table = lb.indonlu_table("nergrit", _write(tmp_path / "p.jsonl", rows))
    # A one-tag list has no comma, so (as with pandas' to_csv) its cell is not quoted.
    assert lb._csv_bytes(header, table) == b"index,label\n0,\"['B-PERSON', 'I-PERSON', 'O']\"\n1,['O']\n"
    rows = [{"split": "test", "idx": 0, "prediction": {a: "neut" for a in lb.INDONLU_FORMATS["hoasa"].aspects}}]
    rows[0]["prediction"]["wifi"] = "neg_pos"
    header, table = lb.indonlu_table("hoasa", _write(tmp_path / "h.jsonl", rows))
    assert lb._csv_bytes(header, table) == (EXAMPLE_HEADERS["absa-airy_test.csv"] + "\n0" + ",neut" * 9
                                            + ",neg_pos\n").encode()


def _write(path, rows):
    _write_jsonl(str(path), rows)
    return str(path)


def test_tag_sets_cover_the_real_training_files(shared_data):
    """The documented tag sets (utils/data_utils.py) contain every tag of the train/valid files."""
    from nli_jax.data import indonlu as data
    for task in ("posp", "bapos", "terma", "keps", "nergrit", "nerp"):
        folder = shared_data / "indonlu" / data.TASKS[task].folder
        tags = set()
        for name in ("train_preprocess.txt", "valid_preprocess.txt"):
            for line in (folder / name).read_text(encoding="utf-8").splitlines():
                if "\t" in line:
                    tags.add(line.rsplit("\t", 1)[1].strip())
        documented = set(lb.INDONLU_FORMATS[task].labels)
        assert tags and tags <= documented, (task, tags - documented)


def test_missing_task_is_an_error_naming_its_path(tmp_path, capsys):
    runs = str(tmp_path / "runs")
    _benchmark_workdir(runs, n=3, tasks=[t for t in lb.INDONLU_TASKS if t not in ("nerp", "keps")])
    with pytest.raises(lb.SubmissionError) as e:
        lb.indonlu_submission(runs, str(tmp_path / "out"))
    message = str(e.value)
    assert "2 of 12" in message
    assert os.path.join(runs, "nerp", "predictions.jsonl") in message
    assert os.path.join(runs, "keps", "predictions.jsonl") in message
    assert not os.path.exists(tmp_path / "out")  # nothing written
    # The command line (in-process here; a subprocess run is tested above): exit status 1, the
    # message on stderr, nothing on stdout.
    assert lb.main(["--format=indonlu", f"--runs={runs}", f"--output={tmp_path / 'out'}"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: missing test predictions") and "keps" in captured.err
    assert not captured.out


def test_nothing_is_written_when_a_later_task_is_invalid(tmp_path):
    runs = str(tmp_path / "runs")
    _benchmark_workdir(runs, n=3)
    path = os.path.join(runs, "facqa", "predictions.jsonl")
    rows = [json.loads(line) for line in open(path)]
    next(r for r in rows if r["split"] == "test")["prediction"][0] = "B-ANSWER"
    _write_jsonl(path, rows)
    with pytest.raises(lb.SubmissionError, match="B-ANSWER"):
        lb.indonlu_submission(runs, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("task,prediction,fragment", [
    ("emot", "joy", "unknown emot label 'joy'"),
    ("wrete", "Entail", "unknown wrete label 'Entail'"),
    ("casa", {"fuel": "neutral", "machine": "good", "others": "neutral", "part": "neutral", "price": "neutral",
              "service": "neutral"}, "unknown casa label for aspect 'machine': 'good'"),
    ("casa", {"fuel": "neutral"}, "prediction aspects ['fuel']"),
    ("posp", ["B-NNO", "NNO"], "unknown posp tag 'NNO'"),
    ("keps", [], "non-empty list of tags"),
])
def test_unknown_label_names_file_and_line(tmp_path, task, prediction, fragment):
    rng = random.Random(2)
    rows = _records(task, 4, rng)
    rows[2]["prediction"] = prediction
    if isinstance(prediction, list):
        rows[2]["tokens"] = ["w"] * len(prediction)
    path = _write(tmp_path / "predictions.jsonl", rows)
    with pytest.raises(lb.SubmissionError) as e:
        lb.indonlu_table(task, path)
    assert f"{path}:3: idx 2: " in str(e.value) and fragment in str(e.value)


def test_tags_must_match_the_sentence_length(tmp_path):
    rows = _records("nerp", 3, random.Random(3), lengths=[2, 3, 4])
    rows[1]["tokens"].append("extra")
    path = _write(tmp_path / "predictions.jsonl", rows)
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:2: idx 1: 3 tags for 4 tokens")):
        lb.indonlu_table("nerp", path)


def test_gap_duplicate_and_missing_split_are_errors(tmp_path):
    rows = _records("smsa", 5, random.Random(4))
    path = _write(tmp_path / "gap.jsonl", [r for r in rows if r["idx"] != 3])
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:4: split 'test' has idx 4 but no idx 3")):
        lb.indonlu_table("smsa", path)
    path = _write(tmp_path / "dup.jsonl", rows + [dict(rows[1])])
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:6: duplicate idx 1 in split 'test' "
                                                           f"(first at line 2)")):
        lb.indonlu_table("smsa", path)
    path = _write(tmp_path / "val.jsonl", [dict(r, split="validation") for r in rows])
    with pytest.raises(lb.SubmissionError, match=r"no rows with split 'test' \(it has splits \['validation'\]\)"):
        lb.indonlu_table("smsa", path)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:2: malformed JSON")):
        lb.indonlu_table("smsa", str(path))


def test_wrong_row_count_against_the_test_file(tmp_path):
    source = tmp_path / "indonlu"
    folder = source / "emot_emotion-twitter"
    folder.mkdir(parents=True)
    # A synthetic test file in EmoT's format (`label,tweet`) with masked-looking labels.
    (folder / "test_preprocess.csv").write_text("label,tweet\n" + "".join(f"happy,t{i}\n" for i in range(6)))
    rows = _records("emot", 5, random.Random(5))
    path = _write(tmp_path / "predictions.jsonl", rows)
    with pytest.raises(lb.SubmissionError) as e:
        lb.indonlu_table("emot", path, source=str(source))
    assert f"{path}:5: 5 test rows (idx 0..4) but the test file {folder / 'test_preprocess.csv'} has 6" in str(e.value)
    _write(tmp_path / "predictions.jsonl", rows + _records("emot", 6, random.Random(5))[5:])
    header, table = lb.indonlu_table("emot", path, source=str(source))
    assert len(table) == 6
    with pytest.raises(lb.SubmissionError, match="but expected_rows has 7"):
        lb.indonlu_table("emot", path, expected_rows=7)


def test_tag_count_against_the_test_file(tmp_path):
    folder = tmp_path / "indonlu" / "keps_keyword-extraction-prosa"
    folder.mkdir(parents=True)
    (folder / "test_preprocess.txt").write_text("a\tO\nb\tO\n\nc\tO\n\n")  # sentences of 2 and 1 words
    path = _write(tmp_path / "predictions.jsonl", [{"split": "test", "idx": 0, "prediction": ["B", "I"]},
                                                   {"split": "test", "idx": 1, "prediction": ["O", "O"]}])
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:2: idx 1: 2 tags but the test file's sentence "
                                                           f"has 1 words")):
        lb.indonlu_table("keps", path, source=str(tmp_path / "indonlu"))


def test_row_count_against_results_json(tmp_path):
    run = tmp_path / "run"
    path = _write(run / "predictions.jsonl", _records("smsa", 4, random.Random(6)))
    (run / "results.json").write_text(json.dumps({"splits": {"test": {"count": 5}}}))
    with pytest.raises(lb.SubmissionError, match=r"4 test rows .* but results.json \(splits.test.count\) has 5"):
        lb.indonlu_table("smsa", path)


def test_per_seed_runs_need_a_seed(tmp_path):
    run = tmp_path / "smsa"
    _write(run / "seed_1" / "predictions.jsonl", _records("smsa", 2, random.Random(7)))
    _write(run / "seed_2" / "predictions.jsonl", _records("smsa", 2, random.Random(7)))
    with pytest.raises(lb.SubmissionError, match=r"per-seed runs \['seed_1', 'seed_2'\]"):
        lb.predictions_path(str(run))
    assert lb.predictions_path(str(run), seed=2) == str(run / "seed_2" / "predictions.jsonl")
    written = lb.indonlu_submission({"smsa": str(run)}, str(tmp_path / "out"), tasks=["smsa"], seed=1)
    assert written == [str(tmp_path / "out" / "smsa" / "pred.txt"), str(tmp_path / "out" / "smsa.zip")]


# --- CLUE OCNLI -----------------------------------------------------------------------------------

def _ocnli_rows(n, rng):
    # nli_jax.data.nli keeps test.json's integer id as a string.
    return [{"split": "test", "idx": i, "id": str(i), "label": None, "prediction": rng.choice(NLI_LABELS),
             "probabilities": [0.3, 0.3, 0.4]} for i in range(n)]


def test_ocnli_cli_writes_the_clue_file(tmp_path, capsys):
    rng = random.Random(8)
    test_rows = _ocnli_rows(9, rng)
    rows = test_rows[::-1] + [dict(r, split="validation", label="neutral") for r in _ocnli_rows(3, rng)]
    run = tmp_path / "ocnli_run"
    _write(run / "predictions.jsonl", rows)
    source = tmp_path / "ocnli"
    source.mkdir()
    # Synthetic test.json in OCNLI's layout (sentence1, sentence2, integer id per line, no label).
    (source / "test.json").write_text("".join(json.dumps({"sentence1": "p", "sentence2": "h", "id": i}) + "\n"
                                              for i in range(9)))
    out_dir = tmp_path / "clue"
    out_dir.mkdir()
    status = lb.main(["--format=clue_ocnli", f"--run={run}", f"--output={out_dir}", f"--source={source}",
                      f"--zip={tmp_path / 'submit.zip'}"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    path = out_dir / "ocnli_50k_predict.json"
    assert captured.out.split() == [str(path), str(tmp_path / "submit.zip")]
    data = path.read_bytes()
    lines = data.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 10
    for i, (line, row) in enumerate(zip(lines, test_rows)):
        parsed = json.loads(line)
        assert list(parsed) == ["id", "label"]  # exactly the documented keys, in that order
        assert parsed == {"id": i, "label": row["prediction"]}
        assert line == f'{{"id": {i}, "label": "{row["prediction"]}"}}'  # as the CLUE guide's example
    with zipfile.ZipFile(tmp_path / "submit.zip") as z:
        assert z.namelist() == ["ocnli_50k_predict.json"] and z.read("ocnli_50k_predict.json") == data


def test_ocnli_errors(tmp_path):
    rng = random.Random(9)
    rows = _ocnli_rows(4, rng)
    rows[1]["prediction"] = "entail"
    path = _write(tmp_path / "a.jsonl", rows)
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:2: idx 1: unknown OCNLI label 'entail'")):
        lb.ocnli_submission(path, str(tmp_path / "o.json"))
    rows = _ocnli_rows(4, rng)
    rows[2]["id"] = "pair-2"
    path = _write(tmp_path / "b.jsonl", rows)
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:3: idx 2: id 'pair-2' is not an integer")):
        lb.ocnli_submission(path, str(tmp_path / "o.json"))
    rows = _ocnli_rows(4, rng)
    rows[3]["id"] = "7"
    path = _write(tmp_path / "c.jsonl", rows)
    test_json = tmp_path / "test.json"
    test_json.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(4)))
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:4: idx 3 has id 7 but line 4 of {test_json} "
                                                           f"has id 3")):
        lb.ocnli_submission(path, str(tmp_path / "o.json"), source=str(test_json))
    rows = _ocnli_rows(4, rng)
    rows[3]["id"] = "1"
    path = _write(tmp_path / "e.jsonl", rows)
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:4: duplicate id 1 (first at line 2)")):
        lb.ocnli_submission(path, str(tmp_path / "o.json"))
    path = _write(tmp_path / "d.jsonl", _ocnli_rows(3, rng))
    with pytest.raises(lb.SubmissionError, match=re.escape(f"{path}:3: 3 test rows (idx 0..2) but the test file")):
        lb.ocnli_submission(path, str(tmp_path / "o.json"), source=str(test_json))
    assert not os.path.exists(tmp_path / "o.json")
    with pytest.raises(lb.SubmissionError, match="documents only ocnli_50k_predict.json"):
        lb.ocnli_submission(path, str(tmp_path / "o.json"), train_size="30k")
    assert lb.ocnli_filename("30k", naming="ocnli") == "OCNLI_30k.json"
    written = lb.ocnli_submission(path, str(tmp_path) + "/", train_size="30k", naming="ocnli")
    assert written == str(tmp_path / "OCNLI_30k.json")
