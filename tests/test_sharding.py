"""FSDP and tensor parallelism through the loop on 8 fake CPU devices: the same per-step losses as
pure data parallelism, parameters and their Adam moments held in the shardings the rules give,
undivisible dimensions replicated with a warning, and models created directly in their shardings."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

# Float32 sums reduced in another order (per shard, then across devices): per-step train losses
# agree to this, as across device counts in tests/test_finetune.py.
LOSS_TOLERANCE = 2e-5

MESHES = {"data8": {"data": 8}, "data2_fsdp4": {"data": 2, "fsdp": 4}, "data2_tensor4": {"data": 2, "tensor": 4},
          "fsdp2_tensor4": {"fsdp": 2, "tensor": 4}}

# The training loop (train_and_evaluate, its jitted step) once per mesh in one process with 8
# devices; loop.train is wrapped only to keep the final state whose shardings are checked.
SCRIPT = r"""
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
from configs import indonli_large
from nli_jax.train import loop


def shardings_of(tree):  # {path: PartitionSpec} the arrays hold (not the ones asked for)
    return {jax.tree_util.keystr(path): x.sharding.spec
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(x, "sharding")}

meshes, root = json.loads(sys.argv[1]), sys.argv[2]
train, kept = loop.train, []
def keep_state(*args, **kwargs):
    out = train(*args, **kwargs)
    kept.append(out[0])
    return out
loop.train = keep_state
report = {}
for name, shape in meshes.items():
    config = indonli_large.get_config("cpu_test")
    config.mesh.shape = dict(shape)
    config.model.preset = "tiny-bert-4heads"
    config.data.tfds_dir = root + "/tfds"
    config.train.max_steps = 6
    config.train.log_every_steps = 1
    config.eval_splits = ("validation",)
    # Padded rows: the same rows and dropout masks on every mesh. Packed rows are laid out per
    # data-parallel shard, so masks fall differently when that size changes (data8 vs data2_*).
    config.data.packing = False
    config.data.pad_to_max_length = True  # one shape: each step compiled once a mesh, not once a bucket
    workdir = f"{root}/{name}"
    loop.train_and_evaluate(config, workdir)
    state = kept.pop()
    losses = [json.loads(line)["train/loss"] for line in open(workdir + "/metrics.jsonl")]
    specs = {path: [list(a) if isinstance(a, tuple) else a for a in spec] for path, spec in shardings_of(state).items()}
    shards = {path: list(x.addressable_shards[0].data.shape)
              for path, x in jax.tree_util.tree_flatten_with_path(state)[0] for path in [jax.tree_util.keystr(path)]}
    report[name] = {"losses": losses, "specs": specs, "shards": shards, "log": open(workdir + "/train.log").read()}
print("REPORT" + json.dumps(report))
"""


def _run_meshes(tmp_path, meshes):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(meshes), str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (tmp_path / "report.json").write_text(proc.stdout.split("REPORT", 1)[1])
    return json.loads(proc.stdout.split("REPORT", 1)[1])


def _spec(report, path):
    matches = [spec for p, spec in report["specs"].items() if p.endswith(path)]
    assert len(matches) == 1, (path, sorted(report["specs"])[:20])
    return matches[0]


# (path suffix of a parameter, its expected spec per mesh, written out by hand). tiny-bert-4heads:
# vocab 185 (the fixture tokenizer's) x embed 64, 4 heads of 16, mlp 128.
QUERY = "['encoder']['layers'][0]['attention']['query']['kernel']"  # [embed, heads, kv]
OUTPUT = "['encoder']['layers'][1]['attention']['output']['kernel']"  # [heads, kv, embed]
MLP_IN = "['encoder']['layers'][0]['mlp_in']['kernel']"  # [embed, mlp]
WORD = "['encoder']['embeddings']['word']['embedding']"  # [vocab, embed]
EXPECTED = {
    "data8": {QUERY: [None, None, None], OUTPUT: [None, None, None], MLP_IN: [None, None], WORD: [None, None]},
    "data2_fsdp4": {QUERY: ["fsdp", None, None], OUTPUT: [None, None, "fsdp"], MLP_IN: ["fsdp", None],
                    WORD: [None, "fsdp"]},
    "data2_tensor4": {QUERY: [None, "tensor", None], OUTPUT: ["tensor", None, None], MLP_IN: [None, "tensor"],
                      WORD: [None, None]},
    "fsdp2_tensor4": {QUERY: ["fsdp", "tensor", None], OUTPUT: ["tensor", None, "fsdp"], MLP_IN: ["fsdp", "tensor"],
                      WORD: [None, "fsdp"]},
}
FULL_SHAPES = {QUERY: [64, 4, 16], OUTPUT: [4, 16, 64], MLP_IN: [64, 128], WORD: [185, 64]}
MESH_SIZES = {"data2_fsdp4": {"fsdp": 4}, "data2_tensor4": {"tensor": 4}, "fsdp2_tensor4": {"fsdp": 2, "tensor": 4},
              "data8": {}}


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_fsdp_and_tensor_meshes_train_like_data_parallel_with_sharded_params_and_moments(tmp_path):
    reports = _run_meshes(tmp_path, MESHES)
    reference = reports["data8"]["losses"]
    assert len(reference) == 6
    for name, report in reports.items():
        diffs = [abs(a - b) for a, b in zip(report["losses"], reference)]
        print(f"{name} vs data8: max |loss diff| {max(diffs):.2e} over {len(diffs)} steps")
        assert len(report["losses"]) == len(reference) and max(diffs) <= LOSS_TOLERANCE, (name, diffs)
        assert str(MESH_SIZES[name] and next(iter(MESH_SIZES[name]))) in report["log"] or name == "data8"
        for path, spec in EXPECTED[name].items():
            assert _spec(report, "['params']" + path) == spec, (name, path)
            # Adam's first and second moments live where their parameter lives.
            assert _spec(report, ".mu" + path) == spec, (name, "mu", path)
            assert _spec(report, ".nu" + path) == spec, (name, "nu", path)
            # Each device holds only its shard of the parameter.
            local = next(s for p, s in report["shards"].items() if p.endswith("['params']" + path))
            expected = [n // MESH_SIZES[name].get(axis, 1) if axis else n for n, axis in zip(FULL_SHAPES[path], spec)]
            assert local == expected, (name, path, local)
        counts = [spec for p, spec in report["specs"].items() if p.endswith(".count")]
        assert counts and all(spec == [] for spec in counts), name  # optimizer step counts: replicated
        # 185 rows do not divide over tensor:4: replicated, and said so.
        undivided = "does not divide vocab=185 over tensor" in report["log"]
        assert undivided == ("tensor" in name), name


def test_processes_agree_on_bucket_lengths_without_exchanging_anything():
    """pipeline.train_dataset / eval_batches given every example's length: each process pads its
    rows of a step to the bucket of the whole global batch's longest row."""
    import numpy as np
    from nli_jax.data import pipeline
    rng = np.random.default_rng(0)
    source = [{"idx": i, "input_ids": np.ones(int(n), np.int32)} for i, n in enumerate(
              rng.choice([5, 12, 20, 40, 100], size=203, p=[0.55, 0.3, 0.1, 0.04, 0.01]))]
    encode = lambda example: example
    batching = pipeline.Batching(buckets=(16, 32, 64, 128), pad_values=(("input_ids", 0),))
    assert batching.needs_global_lengths
    lengths = pipeline.encoded_lengths(source, encode, 0, 1)
    train = [[b["input_ids"].shape[1] for b in pipeline.train_dataset(
        source, encode, batching, local_batch_size=4, seed=1, num_epochs=1, process_index=p, process_count=3,
        lengths=lengths)] for p in range(3)]
    one = [b["input_ids"].shape[1] for b in pipeline.train_dataset(
        source, encode, batching, local_batch_size=12, seed=1, num_epochs=1)]
    assert train[0] == train[1] == train[2] == one and len(set(one)) > 1
    dummy = dict(source[0], idx=-1)
    evals = [[b["input_ids"].shape[1] for b in pipeline.eval_batches(
        source, encode, batching, local_batch_size=8, dummy=dummy, process_index=p, process_count=3,
        lengths=lengths)] for p in range(3)]
    assert evals[0] == evals[1] == evals[2] and len(set(evals[0])) > 1


def _cli(module, workdir, *overrides, config, devices=8, timeout=900):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    proc = subprocess.run([sys.executable, "-m", module, f"--config={config}", f"--workdir={workdir}", *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {json.loads(line)["step"]: json.loads(line)["train/loss"] for line in
            (workdir / "metrics.jsonl").read_text().splitlines()}


@pytest.mark.slow
@pytest.mark.parametrize("module,config,overrides", [
    # Padded rows, as in the in-process test above: packed rows are laid out per data-parallel
    # shard, so dropout masks fall differently when that size changes (data8 vs data2_tensor4).
    ("finetune.main", "configs/indonli_large.py:cpu_test",
     ("--config.train.max_steps=12", "--config.eval_splits=('validation',)", "--config.data.packing=False")),
    ("pretrain.main", "configs/pretrain/indobert_base.py:cpu_test",
     ("--config.train.max_steps=12", "--config.train.eval_every_steps=12", "--config.train.checkpoint_every_steps=12")),
], ids=["finetune", "pretrain"])
def test_cli_runs_on_fsdp_and_tensor_meshes_match_data_parallel(tmp_path, module, config, overrides):
    """The commands users run, on 8 CPU devices, per mesh: the same per-step losses as data:8."""
    common = (*overrides, "--config.train.log_every_steps=1", "--config.model.preset=tiny-bert-4heads",
              f"--config.data.tfds_dir={tmp_path / 'tfds'}")
    curves = {name: _cli(module, tmp_path / name, *common, f"--config.mesh.shape={shape}", config=config)
              for name, shape in MESHES.items()}
    for name, curve in curves.items():
        assert sorted(curve) == list(range(1, 13)), name
        diff = max(abs(curve[s] - curves["data8"][s]) for s in curve)
        print(f"{module} {name} vs data8: max |loss diff| {diff:.2e} over 12 steps")
        assert diff <= LOSS_TOLERANCE, name


@pytest.mark.slow
def test_sigterm_to_one_of_two_processes_saves_the_same_step_on_both(tmp_path):
    """Pods: the preemption notice reaches one host; JAX's preemption service (no per-step
    exchange in the loop) makes both processes save the same step and exit 143; the rerun resumes."""
    import signal
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--config=configs/indonli_large.py:cpu_test", f"--workdir={tmp_path / 'run'}",
            "--config.train.num_epochs=12", "--config.train.checkpoint_every_steps=20",
            "--config.eval_splits=('validation',)", f"--config.data.tfds_dir={tmp_path / 'tfds'}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)

    def start(port):
        return [subprocess.Popen([sys.executable, "-m", "finetune.main", *args, f"--coordinator_address=127.0.0.1:{port}",
                                  "--num_processes=2", f"--process_id={i}"], cwd=REPO, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    procs = start(port)
    root = tmp_path / "run" / "checkpoints"
    deadline = time.time() + 400
    while not (root.is_dir() and any(p.isdigit() for p in os.listdir(root))):
        assert time.time() < deadline and all(p.poll() is None for p in procs), "no checkpoint before the signal"
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], [o[-2000:] for o in outputs]
    saved = [int(o.split("SIGTERM: checkpoint saved at step ")[1].split(";")[0]) for o in outputs]
    print(f"SIGTERM to process 1: both saved step {saved}")
    assert saved[0] == saved[1] and (root / str(saved[0])).is_dir()
    assert not (tmp_path / "run" / "results.json").exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = start(port)
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outputs]
    assert f"at step {saved[0]}" in outputs[0] and "resumed from" in outputs[0]
    assert (tmp_path / "run" / "results.json").is_file()
