"""Zero-shot classification with NLI models (nli_jax.zero_shot, finetune.zero_shot): the label
verbalisers, the pipeline's scoring rule on imported transformers checkpoints of several
families and label orders (max |diff| <= 1e-4 against transformers' zero-shot-classification
pipeline), a task's split through the command, and the one-line refusals. All text here is
synthetic, written for these tests."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from nli_jax.data import fixture_path
from nli_jax.errors import RunError
from nli_jax.plan import default_config
from nli_jax.tasks import create_task, options_config
from nli_jax import cli
from nli_jax.planner import build_plan
from nli_jax.verbalizers import DEFAULTS, Verbalizer, check_template, parse_labels, verbalizer_for
from nli_jax.zero_shot import ZeroShotModel, hypotheses, load_model, nli_columns, predictions_of, score_examples

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 1e-4
TEXTS = ["Budi memasak nasi di rumah pada pagi hari.", "Wati membaca koran di taman.",
         "Siti pergi ke pasar naik sepeda pada hari sabtu karena ingin membeli baju dan payung untuk ibunya."]
CANDIDATES = ["memasak", "membaca koran", "pergi ke pasar"]
TEMPLATE = "Orang itu sedang {}."
# Sentiment sentences of a synthetic SmSA folder: each says its sentiment's Indonesian word.
SENTIMENT_ROWS = [("Rina merasa positif di kantor.", "positive"), ("Joko merasa negatif di stasiun.", "negative"),
                  ("Andi merasa netral di kebun.", "neutral"), ("Dewi positif melihat pantai.", "positive"),
                  ("Bayu negatif melihat jalan ramai.", "negative"), ("Sari netral di perpustakaan.", "neutral")]


def _nli_checkpoint(path, family="bert", labels=("entailment", "neutral", "contradiction"), seed=0):
    """A random transformers NLI classifier with the shipped WordPiece tokenizer, saved to `path`."""
    tokenizer = transformers.BertTokenizerFast.from_pretrained(fixture_path("tiny_wordpiece"))
    common = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=128, num_labels=len(labels),
                  initializer_range=0.5,  # logits that differ between pairs (at 0.02 they are all alike)
                  id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    config = {"bert": lambda: transformers.BertConfig(**common),
              "albert": lambda: transformers.AlbertConfig(**common, embedding_size=16),
              "electra": lambda: transformers.ElectraConfig(**common, embedding_size=16),
              "deberta-v2": lambda: transformers.DebertaV2Config(**common, relative_attention=True,
                                                                 position_buckets=32, max_relative_positions=64,
                                                                 pos_att_type=["p2c", "c2p"], type_vocab_size=2)}[family]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _pipeline_scores(directory, multi_label):
    classifier = transformers.pipeline("zero-shot-classification", model=directory, device="cpu")
    out = classifier(TEXTS, CANDIDATES, hypothesis_template=TEMPLATE, multi_label=multi_label)
    return np.asarray([[o["scores"][o["labels"].index(c)] for c in CANDIDATES] for o in out])


# --- the pipeline's scores from imported checkpoints ----------------------------------------

@pytest.mark.parametrize("family,labels", [
    ("bert", ("contradiction", "neutral", "entailment")),  # MNLI's order (roberta-large-mnli, ...)
    ("albert", ("entailment", "not_entailment")),  # a binary universal classifier
    ("deberta-v2", ("entailment", "neutral", "contradiction")),  # nli-jax's IndoNLI export order
], ids=["bert-mnli-order", "albert-binary", "deberta-v2-indonli-order"])
def test_imported_checkpoint_scores_as_the_pipeline(tmp_path, family, labels):
    directory = _nli_checkpoint(tmp_path / family, family, labels)
    model = load_model(directory, workdir=str(tmp_path / "work"))
    assert model.columns.entailment == labels.index("entailment")
    for multi_label in (False, True):
        ours = model.scores(TEXTS, CANDIDATES, TEMPLATE, multi_label=multi_label)
        reference = _pipeline_scores(directory, multi_label)
        assert np.abs(ours - reference).max() <= TOLERANCE, (family, multi_label, ours, reference)
        # A wrong entailment column (the neighbouring one) is far off: the check can fail.
        wrong = model.label_scores(model.logits([(t, TEMPLATE.format(c)) for t in TEXTS for c in CANDIDATES])
                                   .reshape(3, 3, -1)[..., ::-1], multi_label)
        assert np.abs(wrong - reference).max() > 10 * TOLERANCE


# --- verbalisers ----------------------------------------------------------------------------

class KeywordNLI:
    """An NLI model stand-in: entailment when every word of the hypothesis's phrase occurs in the
    premise (the phrase: what the template adds), contradiction otherwise."""
    columns = nli_columns(("entailment", "neutral", "contradiction"), "stub")

    def __init__(self, template):
        self.before, _, self.after = template.partition("{}")

    def logits(self, pairs, name="zero_shot"):
        out = []
        for premise, hypothesis in pairs:
            phrase = hypothesis.removeprefix(self.before.split("{")[0]).removesuffix(self.after)
            words = [w for w in phrase.replace("tentang", " ").split() if w]
            hit = all(w in premise for w in words)
            out.append([4.0, 0.0, -4.0] if hit else [-4.0, 0.0, 4.0])
        return np.asarray(out, np.float32)

    label_scores = ZeroShotModel.label_scores


def _smsa_task(tmp_path, rows=SENTIMENT_ROWS):
    folder = tmp_path / "indonlu" / "smsa_doc-sentiment-prosa"
    folder.mkdir(parents=True)
    for split in ("train", "valid"):
        (folder / f"{split}_preprocess.tsv").write_text("".join(f"{t}\t{l}\n" for t, l in rows), encoding="utf-8")
    config = default_config("smsa", options_config("smsa"))
    cli.apply_overrides(config, [f"data.source={tmp_path / 'indonlu'}", f"data.tfds_dir={tmp_path / 'tfds'}"])
    task = create_task(build_plan(config, training=False))
    return config, task, task.load()


def test_default_verbaliser_maps_each_label_to_its_phrase(tmp_path):
    _, task, data = _smsa_task(tmp_path)
    verbalizer = verbalizer_for("smsa", task.labels, "single")
    assert hypotheses(task, verbalizer) == [["Sentimen teks ini negatif.", "Sentimen teks ini netral.",
                                             "Sentimen teks ini positif."]]
    examples = [data["validation"][i] for i in range(len(data["validation"]))]
    for multi_label in (False, True):
        scores = score_examples(KeywordNLI(verbalizer.template), task, verbalizer, examples, multi_label=multi_label)
        report = task.report("validation", examples, predictions_of(scores))
        # Broken once (DEFAULTS' sentiment phrases negative <-> positive swapped): f1 0.33.
        assert report["f1"] == 1.0, report


def test_a_task_plugs_in_by_its_label_set():
    # NusaX-Senti's labels in another order: the same default as SmSA, whatever the task's name.
    verbalizer = verbalizer_for("nusax_senti_jav", ("positive", "neutral", "negative"), "single")
    assert verbalizer == DEFAULTS[("single", frozenset({"negative", "neutral", "positive"}))]
    casa = verbalizer_for("casa", ("negative", "neutral", "positive"), "aspects")
    assert casa.hypothesis("positive", "fuel") == "Ulasan ini bernada positif tentang bahan bakar."
    user = verbalizer_for("mine", ("a", "b"), "single", template="Topiknya {}.", phrases={"a": "olahraga", "b": "politik"})
    assert user == Verbalizer("Topiknya {}.", {"a": "olahraga", "b": "politik"}, "single", user.aspects)


def test_aspect_task_scores_each_aspect_with_its_own_hypotheses(tmp_path):
    folder = tmp_path / "indonlu" / "casa_absa-prosa"
    folder.mkdir(parents=True)
    header = "sentence,fuel,machine,others,part,price,service\n"
    rows = ["bahan bakar positif mesin negatif,positive,negative,neutral,neutral,neutral,neutral\n",
            "harga negatif layanan positif,neutral,neutral,neutral,neutral,negative,positive\n"]
    for split in ("train", "valid"):
        (folder / f"{split}_preprocess.csv").write_text(header + "".join(rows), encoding="utf-8")
    config = default_config("casa", options_config("casa"))
    cli.apply_overrides(config, [f"data.source={tmp_path / 'indonlu'}", f"data.tfds_dir={tmp_path / 'tfds'}"])
    task = create_task(build_plan(config, training=False))
    examples = [task.load()["validation"][i] for i in range(2)]
    template = "{} {aspect}"  # the stub reads "<label phrase> <aspect phrase>" back from the premise

    class AspectKeywords(KeywordNLI):
        def logits(self, pairs, name="zero_shot"):
            rows = []
            for premise, hypothesis in pairs:
                label, aspect = hypothesis.split(" ", 1)
                said = f"{aspect} {label}" in premise or (label == "netral" and aspect not in premise)
                rows.append([4.0, 0.0, -4.0] if said else [-4.0, 0.0, 4.0])
            return np.asarray(rows, np.float32)
    verbalizer = verbalizer_for("casa", task.labels, "aspects", template=template,
                                phrases={"negative": "negatif", "neutral": "netral", "positive": "positif"})
    scores = score_examples(AspectKeywords("{}"), task, verbalizer, examples)
    assert scores.shape == (2, 6, 3)
    assert task.report("validation", examples, predictions_of(scores))["f1"] == 1.0


# --- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize("labels,fragment", [
    (("LABEL_0", "LABEL_1", "LABEL_2"), "no entailment label"),
    (("negative", "neutral", "positive"), "['negative', 'neutral', 'positive'] have no entailment"),
    (("entailment", "maybe", "contradiction"), "unknown ['maybe']"),
    (("entailment", "neutral"), "no single contradiction or not-entailment label"),
])
def test_checkpoint_labels_that_cannot_be_mapped_are_refused(labels, fragment):
    with pytest.raises(RunError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        nli_columns(labels, "ckpt")


def test_templates_and_label_lists_are_checked():
    with pytest.raises(RunError, match="exactly one `{}`"):
        check_template("Sentimen teks ini positif.", "single")
    with pytest.raises(RunError, match="no other field"):
        check_template("{} tentang {aspect}", "single")
    check_template("{} tentang {aspect}", "aspects")
    with pytest.raises(RunError, match="an empty label list"):
        parse_labels(" ")
    assert parse_labels("negative=sangat buruk,positive=baik") == {"negative": "sangat buruk", "positive": "baik"}
    with pytest.raises(RunError, match=r"lacks \['neutral'\]"):
        verbalizer_for("smsa", ("negative", "neutral", "positive"), "single", phrases={"negative": "a", "positive": "b"})
    with pytest.raises(RunError, match="has no default verbaliser"):
        verbalizer_for("mine", ("x", "y"), "single")
    with pytest.raises(RunError, match="NLI outcomes"):
        verbalizer_for("wrete", ("Entail_or_Paraphrase", "NotEntail"), "pair",
                       phrases={"Entail_or_Paraphrase": "entailment", "NotEntail": "entailment"})


def _command(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "finetune.zero_shot", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _one_line(proc, fragment):
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert fragment in errors[0], errors[0]


def test_command_classifies_a_split_and_refuses_bad_input_in_one_line(tmp_path):
    config, _, _ = _smsa_task(tmp_path)
    checkpoint = _nli_checkpoint(tmp_path / "nli", "bert", ("contradiction", "neutral", "entailment"))
    common = [f"--checkpoint={checkpoint}", "--task=smsa", f"--override=data.source={config.data.source}",
              f"--override=data.tfds_dir={config.data.tfds_dir}"]
    proc = _command(*common, f"--workdir={tmp_path / 'out'}", "--template=Sentimennya {} sekali.")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    report = results["splits"]["validation"]
    assert results["verbalizer"]["template"] == "Sentimennya {} sekali."
    assert {"f1", "accuracy", "calibration", "majority_baseline"} <= set(report) and report["count"] == 6
    records = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [r["label"] for r in records] == [label for _, label in SENTIMENT_ROWS]
    # The scores are the pipeline's for the same texts, template and phrases.
    classifier = transformers.pipeline("zero-shot-classification", model=checkpoint, device="cpu")
    phrases = ["negatif", "netral", "positif"]
    out = classifier([t for t, _ in SENTIMENT_ROWS], phrases, hypothesis_template="Sentimennya {} sekali.")
    reference = [[o["scores"][o["labels"].index(p)] for p in phrases] for o in out]
    ours = [[r["scores"][label] for label in ("negative", "neutral", "positive")] for r in records]
    assert np.abs(np.asarray(ours) - np.asarray(reference)).max() <= TOLERANCE

    _one_line(_command(*common, f"--workdir={tmp_path / 'b1'}", "--template=Sentimen teks ini."),
              "a template needs exactly one `{}`")
    _one_line(_command(*common, f"--workdir={tmp_path / 'b2'}", "--labels="), "an empty label list")
    bad = tmp_path / "sentiment_model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "bert", "id2label": {"0": "negative", "1": "positive"}}))
    _one_line(_command(*[a for a in common if not a.startswith("--checkpoint")], f"--checkpoint={bad}",
                       f"--workdir={tmp_path / 'b3'}"), "labels ['negative', 'positive'] have no entailment label")
