"""IndoNLU, OCNLI, InferES and translate-train: loader counts against the papers, bad rows,
word alignment, and every task training a tiny model through the benchmark runner."""
import json

import numpy as np
import pytest

from configs import finetune_common, indonlu as indonlu_config
from conftest import INDONLU_SMALL_ROWS, first_rows
from nli_jax.data import indonlu, nli
from nli_jax.data.readers import DataError
from nli_jax.tasks.inferes import INFERES
from nli_jax.tasks.ocnli import OCNLI

# IndoNLU paper, Table 1 (train / valid).
TABLE_1 = {"emot": (3521, 440), "smsa": (11000, 1260), "casa": (810, 90), "hoasa": (2283, 285), "wrete": (300, 50),
           "posp": (6720, 840), "bapos": (8000, 1000), "terma": (3000, 1000), "keps": (800, 200),
           "nergrit": (1672, 209), "nerp": (6720, 840), "facqa": (2495, 311)}
TAG_COUNTS = {"posp": 26, "bapos": 41, "terma": 5, "keps": 3, "nergrit": 7, "nerp": 11, "facqa": 3}


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_indonlu_counts_match_table_1(shared_data, name):
    task = indonlu.TASKS[name]
    examples = indonlu.load_examples(task, indonlu.task_directory(task, str(shared_data / "indonlu")))
    assert (len(examples["train"]), len(examples["validation"])) == TABLE_1[name]
    labels = indonlu.label_vocabulary(task)
    if name in TAG_COUNTS:  # the benchmark's tag set, which the files' tags fill
        assert len(labels) == TAG_COUNTS[name]
        assert {t for rows in examples.values() for e in rows for t in e["tags"]} == set(labels)
    if name == "hoasa":
        assert "neg_pos" in labels and len(task.aspects) == 10
    if name == "casa":
        assert len(task.aspects) == 6 and len(labels) == 3


def test_tokens_with_spaces_are_kept_whole(shared_data):
    task = indonlu.TASKS["posp"]
    examples = indonlu.load_examples(task, indonlu.task_directory(task, str(shared_data / "indonlu")))
    assert any(" " in tok for e in examples["train"] for tok in e["tokens"])


def test_nli_corpora_counts(shared_data):
    ocnli = nli.load_examples(OCNLI, str(shared_data / "ocnli"))
    with open(shared_data / "ocnli" / "dev.json", encoding="utf-8") as f:
        raw = [json.loads(line) for line in f if line.strip()]
    assert len(raw) == 3000  # OCNLI dev before dropping label '-'
    assert len(ocnli["validation"]) == sum(r["label"] != "-" for r in raw) == 2950
    assert {e["categories"]["level"] for e in ocnli["validation"]} == {"easy", "medium", "hard"}
    inferes = nli.load_examples(INFERES, str(shared_data / "inferes"))
    assert len(inferes["train"]) == 6444
    assert {e["categories"]["anno_type"] for e in inferes["train"]} >= {"Generate", "Rewrite"}


def _write(tmp_path, task, train_text):
    folder = tmp_path / indonlu.TASKS[task].folder
    folder.mkdir(parents=True)
    ext = indonlu.TASKS[task].extension
    (folder / f"train_preprocess.{ext}").write_text(train_text, encoding="utf-8")
    (folder / f"valid_preprocess.{ext}").write_text(train_text, encoding="utf-8")
    return indonlu.TASKS[task], str(folder)


@pytest.mark.parametrize("task,text,message", [
    ("emot", "label,tweet\nhappy,senang sekali\nanger,marah,lagi\n", "train_preprocess.csv:3: expected 2 columns, got 3"),
    ("emot", "label,tweet\nhappy,senang\nbored,bosan\n", "train_preprocess.csv:3: unknown label 'bored'"),
    ("smsa", "bagus sekali\tpositive\njelek\n", "train_preprocess.tsv:2: expected 2 columns, got 1"),
    ("casa", "sentence,fuel,machine,others,part,price,service\nmobil irit,positive,neutral,neutral,neutral,neutral\n",
     "train_preprocess.csv:2: expected 7 columns, got 6"),
    ("nerp", "Budi\tB-PPL\npergi\tO\n\nke\tX-PLC\n", "train_preprocess.txt:4: unknown tag 'X-PLC'"),
    ("nerp", "Budi\tB-PPL\npergi O\n", "train_preprocess.txt:2: expected 'token<TAB>tag'"),
    ("facqa", 'question,passage,seq_label\n"[\'Siapa\', \'?\']","[\'Budi\', \'pergi\']","[\'B\']"\n',
     "train_preprocess.csv:2: passage has 2 tokens but seq_label has 1 labels"),
    ("facqa", 'question,passage,seq_label\n"[\'Siapa\']","__import__(\'os\')","[\'B\']"\n',
     "train_preprocess.csv:2: column 'passage' is not a Python list literal"),
])
def test_bad_rows_name_file_and_line(tmp_path, task, text, message):
    spec, folder = _write(tmp_path, task, text)
    with pytest.raises(DataError, match=message):
        indonlu.load_examples(spec, folder)


def test_word_alignment_first_and_average(minilm_dir):
    import nli_jax
    from conftest import config_for, task_for
    tokenizer = nli_jax.load_tokenizer(minilm_dir)
    example = {"tokens": ["Budi", "mengunjungi", "Surabaya"], "tags": ["B-PPL", "O", "O"], "idx": 0}
    pieces = [tokenizer.tokenize(w) for w in example["tokens"]]
    assert len(pieces[1]) > 1, "need a word split into several sub-tokens"
    for alignment in ("first", "average"):
        task = task_for(config_for("indonlu:task=nerp,cpu_test", "data.max_seq_length=32",
                                   f"task_options.word_alignment={alignment}"))
        task.labels = ("B-PPL", "O")
        features = task.encoder(tokenizer)(example)
        index = features["word_index"]
        expected = [-1]
        for w, p in enumerate(pieces):
            expected += [w] + ([w if alignment == "average" else -1] * (len(p) - 1))
        expected += [-1]
        assert index.tolist() == expected, alignment
        assert features["word_labels"].tolist() == [0, 1, 1] and features["word_mask"].tolist() == [1, 1, 1]


def test_word_logits_average_subtokens():
    """Word logits = mean of the word's sub-token logits (what averaging vectors gives)."""
    import jax.numpy as jnp
    from conftest import config_for, task_for

    class Fixed:
        def __call__(self, ids, mask, types, deterministic):
            return jnp.arange(2 * 5 * 3, dtype=jnp.float32).reshape(2, 5, 3)

    batch = {"input_ids": jnp.zeros((2, 5), jnp.int32), "attention_mask": jnp.ones((2, 5)),
             "token_type_ids": jnp.zeros((2, 5), jnp.int32), "word_index": jnp.array([[-1, 0, 0, 1, -1], [-1, 0, 1, 1, 1]]),
             "word_labels": jnp.zeros((2, 2), jnp.int32)}
    logits = np.asarray(Fixed()(None, None, None, True))
    out = np.asarray(task_for(config_for("indonlu:task=nerp,cpu_test")).word_logits(Fixed(), batch, True))
    np.testing.assert_allclose(out[0, 0], logits[0, 1:3].mean(0))
    np.testing.assert_allclose(out[1, 1], logits[1, 2:5].mean(0))


@pytest.fixture(scope="module")
def benchmark_run(indonlu_small, tmp_path_factory):
    """The benchmark runner on every task's real files cut to their first rows (conftest.indonlu_small;
    the whole files' counts are test_indonlu_counts_match_table_1's): every format, reader, head and
    metric end to end, at a few steps' and a few batches' cost."""
    from finetune import indonlu_benchmark
    workdir = tmp_path_factory.mktemp("indonlu_benchmark")
    text = indonlu_benchmark.run("scratch", str(workdir), str(indonlu_small), indonlu_config.TASKS,
                                 overrides=["train.max_steps=4", f"data.tfds_dir={workdir / 'tfds'}"], cpu_test=True)
    return workdir, text


@pytest.mark.slow  # end to end, minutes: python -m pytest -m slow
def test_every_indonlu_task_trains_and_reports_its_metric(benchmark_run):
    workdir, text = benchmark_run
    for task in indonlu_config.TASKS:
        results = json.loads((workdir / task / "results.json").read_text())
        assert results["primary_metric"] == "f1" and results["steps"] == 4
        validation = results["splits"]["validation"]
        # Every validation row evaluated (the cut files' rows: sentences of the tagging tasks).
        assert 0.0 <= validation["f1"] <= 1.0 and validation["count"] == INDONLU_SMALL_ROWS[1]
        if task in ("posp", "bapos", "terma", "keps", "nergrit", "nerp", "facqa"):
            assert "token_accuracy" in validation and "by_type" in validation
        if task in ("casa", "hoasa"):
            assert len(validation["by_aspect"]) == len(indonlu.TASKS[task].aspects)


def test_the_benchmark_table_names_the_model_its_runs_build():
    """--model names a checkpoint; --cpu_test and a model override replace it, and the table says so
    (it titled a tiny ModernBERT's from-scratch runs 'model `large`')."""
    from finetune import indonlu_benchmark
    tiny = indonlu_benchmark.task_configs("large", "/data", ["smsa", "nerp"], ["model.preset=tiny-modernbert"],
                                          cpu_test=True)
    assert indonlu_benchmark.built_model("large", tiny) == "`large` (run: preset tiny-modernbert from scratch)"
    hub = indonlu_benchmark.task_configs("large", "/data", ["smsa"])
    assert indonlu_benchmark.built_model("large", hub) == "`large`"
    other = indonlu_benchmark.task_configs("large", "/data", ["smsa"], ["model.init=/models/mine"])
    assert indonlu_benchmark.built_model("large", other) == "`large` (run: /models/mine)"


@pytest.mark.slow  # end to end, minutes: python -m pytest -m slow
def test_benchmark_table_has_table_5_layout(benchmark_run):
    workdir, text = benchmark_run
    header = (workdir / "table.csv").read_text().splitlines()[0].split(",")
    assert header == ["split", "EmoT", "SmSA", "CASA", "HoASA", "WReTE", "cls avg", "POSP", "BaPOS", "TermA", "KEPS",
                      "NERGrit", "NERP", "FacQA", "seq avg"]
    row = (workdir / "table.csv").read_text().splitlines()[1].split(",")
    values = [float(v) for v in row[1:]]
    assert values[5] == pytest.approx(np.mean(values[0:5]), abs=0.01)
    assert values[13] == pytest.approx(np.mean(values[6:13]), abs=0.01)
    assert "| validation |" in text


@pytest.mark.slow  # end to end, minutes: python -m pytest -m slow
def test_task_results_match_seqeval_on_written_predictions(benchmark_run):
    from seqeval.metrics import f1_score
    from nli_jax.metrics import conll_scores
    workdir, _ = benchmark_run
    rows = [json.loads(line) for line in (workdir / "nerp" / "predictions.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "validation"]
    results = json.loads((workdir / "nerp" / "results.json").read_text())["splits"]["validation"]
    gold, pred = [r["tags"] for r in rows], [r["prediction"] for r in rows]
    assert results["f1"] == pytest.approx(conll_scores(gold, pred)["f1"])
    assert results["micro_f1"] == pytest.approx(f1_score(gold, pred))


def _nli_config(task, shared_data, tmp_path, **data):
    c = finetune_common.base_config(task)
    finetune_common.apply_nli_cpu_test(c)
    c.data.tfds_dir = str(tmp_path / "tfds")
    c.train.max_steps = 4
    c.train.log_every_steps = 2
    for k, v in data.items():  # the data section's keys, or the task's own options
        (c.data if k in c.data else c.task_options)[k] = v
    # Only splits the task can have: a name it never has (a typo) is refused before compute.
    from conftest import task_for
    c.eval_splits = tuple(s for s in ("validation", "test", "topic_ood") if s in task_for(c).possible_splits())
    return c


def test_ocnli_reports_genre_and_level(shared_data, tmp_path):
    """A run on OCNLI's real files, their first 300 rows (every genre and level among them; the whole
    files' counts are test_nli_corpora_counts'), reports accuracy by genre and by level."""
    from nli_jax.pretraining.vocab import train_vocabulary
    from nli_jax.train.loop import train_and_evaluate
    source = tmp_path / "ocnli"
    for name in ("train.3k.json", "dev.json"):
        first_rows(shared_data / "ocnli" / name, source / name, 300, "lines")
    c = _nli_config("ocnli", shared_data, tmp_path, source=str(source), train_size="3k")
    # Chinese text needs a vocabulary with its characters: the Indonesian fixture's maps 95% of it
    # to [UNK], which the loop refuses.
    with open(source / "train.3k.json", encoding="utf-8") as f, \
            open(tmp_path / "sentences.txt", "w", encoding="utf-8") as out:
        for line in f:
            row = json.loads(line)
            out.write(f"{row['sentence1']}\n{row['sentence2']}\n")
    c.model.tokenizer = train_vocabulary([str(tmp_path / "sentences.txt")], str(tmp_path / "vocab"), vocab_size=3000,
                                         min_frequency=1, limit_alphabet=3000)
    results = train_and_evaluate(c, str(tmp_path / "run"))
    validation = results["splits"]["validation"]
    assert validation["count"] == 298  # 2 of the 300 rows have label '-' (no gold label): dropped
    assert set(validation["by_level"]) == {"easy", "medium", "hard"}
    assert set(validation["by_genre"]) == {"gov", "news", "lit", "tv", "phone"}


def test_inferes_validation_carved_and_topic_out_of_distribution(shared_data, tmp_path):
    """On InferES's real training file, its first 600 rows (every topic and creation strategy among
    them): validation carved from the topics trained on, topic 3 held out as its own split."""
    from nli_jax.train.loop import train_and_evaluate
    first_rows(shared_data / "inferes" / "inferes_train.csv", tmp_path / "inferes" / "inferes_train.csv", 600, "csv")
    c = _nli_config("inferes", shared_data, tmp_path, source=str(tmp_path / "inferes"), holdout_topic="3",
                    hypothesis_only=True)
    c.data.allow_overlap = True  # as configs/inferes.py: its validation split repeats training premises
    results = train_and_evaluate(c, str(tmp_path / "run"))
    ood, validation = results["splits"]["topic_ood"], results["splits"]["validation"]
    assert set(ood["by_topic"]) == {"3"} and "3" not in validation["by_topic"]
    assert results["hypothesis_only"] is True
    assert set(validation["by_anno_type"]) <= {"Generate", "Rewrite", "Crowd", "Automated"}
    with open(tmp_path / "run" / "predictions.jsonl") as f:
        assert sum(1 for _ in f) == ood["count"] + validation["count"]


@pytest.mark.slow  # end to end, minutes: python -m pytest -m slow
def test_translate_train_trains_on_mt_and_evaluates_on_indonli(shared_data, tmp_path):
    """The task reads every machine-translated pair (10,330); mixed, every IndoNLI training pair too
    (on the real files' first rows; IndoNLI's whole count is tests/test_data.py's); a run on those
    rows (each split its own count) trains on both and evaluates on IndoNLI's validation split, not
    on the machine-translated dev."""
    from conftest import task_for
    from nli_jax.train.loop import train_and_evaluate
    c = _nli_config("indonli_translate_train", shared_data, tmp_path, source=str(shared_data / "indonli"),
                    translate_train_source=str(shared_data / "indonli_translate_train_small"))
    assert len(task_for(c).load()["train"]) == 10330
    c.task_options.mix_indonli_train = True
    small = tmp_path / "small"
    for folder, name, rows in (("indonli", "train.jsonl", 96), ("indonli", "val.jsonl", 48),
                               ("indonli_translate_train_small", "train.jsonl", 64),
                               ("indonli_translate_train_small", "dev.jsonl", 40)):
        first_rows(shared_data / folder / name, small / folder / name, rows, "lines")
    c.data.source, c.task_options.translate_train_source = str(small / "indonli"), str(small / "indonli_translate_train_small")
    assert len(task_for(c).load()["train"]) == 64 + 96
    results = train_and_evaluate(c, str(tmp_path / "run"))
    assert results["splits"]["validation"]["count"] == 48
