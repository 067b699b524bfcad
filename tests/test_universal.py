"""The universal classifier (nli_jax/tasks/universal.py, configs/universal_nli.py,
finetune.universal_heldout): classification tasks recast as binary NLI pairs, capped per class;
the task's refusals; and (slow) the held-out-dataset protocol end to end on synthetic IndoNLU
files, the export of an nli-jax NLI model in transformers' zero-shot pipeline (max |diff|
<= 1e-4), and the recasting of the real IndoNLU tasks. Every sentence here is synthetic."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, config_for, indonlu_first_rows
from nli_jax.errors import ConfigValueError
from nli_jax.planner import build_plan
from nli_jax.tasks import create_task
from nli_jax.tasks.universal import BINARY_LABELS, cap_per_class, recast
from nli_jax.verbalizers import verbalizer_for

PEOPLE = ["Budi", "Wati", "Siti", "Agus", "Rina", "Joko", "Dewi", "Bayu", "Sari", "Andi", "Rudi", "Putri"]
PLACES = ["kantor", "pasar", "taman", "pantai", "sekolah", "stasiun", "kebun", "warung"]
SENTIMENT_WORDS = {"positive": "positif", "negative": "negatif", "neutral": "netral"}
EMOTION_WORDS = {"happy": "senang", "sadness": "sedih", "anger": "marah", "fear": "takut", "love": "cinta"}


def _sentences(n, words, seed):
    """(text, label) pairs: a person at a place saying how it felt, in the label's own word."""
    rng = np.random.default_rng(seed)
    labels = sorted(words)
    return [(f"{PEOPLE[rng.integers(len(PEOPLE))]} merasa {words[labels[i % len(labels)]]} di "
             f"{PLACES[rng.integers(len(PLACES))]} pada hari sabtu.", labels[i % len(labels)]) for i in range(n)]


def write_indonlu(root, n_train=48, n_valid=15):
    """Synthetic SmSA, EmoT and WReTE folders in the IndoNLU file formats."""
    smsa, emot, wrete = (root / "smsa_doc-sentiment-prosa", root / "emot_emotion-twitter", root / "wrete_entailment-ui")
    for folder in (smsa, emot, wrete):
        folder.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("valid", n_valid, 1)):
        (smsa / f"{split}_preprocess.tsv").write_text(
            "".join(f"{t}\t{label}\n" for t, label in _sentences(n, SENTIMENT_WORDS, seed)), encoding="utf-8")
        (emot / f"{split}_preprocess.csv").write_text(
            "label,tweet\n" + "".join(f"{label},{t}\n" for t, label in _sentences(n, EMOTION_WORDS, seed)),
            encoding="utf-8")
        rows = []
        for i, (text, _) in enumerate(_sentences(n, SENTIMENT_WORDS, seed + 5)):
            person = text.split()[0]
            entails = i % 2 == 0
            second = f"{person} berada di sana." if entails else f"{person} tidak pernah pergi."
            rows.append(f"\"{text}\",\"{second}\",synthetic,{'Entail_or_Paraphrase' if entails else 'NotEntail'}\n")
        (wrete / f"{split}_preprocess.csv").write_text("sent_A,sent_B,category,label\n" + "".join(rows), encoding="utf-8")
    return root


def write_nusax(root, languages=("indonesian", "javanese"), n_train=24, n_valid=12):
    """A synthetic NusaX-Senti folder (<language>/{train,valid}.csv: id,text,label)."""
    for language in languages:
        (root / language).mkdir(parents=True, exist_ok=True)
        for split, n, seed in (("train", n_train, 2), ("valid", n_valid, 3)):
            (root / language / f"{split}.csv").write_text("id,text,label\n" + "".join(
                f"{i},\"{t}\",{label}\n" for i, (t, label) in enumerate(_sentences(n, SENTIMENT_WORDS, seed))),
                encoding="utf-8")
    return root


def _universal(tmp_path, *assignments):
    data = write_indonlu(tmp_path / "indonlu")
    config = config_for("universal_nli:cpu_test", f"data.tfds_dir={tmp_path / 'tfds'}",
                        f"task_options.recast_source={data}", *assignments)
    return create_task(build_plan(config, training=False))


def test_each_example_becomes_its_true_hypothesis_and_the_others_as_not_entailment(tmp_path):
    task = _universal(tmp_path, "task_options.recast_tasks=smsa,wrete", "task_options.include_nli=False")
    splits = task.load()
    train = [splits["train"][i] for i in range(len(splits["train"]))]
    smsa = [e for e in train if e["categories"]["origin"] == "smsa"]
    wrete = [e for e in train if e["categories"]["origin"] == "wrete"]
    # SmSA: 48 texts (16 a class, under the cap of 40), 3 hypotheses each, 1 entailed.
    assert len(smsa) == 48 * 3 and sum(e["label"] == 0 for e in smsa) == 48
    for e in smsa:
        said = next(word for word in SENTIMENT_WORDS.values() if f" {word} " in e["premise"])
        assert (e["label"] == 0) == (e["hypothesis"] == f"Sentimen teks ini {said}."), e
    # WReTE: one pair per example, its second sentence the hypothesis, its label the outcome.
    assert len(wrete) == 48 and all(e["hypothesis"].endswith(("berada di sana.", "tidak pernah pergi.")) for e in wrete)
    assert all((e["label"] == 0) == e["hypothesis"].endswith("berada di sana.") for e in wrete)
    validation = splits["validation"]
    assert len(validation) == 15 * 3 + 15
    assert BINARY_LABELS == ("entailment", "not_entailment")


def test_aspect_tasks_are_recast_per_aspect(tmp_path):
    from nli_jax.plan import default_config
    from nli_jax.tasks import options_config
    folder = tmp_path / "casa_absa-prosa"
    folder.mkdir()
    text = "sentence,fuel,machine,others,part,price,service\nbensin irit harga murah,positive,neutral,neutral,neutral,positive,neutral\n"
    for split in ("train", "valid"):
        (folder / f"{split}_preprocess.csv").write_text(text, encoding="utf-8")
    config = default_config("casa", options_config("casa"))
    config.data.source, config.data.tfds_dir = str(tmp_path), str(tmp_path / "tfds")
    casa = create_task(build_plan(config, training=False))
    example = casa.load()["train"][0]
    pairs = recast(casa, verbalizer_for("casa", casa.labels, "aspects"), [example], "casa")
    assert len(pairs) == 6 * 3
    entailed = [p["hypothesis"] for p in pairs if p["label"] == 0]
    assert entailed == ["Ulasan ini bernada positif tentang bahan bakar.", "Ulasan ini bernada netral tentang mesin.",
                        "Ulasan ini bernada netral tentang hal lain.", "Ulasan ini bernada netral tentang suku cadang.",
                        "Ulasan ini bernada positif tentang harga.", "Ulasan ini bernada netral tentang layanan."]
    # Capped, each aspect's label is a class: (fuel, positive) and (price, positive) hold one example
    # each, every (aspect, neutral) four; at most two of each are kept, each for the aspects drawn for it.
    rows = ["bensin irit harga murah,positive,neutral,neutral,neutral,positive,neutral"] + [
        f"mobil biasa saja nomor {i},neutral,neutral,neutral,neutral,neutral,neutral" for i in range(3)]
    (folder / "train_preprocess.csv").write_text(text.splitlines()[0] + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    casa = create_task(build_plan(config, training=False))
    train = [casa.load()["train"][i] for i in range(4)]
    kept = cap_per_class(casa, train, 2, seed=0)
    entailed = [p["hypothesis"] for p in recast(casa, verbalizer_for("casa", casa.labels, "aspects"), kept, "casa")
                if p["label"] == 0]
    assert {0, 4} <= set(kept[0]["recast_aspects"])  # the only positive fuel and price example
    assert len(entailed) == 2 + 2 * 6
    assert entailed.count("Ulasan ini bernada positif tentang harga.") == 1
    assert all(entailed.count(f"Ulasan ini bernada netral tentang {a}.") == 2 for a in ("mesin", "hal lain", "layanan"))
    assert cap_per_class(casa, train, 4, seed=0) == train  # nothing capped: every aspect recast


def test_cap_keeps_at_most_n_per_class_drawn_by_seed(tmp_path):
    task = _universal(tmp_path).recast_task("smsa")
    examples = [task.load()["train"][i] for i in range(48)]
    kept = cap_per_class(task, examples, 5, seed=0)
    counts = {label: sum(e["label"] == label for e in kept) for label in SENTIMENT_WORDS}
    assert counts == {"positive": 5, "negative": 5, "neutral": 5}
    order = [e["idx"] for e in examples]
    assert [order.index(e["idx"]) for e in kept] == sorted(order.index(e["idx"]) for e in kept)  # their order kept
    assert kept != cap_per_class(task, examples, 5, seed=1)
    assert cap_per_class(task, examples, 100, seed=0) == examples


def test_recast_tasks_are_checked_by_the_planner(tmp_path):
    with pytest.raises(ConfigValueError, match="unknown task 'smsaa'"):
        _universal(tmp_path, "task_options.recast_tasks=smsa,smsaa")
    with pytest.raises(ConfigValueError, match="no training data"):
        _universal(tmp_path, "task_options.recast_tasks=", "task_options.include_nli=False")


def test_tasks_sharing_texts_are_never_recast_for_each_other():
    from nli_jax.heldout import overrides_for, recast_for
    from nli_jax.data.provenance import share_texts
    assert share_texts("nusax", "smsa") and share_texts("smsa", "nusax")
    assert not share_texts("smsa", "smsa") and not share_texts("emot", "nusax")
    assert recast_for("nusax", ["smsa", "emot", "wrete"]) == ["emot", "wrete"]
    assert recast_for("smsa", ["nusax", "emot"]) == ["emot"]
    assert recast_for("emot", ["smsa", "emot", "nusax"]) == ["smsa", "nusax"]
    overrides = ["data.max_seq_length=64", "nusax:data.source=gs://b/nusax", "smsa:data.source=/x"]
    assert overrides_for("nusax", overrides) == ["data.max_seq_length=64", "data.source=gs://b/nusax"]
    assert overrides_for("emot", overrides) == ["data.max_seq_length=64"]


def test_heldout_table_gives_mean_sd_over_seeds_and_a_ceiling_of_fewer_seeds():
    from nli_jax.heldout import table
    rows = {"nusax validation_javanese": {"metric": "f1", "seeds": [1, 2, 3], "zero_shot": [0.3, 0.4, 0.5],
                                          "majority": [0.2, 0.2, 0.2], "ceiling": [0.8], "ceiling_seeds": [1],
                                          "not_recast": ["smsa"]}}
    text = table(rows)
    assert "| nusax validation_javanese | f1 | 1,2,3 | 40.00 (10.00) | 20.00 (0.00) | 80.00 (seed 1) |" in text, text
    assert "nusax: its runs trained without smsa" in text


def test_nli_and_validation_caps(tmp_path):
    task = _universal(tmp_path, "task_options.recast_tasks=smsa", "task_options.max_per_class=2",
                      "task_options.max_nli_examples=5", "task_options.max_validation_examples=4")
    assert task.trained_task_names() == ("indonli", "smsa")
    splits = task.load()
    origins = lambda split: [splits[split][i]["categories"]["origin"] for i in range(len(splits[split]))]  # noqa: E731
    assert origins("train").count("indonli") == 5 and origins("train").count("smsa") == 3 * 2 * 3
    assert origins("validation").count("indonli") == 4 and origins("validation").count("smsa") == 4 * 3


# --- slow: the protocol and the pipeline end to end ------------------------------------------

def _command(module, *args, timeout=900):
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_heldout_protocol_trains_on_the_others_and_scores_the_heldout_task_zero_shot(tmp_path):
    data = write_indonlu(tmp_path / "indonlu")
    common = ["--config=configs/universal_nli.py:cpu_test", f"--config.task_options.recast_source={data}",
              f"--config.data.tfds_dir={tmp_path / 'tfds'}", "--config.train.num_epochs=2",
              "--config.optimizer.warmup_steps=2",
              "--tasks=smsa,wrete"]
    proc = _command("finetune.universal_heldout", *common, f"--workdir={tmp_path / 'heldout'}", "--ceiling")
    assert "| smsa | f1 | 1 |" in proc.stdout and "| wrete | f1 | 1 |" in proc.stdout, proc.stdout
    assert "fine-tuned (ceiling)" in proc.stdout
    ceiling = json.loads((tmp_path / "heldout" / "ceiling_smsa" / "seed_1" / "config.json").read_text())
    assert ceiling["task"] == "smsa" and ceiling["model"]["preset"] == "tiny-bert"
    for heldout, other in (("smsa", "wrete"), ("wrete", "smsa")):
        run = tmp_path / "heldout" / f"heldout_{heldout}" / "seed_1"
        assert json.loads((run / "config.json").read_text())["task_options"]["recast_tasks"] == other
        results = json.loads((run / "zero_shot" / "results.json").read_text())
        assert results["task"] == heldout and results["nli_labels"] == ["entailment", "not_entailment"]
        assert results["splits"]["validation"]["count"] == 15
    # NusaX held out: its runs never train on SmSA (whose texts NusaX's are); each language a row.
    nusax = write_nusax(tmp_path / "nusax")
    with_nusax = [*common[:-1], "--tasks=smsa,wrete", "--heldout_only=nusax", f"--task_override=nusax:data.source={nusax}",
                  "--task_override=nusax:task_options.eval_languages=javanese"]
    held = _command("finetune.universal_heldout", *with_nusax, f"--workdir={tmp_path / 'with_nusax'}").stdout
    assert "| nusax | f1 | 1 |" in held and "| nusax validation_javanese | f1 | 1 |" in held, held
    assert "nusax: its runs trained without smsa" in held
    # SmSA's held-out run trains on what NusaX's would (wrete): one run, scored on both.
    run = tmp_path / "with_nusax" / "heldout_smsa" / "seed_1"
    assert not (tmp_path / "with_nusax" / "heldout_nusax").exists()
    assert json.loads((run / "config.json").read_text())["task_options"]["recast_tasks"] == "wrete"
    scored = json.loads((run / "zero_shot_nusax" / "results.json").read_text())
    assert set(scored["splits"]) == {"validation", "validation_javanese"}
    assert scored["trained_on"] == {"indonli": f"the run {run}", "wrete": f"the run {run}"}
    # A run trained on SmSA recast is refused on NusaX, zero-shot and as a fine-tuning run's init.
    trained_on_smsa = tmp_path / "heldout" / "heldout_wrete" / "seed_1"
    refused = subprocess.run([sys.executable, "-m", "finetune.zero_shot", f"--checkpoint={trained_on_smsa}",
                              "--task=nusax", f"--workdir={tmp_path / 'zs_nusax'}", f"--override=data.source={nusax}"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "trained on smsa, and nusax's texts are smsa's" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "zs_nusax" / "results.json").exists()
    refused = subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/nusax.py:cpu_test",
                              f"--workdir={tmp_path / 'ft_nusax'}", f"--config.data.source={nusax}",
                              f"--config.model.init={trained_on_smsa}"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "trained on smsa, and nusax's texts are smsa's" in refused.stderr, refused.stderr
    # Rerun: every cell is read back, nothing trained or scored again.
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "heldout").rglob("results.json")}
    again = _command("finetune.universal_heldout", *common, f"--workdir={tmp_path / 'heldout'}", "--ceiling")
    table = lambda out: [line for line in out.splitlines() if line.startswith("|")]  # noqa: E731
    assert table(again.stdout) == table(proc.stdout) and len(table(proc.stdout)) == 4
    assert len(written) == 6 and {p: p.stat().st_mtime_ns for p in written} == written


@pytest.mark.slow
def test_an_exported_nli_jax_model_scores_in_the_pipeline_as_in_nli_jax(tmp_path):
    transformers = pytest.importorskip("transformers")
    from nli_jax.zero_shot import load_model
    run, export = tmp_path / "run", tmp_path / "export"
    _command("finetune.main", "--config=configs/indonli_large.py:cpu_test", f"--workdir={run}",
             f"--config.data.tfds_dir={tmp_path / 'tfds'}")
    _command("finetune.export", f"--checkpoint={run}", f"--output={export}")
    config = json.loads((export / "config.json").read_text())
    assert config["label2id"]["entailment"] == 0  # the pipeline's entailment: the label starting with "entail"
    assert config["nli_jax"]["trained_on"] == {"indonli": f"the run {run}"}  # checked by finetune.zero_shot
    texts = ["Budi memasak nasi di rumah pada pagi hari.", "Wati membaca koran di taman pada sore hari.",
             "Siti pergi ke pasar naik sepeda karena ingin membeli baju."]
    candidates, template = ["memasak nasi", "membaca koran", "pergi ke pasar", "menanam pohon"], "Orang itu {}."
    classifier = transformers.pipeline("zero-shot-classification", model=str(export), device="cpu")
    for checkpoint in (run, export):
        model = load_model(str(checkpoint), workdir=str(tmp_path / "work"))
        for multi_label in (False, True):
            ours = model.scores(texts, candidates, template, multi_label=multi_label)
            out = classifier(texts, candidates, hypothesis_template=template, multi_label=multi_label)
            reference = np.asarray([[o["scores"][o["labels"].index(c)] for c in candidates] for o in out])
            assert np.abs(ours - reference).max() <= 1e-4, (checkpoint, multi_label, ours, reference)
            assert reference.std() > 1e-3  # a trained model: the scores differ between labels


# The first rows of each real file (SmSA's first 800: 86 to 464 a class; EmoT's: 107 to 211), so
# every class still holds well over the cap of 30 while the datasets built are a fraction of the files.
RECAST_ROWS = (800, 100)  # training, validation rows per task


@pytest.mark.slow
def test_real_indonlu_tasks_recast(shared_data, tmp_path):
    indonlu_first_rows(shared_data / "indonlu", tmp_path / "indonlu", RECAST_ROWS,
                       ("smsa", "emot", "wrete", "casa", "hoasa"))
    config = config_for("universal_nli:cpu_test", f"data.tfds_dir={tmp_path / 'tfds'}",
                        f"task_options.recast_source={tmp_path / 'indonlu'}",
                        "task_options.recast_tasks=smsa,emot,wrete,casa,hoasa", "task_options.max_per_class=30")
    splits = create_task(build_plan(config, training=False)).load()
    train = [splits["train"][i] for i in range(len(splits["train"]))]
    by_origin = {}
    for e in train:
        by_origin.setdefault(e["categories"]["origin"], []).append(e["label"])
    # Capped: at most 30 texts a class (SmSA 3 classes x 3 hypotheses, EmoT 5 x 5; an aspect task's
    # classes are its label tuples); one entailed hypothesis per text (per aspect).
    assert len(by_origin["smsa"]) == 3 * 30 * 3 and by_origin["smsa"].count(0) == 90
    assert len(by_origin["emot"]) == 5 * 30 * 5 and by_origin["emot"].count(0) == 150
    assert len(by_origin["wrete"]) <= 2 * 30
    assert by_origin["casa"].count(0) * 3 == len(by_origin["casa"])
    assert by_origin["hoasa"].count(0) * 4 == len(by_origin["hoasa"])
    # An aspect task's class is (aspect, label): at most 30 entailed hypotheses of each.
    assert 6 * 30 <= by_origin["casa"].count(0) <= 6 * 3 * 30
    assert 10 * 30 <= by_origin["hoasa"].count(0) <= 10 * 4 * 30
    assert by_origin["indonli"].count(0) > 0 and by_origin["indonli"].count(1) > 0
