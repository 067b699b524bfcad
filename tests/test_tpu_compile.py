"""launch.compile: a run's own train and evaluation steps compiled by the TPU compiler (libtpu) for
Cloud TPU topologies on this CPU host: fits or not, sharded as the mesh rules say, FLOPs as the
model's formula counts them, and a one-line refusal naming the fix for a run that does not fit.

The slow tests compile one shipped recipe of each kind for its target topology (minutes each), and
`-m tpu_recipes` all the others; each fails when its recipe stops fitting.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="the TPU compiler (libtpu) is not installed: pip install -e '.[test]'")


def compile_command(tmp_path, *args, name="report.json"):
    """(exit status, stdout, stderr, the JSON report or None) of python -m launch.compile."""
    output = tmp_path / name
    done = subprocess.run([sys.executable, "-m", "launch.compile", f"--output={output}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    report = json.loads(output.read_text()) if output.is_file() else None
    return done.returncode, done.stdout, done.stderr, report


def test_tiny_run_compiles_for_a_v4_8_with_fsdp_as_the_rules_shard_it(tmp_path):
    code, out, err, report = compile_command(
        tmp_path, "--config=configs/indonli_large.py:cpu_test", "--topology=v4-8",
        "--config.mesh.shape={'data': 2, 'fsdp': 2}")
    assert code == 0, err
    assert (report["devices"], report["hosts"], report["device_kind"]) == (4, 1, "TPU v4")
    assert report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    train, evaluation = report["train_step"], report["eval_step"]
    assert train["fits"] and evaluation["fits"]
    # The compiled program's own parameter shardings: "embed" -> fsdp, everything else replicated
    # (configs/finetune_common.py MESH_RULES; tensor has size 1).
    specs = train["parameter_specs"]
    assert specs["encoder.embeddings.word.embedding"] == [None, "fsdp"]
    assert specs["encoder.layers.0.mlp_in.kernel"] == ["fsdp", None]
    assert specs["encoder.layers.0.mlp_out.kernel"] == [None, "fsdp"]
    assert specs["encoder.layers.0.attention.query.kernel"] == ["fsdp", None, None]
    assert specs["encoder.layers.0.attention_norm.scale"] == ["fsdp"]
    # FSDP gathers the weights and scatters the gradients; the batch is 16 x 64 over 4 devices.
    assert train["collectives"].get("all-gather", {}).get("count", 0) > 0
    assert report["batch"]["train_shapes"]["input_ids"][1] == 64
    # The compiler counts what the model's formula counts, within 10% (measured: x1.05 here).
    assert 0.95 < train["compiler_over_formula"] < 1.10
    assert train["compiler_estimated_seconds"] > 0 and train["unpriced_instructions"] > 0  # dropout's RNG
    assert "train_step: fits" in out and "eval_step: fits" in out
    assert "libtpu" not in err and "TPU_ACCELERATOR_TYPE" not in err  # no start-up noise


def test_a_two_host_topology_compiles_the_step_each_host_runs(tmp_path):
    from configs import indonli_large
    from nli_jax import aot
    report = aot.compile_run(indonli_large.get_config("cpu_test"), "v4-16", eval_step=False)
    assert (report["devices"], report["hosts"]) == (8, 2)
    train = report["train_step"]
    assert train["fits"]
    assert report["batch"]["per_device"] == 2  # 16 over 8 devices on 2 hosts
    # Pure data parallelism: the gradients (float32, one copy of the parameters) are all-reduced.
    assert train["collectives"]["all-reduce"]["bytes"] >= 4 * report["model"]["parameters"]
    assert set(train["parameter_specs"]["encoder.layers.0.mlp_in.kernel"]) == {None}


def test_a_run_that_does_not_fit_is_one_line_naming_the_fix(tmp_path):
    config = tmp_path / "too_wide.py"
    config.write_text("from configs import indonli_large\n\n\ndef get_config(arg=None):\n"
                      "    c = indonli_large.get_config('cpu_test')\n"
                      "    c.model.overrides.vocab_size = 60_000_000  # 3.8G parameters: 43 GiB with Adam\n"
                      "    return c\n")
    code, out, err, report = compile_command(tmp_path, f"--config={config}", "--topology=v4-8", "--eval_step=False")
    assert code == 2, err
    lines = [line for line in out.splitlines() if line.startswith("train_step")]
    assert len(lines) == 1 and "DOES NOT FIT" in lines[0], out
    assert "needs 71." in lines[0] and "30.75 GiB usable per device" in lines[0]
    assert "--config.mesh.shape=\"{'data': 1, 'fsdp': -1}\"" in lines[0]
    assert "Traceback" not in err and "Traceback" not in out
    assert report["train_step"]["fits"] is False


def test_an_unknown_topology_is_one_line(tmp_path):
    code, out, err, _ = compile_command(tmp_path, "--config=configs/indonli_large.py:cpu_test", "--topology=v9-8")
    assert code == 1
    assert err.strip().splitlines() == ["error: --topology='v9-8': unknown; expected one of v2-8, v3-8, v4-8, v4-16, "
                                        "v4-32, v5e-4, v5e-8, v5e-256, v5p-8, v6e-8"]


def test_a_cpu_only_machine_does_not_start_libtpu():
    """With libtpu installed, a command line on a machine without TPU chips asks JAX for the CPU
    alone: none of libtpu's start-up lines on stderr (without it, they are there)."""
    from nli_jax.cli import platforms
    if platforms.tpu_chips_present():
        pytest.skip("this machine has TPU chips")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TPU_SKIP_MDS_QUERY",
                                                            "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")}
    probe = "import jax; print(jax.default_backend(), len(jax.devices()))"
    # `import nli_jax` (every command line's first import, and the library's) asks for the CPU alone.
    skipped = subprocess.run([sys.executable, "-c", "import os, nli_jax; "
                              "assert os.environ.get('JAX_PLATFORMS') == 'cpu'; " + probe],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.split() == ["cpu", "1"]
    assert skipped.stderr == ""
    plain = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=120)
    assert plain.stdout.split() == ["cpu", "1"]
    assert "TPU" in plain.stderr  # libtpu's failed start-up: what the setting spares every CPU run


def test_decisions_about_the_target_come_from_the_mesh_not_the_host():
    import jax
    import numpy as np
    from nli_jax.train import compilation
    from nli_jax import aot
    from nli_jax.train import mesh as mesh_lib
    devices = aot.topology("v4-8").devices()
    assert jax.default_backend() == "cpu"
    mesh = mesh_lib.make_mesh({"data": -1}, devices)
    assert mesh_lib.platform(mesh) == "tpu"
    assert compilation.forward_compiler_options("tpu") is None  # XLA:CPU's options never reach the TPU compiler
    assert compilation.forward_compiler_options(mesh_lib.platform(mesh_lib.make_mesh({"data": -1}))) is not None
    assert np.asarray(mesh.devices).size == 4


# --- every shipped recipe on its target hardware (slow: minutes each) --------------------------------

SHIPPED = [
    *[(f"configs/pretrain/{m}.py:phase={p}", "v3-8", []) for m in ("indobert_base", "indobert_large",
                                                                 "indobert_lite_base", "indobert_lite_large")
      for p in (1, 2)],
    # The paper's 128 sequences do not split over 256 chips: 4 per chip.
    ("configs/pretrain/indobert_large.py:phase=2", "v5e-256", ["--config.mesh.shape={'data': 1, 'fsdp': -1}",
                                                              "--config.train.batch_size=1024"]),
    *[(f"configs/{c}", t, []) for t in ("v3-8", "v4-8")
      for c in ("indonli_large.py", "indonli_base.py", "indonli_lite.py", "indonli_xlmr_large.py",
                "indonlu.py:task=smsa,model=large", "indonlu.py:task=posp,model=large", "ocnli.py", "inferes.py")],
]


# The slow suite (and so CI) compiles one recipe of each kind: the longest accumulation (ALBERT at
# 512), BERT-large at 512 on a v3-8 and over 256 v5e chips (FSDP), large fine-tuning and tagging.
# Tagging on the v3-8, where it fits with less room (16 GiB a core against a v4 chip's 32: 10.5 GiB
# of headroom against 25.6) and compiles in half the time (107 s against 215); the v4 compiler is
# exercised by the tiny v4-8 and v4-16 tests above.
# The other 20 (about 4 minutes each on 2 loaded cores) run with `python -m pytest -m tpu_recipes`, as
# before changing a recipe or what a model keeps in memory.
IN_SLOW_SUITE = {("configs/pretrain/indobert_lite_base.py:phase=2", "v3-8"), ("configs/pretrain/indobert_large.py:phase=2", "v3-8"),
                 ("configs/pretrain/indobert_large.py:phase=2", "v5e-256"), ("configs/indonli_large.py", "v3-8"),
                 ("configs/indonlu.py:task=posp,model=large", "v3-8")}
assert IN_SLOW_SUITE <= {(c, t) for c, t, _ in SHIPPED}


@pytest.mark.parametrize("config,topology,extra", [
    pytest.param(c, t, e, id=f"{c.split('/')[-1]}@{t}",
                 marks=pytest.mark.slow if (c, t) in IN_SLOW_SUITE else pytest.mark.tpu_recipes)
    for c, t, e in SHIPPED])
def test_every_shipped_recipe_fits_its_hardware(tmp_path, config, topology, extra):
    code, out, err, report = compile_command(tmp_path, f"--config={config}", f"--topology={topology}", *extra)
    assert code == 0, out + err
    assert report["train_step"]["fits"] and report["eval_step"]["fits"]


@pytest.mark.slow  # two compilations of a 4-layer BERT: ~2 minutes
def test_fsdp_keeps_activations_split_over_the_batch(tmp_path):
    """FSDP splits the weights' hidden dimension; the hidden states stay split over the batch only
    (models.encoder.batch_sharded). Left to choose, XLA split them along their hidden dimension too
    and moved them at every layer: 2.11 GiB of temporaries against 0.61 data-parallel, 57
    all-reduces and 56 all-to-alls (a 4 x 256 BERT, 256 x 128 on a v4-8)."""
    from nli_jax import aot
    from conftest import config_for
    steps = {}
    for mesh in ("{'data': 4}", "{'data': 1, 'fsdp': -1}"):
        config = config_for("pretrain.indobert_base:cpu_test", f"mesh.shape={mesh}", "model.preset=small-bert",
                            "train.batch_size=256", "data.max_seq_length=128", "task_options.max_predictions=20")
        steps[mesh] = aot.compile_run(config, "v4-8", eval_step=False)["train_step"]
    data, fsdp = steps["{'data': 4}"], steps["{'data': 1, 'fsdp': -1}"]
    assert fsdp["temporaries_gib"] < 1.3 * data["temporaries_gib"], (fsdp["temporaries_gib"], data["temporaries_gib"])
    assert fsdp["collectives"].get("all-to-all", {}).get("count", 0) <= 4
    assert fsdp["compiler_estimated_seconds"] < 1.2 * data["compiler_estimated_seconds"]
    assert fsdp["parameters_gib"] < data["parameters_gib"] / 3  # the weights are split 4 ways
