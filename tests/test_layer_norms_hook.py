"""The layer-norms run hook (nli_jax/hooks/layer_norms.py, configs/pretrain/indobert_large_watched.py):
per-layer norms against numpy, spikes against their definition, and a fine-tuning run with the hook
whose TensorBoard norms add up to the loop's own global gradient norm."""
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO


def test_each_layers_norm_is_the_norm_of_its_parameters_scanned_or_not():
    from nli_jax.hooks.layer_norms import layer_norms, squared_norms
    rng = np.random.default_rng(0)
    tree = {"encoder": {"layers": {str(i): {"attention": {"kernel": rng.normal(size=(4, 3))},
                                            "norm": {"scale": rng.normal(size=(3,))}} for i in range(2)},
                        "embeddings": {"word": {"embedding": rng.normal(size=(7, 3))}}}}
    scanned = {"encoder": {"layers": {"attention": {"kernel": np.stack([tree["encoder"]["layers"][str(i)]["attention"]
                                                                         ["kernel"] for i in range(2)])},
                                      "norm": {"scale": np.stack([tree["encoder"]["layers"][str(i)]["norm"]["scale"]
                                                                  for i in range(2)])}},
                           "embeddings": tree["encoder"]["embeddings"]}}
    want = {f"encoder/layers/{i}": np.sqrt(np.sum(tree["encoder"]["layers"][str(i)]["attention"]["kernel"] ** 2)
                                           + np.sum(tree["encoder"]["layers"][str(i)]["norm"]["scale"] ** 2))
            for i in range(2)}
    want["encoder/embeddings"] = np.linalg.norm(tree["encoder"]["embeddings"]["word"]["embedding"])
    for t in (tree, scanned):
        got = layer_norms({k: np.asarray(v) for k, v in squared_norms(t).items()})
        assert sorted(got) == sorted(want)
        np.testing.assert_allclose([got[k] for k in sorted(want)], [want[k] for k in sorted(want)], rtol=1e-5)


def test_a_spike_is_a_loss_above_k_times_the_median_of_the_window_before_it(tmp_path):
    from nli_jax.hooks.layer_norms import LayerNormsHook, LayerNormsOptions
    hook = LayerNormsHook(str(tmp_path), LayerNormsOptions(enabled=True, spike_factor=2.0, window=3))
    # Chosen so that a window of 2 or 4 flags other steps ([4, 7] and [7, 9]).
    losses = [2.5, 3.0, 1.5, 0.5, 3.0, 0.5, 0.5, 5.0, 2.5, 5.0]
    flagged = [hook._count({"step": s, "loss": v}) for s, v in enumerate(losses)]
    want = [s > 0 and v > 2.0 * np.median(losses[max(0, s - 3):s]) for s, v in enumerate(losses)]
    assert flagged == want and hook.spikes == [7, 8]


def _scalars(directory):
    """{tag: {step: value}} of every TensorBoard event file under `directory` (TFRecord framing)."""
    from tensorboardX.proto import event_pb2
    out = {}
    for path in directory.rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watched")
    proc = subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/indonli_large.py:cpu_test",
                           f"--workdir={tmp / 'run'}", f"--config.data.tfds_dir={tmp / 'tfds'}",
                           "--config.hooks.layer_norms.enabled=True", "--config.hooks.layer_norms.every_steps=4",
                           "--config.hooks.layer_norms.spike_factor=1.5", "--config.train.log_every_steps=4",
                           "--config.train.num_epochs=2", "--config.optimizer.grad_clip=0.0"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def test_the_runs_layer_gradient_norms_add_up_to_its_global_gradient_norm(watched_run):
    scalars = _scalars(watched_run / "tensorboard")
    layers = sorted(t for t in scalars if t.startswith("grad_norm/"))
    assert "grad_norm/encoder/layers/0" in layers and "param_norm/encoder/embeddings" in scalars
    logged = {row["step"]: row["train/grad_norm"] for row in
              map(json.loads, (watched_run / "metrics.jsonl").read_text().splitlines()) if "train/grad_norm" in row}
    steps = sorted(set(scalars["grad_norm/encoder/layers/0"]) & set(logged))
    assert len(steps) >= 3
    for step in steps:
        total = np.sqrt(sum(scalars[t][step] ** 2 for t in layers))
        assert total == pytest.approx(logged[step], rel=1e-4), step


def test_the_runs_spikes_are_counted_in_its_results_and_records(watched_run):
    results = json.loads((watched_run / "results.json").read_text())
    rows = [json.loads(line) for line in (watched_run / "loss_spikes.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == results["steps"]
    assert results["loss_spikes"]["count"] == sum(r["spike"] for r in rows)
    assert results["loss_spikes"]["steps"] == [r["step"] for r in rows if r["spike"]]
    losses = [r["loss"] for r in rows]
    want = [s > 0 and v > 1.5 * np.median(losses[max(0, s - 100):s]) for s, v in enumerate(losses)]
    assert [r["spike"] for r in rows] == want


def test_the_watched_recipe_is_indobert_large_with_the_hook():
    from configs.pretrain import indobert_large, indobert_large_watched
    from nli_jax.planner import build_plan
    watched, parent = (build_plan(m.get_config("cpu_test"), training=False)
                       for m in (indobert_large_watched, indobert_large))
    assert watched.hook("layer_norms").enabled and not parent.hook("layer_norms").enabled
    assert (watched.hook("layer_norms").every_steps, watched.hook("layer_norms").spike_factor) == (100, 3.0)
    assert watched.model == parent.model and watched.optimizer == parent.optimizer
