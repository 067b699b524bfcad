"""Scanned layers (model.scan_layers) and remat policies (model.remat): the scanned encoder computes
what the loop computes with the same weights (converted by encoder.stack_layers), through the jitted
train step too; dropout draws other masks per layer and per step; every remat policy gives the
loop's loss and gradients; Hugging Face import/export round-trips a scanned model; older configs'
remat=True/False still plan and resume; scanned parameters shard by the rules, layers unsharded.

Tolerances (float32): forward outputs and gradients 1e-5 (the scan and the loop run the same
operations; only XLA's fusion of them differs), transformers parity 1e-4 (as tests/test_checkpoints.py).
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx, traverse_util

from conftest import REPO, config_for
from nli_jax.models import ForSequenceClassification, make_rngs, preset
from nli_jax.models import encoder
from nli_jax.models.encoder import stack_layers, unstack_layers
from nli_jax.plan import REMAT_POLICIES
from nli_jax.train.steps import make_train_step

TOLERANCE = 1e-5
LAYERS = 3


def _config(dropout=0.0, **changes):
    return preset("tiny-bert", num_hidden_layers=LAYERS, hidden_dropout_prob=dropout,
                  attention_probs_dropout_prob=dropout, **changes)


def _flat(model):
    return {path: v[...] for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _models(dropout=0.0, remat="none"):
    """(loop model, scanned model with the loop's weights stacked into it)."""
    loop = ForSequenceClassification(_config(dropout, remat=remat), num_labels=3, rngs=make_rngs(0))
    scanned = ForSequenceClassification(_config(dropout, remat=remat, scan_layers=True), num_labels=3,
                                        rngs=make_rngs(1))  # other seed: every weight must come from the loop's
    flat = dict(nnx.to_flat_state(nnx.state(scanned, nnx.Param)))
    stacked = stack_layers(_flat(loop))
    assert set(stacked) == set(flat)
    for path, value in stacked.items():
        assert flat[path].shape == value.shape, path
        flat[path].set_value(value)
    nnx.update(scanned, nnx.from_flat_state(flat))
    return loop, scanned


def _padded_batch():
    rng = np.random.default_rng(0)
    mask = np.ones((4, 12), np.int32)
    mask[1, 7:] = 0
    mask[3, 3:] = 0
    return {"input_ids": rng.integers(5, 900, (4, 12)).astype(np.int32) * mask, "attention_mask": mask,
            "token_type_ids": (np.arange(12)[None, :] >= 6).astype(np.int32).repeat(4, 0),
            "label": np.array([0, 1, 2, 1], np.int32), "weight": np.ones(4, np.float32)}


def _packed_batch():
    """Two rows of 12 in one group, four examples (lengths 5, 4 | 7, 5), the rest padding."""
    rng = np.random.default_rng(1)
    segments = np.array([[1] * 5 + [2] * 4 + [0] * 3, [1] * 7 + [2] * 5], np.int32)
    positions = np.array([list(range(5)) + list(range(4)) + [0] * 3, list(range(7)) + list(range(5))], np.int32)
    packing = {"segment_ids": segments, "position_ids": positions, "cls_index": np.array([[0, 5, 12, 19]], np.int32)}
    return {"input_ids": rng.integers(5, 900, (2, 12)).astype(np.int32) * (segments > 0),
            "attention_mask": (segments > 0).astype(np.int32), "token_type_ids": np.zeros((2, 12), np.int32),
            "packing": packing, "label": np.array([0, 1, 2, 1], np.int32), "weight": np.ones(4, np.float32)}


class ClassificationTask:
    """The classification cross-entropy of a batch (padded or packed), as the train step calls a task."""

    def loss_normalizers(self, batch):
        return None

    def loss(self, model, batch, deterministic):
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                       deterministic=deterministic, packing=batch.get("packing"))
        rows = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * batch["weight"]
        return jnp.sum(rows), jnp.sum(batch["weight"]), {}


def _sgd_step(model):
    """The jitted train step with plain SGD at rate 1: new params = params - mean gradient, so the
    updated parameters show the gradients themselves."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx = optax.sgd(1.0)
    step = jax.jit(make_train_step(graphdef, rest, ClassificationTask(), tx, optax.constant_schedule(1.0), seed=3))
    return step, {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}


def _flat_dict(tree):
    return {tuple(int(k) if isinstance(k, str) and k.isdigit() else k for k in path): v
            for path, v in traverse_util.flatten_dict(tree).items()}


def _assert_same_params(loop_params, scanned_params, tolerance=TOLERANCE):
    expected = stack_layers(_flat_dict(loop_params))
    got = _flat_dict(scanned_params)
    assert set(expected) == set(got)
    for path in expected:
        np.testing.assert_allclose(got[path], expected[path], rtol=0, atol=tolerance, err_msg=str(path))


@pytest.mark.parametrize("batch", [_padded_batch, _packed_batch], ids=["padded", "packed"])
def test_scanned_forward_and_gradients_equal_the_loop(batch):
    batch = batch()
    loop, scanned = _models()
    task = ClassificationTask()
    outputs, grads = [], []
    for model in (loop, scanned):
        outputs.append(model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                             packing=batch.get("packing")))
        grads.append(nnx.to_pure_dict(nnx.grad(lambda m: task.loss(m, batch, True)[0])(model)))
    assert outputs[0].shape == (4, 3)
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=0, atol=TOLERANCE)
    _assert_same_params(grads[0], grads[1])
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[0])) > 100 * TOLERANCE  # not all ~0


@pytest.mark.parametrize("batch", [_padded_batch, _packed_batch], ids=["padded", "packed"])
def test_scanned_train_step_equals_the_loop_without_dropout(batch):
    batch = batch()
    results = []
    for model in _models():
        step, state = _sgd_step(model)
        results.append((state["params"], *step(state, batch)))
    (loop_before, loop_state, loop_metrics), (_, scanned_state, scanned_metrics) = results
    np.testing.assert_allclose(scanned_metrics["loss_sum"], loop_metrics["loss_sum"], rtol=1e-6)
    _assert_same_params(loop_state["params"], scanned_state["params"])
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(loop_state["params"]),
                                                             jax.tree.leaves(loop_before)))
    assert moved > 100 * TOLERANCE  # the step changed the parameters


def test_scanned_dropout_masks_differ_per_layer_and_per_step(monkeypatch):
    """Every hidden-state dropout mask the scanned model draws in a train step (embeddings, then two
    per layer) and every attention one (one per layer) is its own; the next step (reseeded by
    nnx.reseed in the train step) draws new ones."""
    masks = []
    original = encoder.Dropout.__call__

    def recording(self, inputs, *, deterministic=None, rngs=None):
        out = original(self, inputs, deterministic=deterministic, rngs=rngs)
        if not (self.deterministic if deterministic is None else deterministic):
            jax.debug.callback(lambda dropped: masks.append(np.asarray(dropped)), out == 0)
        return out
    monkeypatch.setattr(encoder.Dropout, "__call__", recording)
    _, scanned = _models(dropout=0.3)
    step, state = _sgd_step(scanned)
    batch = _padded_batch()
    batch["attention_mask"] = np.ones_like(batch["attention_mask"])  # no masked scores: zeros are dropout's
    drawn = []
    for _ in range(2):
        masks.clear()
        state, _ = step(state, batch)
        jax.effects_barrier()
        drawn.append({m.tobytes(): m for m in masks})
    hidden = 1 + 2 * LAYERS
    for step_masks in drawn:
        shapes = [m.shape for m in step_masks.values()]
        # Distinct masks: one for each call site and layer (identical ones would collapse).
        assert shapes.count((4, 12, 64)) == hidden and shapes.count((4, 2, 12, 12)) == LAYERS, shapes
        assert all(0.2 < m.mean() < 0.4 for m in step_masks.values())  # rate 0.3
    assert not set(drawn[0]) & set(drawn[1])  # the second step's masks are new


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_remat_policies_give_the_same_loss_and_gradients(scan):
    """Through the jitted train step with dropout on (a recomputed layer must redraw its masks)."""
    batch = _packed_batch()
    results = {}
    for policy in REMAT_POLICIES:
        loop, scanned = _models(dropout=0.1, remat=policy)
        step, state = _sgd_step(scanned if scan else loop)
        results[policy] = step(state, batch)
    reference_state, reference_metrics = results["none"]
    for policy, (state, metrics) in results.items():
        np.testing.assert_allclose(metrics["loss_sum"], reference_metrics["loss_sum"], rtol=1e-6, err_msg=policy)
        for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(reference_state["params"])):
            np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE, err_msg=policy)


def test_remat_policies_rematerialise():
    """Each policy other than "none" puts the layer under jax.checkpoint (a remat primitive in the
    gradient's program); "none" does not."""
    batch = _padded_batch()
    for policy in REMAT_POLICIES:
        for scan in (False, True):
            model = ForSequenceClassification(_config(remat=policy, scan_layers=scan), num_labels=3, rngs=make_rngs(0))
            graphdef, params, rest = nnx.split(model, nnx.Param, ...)
            rest = nnx.to_pure_dict(rest)  # merged inside the trace, as the train step does

            def loss(p):
                return ClassificationTask().loss(nnx.merge(graphdef, p, rest), batch, True)[0]
            program = str(jax.make_jaxpr(jax.grad(loss))(params))
            assert ("remat" in program or "checkpoint" in program) == (policy != "none"), (policy, scan)


def test_old_remat_values_and_the_scanned_flag_in_encoder_config():
    assert preset("tiny-bert", remat=True).remat == "full"
    assert preset("tiny-bert", remat=False).remat == "none"
    assert preset("tiny-bert").remat == "none" and not preset("tiny-bert").scan_layers
    with pytest.raises(ValueError, match="unknown remat 'partial'"):
        preset("tiny-bert", remat="partial")
    assert preset("tiny-bert", scan_layers=True).scans_layers
    assert not preset("tiny-albert", scan_layers=True).scans_layers  # ALBERT keeps its loop
    albert = ForSequenceClassification(preset("tiny-albert", scan_layers=True), num_labels=3, rngs=make_rngs(0))
    assert isinstance(albert.encoder.layers, nnx.List)
    # nli-jax's own fields never reach a Hugging Face config.json, nor are read from one.
    hf = preset("tiny-bert", remat="dots_saveable", scan_layers=True, dtype="bfloat16").to_hf_dict()
    assert not {"remat", "scan_layers"} & set(hf) and hf["dtype"] == "float32"
    from nli_jax.models.config import EncoderConfig
    config = EncoderConfig.from_hf_dict(dict(hf, remat=True, scan_layers=True))
    assert config.remat == "none" and not config.scan_layers and not {"remat", "scan_layers"} & set(config.extra)


# --- Hugging Face import / export -------------------------------------------------------------

def test_hugging_face_round_trip_of_a_scanned_model(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=64, num_labels=3)
    torch.manual_seed(0)
    reference = transformers.BertForSequenceClassification(hf_config).eval()
    reference.save_pretrained(tmp_path / "hf")
    batch = _padded_batch()
    ids = batch["input_ids"] % 300
    inputs = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(batch["attention_mask"]),
              "token_type_ids": torch.tensor(batch["token_type_ids"])}
    with torch.no_grad():
        expected = reference(**inputs).logits.numpy()

    model = ForSequenceClassification.from_pretrained(str(tmp_path / "hf"), scan_layers=True)
    assert model.encoder.layers.mlp_in.kernel.shape == (LAYERS, 64, 128)  # really scanned
    logits = np.asarray(model(ids, batch["attention_mask"], batch["token_type_ids"]))
    assert np.max(np.abs(logits - expected)) <= 1e-4

    model.save_pretrained(str(tmp_path / "export"))
    saved = json.loads((tmp_path / "export" / "config.json").read_text())
    assert not {"remat", "scan_layers"} & set(saved)
    back = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "export").eval()
    with torch.no_grad():
        again = back(**inputs).logits.numpy()
    assert np.max(np.abs(again - expected)) <= 1e-4
    # Layer by layer: export's per-layer weights are transformers' own.
    for name, weight in reference.state_dict().items():
        if ".layer." in name:
            np.testing.assert_array_equal(back.state_dict()[name].numpy(), weight.numpy(), err_msg=name)


def test_unstack_and_stack_are_inverse_and_name_each_layer():
    _, scanned = _models()
    flat = _flat(scanned)
    per_layer = unstack_layers(flat)
    assert ("encoder", "layers", LAYERS - 1, "mlp_in", "kernel") in per_layer
    assert not any(p[:2] == ("encoder", "layers") and isinstance(p[2], str) for p in per_layer)
    np.testing.assert_array_equal(per_layer[("encoder", "layers", 1, "mlp_in", "kernel")],
                                  flat[("encoder", "layers", "mlp_in", "kernel")][1])
    again = stack_layers(per_layer)
    assert set(again) == set(flat)
    for path in flat:
        np.testing.assert_array_equal(again[path], flat[path])
    with pytest.raises(ValueError, match="are not 0..1"):
        stack_layers({k: v for k, v in per_layer.items() if k[:3] != ("encoder", "layers", 0)})


# --- older configs and workdirs ---------------------------------------------------------------

@pytest.mark.parametrize("old,new", [(False, "none"), (True, "full"), ("dots_saveable", "dots_saveable")])
def test_old_remat_values_plan(old, new):
    from nli_jax import cli
    from nli_jax.planner import build_plan
    config = config_for()
    config.model.remat = old  # as an older config file assigns it
    assert build_plan(config, training=False).model.remat == new
    config = config_for()
    cli.apply_overrides(config, [f"model.remat={old}"])  # as the command line gives it
    assert build_plan(config, training=False).model.remat == new


def test_unknown_remat_policy_is_refused():
    from nli_jax.errors import ConfigValueError
    from nli_jax.planner import build_plan
    config = config_for("indonli_large:cpu_test", "model.remat=partial")
    with pytest.raises(ConfigValueError, match="model.remat must be one of .*'dots_with_no_batch_dims_saveable'"):
        build_plan(config, training=False)


def test_an_old_workdir_with_remat_false_resumes(tmp_path):
    from nli_jax import workdir
    from nli_jax.planner import build_plan, saved_config
    current = build_plan(config_for(), training=False).config_json
    assert current["model"]["remat"] == "none" and ["layers", None] in [list(r) for r in current["mesh"]["rules"]]
    # What an older nli-jax wrote: remat a boolean, no scan_layers key, no ("layers", None) rule.
    old = json.loads(json.dumps(current))
    old["model"]["remat"] = False
    del old["model"]["scan_layers"]
    old["mesh"]["rules"] = [r for r in old["mesh"]["rules"] if r[0] != "layers"]
    (tmp_path / workdir.CONFIG_FILE).write_text(json.dumps(old))
    workdir.check_config(str(tmp_path), current)  # accepted
    assert build_plan(saved_config(str(tmp_path)), training=False).model.remat == "none"
    # A different remat, or scanning, is another run: refused, naming the key.
    for key, value in (("remat", True), ("scan_layers", True)):
        changed = json.loads(json.dumps(current))
        changed["model"][key] = value
        with pytest.raises(workdir.WorkdirConfigError, match=f"model.{key}"):
            workdir.check_config(str(tmp_path), changed)


# --- sharding ---------------------------------------------------------------------------------

SHARDING_SCRIPT = r"""
import json
import jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
from flax import nnx
from configs.finetune_common import MESH_RULES
from nli_jax.models import ForSequenceClassification, make_rngs, preset
from nli_jax.train import mesh as mesh_lib, sharding as sharding_lib

config = preset("tiny-bert-4heads", num_hidden_layers=4, scan_layers=True)  # 4: fsdp could split it
report = {}
for name, shape in {"fsdp2_tensor4": {"fsdp": 2, "tensor": 4}, "data2_fsdp4": {"data": 2, "fsdp": 4}}.items():
    mesh = mesh_lib.make_mesh(shape)
    model, params, shardings = sharding_lib.create_sharded(
        lambda: ForSequenceClassification(config, num_labels=3, rngs=make_rngs(0)), mesh, MESH_RULES)
    flat = {".".join(map(str, p)): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
            for p in [[k.key for k in p]]}
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    rest = nnx.to_pure_dict(rest)  # merged inside the trace, as the steps do
    ids = np.ones((8, 16), np.int32)
    logits = jax.jit(lambda p: nnx.merge(graphdef, p, rest)(ids, ids, 0 * ids))(params)
    report[name] = {"specs": {k: [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]
                              for k, x in flat.items()},
                    "shapes": {k: list(x.shape) for k, x in flat.items()},
                    "logits_finite": bool(np.isfinite(np.asarray(logits)).all())}
print("REPORT" + json.dumps(report))
"""


def test_scanned_parameters_shard_by_the_rules_with_layers_unsharded():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", SHARDING_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.split("REPORT", 1)[1])
    expected = {  # [layers, ...the rules' axes for the per-layer dims]
        "fsdp2_tensor4": {"encoder.layers.attention.query.kernel": [None, "fsdp", "tensor", None],
                          "encoder.layers.attention.output.kernel": [None, "tensor", None, "fsdp"],
                          "encoder.layers.mlp_in.kernel": [None, "fsdp", "tensor"],
                          "encoder.layers.mlp_in.bias": [None, "tensor"],
                          "encoder.layers.mlp_norm.scale": [None, "fsdp"]},
        "data2_fsdp4": {"encoder.layers.attention.query.kernel": [None, "fsdp", None, None],
                        "encoder.layers.mlp_in.kernel": [None, "fsdp", None],
                        "encoder.layers.mlp_in.bias": [None, None]},
    }
    for name, specs in expected.items():
        got = report[name]
        assert got["logits_finite"], name
        assert got["shapes"]["encoder.layers.attention.query.kernel"] == [4, 64, 4, 16]
        for path, spec in specs.items():
            assert got["specs"][path] == spec, (name, path, got["specs"][path])
        # No parameter is split along the layers axis.
        assert all(not spec or spec[0] is None for path, spec in got["specs"].items() if ".layers." in path), name
