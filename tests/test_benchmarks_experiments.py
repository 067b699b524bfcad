"""The experiments of past issues (benchmarks/experiments/) still run as their commands, on tiny
budgets and slices of the real data, and write what their JSON promises (figures, ratios as the
quotients of their sides, the machine). Their results at full size are in docs/."""
import json
import subprocess
import sys

import numpy as np
import pytest

from benchmark_runs import assert_ratio, run_benchmark
from conftest import REPO


@pytest.fixture(scope="module")
def recipe_run(shared_data, tmp_path_factory):
    """One 20-step cell of the recipe search on 3,000 lines of two corpus files: (its workdir, the
    data folder it read, its result). The later experiments build on its data and its export."""
    root = tmp_path_factory.mktemp("recipe_search")
    corpus = root / "data" / "id_corpus_sample"
    corpus.mkdir(parents=True)
    for file in sorted((shared_data / "id_corpus_sample").glob("*.txt"))[:2]:
        with open(file, encoding="utf-8") as f:
            (corpus / file.name).write_text("".join(line for _, line in zip(range(3000), f)), encoding="utf-8")
    work = root / "w"
    _, result = run_benchmark("benchmarks.experiments.pretrain_recipe_search", f"--workdir={work}",
                              f"--data={root / 'data'}", "--name=bert", "--steps=20", "--eval_every=10",
                              tmp_path=root, timeout=900)
    return work, root / "data", result


@pytest.mark.slow  # a 20-step BERT on a slice of the real corpus: ~30 s
def test_pretrain_recipe_search(recipe_run):
    work, _, result = recipe_run
    assert [r["step"] for r in result["evaluations"]] == [10, 20]
    for r in result["evaluations"]:
        assert 0 <= r["mask_input_accuracy"] <= 1 and r["loss"] > 0 and r["tokens_per_s"] > 0 and r["constant"] > 0
    last = result["evaluations"][-1]
    assert result["ratios"]["mask_input_accuracy_over_constant"] == pytest.approx(
        last["mask_input_accuracy"] / last["constant"])
    cells = [json.loads(line) for line in (work / "search.jsonl").read_text().splitlines()]
    assert [c["name"] for c in cells] == ["bert"] and cells[0]["ratios"] == result["ratios"]
    assert (work / "runs" / "bert" / "export" / "vocab.txt").is_file()


@pytest.mark.slow  # a few steps of ELECTRA-small's width at 2 layers after the BERT cell: ~30 s
def test_electra_vs_bert(recipe_run, tmp_path):
    """ELECTRA-small (its width, --layers=2 of its 12) gets the steps its budget buys at the given
    rate, both held-out curves come with their wall times, and the plot is written."""
    work, data, _ = recipe_run
    proc, result = run_benchmark("benchmarks.experiments.electra_vs_bert", f"--workdir={work}", f"--data={data}",
                                 f"--bert_run={work / 'runs' / 'bert'}", "--seconds=10", "--seconds_per_step=1.0",
                                 "--evaluations=2", "--layers=2", tmp_path=tmp_path, timeout=900)
    assert "-> 8 steps" in proc.stdout  # 10 s at 1 s a step, 2 evaluations
    export = json.loads((work / "runs" / "electra_cpu_learn" / "export" / "config.json").read_text())
    assert (export["num_hidden_layers"], export["hidden_size"], export["embedding_size"]) == (2, 256, 128)
    assert [r["step"] for r in result["bert"]] == [10, 20]
    assert [r["step"] for r in result["electra"]] == [4, 8]
    for row in result["bert"] + result["electra"]:
        assert row["seconds"] is not None and 0 <= row["mlm_accuracy"] <= 1
    assert all(0 <= r["replaced_f1"] <= 1 for r in result["electra"])
    assert result["electra"][-1]["seconds"] >= result["electra"][0]["seconds"]
    assert_ratio(result, "electra_over_bert_seconds", result["electra_seconds"], result["bert_seconds"])
    if result["bert"][-1]["mlm_accuracy"] > 0:
        assert_ratio(result, "electra_over_bert_final_mlm_accuracy", result["electra"][-1]["mlm_accuracy"],
                     result["bert"][-1]["mlm_accuracy"])
    assert (work / "electra_vs_bert.png").stat().st_size > 0


@pytest.mark.slow  # 20 steps of nli-jax's loop and of the PyTorch loop on its batches: ~a minute
def test_pretrain_vs_transformers(recipe_run, tmp_path):
    work, data, _ = recipe_run
    _, result = run_benchmark("benchmarks.experiments.pretrain_vs_transformers", f"--workdir={work}",
                              f"--data={data}", "--steps=20", "--eval_every=10", tmp_path=tmp_path, timeout=900)
    curves = result["curves"]
    for side in ("nli-jax", "transformers"):
        assert [r["step"] for r in curves[side]] == [10, 20] and result["seconds"][side] > 0
        assert all(r["loss"] > 0 and 0 <= r["mlm_accuracy"] <= 1 for r in curves[side])
    assert_ratio(result, "nli_jax_over_transformers_seconds", result["seconds"]["nli-jax"],
                 result["seconds"]["transformers"])
    assert_ratio(result, "nli_jax_over_transformers_final_loss", curves["nli-jax"][-1]["loss"],
                 curves["transformers"][-1]["loss"])
    # From the same initial loss (ln of the 2,000-piece vocabulary), the two stay close over 20 steps.
    assert abs(curves["nli-jax"][-1]["loss"] - curves["transformers"][-1]["loss"]) < 0.5
    assert (work / "pretrain_vs_transformers.png").stat().st_size > 0


@pytest.mark.slow  # four short SmSA fine-tunes on IndoNLU's first rows: about a minute
def test_downstream_gain(recipe_run, shared_data, indonlu_small, tmp_path):
    """The export's arm loads its weights, the random arm has its shape and vocabulary; every
    (arm, seed) run is reported with the mean, sd and verdict."""
    work, _, _ = recipe_run
    export = work / "runs" / "bert" / "export"
    down = tmp_path / "down"
    data = _small_data(shared_data, indonlu_small, tmp_path)
    proc, result = run_benchmark("benchmarks.experiments.downstream_gain", f"--export={export}",
                                 f"--workdir={down}", f"--data={data}", "--tasks=smsa", "--seeds=1,2",
                                 "--epochs=smsa=1", "--train_limit=64", "--max_seq_length=32", tmp_path=tmp_path,
                                 timeout=900)
    assert sorted((r["arm"], r["seed"]) for r in result["runs"]) == [("pretrained", 1), ("pretrained", 2),
                                                                      ("random", 1), ("random", 2)]
    assert all(0 < r["f1"] <= 100 for r in result["runs"])
    assert set(result["verdicts"]) == {"smsa/pretrained vs random"}
    assert "| smsa | random |" in proc.stdout
    mean = {arm: sum(r["f1"] for r in result["runs"] if r["arm"] == arm) / 2 for arm in ("pretrained", "random")}
    assert_ratio(result, "smsa/pretrained_over_random_f1", mean["pretrained"], mean["random"])
    # The pretrained arm starts from the export (its encoder weights), the random arm does not.
    logs = {arm: (down / f"smsa_{arm}_seed1" / "train.log").read_text() for arm in ("pretrained", "random")}
    assert str(export) in logs["pretrained"] and str(export) not in logs["random"]


@pytest.mark.slow  # features of 200 texts per split, twice per task: about a minute
def test_probe_pretrained(recipe_run, shared_data, tmp_path):
    work, _, _ = recipe_run
    corpus = sorted((work / "corpus").glob("corpus-*.txt"))[0]
    _, result = run_benchmark("benchmarks.experiments.probe_pretrained", f"--export={work / 'runs' / 'bert' / 'export'}",
                              f"--corpus={corpus}", f"--data={shared_data}", "--limit=200", tmp_path=tmp_path,
                              timeout=900)
    context = result["context_check"]
    assert context["predictions"] > 0 and 0 <= context["accuracy"] <= 1 and context["distinct_predictions"] >= 1
    assert set(result["probe_macro_f1"]) == {"emot/mean", "emot/pooled", "smsa/mean", "smsa/pooled"}
    for key, f1 in result["probe_macro_f1"].items():
        assert_ratio(result, f"{key}_pretrained_over_random_init_f1", f1["pretrained"], f1["random init"])


@pytest.mark.slow  # 4 steps of a toy task in both frameworks, and their imports: ~25 s
def test_mlm_plateau_toy(tmp_path):
    _, result = run_benchmark("benchmarks.experiments.mlm_plateau_toy", "--seeds=0", "--steps=4",
                              "--report_every=2", tmp_path=tmp_path)
    for seed in ("0",):
        rows = result["seeds"][seed]
        assert [r["step"] for r in rows] == [2, 4]
        # Both start at the uniform loss ln(1990) = 7.6 from the same weights on the same batches.
        assert all(abs(r["nli_jax_loss"] - r["transformers_loss"]) < 0.05 and 7 < r["nli_jax_loss"] < 8.5
                   for r in rows), rows
        assert_ratio(result, f"seed{seed}_nli_jax_over_transformers_final_loss", rows[-1]["nli_jax_loss"],
                     rows[-1]["transformers_loss"])


def _small_data(shared_data, indonlu_small, root):
    """A data folder with two small corpus files and the real IndoNLU's first rows beside them."""
    corpus = root / "data" / "id_corpus_sample"
    corpus.mkdir(parents=True)
    for name in ("talpco.txt", "frog_storytelling.txt"):
        (corpus / name).write_bytes((shared_data / "id_corpus_sample" / name).read_bytes())
    (root / "data" / "indonlu").symlink_to(indonlu_small)
    return root / "data"


@pytest.mark.slow  # a 20-step pretraining 64 wide and two SmSA fine-tunes of 64 examples: ~30 s
def test_pretrain_id_corpus(shared_data, indonlu_small, tmp_path):
    data = _small_data(shared_data, indonlu_small, tmp_path)
    work = tmp_path / "work"
    _, result = run_benchmark("benchmarks.experiments.pretrain_id_corpus", f"--workdir={work}", f"--data={data}",
                              "--steps=20", "--batch=8", "--vocab_size=1000", "--hidden_size=64",
                              "--finetune_epochs=smsa=1", "--train_limit=64", tmp_path=tmp_path, timeout=900)
    assert result["steps"] == 20 and list(result["heldout_mlm_accuracy"]) == ["20"]
    scores = result["scores"]
    assert set(scores) == {"smsa/pretrained", "smsa/random"} and all(0 < s["f1"] <= 100 for s in scores.values())
    assert_ratio(result, "smsa_pretrained_over_random_f1", scores["smsa/pretrained"]["f1"], scores["smsa/random"]["f1"])
    assert "| smsa | 1 |" in (work / "report.md").read_text()


@pytest.mark.slow  # a tiny BERT continued 4 steps, then two 4-step SmSA fine-tunes: ~40 s
def test_continued_pretraining_gain(shared_data, indonlu_small, tiny_bert_dir, tmp_path):
    """A BERT checkpoint (MiniLM-L6's vocabulary, the tiny-bert shape) continued on the corpus, its
    held-out curve, and both arms fine-tuned: the report's ratios are the runs' own quotients."""
    data = _small_data(shared_data, indonlu_small, tmp_path)
    work = tmp_path / "work"
    _, result = run_benchmark("benchmarks.experiments.continued_pretraining_gain", f"--workdir={work}",
                              f"--data={data}", f"--init={tiny_bert_dir}", "--pretrain_steps=4", "--evaluations=2",
                              "--heldout_examples=16", "--finetune=smsa:4", "--seeds=1", "--max_seq_length=32",
                              "--batch=8", tmp_path=tmp_path, timeout=900)
    assert result["pretrain"]["steps"] == 4 and [c[0] for c in result["pretrain"]["curve"]] == [2, 4]
    original, continued = result["finetune"]["smsa/original"], result["finetune"]["smsa/continued"]
    assert original["metric"] == "f1" and 0 < original["mean"] <= 1 and 0 < continued["mean"] <= 1
    assert_ratio(result, "smsa_continued_over_original", continued["mean"], original["mean"])
    if result["before"]["mlm_accuracy"] > 0:
        assert_ratio(result, "heldout_mlm_accuracy_after_over_before", result["pretrain"]["curve"][-1][1],
                     result["before"]["mlm_accuracy"])
    assert "| smsa | 4 | f1 |" in (work / "report.md").read_text()
    assert (work / "heldout_mlm_accuracy.png").stat().st_size > 0


@pytest.mark.slow  # two tiny-BERT fine-tunes of 96 pairs through finetune.main, a data map: ~30 s
def test_dynamics_and_calibration_indonli(shared_data, tiny_bert_dir, tmp_path):
    if not (shared_data / "indonli" / "train.jsonl").is_file():
        pytest.skip(f"{shared_data / 'indonli'} has no train.jsonl")
    _, result = run_benchmark("benchmarks.experiments.dynamics_and_calibration_indonli", f"--data={shared_data}",
                              f"--workdir={tmp_path / 'work'}", f"--model={tiny_bert_dir}", "--train_pairs=96",
                              "--test_pairs=32", "--val_pairs=32", "--epochs=2", "--max_seq_length=32", "--batch=8",
                              tmp_path=tmp_path, timeout=900)
    assert result["flipped"] == 5  # 5% of 96
    regions = result["cartography"]  # a third of the pairs each, by confidence or variability (they may overlap)
    for r in ("easy_to_learn", "ambiguous", "hard_to_learn"):
        assert 0 < regions[r]["examples"] <= 96 and 0 <= regions[r]["flipped"] <= 5, regions
    hard = regions["hard_to_learn"]
    assert result["ratios"]["hard_to_learn_over_overall_flipped_share"] == pytest.approx(
        (hard["flipped"] / hard["examples"]) / (5 / 96))
    rates = result["train_examples_per_s"]
    assert_ratio(result, "with_over_without_dynamics_examples_per_s", rates["with_dynamics"], rates["without"])
    for split in ("validation", "test_lay"):
        assert 0 <= result["calibration"][split]["raw"]["ece"] <= 1


@pytest.mark.slow  # 20 steps of nli-jax's crammed step and of transformers' ModernBertForMaskedLM: ~two minutes
def test_crammed_vs_transformers(recipe_run, tmp_path):
    """From nli-jax's initial parameters (--same_init), transformers' ModernBertForMaskedLM trained by
    the PyTorch loop on the same batches with the same AdamW, triangle, ramp (k up to 4 by step 4)
    and clipping gives the same loss at every step (within 1e-3): the update rules agree, ramp included."""
    work, data, _ = recipe_run
    _, result = run_benchmark("benchmarks.experiments.crammed_vs_transformers", f"--workdir={work}",
                              f"--data={data}", "--steps=20", "--window=10", "--same_init", "--ramp_fraction=0.2",
                              tmp_path=tmp_path, timeout=900)
    curves = result["curves"]
    assert len(curves["nli-jax"]) == len(curves["transformers"]) == 20 and result["steps"] == 20
    assert all(abs(curves[side][0] - np.log(2000)) < 0.3 for side in ("nli-jax", "transformers"))
    # k = floor(1 + 3 x step / 4) = 1, 1, 2, 3, 4, 4, ...: updates at steps 0, 1, 5, 9, 13, 17 and the last (19).
    assert [i for i, u in enumerate(curves["update"]) if u] == [0, 1, 5, 9, 13, 17, 19] and result["updates"] == 7
    # Cramming's triangle: a quarter of the peak at step 0, then up to 1e-3.
    assert curves["lr"][0] == pytest.approx(0.25e-3) and max(curves["lr"]) == pytest.approx(1e-3, rel=0.1)
    assert result["max_gap"]["per_step"] == pytest.approx(
        max(abs(a - b) for a, b in zip(curves["nli-jax"], curves["transformers"])))
    assert result["max_gap"]["per_step"] < 1e-3 and curves["nli-jax"][-1] < curves["nli-jax"][0] - 0.05
    assert_ratio(result, "nli_jax_over_transformers_seconds", result["curves"]["seconds"]["nli-jax"],
                 result["curves"]["seconds"]["transformers"])
    assert (work / "crammed_vs_transformers.png").stat().st_size > 0


@pytest.mark.slow  # 6 steps of each side: ~40 s
def test_crammed_vs_transformers_from_transformers_draw(recipe_run, tmp_path):
    """--init_from=transformers: nli-jax's model holds transformers' own draw of --seed (the first
    losses agree within 1e-4: nli-jax's own draw of seed 1 starts 0.0065 away), and the two trainers
    then agree step by step."""
    work, data, _ = recipe_run
    _, result = run_benchmark("benchmarks.experiments.crammed_vs_transformers", f"--workdir={work}",
                              f"--data={data}", "--steps=6", "--window=3", "--seed=1", "--init_from=transformers",
                              "--ramp_fraction=0.2", tmp_path=tmp_path, timeout=900)
    curves = result["curves"]
    assert result["init_from"] == "transformers" and len(curves["nli-jax"]) == 6
    assert abs(curves["nli-jax"][0] - curves["transformers"][0]) < 1e-4
    assert result["max_gap"]["per_step"] < 1e-3


@pytest.mark.slow  # two budgeted runs of 6 s of training steps each, with their evaluations: ~a minute or two
def test_crammed_vs_bert(recipe_run, tmp_path):
    """Each arm's steps come from the same budget (its own step time), its held-out curve with wall
    times; the exports exist for downstream_gain."""
    work, data, _ = recipe_run
    _, result = run_benchmark("benchmarks.experiments.crammed_vs_bert", f"--workdir={work}", f"--data={data}",
                              "--minutes=0.1", "--eval_every=40", tmp_path=tmp_path, timeout=900)
    for arm in ("bert", "crammed"):
        curve = result["curves"][arm]
        assert curve[-1]["step"] == result["steps"][arm] > 0
        assert all(r["seconds"] is not None and 0 <= r["mlm_accuracy"] <= 1 for r in curve)
        config = json.loads((work / "runs" / f"budget_{arm}_0.1" / "export" / "config.json").read_text())
        assert config["model_type"] == {"bert": "bert", "crammed": "modernbert"}[arm]
        state = json.loads((work / "runs" / f"budget_{arm}_0.1" / "run.json").read_text())
        assert state["total_steps"] == result["steps"][arm]
    assert_ratio(result, "crammed_over_bert_steps", result["steps"]["crammed"], result["steps"]["bert"])
    # Both arms scored on the same held-out masks (15%), though crammed trains at 30%.
    assert result["heldout_masked_tokens"]["bert"] == result["heldout_masked_tokens"]["crammed"] > 0
    assert (result["curves"]["bert"][-1]["mask_input_constant_baseline"]
            == result["curves"]["crammed"][-1]["mask_input_constant_baseline"])  # the same [MASK] targets
    assert result["heldout_mask_prob"] == 0.15 and "ahead" in result["verdict"]
    assert (work / "crammed_vs_bert.png").stat().st_size > 0


@pytest.mark.slow  # two tiny programs through the TPU compiler (libtpu) on this host: about a minute
def test_crammed_tpu_projection(tmp_path):
    """Each row's FLOPs per token, tokens per hour and day's tokens follow from launch.compile's own
    report (the compiler's count and step time)."""
    _, result = run_benchmark("benchmarks.experiments.crammed_tpu_projection", f"--workdir={tmp_path / 'w'}",
                              "--rows=configs/pretrain/crammed.py:cpu_test@v3-8@--config.model.attention=plain,"
                              "configs/pretrain/indobert_base.py:cpu_test@v3-8@", tmp_path=tmp_path, timeout=900)
    crammed, bert = result["rows"]
    assert (crammed["tokens_per_step"], bert["tokens_per_step"]) == (16 * 64, 16 * 64)
    for row in (crammed, bert):
        assert row["fits"] and row["step_seconds"] > 0
        assert row["tokens_per_hour"] == pytest.approx(row["tokens_per_step"] / row["step_seconds"] * 3600)
        assert row["compiler_flops_per_token"] == pytest.approx(row["formula_flops_per_token"], rel=0.5)
    assert_ratio(result, "first_over_last_tokens_per_hour", crammed["tokens_per_hour"], bert["tokens_per_hour"])


def test_zero_shot_experiment_scores_nusax_languages_against_the_majority(tmp_path):
    """benchmarks.experiments.zero_shot_indonesian (issue 50) on a random NLI checkpoint and two synthetic
    NusaX languages: its macro-F1 is scikit-learn's on the model's own scores, beside the majority baseline."""
    import os
    import subprocess
    import sys

    from conftest import REPO
    from nli_jax.zero_shot import load_model
    from test_zero_shot import SENTIMENT_ROWS, _nli_checkpoint
    from sklearn.metrics import f1_score
    checkpoint = _nli_checkpoint(tmp_path / "nli", "bert", ("entailment", "neutral", "contradiction"))
    valid = SENTIMENT_ROWS + SENTIMENT_ROWS[3:4]  # positive 3 times: a constant prediction's F1 depends on its label
    for language in ("javanese", "sundanese"):
        folder = tmp_path / "nusax" / "sentiment" / language
        folder.mkdir(parents=True)
        for split, rows in (("train", SENTIMENT_ROWS + SENTIMENT_ROWS[:1]), ("valid", valid)):
            (folder / f"{split}.csv").write_text("id,text,label\n" + "".join(
                f'{i},"{t}",{label}\n' for i, (t, label) in enumerate(rows)), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.experiments.zero_shot_indonesian",
                           f"--checkpoints={checkpoint}", f"--nusax={tmp_path / 'nusax'}", "--languages=javanese,sundanese",
                           f"--workdir={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())[checkpoint]
    model = load_model(checkpoint, workdir=str(tmp_path / "work"))
    labels = ["negative", "neutral", "positive"]
    predicted = model.scores([t for t, _ in valid], ["negatif", "netral", "positif"], "Sentimen teks ini {}.").argmax(-1)
    gold = [label for _, label in valid]
    expected = f1_score(gold, [labels[i] for i in predicted], average="macro", zero_division=0)
    assert results["nusax_javanese"]["f1"] == pytest.approx(expected, abs=1e-9)
    # The training split's most frequent label ("positive": one more row) predicted throughout.
    assert results["nusax_sundanese"]["majority_f1"] == pytest.approx(
        f1_score(gold, ["positive"] * len(gold), average="macro", zero_division=0))
    assert "| nusax_javanese |" in (tmp_path / "out" / "table.md").read_text()
    # A checkpoint whose export records SmSA among its training data is refused on NusaX, in one line.
    import shutil
    trained = tmp_path / "trained_on_smsa"
    shutil.copytree(checkpoint, trained)
    config = json.loads((trained / "config.json").read_text())
    config.setdefault("nli_jax", {})["trained_on"] = {"smsa": "the run R"}
    (trained / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.experiments.zero_shot_indonesian",
                           f"--checkpoints={trained}", f"--nusax={tmp_path / 'nusax'}", "--languages=javanese",
                           f"--workdir={tmp_path / 'out_refused'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode != 0 and "the run R trained on smsa, and nusax's texts are smsa's" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # WSD and one-cycle for 1.2 s of steps each, three 4-step decays, six 32-example fine-tunes: ~1.5 minutes
def test_new_languages_decay(shared_data, tmp_path):
    """Issue 52's new-languages experiment on two languages: the decays' curves come from their own
    checkpoints (the Indonesian held-out accuracy at each evaluation is the run's own), the fertility
    is vocab_extension.json's, the F1 the fine-tuning runs', and the targets and ratios follow."""
    if not (shared_data / "nusax" / "mt" / "valid.csv").is_file():
        pytest.skip(f"no NusaX MT text at {shared_data / 'nusax' / 'mt'}")
    data = tmp_path / "data"
    (data / "id_corpus_sample").mkdir(parents=True)
    for name in ("talpco.txt", "frog_storytelling.txt"):
        (data / "id_corpus_sample" / name).write_bytes((shared_data / "id_corpus_sample" / name).read_bytes())
    (data / "nusax").symlink_to(shared_data / "nusax")
    work, languages = tmp_path / "work", ["javanese", "sundanese"]
    command = ["benchmarks.experiments.new_languages_decay", f"--workdir={work}", f"--data={data}",
               "--pretrain_minutes=0.02", "--calibration_steps=2", "--eval_every=10", "--decay_steps=4", "--evaluations=2",
               f"--languages={','.join(languages)}", "--heldout_examples=32", "--new_pieces=50", "--seeds=1",
               "--finetune_epochs=1", "--finetune_limit=32", "--finetune_max_seq_length=32", "--batch=8",
               "--vocab_size=1000"]
    _, result = run_benchmark(*command, tmp_path=tmp_path, timeout=900)
    for arm in ("wsd", "one_cycle"):  # equal minutes of training steps
        config = json.loads((work / "pretrain" / arm / "config.json").read_text())
        assert config["train"]["budget_minutes"] == 0.02 and result[arm]["curve"][-1]["step"] == result[arm]["steps"]
    verdict = result["wsd_vs_one_cycle"]
    assert verdict["wsd_ahead"] == (verdict["wsd"] > verdict["one_cycle"]) and verdict["minutes"] == 0.02
    decays = result["decays"]
    for arm in ("a", "b", "c"):
        decay = decays[arm]
        assert decay["steps"] == result["decay_steps"] == 4
        assert [p["step"] for p in decay["curve"]] == [0, 2, 4] == [0] + [h["step"] for h in decay["run_heldout"]]
        for point, own in zip(decay["curve"][1:], decay["run_heldout"]):  # the checkpoint's parameters, scored again
            assert point["indonesian"] == pytest.approx(own["mlm_accuracy_indonesian"], abs=1e-6)
        for point in decay["curve"]:
            assert set(point["languages"]) == {*languages, "nusax_indonesian"}
            assert all(0 <= a <= 1 for a in point["languages"].values())
            assert all(n > 0 for n in point["masked_tokens"].values())
    # (a)'s held-out split is the Indonesian pairs alone: its loss at each evaluation is the run's own, to float
    # precision, and moves from the start's (the parameters are each evaluation's, not the pre-decay ones).
    losses = [p["indonesian_loss"] for p in decays["a"]["curve"]]
    assert losses[1:] == pytest.approx([h["loss"] for h in decays["a"]["run_heldout"]], rel=1e-5)
    assert losses[-1] != pytest.approx(losses[0], rel=1e-6)
    assert [c.split("=")[0] for c in decays["a"]["corpus"]] == ["indonesian"]
    assert [c.split("=")[0] for c in decays["c"]["corpus"]] == ["indonesian", *languages]
    assert decays["a"]["curve"][0] == decays["b"]["curve"][0]  # the same pre-decay parameters and tokenizer
    assert decays["c"]["tokenizer"] == str(work / "vocab_extended")
    extension = json.loads((work / "vocab_extended" / "vocab_extension.json").read_text())
    assert result["extension"]["fertility_train"] == extension["fertility"] and set(extension["fertility"]) == set(languages)
    assert 0 < result["extension"]["new_pieces"] == len(extension["new_pieces"]) <= 50
    for language in languages:  # the pieces trained on the training text shorten the validation text too
        v = result["extension"]["fertility_validation"][language]
        assert v["after"] < v["before"] and v["words"] > 0

    def mean(values):
        return sum(values) / len(values)
    for arm in ("a", "b", "c"):
        finetune = result["finetune"][arm]
        f1 = {lang: json.loads((work / "finetune" / arm / lang / "seed_1" / "results.json").read_text())
              ["splits"]["validation"]["f1"] for lang in languages}
        assert {lang: finetune["languages"][lang]["values"] for lang in languages} == {l: [f] for l, f in f1.items()}
        assert finetune["local_mean"]["mean"] == pytest.approx(mean(list(f1.values())))
    local = {arm: [mean([p["languages"][lang] for lang in languages]) for p in decays[arm]["curve"]] for arm in decays}
    accuracy = result["targets"]["c_ahead_of_a_local_accuracy_at_every_evaluation"]
    margins = [c - a for a, c in zip(local["a"][1:], local["c"][1:])]
    assert accuracy["margins"] == pytest.approx(margins) and accuracy["holds"] == all(m > 0 for m in margins)
    f1_target = result["targets"]["c_ahead_of_a_local_f1_by_more_than_larger_sd"]
    f1_means = {arm: result["finetune"][arm]["local_mean"]["mean"] for arm in ("a", "c")}
    assert f1_target["margin"] == pytest.approx(f1_means["c"] - f1_means["a"]) and f1_target["larger_sd"] == 0.0
    assert f1_target["holds"] == (f1_target["margin"] > 0)
    quotients = {f"{arm}_over_a_local_accuracy_final": (local[arm][-1], local["a"][-1]) for arm in ("b", "c")}
    quotients.update({f"{arm}_over_a_indonesian_accuracy_final": (decays[arm]["curve"][-1]["indonesian"],
                                                                   decays["a"]["curve"][-1]["indonesian"])
                      for arm in ("b", "c")})
    quotients["c_over_a_local_f1"] = f1_means["c"], f1_means["a"]
    quotients["wsd_over_one_cycle_final_mlm_accuracy"] = (result["wsd"]["curve"][-1]["mlm_accuracy"],
                                                          result["one_cycle"]["curve"][-1]["mlm_accuracy"])
    for name, (numerator, denominator) in quotients.items():  # a tiny run's held-out accuracy may be 0
        if denominator == 0:
            assert name not in result["ratios"]
        elif numerator == 0:
            assert result["ratios"][name] == 0
        else:
            assert_ratio(result, name, numerator, denominator)
    report = (work / "report.md").read_text()
    assert "| c | 4 |" in report and "## Targets" in report and (work / "decay_curves.png").stat().st_size > 0
    # Rerun: every stage is in report.json and nothing runs again; other sizes in the same workdir are refused.
    _, again = run_benchmark(*command, tmp_path=tmp_path, timeout=300)
    assert (again["decays"], again["finetune"], again["wsd"]) == (result["decays"], result["finetune"], result["wsd"])
    refused = subprocess.run([sys.executable, "-m", *command, "--decay_steps=6"], cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode != 0 and "holds a run with other settings (decay_steps)" in refused.stderr
