"""The benchmark harnesses run (tiny shapes) and print what the README quotes."""
import json
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_mlm_train_step_benchmark_reports_every_side_and_ratio(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "benchmarks/mlm_train_step.py", "--model", "tiny-bert", "--steps", "1",
                           "--rounds", "2", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio nli-jax / pytorch-eager" in proc.stdout
    result = json.loads(out.read_text())
    # The loop's own jitted step, the hand-written one (labelled) and the PyTorch peer.
    assert "make_train_step" in result["nli_jax_step"]
    for side in ("nli-jax", "nli-jax-handwritten", "pytorch-eager"):
        r = result[side]
        assert r["tokens_per_s"] > 0 and r["steps"] == 2, (side, r)
        assert 0 < r["min_step_s"] <= r["median_step_s"] <= r["max_step_s"], (side, r)
    assert result["ratio_nli_jax_over_pytorch"] > 0 and result["ratio_handwritten_over_pytorch"] > 0
    assert result["ratio_nli_jax_over_pytorch"] == pytest.approx(
        result["pytorch-eager"]["median_step_s"] / result["nli-jax"]["median_step_s"], rel=1e-2)


def test_input_pipeline_benchmark_runs_on_the_fixture_corpus(tmp_path):
    out = tmp_path / "result.json"
    corpus = REPO / "nli_jax" / "data" / "fixtures" / "corpus_tiny" / "*.txt"
    proc = subprocess.run([sys.executable, "benchmarks/input_pipeline.py", f"--corpus={corpus}", "--vocab_size=300",
                           "--batch=16", "--batches=3", "--workers=0", f"--workdir={tmp_path / 'work'}",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["words_per_s"] > 0 and result["nli_jax_seq_per_s_0_workers"] > 0
    assert result["peer_transformers_collator_seq_per_s"] > 0 and "ratio nli-jax / peer" in proc.stdout


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_finetune_vs_transformers_smoke_on_real_indonli(tmp_path, shared_data, minilm_dir):
    indonli = shared_data / "indonli"
    if not (indonli / "train.jsonl").is_file() or not (indonli / "val.jsonl").is_file():
        pytest.skip(f"IndoNLI train.jsonl / val.jsonl not found in {indonli}")
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "benchmarks/finetune_vs_transformers.py", f"--model={minilm_dir}",
                           f"--data={indonli}", "--train_pairs=32", "--eval_pairs=32", "--max_seq_length=64",
                           "--seeds=1", "--epochs=1", "--batch_size=16", f"--workdir={tmp_path / 'work'}",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "nli-jax / transformers" in proc.stdout
    result = json.loads(out.read_text())
    summary = result["summary"]["64"]
    for side in ("nli-jax", "transformers"):
        s = summary[side]
        assert s["train_examples_per_s"]["mean"] > 0 and s["eval_examples_per_s"]["mean"] > 0, (side, s)
        assert 0.0 <= s["accuracy"]["mean"] <= 1.0, (side, s)
        assert s["end_to_end_s"]["mean"] > s["train_s"]["mean"] > 0, (side, s)
    ratio = summary["ratio_nli_jax_over_transformers"]
    assert all(ratio[k] > 0 for k in ("end_to_end_time", "train_examples_per_s", "eval_examples_per_s")), ratio
    # Both sides trained on the same 2 batches of 16 and evaluated the same 32 validation pairs;
    # nli-jax through its own loop (results.json in its run directory).
    runs = {r["side"]: r for r in result["runs"]}
    assert {r["train_examples"] for r in runs.values()} == {32}
    assert {r["eval_examples"] for r in runs.values()} == {32}
    assert (tmp_path / "work" / "runs" / "nli-jax" / "len64_seed1" / "run" / "results.json").is_file()
    assert runs["nli-jax"]["train_compile_s"] > 0
    assert result["nli_jax_commands"]["len64_seed1"].startswith("python -m finetune.main --config=configs/indonli_base.py")
    assert all(0.3 < r["peak_rss_gb"] < 24 for r in runs.values()), runs


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_finetune_vs_transformers_smoke_on_real_nerp(tmp_path, shared_data, minilm_dir):
    """The tagging side: nli-jax's NERP run (packed) against the token-classification loop, the
    same sentences, F1 on both, each run's peak RSS."""
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "benchmarks/finetune_vs_transformers.py", "--task=nerp",
                           f"--model={minilm_dir}", f"--data={shared_data / 'indonlu'}", "--train_pairs=32",
                           "--eval_pairs=24", "--max_seq_length=64", "--seeds=1", "--batch_size=16",
                           "--eval_batch_size=16", f"--workdir={tmp_path / 'work'}", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    runs = {r["side"]: r for r in result["runs"]}
    assert {r["train_examples"] for r in runs.values()} == {32} and {r["eval_examples"] for r in runs.values()} == {24}
    assert all(0.0 <= r["accuracy"] <= 1.0 and 0.3 < r["peak_rss_gb"] < 24 for r in runs.values()), runs
    assert result["settings"]["metric"] == "f1" and "val f1" in proc.stdout
    assert result["nli_jax_commands"]["len64_seed1"].startswith("python -m finetune.main --config=configs/indonlu.py:task=nerp")


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_dynamics_cost_benchmark_times_both_steps(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "benchmarks/dynamics_cost.py", "--model=tiny", "--rounds=2", "--steps=2",
                           f"--json={out}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["machine"]["cpu"] and result["ratio_with_over_without"] > 0 and "ratio with / without" in proc.stdout
    for side in ("with", "without"):
        assert 0 < result[side]["min_step_s"] <= result[side]["median_step_s"] <= result[side]["max_step_s"]


@pytest.mark.slow  # three cpu_test fine-tunings: a minute
def test_compilation_cache_benchmark_reads_the_rerun_and_the_next_cell_from_the_cache(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "benchmarks/compilation_cache.py", "--cpu_test", f"--workdir={tmp_path / 'w'}",
                           f"--json={out}"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert proc.stdout.startswith("CPU: ") and runs["cold"]["cache_hits"] == 0 and runs["cold"]["programs"] > 0
    for name in ("rerun", "next_sweep_cell"):
        assert runs[name]["cache_hits"] >= runs[name]["programs"] - 1, runs
        assert runs[name]["seconds"] < 0.25 * runs["cold"]["seconds"], runs


@pytest.mark.slow  # a tiny pretraining run, then four short fine-tunes: about a minute
def test_downstream_gain_compares_a_pretrained_export_with_random_init_on_real_smsa(tmp_path, shared_data):
    """benchmarks/downstream_gain.py: the export's arm loads its weights, the random arm has its shape
    and vocabulary; every (arm, seed) run is reported with the mean, sd and verdict."""
    pre = tmp_path / "pre"
    proc = subprocess.run([sys.executable, "-m", "pretrain.main", "--config=configs/pretrain/indobert_base.py:cpu_test",
                           f"--workdir={pre}", "--config.train.max_steps=20", "--config.train.eval_every_steps=20",
                           "--config.train.checkpoint_every_steps=20"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp_path / "down"
    proc = subprocess.run([sys.executable, "benchmarks/downstream_gain.py", f"--export={pre / 'export'}",
                           f"--workdir={work}", f"--data={shared_data}", "--tasks=smsa", "--seeds=1,2",
                           "--epochs=smsa=1", "--train_limit=64", "--max_seq_length=64"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads((work / "downstream_gain.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in result["runs"]) == [("pretrained", 1), ("pretrained", 2),
                                                                      ("random", 1), ("random", 2)]
    assert all(0 < r["f1"] <= 100 for r in result["runs"])
    assert set(result["verdicts"]) == {"smsa/pretrained vs random"}
    assert proc.stdout.startswith("CPU: ") and "| smsa | random |" in proc.stdout
    # The pretrained arm starts from the export (its encoder weights), the random arm does not.
    logs = {arm: (work / f"smsa_{arm}_seed1" / "train.log").read_text() for arm in ("pretrained", "random")}
    assert str(pre / "export") in logs["pretrained"] and str(pre / "export") not in logs["random"]


@pytest.mark.slow  # a 20-step BERT and a few ELECTRA-small steps on a slice of the real corpus: minutes
def test_electra_vs_bert_puts_both_runs_on_one_wall_clock(tmp_path, shared_data):
    """benchmarks/electra_vs_bert.py after a BERT run of benchmarks/pretrain_recipe_search.py on the
    same prepared corpus: ELECTRA-small gets the steps its budget buys at the given rate, both
    held-out curves come with their wall times, and the plot is written."""
    corpus = tmp_path / "data" / "id_corpus_sample"
    corpus.mkdir(parents=True)
    for file in sorted((shared_data / "id_corpus_sample").glob("*.txt"))[:2]:
        with open(file, encoding="utf-8") as f:
            (corpus / file.name).write_text("".join(line for _, line in zip(range(3000), f)), encoding="utf-8")
    work = tmp_path / "w"
    proc = subprocess.run([sys.executable, "benchmarks/pretrain_recipe_search.py", f"--workdir={work}",
                           f"--data={tmp_path / 'data'}", "--name=bert", "--steps=20", "--eval_every=10"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    proc = subprocess.run([sys.executable, "benchmarks/electra_vs_bert.py", f"--workdir={work}",
                           f"--data={tmp_path / 'data'}", f"--bert_run={work / 'runs' / 'bert'}", "--seconds=10",
                           "--seconds_per_step=1.0", "--evaluations=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.startswith("CPU: ") and "-> 8 steps" in proc.stdout  # 10 s at 1 s a step, 2 evaluations
    result = json.loads((work / "electra_vs_bert.json").read_text())
    assert [r["step"] for r in result["bert"]] == [10, 20]
    assert [r["step"] for r in result["electra"]] == [4, 8]
    for row in result["bert"] + result["electra"]:
        assert row["seconds"] is not None and 0 <= row["mlm_accuracy"] <= 1
    assert all(0 <= r["replaced_f1"] <= 1 for r in result["electra"])
    assert result["electra"][-1]["seconds"] >= result["electra"][0]["seconds"]
    assert (work / "electra_vs_bert.png").stat().st_size > 0
