"""Forward-only programs (evaluation, prediction) compile their dots without XLA:CPU's YNNPACK
fusions (nli_jax.train.compilation.forward_compiler_options; NLI_JAX_CPU_FORWARD_DOTS), while
the train step keeps XLA's defaults.

What a user relies on: the run's own jitted evaluation and prediction steps are the programs
that change, their predictions do not (real checkpoint, real data), and a mistyped setting is
one line before any compute.
"""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import config_for
from nli_jax.data import pipeline
from nli_jax.train import compilation
from nli_jax import planner
from nli_jax.train.setup import prepare

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YNN = '"__ynn_fusion"'


def _prepare(tmp_path, name, shared_data, minilm_dir):
    config = config_for("indonli_base", f"data.source={shared_data / 'indonli'}", f"model.init={minilm_dir}",
                        "model.dtype=float32", "data.max_seq_length=128", "train.eval_batch_size=16",
                        f"data.tfds_dir={tmp_path / 'tfds'}")
    return prepare(planner.build_plan(config, training=False), str(tmp_path / name))


def _first_batch(run, split="validation"):
    data = run.evaluator._splits[split]
    dummy = dict(data.encode(data.examples[0]), idx=np.int32(-1))
    batch = next(iter(pipeline.eval_batches(data.examples, data.encode, run.batching, local_batch_size=16,
                                            dummy=dummy, lengths=data.lengths(0, 1))))
    return pipeline.to_global(batch, run.batch_sharding)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU setting")
def test_evaluation_and_prediction_steps_compile_without_ynnpack_and_predict_the_same(
        tmp_path, shared_data, minilm_dir, monkeypatch):
    """IndoNLI validation, MiniLM: the evaluator's jitted evaluation and prediction steps hold no
    YNNPACK fusion by default and do with NLI_JAX_CPU_FORWARD_DOTS=ynnpack (XLA's default, which
    the train step keeps); both settings predict the same labels, logits within 1e-4."""
    evaluations, texts = {}, {}
    for setting in ("eigen", "ynnpack"):
        monkeypatch.setenv(compilation.FORWARD_DOTS_ENV, setting)
        run = _prepare(tmp_path, setting, shared_data, minilm_dir)
        source = pipeline.Subset(run.splits["validation"], range(96))
        evaluations[setting] = run.evaluator.evaluate(run.params, "validation", source)
        batch = _first_batch(run)
        texts[setting] = [step.lower(run.params, batch).compile().as_text()
                          for step in (run.evaluator.eval_step, run.evaluator.predict_step)]
    assert all(YNN not in text for text in texts["eigen"])
    assert all(YNN in text for text in texts["ynnpack"])
    eigen, ynnpack = evaluations["eigen"], evaluations["ynnpack"]
    assert eigen.predictions["prediction"] == ynnpack.predictions["prediction"]
    np.testing.assert_allclose(np.stack(eigen.predictions["logits"]), np.stack(ynnpack.predictions["logits"]),
                               atol=1e-4)
    assert eigen.report["accuracy"] == ynnpack.report["accuracy"] and eigen.report["count"] == 96


def test_an_unknown_forward_dots_setting_is_one_line_before_any_compute(tmp_path):
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO,
                   compilation.FORWARD_DOTS_ENV: "onednn"}
    result = subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/indonli_large.py:cpu_test",
                             f"--workdir={tmp_path / 'run'}"], capture_output=True, text=True, env=environment,
                            cwd=REPO, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: NLI_JAX_CPU_FORWARD_DOTS='onednn': expected one of eigen, ynnpack")
    assert not (tmp_path / "run").exists()
