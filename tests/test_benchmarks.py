"""The benchmark harnesses run (tiny shapes) and print what the README quotes."""
import json
import subprocess
import sys

from conftest import REPO


def test_mlm_train_step_benchmark_reports_both_sides_and_ratio(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "benchmarks/mlm_train_step.py", "--model", "tiny-bert", "--steps", "1",
                           "--rounds", "1", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio nli-jax / pytorch-eager" in proc.stdout
    result = json.loads(out.read_text())
    assert result["nli-jax"]["tokens_per_s"] > 0 and result["pytorch-eager"]["tokens_per_s"] > 0
    assert result["ratio_nli_jax_over_pytorch"] > 0


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
