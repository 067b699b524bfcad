"""The performance benchmarks (benchmarks/) run as their commands, on tiny shapes, and write what
their JSON promises: every side's figures, the ratios as the sides' quotients, the machine they ran
on. The experiments of past issues (benchmarks/experiments/): tests/test_benchmarks_experiments.py."""
import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmark_runs import assert_ratio, run_benchmark
from conftest import REPO

BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.rglob("*.py") if p.name not in ("__init__.py", "harness.py"))


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


# --- the harness and the package's shape -------------------------------------------------------

def test_benchmarks_leave_sys_path_alone_and_use_only_the_librarys_public_api():
    """Run as modules from the repository root, they import the library and each other as packages
    (no sys.path edits) and call no private name of nli_jax (no loop._checked_setup)."""
    for path in [*SCRIPTS, BENCHMARKS / "harness.py"]:
        source = path.read_text(encoding="utf-8")
        assert "sys.path" not in source, f"{path.name} edits sys.path"
        tree = ast.parse(source)
        nli_jax_modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                           for a in n.names if a.name.startswith("nli_jax")}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if (node.module or "").startswith("nli_jax"):
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    assert not private, f"{path.name} imports private {private} from {node.module}"
                    nli_jax_modules |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):  # loop._checked_setup, nli_jax.train.loop._train_batches and the like
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in nli_jax_modules:
                    pytest.fail(f"{path.name}:{node.lineno} uses a private name of nli_jax: .{node.attr}")


def test_every_benchmark_has_a_smoke_test_and_the_docs_run_them_as_modules():
    tests = "".join(p.read_text(encoding="utf-8") for p in (REPO / "tests").glob("test_benchmarks*.py"))
    untested = [module_name(p) for p in SCRIPTS if f'"{module_name(p)}"' not in tests]
    assert not untested, f"no smoke test runs {untested}"
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "tests").glob("*.py"))]
    modules = {module_name(p) for p in SCRIPTS} | {"benchmarks.harness"}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"python3? benchmarks/", text), f"{page.name} runs a benchmark by its path"
        named = set(re.findall(r"\bbenchmarks(?:\.\w+)+", text)) - modules
        named = {n for n in named if not n.split(".")[-1].isupper()  # benchmarks.NAME: a placeholder
                 and not any(m.startswith(n + ".") or n.startswith(m + ".") for m in modules)}
        assert not named, f"{page.name} names benchmark modules that do not exist: {sorted(named)}"
        paths = {p for p in re.findall(r"\bbenchmarks/[\w/]+\.py", text) if not (REPO / p).is_file()}
        assert not paths, f"{page.name} names benchmark files that do not exist: {sorted(paths)}"


def test_time_sides_warms_up_rotates_the_first_side_and_summarises():
    from benchmarks import harness
    calls = []
    sides = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    timings = harness.time_sides(sides, rounds=3, calls=2, warmup=2)
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]  # warm-up, untimed but the first call
    assert calls[6:] == ["a", "a", "b", "b", "c", "c", "b", "b", "c", "c", "a", "a", "c", "c", "a", "a", "b", "b"]
    for timing in timings.values():
        s = timing.summary()
        assert s["calls"] == 6 and 0 <= s["min_s"] <= s["median_s"] <= s["max_s"] and s["first_call_s"] >= 0
    with pytest.raises(ValueError, match="at least 1"):
        harness.time_sides(sides, rounds=0)
    assert harness.summary([3.0, 1.0, 2.0]) == {"min_s": 1.0, "median_s": 2.0, "max_s": 3.0, "calls": 3,
                                                "total_s": 6.0}


# --- the loop's own steps against PyTorch -------------------------------------------------------

@pytest.mark.slow  # three sides compiled and timed: ~40 s
def test_mlm_train_step(tmp_path):
    proc, result = run_benchmark("benchmarks.mlm_train_step", "--model=tiny-bert", "--steps=1", "--rounds=2",
                                 tmp_path=tmp_path)
    assert "make_train_step" in result["nli_jax_step"]  # the loop's own jitted step, the hand-written one labelled
    sides = result["sides"]
    for side in ("nli-jax", "nli-jax-handwritten", "pytorch-eager"):
        r = sides[side]
        assert r["tokens_per_s"] > 0 and r["calls"] == 2 and r["first_call_s"] > 0, (side, r)
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], (side, r)
        assert r["tokens_per_s"] == pytest.approx(8 * 128 / r["median_s"])
    assert_ratio(result, "nli_jax_over_pytorch_eager_tokens_per_s", sides["nli-jax"]["tokens_per_s"],
                 sides["pytorch-eager"]["tokens_per_s"])
    assert_ratio(result, "nli_jax_handwritten_over_pytorch_eager_tokens_per_s",
                 sides["nli-jax-handwritten"]["tokens_per_s"], sides["pytorch-eager"]["tokens_per_s"])
    assert_ratio(result, "nli_jax_over_nli_jax_handwritten_tokens_per_s", sides["nli-jax"]["tokens_per_s"],
                 sides["nli-jax-handwritten"]["tokens_per_s"])
    assert "ratio nli_jax_over_pytorch_eager_tokens_per_s" in proc.stdout
    # FLOP/s against the CPU's peak: BERT's training FLOPs per token counted by hand (6 x the
    # parameters a token passes through outside the embeddings: the layers, the MLM transform and
    # the decoder's bias; + 12 x layers x hidden x length for attention).
    from nli_jax.models import preset
    c = preset("tiny-bert")
    h, i, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
    by_hand = 6 * (layers * layer + h * h + h + 2 * h + c.vocab_size) + 12 * layers * h * 128
    assert result["training_flops_per_token"] == by_hand
    peak = result["cpu_peak"]
    assert peak["gflops"] == pytest.approx(peak["cores"] * peak["clock_ghz"] * peak["fma_units_per_core"]
                                           * peak["fp32_lanes_per_fma"] * 2)
    for side, r in sides.items():
        assert r["gflops"] == pytest.approx(r["tokens_per_s"] * by_hand / 1e9), side
        assert r["share_of_peak"] == pytest.approx(r["gflops"] / peak["gflops"]), side
    assert "GFLOP/s" in proc.stdout and peak["formula"] in proc.stdout


def test_mlm_train_step_against_transformers_sparse_prediction(tmp_path):
    """ModernBERT's peer at its fastest (sparse_prediction: the decoder at the labelled positions
    only); asked of another family, refused before anything is built."""
    proc, result = run_benchmark("benchmarks.mlm_train_step", "--model=tiny-modernbert", "--steps=1", "--rounds=2",
                                 "--sides=nli-jax,pytorch-sparse", tmp_path=tmp_path)
    sides = result["sides"]
    assert set(sides) == {"nli-jax", "pytorch-sparse"}
    # 8 rows x the 19 masked positions of make_batch at length 128, not 8 x 128: the decoder is sparse
    assert sides["pytorch-sparse"]["decoded_rows"] == 8 * 19
    assert_ratio(result, "nli_jax_over_pytorch_sparse_tokens_per_s", sides["nli-jax"]["tokens_per_s"],
                 sides["pytorch-sparse"]["tokens_per_s"])
    refused = subprocess.run([sys.executable, "-m", "benchmarks.mlm_train_step", "--model=tiny-bert",
                              "--sides=nli-jax,pytorch-sparse"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "pytorch-sparse is transformers' ModernBERT option" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_step_profile(tmp_path):
    """The loop's own step (with :cpu_test's batch ramp) profiled: every thunk's time goes to the
    function of the repository that traced it, forward and backward apart, the dots of fusions
    counted as dots; PyTorch's step profiled beside it."""
    proc, result = run_benchmark("benchmarks.step_profile", "--model=tiny-crammed", "--batch=4", "--seq=16",
                                 "--predictions=3", "--steps=2", "--recipe=crammed:cpu_test", "--torch",
                                 tmp_path=tmp_path)
    r = result["nli_jax"]
    functions = r["functions"]
    model = "nli_jax/models/modernbert.py:"
    for name in ("GeGLU.__call__", "Attention.__call__", "MaskedLMHead.__call__", "_normed"):
        assert functions[model + name]["forward"] > 0 and functions[model + name]["backward"] > 0, name
    assert functions["nli_jax/losses.py:weighted_cross_entropy"]["forward"] > 0
    assert any(f.startswith("nli_jax/train/batch_ramp.py:") for f in functions)  # the ramp's accumulation
    assert sum(sum(parts.values()) for parts in functions.values()) == pytest.approx(r["thunk_s_per_step"])
    assert r["unattributed_share"] < 0.25 and r["kinds"]["dot"] > 0 and len(r["step_times_s"]) == 2
    assert any(line.startswith(model) for line in r["lines"])
    torch_side = result["pytorch"]
    assert torch_side["kinds"]["dot"] > 0 and torch_side["self_cpu_s_per_step"] > 0
    assert_ratio(result, "nli_jax_over_pytorch_tokens_per_s", 1 / r["median_step_s"], 1 / torch_side["median_step_s"])
    assert "GeGLU.__call__" in proc.stdout and "by kind" in proc.stdout


def test_device_check_tiny(tmp_path):
    """The accelerator check's CPU mode: every kind of row (MLM of BERT and ModernBERT at two
    lengths, IndoNLI fine-tuning) through the loop's own bf16 step and PyTorch's; MFU against the
    given peak; the rows printed for docs/performance.md."""
    proc, result = run_benchmark("benchmarks.device_check", "--tiny", "--peak_tflops=1", tmp_path=tmp_path)
    assert result["backend"] == "cpu" and result["peak_bf16_tflops"] == 1.0
    assert [r["task"] for r in result["rows"]] == ["mlm", "mlm", "mlm", "indonli"]
    assert {r["model"] for r in result["rows"]} == {"tiny-bert", "tiny-modernbert"}
    for number, row in enumerate(result["rows"], 1):
        for side in ("nli-jax", "pytorch"):
            r = row["sides"][side]
            assert r["calls"] == 2 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"], (row["name"], side, r)
            assert r["tokens_per_s"] == pytest.approx(row["batch"] * row["length"] / r["median_s"])
            assert r["mfu"] == pytest.approx(r["tokens_per_s"] * row["training_flops_per_token"] / 1e12)
        assert_ratio(result, f"row{number}_nli_jax_over_pytorch_tokens_per_s", row["sides"]["nli-jax"]["tokens_per_s"],
                     row["sides"]["pytorch"]["tokens_per_s"])
    assert proc.stdout.count("the loop's own step |") == 4 and "MFU" in proc.stdout


@pytest.mark.slow  # a tiny BERT checkpoint compiled three times, PyTorch beside it: ~20 s
def test_encoder_vs_torch(tmp_path, tiny_bert_dir):
    proc, result = run_benchmark("benchmarks.encoder_vs_torch", f"--model={tiny_bert_dir}", "--shapes=2x16",
                                 "--rounds=2", "--repeats=1", tmp_path=tmp_path)
    row = result["shapes"]["2x16"]
    assert "Python API forward, no mesh" in proc.stdout
    for name in ("forward", "api_forward", "forward_backward"):
        j, t = row[name]["nli-jax"], row[name]["pytorch"]
        assert j["calls"] == t["calls"] == 2 and 0 < j["min_s"] <= j["median_s"] <= j["max_s"]
        assert j["minor_faults_last_call"] >= 0
        assert_ratio(result, f"2x16_{name}_nli_jax_over_pytorch_speed", t["median_s"], j["median_s"])
    assert row["peak_rss_gb_so_far"] > 0.1


@pytest.mark.slow  # two compilations of the cpu_test step and 2 rounds: ~40 s
def test_dynamics_cost(tmp_path):
    proc, result = run_benchmark("benchmarks.dynamics_cost", "--model=tiny", "--rounds=2", "--steps=2",
                                 tmp_path=tmp_path)
    sides = result["sides"]
    for side in ("with", "without"):
        s = sides[side]
        assert s["calls"] == 2 and 0 < s["min_s"] <= s["median_s"] <= s["max_s"] and s["examples_per_s"] > 0
    assert_ratio(result, "with_over_without_step_s", sides["with"]["median_s"], sides["without"]["median_s"])
    assert "ratio with / without" in proc.stdout


# --- input pipeline and padding ------------------------------------------------------------------

def test_input_pipeline(tmp_path):
    corpus = REPO / "nli_jax" / "data" / "fixtures" / "corpus_tiny" / "*.txt"
    proc, result = run_benchmark("benchmarks.input_pipeline", f"--corpus={corpus}", "--vocab_size=300", "--batch=16",
                                 "--batches=3", "--workers=0", f"--workdir={tmp_path / 'work'}", tmp_path=tmp_path)
    assert result["words"] > 0 and result["words_per_s"] > 0 and result["examples"] > 0
    ours, peer = result["sides"]["nli-jax"], result["sides"]["transformers-collator"]
    for side in (ours, peer):
        assert side["calls"] == 3 and side["seq_per_s"] == pytest.approx(16 * 3 / side["total_s"])
    assert_ratio(result, "nli_jax_over_peer_seq_per_s", ours["seq_per_s"], peer["seq_per_s"])
    assert "ratio nli-jax / peer" in proc.stdout


def test_bucket_padding(tmp_path, shared_data, minilm_dir):
    """Buckets agreed across 2 processes pad exactly as one process does, far less than
    max_seq_length 512 (the script also checks that the processes agree on every step)."""
    train = shared_data / "indonli" / "train.jsonl"
    if not train.is_file():
        pytest.skip(f"{train} not found")
    _, result = run_benchmark("benchmarks.bucket_padding", f"--train={train}", f"--tokenizer={minilm_dir}",
                              "--limit=1000", tmp_path=tmp_path)
    cases = result["cases"]
    agreed, one, full = (cases[name]["padded_per_real_token"] for name in (
        "buckets agreed across 2 processes", "one process, buckets", "max_seq_length 512"))
    assert result["pairs"] == 1000 and 0 < agreed == one < full / 2
    assert_ratio(result, "max_seq_length_over_agreed_buckets_padding", full, agreed)
    assert_ratio(result, "max_seq_length_over_one_process_buckets_padding", full, one)


# --- whole runs: fine-tuning against transformers, compilation, processes ------------------------

@pytest.mark.slow  # end to end, tens of seconds
def test_finetune_vs_transformers_on_real_indonli(tmp_path, shared_data, tiny_bert_dir):
    """Both sides fine-tune a BERT checkpoint directory (MiniLM-L6's vocabulary, the tiny-bert shape)
    on the same real IndoNLI pairs: each side's figures and their ratios."""
    indonli = shared_data / "indonli"
    if not (indonli / "train.jsonl").is_file() or not (indonli / "val.jsonl").is_file():
        pytest.skip(f"IndoNLI train.jsonl / val.jsonl not found in {indonli}")
    proc, result = run_benchmark("benchmarks.finetune_vs_transformers", f"--model={tiny_bert_dir}", f"--data={indonli}",
                                 "--train_pairs=32", "--eval_pairs=32", "--max_seq_length=64", "--seeds=1",
                                 "--epochs=1", "--batch_size=16", f"--workdir={tmp_path / 'work'}", tmp_path=tmp_path)
    assert "nli-jax / transformers" in proc.stdout
    summary = result["summary"]["64"]
    for side in ("nli-jax", "transformers"):
        s = summary[side]
        assert s["train_examples_per_s"]["mean"] > 0 and s["eval_examples_per_s"]["mean"] > 0, (side, s)
        assert 0.0 <= s["accuracy"]["mean"] <= 1.0, (side, s)
        assert s["end_to_end_s"]["mean"] > s["train_s"]["mean"] > 0, (side, s)
    j, t = summary["nli-jax"], summary["transformers"]
    assert_ratio(result, "64_end_to_end_time", j["end_to_end_s"]["mean"], t["end_to_end_s"]["mean"])
    for figure in ("train_examples_per_s", "eval_examples_per_s"):
        assert_ratio(result, f"64_{figure}", j[figure]["mean"], t[figure]["mean"])
    # Both sides trained on the same 2 batches of 16 and evaluated the same 32 validation pairs;
    # nli-jax through its own loop (results.json in its run directory).
    runs = {r["side"]: r for r in result["runs"]}
    assert {r["train_examples"] for r in runs.values()} == {32}
    assert {r["eval_examples"] for r in runs.values()} == {32}
    assert (tmp_path / "work" / "runs" / "nli-jax" / "len64_seed1" / "run" / "results.json").is_file()
    assert runs["nli-jax"]["train_compile_s"] > 0
    assert result["nli_jax_commands"]["len64_seed1"].startswith("python -m finetune.main --config=configs/indonli_base.py")
    assert all(0.3 < r["peak_rss_gb"] < 24 for r in runs.values()), runs


@pytest.mark.slow  # end to end, ~30 s a family
@pytest.mark.parametrize("family,model_type,hf_class", [
    ("deberta", "deberta-v2", "DebertaV2ForSequenceClassification"),
    ("modernbert", "modernbert", "ModernBertForSequenceClassification")])
def test_finetune_vs_transformers_from_a_random_checkpoint_of_each_family(tmp_path, shared_data, minilm_dir, family,
                                                                          model_type, hf_class):
    """--model=random-deberta:... / random-modernbert:...: the checkpoint is made in the workdir
    with transformers' classes (MiniLM's tokenizer beside it), and both sides fine-tune that same
    checkpoint: nli-jax through its family module, transformers through its own class."""
    indonli = shared_data / "indonli"
    if not (indonli / "train.jsonl").is_file() or not (indonli / "val.jsonl").is_file():
        pytest.skip(f"IndoNLI train.jsonl / val.jsonl not found in {indonli}")
    proc, result = run_benchmark("benchmarks.finetune_vs_transformers", f"--model=random-{family}:2x128x30522",
                                 f"--data={indonli}", "--train_pairs=32", "--eval_pairs=32", "--max_seq_length=64",
                                 "--seeds=1", "--epochs=1", "--batch_size=16", f"--workdir={tmp_path / 'work'}",
                                 tmp_path=tmp_path)
    checkpoint = tmp_path / "work" / f"random_{family}_2x128x30522"
    config = json.loads((checkpoint / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == (model_type, 2, 128)
    assert result["settings"]["model"] == str(checkpoint)
    runs = {r["side"]: r for r in result["runs"]}
    assert {r["train_examples"] for r in runs.values()} == {32} and {r["eval_examples"] for r in runs.values()} == {32}
    run = tmp_path / "work" / "runs" / "nli-jax" / "len64_seed1" / "run"
    assert json.loads((run / "config.json").read_text())["model"]["init"] == str(checkpoint)
    summary = result["summary"]["64"]
    for side in ("nli-jax", "transformers"):
        assert summary[side]["end_to_end_s"]["mean"] > summary[side]["train_s"]["mean"] > 0, side
    assert_ratio(result, "64_end_to_end_time", summary["nli-jax"]["end_to_end_s"]["mean"],
                 summary["transformers"]["end_to_end_s"]["mean"])
    # Each side read the checkpoint as the family's: nli-jax's family module, transformers' own class.
    log = (tmp_path / "work" / "runs" / "nli-jax" / "len64_seed1" / "log.txt").read_text()
    assert f"ForSequenceClassification {model_type}," in log
    assert runs["transformers"]["model_class"] == hf_class


@pytest.mark.slow  # end to end, tens of seconds
def test_finetune_vs_transformers_on_real_nerp(tmp_path, shared_data, tiny_bert_dir):
    """The tagging side: nli-jax's NERP run (packed) against the token-classification loop, the
    same sentences, F1 on both, each run's peak RSS (a tiny BERT checkpoint with MiniLM-L6's vocabulary)."""
    proc, result = run_benchmark("benchmarks.finetune_vs_transformers", "--task=nerp", f"--model={tiny_bert_dir}",
                                 f"--data={shared_data / 'indonlu'}", "--train_pairs=32", "--eval_pairs=24",
                                 "--max_seq_length=64", "--seeds=1", "--batch_size=16", "--eval_batch_size=16",
                                 f"--workdir={tmp_path / 'work'}", tmp_path=tmp_path)
    runs = {r["side"]: r for r in result["runs"]}
    assert {r["train_examples"] for r in runs.values()} == {32} and {r["eval_examples"] for r in runs.values()} == {24}
    assert all(0.0 <= r["accuracy"] <= 1.0 and 0.3 < r["peak_rss_gb"] < 24 for r in runs.values()), runs
    assert result["settings"]["metric"] == "f1" and "val f1" in proc.stdout
    assert result["nli_jax_commands"]["len64_seed1"].startswith("python -m finetune.main --config=configs/indonlu.py:task=nerp")
    summary = result["summary"]["64"]
    assert_ratio(result, "64_peak_rss", summary["nli-jax"]["peak_rss_gb"]["mean"],
                 summary["transformers"]["peak_rss_gb"]["mean"])


@pytest.mark.slow  # three cpu_test fine-tunings: a minute
def test_compilation_cache(tmp_path):
    """The rerun and the next sweep cell read their programs from the cache the cold run filled."""
    proc, result = run_benchmark("benchmarks.compilation_cache", "--cpu_test", f"--workdir={tmp_path / 'w'}",
                                 tmp_path=tmp_path, timeout=900)
    runs = result["runs"]
    assert runs["cold"]["cache_hits"] == 0 and runs["cold"]["programs"] > 0
    for name in ("rerun", "next_sweep_cell"):
        assert runs[name]["cache_hits"] >= runs[name]["programs"] - 1, runs
        assert runs[name]["seconds"] < 0.25 * runs["cold"]["seconds"], runs
        assert_ratio(result, f"cold_over_{name}_compile_s", runs["cold"]["seconds"], runs[name]["seconds"])


@pytest.mark.slow  # four 2-process cpu_test runs of 8 steps: about a minute
def test_multiprocess_steps(tmp_path):
    """This checkout against itself as the peer, alternating: both rates and their ratio (each rate
    from the log interval after the first, steps 4 to 8)."""
    scratch = tmp_path / "scratch"  # the benchmark's temporary directories: none left behind
    scratch.mkdir()
    _, result = run_benchmark("benchmarks.multiprocess_steps", "--steps=8", "--log_every=4", "--repeats=2",
                              f"--peer_repo={REPO}", tmp_path=tmp_path, timeout=1200,
                              env=dict(os.environ, TMPDIR=str(scratch)))
    assert not list(scratch.glob("multiprocess_steps_*"))
    sides = result["sides"]
    for side in ("repo", "peer_repo"):
        assert len(sides[side]["steps_per_s"]) == 2 and all(r > 0 for r in sides[side]["steps_per_s"])
    assert_ratio(result, "repo_over_peer_repo_steps_per_s", sides["repo"]["median_steps_per_s"],
                 sides["peer_repo"]["median_steps_per_s"])


def test_sharded_init_memory(tmp_path):
    proc, result = run_benchmark("benchmarks.sharded_init_memory", "--preset=tiny-bert", tmp_path=tmp_path)
    cases = result["cases"]
    assert set(cases) == {"fsdp=8, sharded init", "data=8, host init then placed", "fsdp=8, host init then placed"}
    for r in cases.values():
        assert r["peak_rss_kib"] >= r["rss_before_kib"] > 0 and r["param_bytes"] > 0
    # fsdp keeps an eighth of the parameters on a device, data parallelism all of them
    fsdp, data = cases["fsdp=8, sharded init"], cases["data=8, host init then placed"]
    assert data["bytes_on_device_0"] == data["param_bytes"] and fsdp["bytes_on_device_0"] < data["param_bytes"] / 4
    assert_ratio(result, "fsdp8_sharded_over_data8_host_peak_rss", fsdp["peak_rss_kib"], data["peak_rss_kib"])
    assert "peak RSS fsdp=8 / data=8:" in proc.stdout


def test_corpus_at_scale(tmp_path, shared_data):
    data = tmp_path / "data" / "id_corpus_sample"
    data.mkdir(parents=True)
    for name in ("talpco.txt", "frog_storytelling.txt"):  # 0.2 MB of real text
        (data / name).write_bytes((shared_data / "id_corpus_sample" / name).read_bytes())
    work = tmp_path / "work"
    _, result = run_benchmark("benchmarks.corpus_at_scale", f"--data={tmp_path / 'data'}", f"--workdir={work}",
                              "--sizes_gb=0.0002,0.0004", "--workers=1", "--shards=2", "--vocab_size=500",
                              "--sample_sentences=2000", tmp_path=tmp_path, timeout=900)
    rows = {(r["size_gb"], r["stage"]): r for r in result["rows"]}
    assert len(rows) == 6 and all(r["wall_s"] > 0 and r["words_per_s"] > 0 and r["peak_rss_tree_gb"] > 0
                                  for r in rows.values())
    assert rows[(0.0004, "create_examples")]["words"] > rows[(0.0002, "create_examples")]["words"]
    for stage in ("prepare_corpus", "build_vocab", "create_examples"):
        small, large = rows[(0.0002, stage)], rows[(0.0004, stage)]
        assert_ratio(result, f"{stage}_0.0004gb_over_0.0002gb_peak_rss", large["peak_rss_tree_gb"],
                     small["peak_rss_tree_gb"])
        assert_ratio(result, f"{stage}_0.0004gb_over_0.0002gb_words_per_s", large["words_per_s"], small["words_per_s"])
    assert "| create_examples |" in (work / "report.md").read_text()


# --- the TPU compiler on this host ---------------------------------------------------------------

def test_attention_tpu_compile(tmp_path):
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu")
    _, result = run_benchmark("benchmarks.attention_tpu_compile", "--chips=v4", "--lengths=512",
                              "--batch_per_device=16", "--heads=4", tmp_path=tmp_path)
    (row,) = result["rows"]
    plain, splash = row["plain"], row["splash"]
    assert splash["has_kernel"] and not plain["has_kernel"] and plain["flops"] > 0 and plain["temp_bytes"] > 0
    ratio = result["ratios"]["v4_512_splash_over_plain_temp_bytes"]
    assert ratio == pytest.approx(splash["temp_bytes"] / plain["temp_bytes"]) and ratio < 0.5


def test_tpu_compile_scan_remat(tmp_path):
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu")
    _, result = run_benchmark("benchmarks.tpu_compile_scan_remat", "--preset=tiny-bert", "--length=16",
                              "--per_device_batch=1", "--variant=loop:none", "--variant=scan:full", tmp_path=tmp_path)
    loop, scan = result["variants"]["loop:none"], result["variants"]["scan:full"]
    assert (loop["scan"], scan["scan"], scan["remat"]) == (False, True, "full")
    assert_ratio(result, "scan:full_over_loop:none_compile_s", scan["compile_s"], loop["compile_s"])
    assert_ratio(result, "scan:full_over_loop:none_temp_bytes", scan["temp_bytes"], loop["temp_bytes"])


def test_tpu_compile_table(tmp_path):
    """One tiny pretraining row on a v3-8: fits, with the compiler's step time, and the hours it
    projects for IndoBERT-base phase 1's steps against the paper's."""
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu")
    work = tmp_path / "table"
    config = "configs/pretrain/indobert_base.py:cpu_test,phase=1"
    _, result = run_benchmark("benchmarks.tpu_compile_table", f"--workdir={work}", f"--row={config}@v3-8",
                              tmp_path=tmp_path)
    (row,) = result["rows"]
    step = row["report"]["train_step"]
    assert step["fits"] and step["total_gib"] > 0 and step["compiler_estimated_seconds"] > 0
    from configs.pretrain.common import PHASES
    paper_hours, steps = PHASES["indobert-base"][1][3], PHASES["indobert-base"][1][2]
    assert row["paper_hours"] == paper_hours
    assert row["projected_hours"] == pytest.approx(step["compiler_estimated_seconds"] * steps / 3600)
    assert_ratio(result, "pretrain/indobert_base.py:cpu_test,phase=1@v3-8: paper_over_projected_hours", paper_hours,
                 row["projected_hours"])
    assert "| pretrain/indobert_base.py:cpu_test,phase=1 | v3-8 |" in (work / "table.md").read_text()


def test_checkpoint_digest_cost_runs_on_a_small_state(monkeypatch, capsys):
    """benchmarks.checkpoint_digest_cost (docs/errors.md §20) on a state of two small arrays."""
    import importlib
    bench = importlib.import_module("benchmarks.checkpoint_digest_cost")
    monkeypatch.setattr(bench, "SHAPES", [(8, 4), (4,)])
    bench.main()
    out = capsys.readouterr().out
    assert "checkpoint (params + Adam): digest" in out and "orbax restore:" in out
