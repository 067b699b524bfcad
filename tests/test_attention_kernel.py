"""The splash attention kernel (nli_jax.models.attention) against the plain path, on CPU in Pallas
interpret mode: padded rows, packed rows, float32 and bfloat16, gradients, a whole Encoder, the
"auto" choice, the sharded (shard_map) path on fake CPU devices, a compilation for TPU v4, and a
sliding window (ModernBERT's local layers)."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nli_jax.models import attention
from nli_jax.models.config import ConfigError, EncoderConfig
from nli_jax.models import encoder
from nli_jax.models.encoder import Encoder, make_rngs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, HEADS, LENGTH, HEAD_DIM = 2, 2, 128, 64

# Measured max |splash - plain| at real positions (this file's shapes, CPU interpret mode):
# outputs 1.5e-7 (float32) and 2.0e-3 (bfloat16: a rounding of outputs below 1); gradients 5e-7
# and 7.8e-3 (entries up to 1.9); a 2-layer encoder's hidden states (sharp attention, see
# test_encoder_with_splash_matches_plain) 5.8e-6 and 7.8e-2 against 2.8-3.4 with the kernel's
# segment ids dropped. The tolerances leave 3-10x room.
TOLERANCE = {jnp.float32: 2e-6, jnp.bfloat16: 1e-2}
GRAD_TOLERANCE = {jnp.float32: 5e-6, jnp.bfloat16: 3e-2}
ENCODER_TOLERANCE = {"float32": 5e-5, "bfloat16": 0.25}


def qkv(dtype, seed=0, length=LENGTH):
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(HEAD_DIM) ** 0.5  # q is scaled by the encoder; unit-scale logits here
    return tuple(jnp.asarray(rng.standard_normal((BATCH, HEADS, length, HEAD_DIM)) * scale, dtype) for _ in range(3))


def padding_mask(length=LENGTH):
    mask = np.zeros((BATCH, length), bool)
    mask[0, :100], mask[1, :37] = True, True
    return jnp.asarray(mask)


def packed_segments(length=LENGTH):
    """Row 0: three examples then padding; row 1: two examples then padding."""
    segments = np.zeros((BATCH, length), np.int32)
    segments[0, :40], segments[0, 40:90], segments[0, 90:120] = 1, 2, 3
    segments[1, :70], segments[1, 70:101] = 1, 2
    return jnp.asarray(segments)


def packed_mask(segments):
    """The mask Encoder.__call__ builds for packed rows."""
    return (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)


def real_positions(real_tokens):
    return jnp.asarray(real_tokens)[:, None, :, None]  # against [b, h, q, d]


def splash(q, k, v, mask):
    with attention.interpret_splash():
        return jax.jit(lambda q, k, v, m: attention.attend(q, k, v, m, implementation="splash"))(q, k, v, mask)


def plain(q, k, v, mask):
    return jax.jit(lambda q, k, v, m: attention.attend(q, k, v, m, implementation="plain"))(q, k, v, mask)


def max_diff_at(real, a, b):
    return float(jnp.max(jnp.where(real, jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)), 0.0)))


MASKS = {
    "padded": (padding_mask, lambda: padding_mask()),
    "packed_mask": (lambda: packed_mask(packed_segments()), lambda: packed_segments() > 0),
    "packed_segment_ids": (packed_segments, lambda: packed_segments() > 0),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("layout", sorted(MASKS))
def test_splash_matches_plain_at_real_positions(layout, dtype):
    make_mask, make_real = MASKS[layout]
    q, k, v = qkv(dtype)
    mask, real = make_mask(), real_positions(make_real())
    out_splash, out_plain = splash(q, k, v, mask), plain(q, k, v, mask)
    assert out_splash.dtype == out_plain.dtype == dtype
    assert out_splash.shape == out_plain.shape == q.shape
    assert max_diff_at(real, out_splash, out_plain) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["padded", "packed_segment_ids"])
def test_splash_gradients_match_plain(layout, dtype):
    """d/dq, d/dk, d/dv of a loss over real positions (the kernel's own backward pass)."""
    make_mask, make_real = MASKS[layout]
    q, k, v = qkv(dtype, seed=1)
    mask, real = make_mask(), real_positions(make_real())
    weights = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape), jnp.float32) * real

    def grads(implementation):
        def loss(q, k, v):
            out = attention.attend(q, k, v, mask, implementation=implementation)
            return jnp.sum(out.astype(jnp.float32) * weights)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    with attention.interpret_splash():
        splash_grads = grads("splash")
    plain_grads = grads("plain")
    real_tokens = jnp.asarray(make_real())[:, None, :, None]
    for name, g_splash, g_plain in zip("qkv", splash_grads, plain_grads):
        # Padding tokens get no gradient on either path: nothing real attends to them.
        assert max_diff_at(jnp.ones_like(real_tokens), g_splash, g_plain) <= GRAD_TOLERANCE[dtype], name
        assert float(jnp.abs(jnp.where(real_tokens, 0, g_splash.astype(jnp.float32))).max()) == 0.0, name
        assert float(jnp.abs(g_plain.astype(jnp.float32)).max()) > 0.1, name  # a loss that moves them


def test_lengths_the_kernel_does_not_tile_are_padded():
    """Forced splash at a length that is no multiple of 128 (a 96-token bucket): the extra
    positions are padding (segment 0), real positions unchanged."""
    q, k, v = qkv(jnp.float32, length=96)
    segments = packed_segments(length=96)
    out = splash(q, k, v, segments)
    assert out.shape == q.shape
    assert max_diff_at(real_positions(segments > 0), out, plain(q, k, v, segments)) <= TOLERANCE[jnp.float32]


def test_segment_ids_from_the_packed_mask_name_each_example():
    segments = packed_segments()
    derived = np.asarray(attention.segment_ids(packed_mask(segments)))
    original = np.asarray(segments)
    assert ((derived == 0) == (original == 0)).all()
    for row in range(BATCH):  # the same partition of the row's tokens, under other names
        pairs = set(zip(original[row].tolist(), derived[row].tolist()))
        assert len(pairs) == len(set(original[row].tolist())) == len(set(derived[row].tolist()))


def test_plain_segment_ids_equal_the_packed_mask_bitwise():
    q, k, v = qkv(jnp.float32)
    segments = packed_segments()
    assert (plain(q, k, v, segments) == plain(q, k, v, packed_mask(segments))).all()


def tiny_config(**changes):
    values = dict(vocab_size=50, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=LENGTH, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return EncoderConfig(**{**values, **changes})


def encoder_outputs(config, input_ids, mask=None, packing=None):
    model = Encoder(config, rngs=make_rngs(0))
    return jax.jit(lambda ids, m: model(ids, m, packing=packing)[0])(input_ids, mask)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_encoder_with_splash_matches_plain(layout, dtype):
    """A whole (2-layer) encoder: attention="splash" in interpret mode against "plain", at real
    positions; same parameters (same seed), so any difference is the attention's."""
    input_ids = jnp.asarray(np.random.default_rng(3).integers(1, 50, (BATCH, LENGTH)), jnp.int32)
    if layout == "padded":
        mask, packing, real = padding_mask(), None, padding_mask()
    else:
        segments = packed_segments()
        positions = jnp.asarray(np.concatenate([np.arange(40), np.arange(50), np.arange(38)])[None].repeat(2, 0))
        packing = {"segment_ids": segments, "position_ids": positions, "cls_index": jnp.zeros((BATCH, 1), jnp.int32)}
        mask, real = None, segments > 0
    # Weights 10x BERT's 0.02, so that attention moves the hidden states: at 0.02, attending to
    # every key (the kernel without segment ids) moved bfloat16 states by 2 roundings only.
    config = tiny_config(dtype=dtype, initializer_range=0.2)
    with attention.interpret_splash():
        out_splash = encoder_outputs(config.replace(attention="splash"), input_ids, mask, packing)
    out_plain = encoder_outputs(config.replace(attention="plain"), input_ids, mask, packing)
    # LayerNorm'ed hidden states of unit scale; bfloat16 differences compound over the layers.
    diff = max_diff_at(jnp.asarray(real)[:, :, None], out_splash, out_plain)
    assert diff <= ENCODER_TOLERANCE[dtype], diff


def test_auto_is_plain_on_cpu_and_with_dropout():
    q = jnp.zeros((BATCH, HEADS, LENGTH, HEAD_DIM))
    assert attention.compile_target(q).platform == "cpu"
    assert attention.choose("auto", q, dropout_active=False) == "plain"
    assert attention.choose("splash", q, dropout_active=False) == "splash"
    assert attention.choose("plain", q, dropout_active=False) == "plain"
    with pytest.raises(ValueError, match="unknown attention"):
        attention.choose("flash", q, dropout_active=False)


def test_auto_on_a_tpu_mesh_is_splash_unless_dropout_is_active():
    """The target comes from the mesh in context, not jax.default_backend() (cpu here): an
    abstract TPU v4 mesh makes "auto" splash, unless dropout is active or 128 does not divide the
    length."""
    def tpu_mesh(kind):
        device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=1, platform="tpu")
        return jax.sharding.AbstractMesh((4, 1, 1), ("data", "fsdp", "tensor"),
                                         (jax.sharding.AxisType.Auto,) * 3, abstract_device=device)
    mesh = tpu_mesh("TPU v4")

    def chosen(length=LENGTH, dropout_active=False, dtype=jnp.bfloat16, mesh=mesh):
        q = jnp.zeros((BATCH, HEADS, length, HEAD_DIM), dtype)
        with jax.sharding.use_abstract_mesh(mesh):
            return attention.choose("auto", q, dropout_active=dropout_active)
    assert jax.default_backend() == "cpu"
    assert chosen() == "splash"
    assert chosen(dropout_active=True) == "plain"
    assert chosen(length=96) == "plain"
    # TPU v3's Mosaic has no bfloat16 matmuls in the kernel (python -m benchmarks.attention_tpu_compile).
    assert chosen(mesh=tpu_mesh("TPU v3")) == "plain"
    assert chosen(mesh=tpu_mesh("TPU v3"), dtype=jnp.float32) == "splash"
    with jax.sharding.use_abstract_mesh(mesh):
        assert encoder._cache_sized_rows((64, 12, 512, 64)) == 0  # no CPU blocks for a TPU target
    assert encoder._cache_sized_rows((64, 12, 512, 64)) > 0


def test_encoder_asks_for_plain_in_training_with_dropout(monkeypatch):
    """The encoder tells "auto" that dropout is active in training with a nonzero rate, and
    inactive in evaluation; on a (faked) TPU target that decides plain against splash."""
    choices = []
    real_choose = attention.choose

    def record(implementation, q, *, dropout_active):
        if implementation == "auto":  # the encoder's question (attend asks again with the answer)
            choices.append(real_choose(implementation, q, dropout_active=dropout_active))
        return "plain"  # run on CPU whatever was chosen
    monkeypatch.setattr(attention, "choose", record)
    monkeypatch.setattr(attention, "compile_target", lambda *arrays: attention.Target("tpu", "TPU v4", None, 1))
    model = Encoder(tiny_config(attention_probs_dropout_prob=0.1), rngs=make_rngs(0))
    ids = jnp.ones((BATCH, LENGTH), jnp.int32)
    model(ids, deterministic=False)
    assert choices == ["plain"] * 2  # two layers
    choices.clear()
    model(ids, deterministic=True)
    assert choices == ["splash"] * 2
    choices.clear()
    Encoder(tiny_config(attention_probs_dropout_prob=0.0), rngs=make_rngs(0))(ids, deterministic=False)
    assert choices == ["splash"] * 2  # rate 0: no dropout to lose


def test_forced_splash_refuses_attention_dropout():
    q, k, v = qkv(jnp.float32)
    with pytest.raises(ValueError, match="no dropout"):
        attention.attend(q, k, v, padding_mask(), implementation="splash", probs_dropout=lambda p: p)


def test_config_attention_field_is_not_exported():
    config = EncoderConfig(attention="splash")
    exported = config.to_hf_dict()
    assert "attention" not in exported
    assert EncoderConfig.from_hf_dict(exported).attention == "auto"
    # A config.json's own "attention" key (none of Hugging Face's) is not ours to read.
    assert EncoderConfig.from_hf_dict({**exported, "attention": "plain"}).attention == "auto"
    assert EncoderConfig.from_hf_dict(exported, attention="plain").attention == "plain"
    with pytest.raises(ConfigError, match="unknown attention"):
        EncoderConfig(attention="flash")


SHARDED = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from nli_jax.models import attention
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 1, 2), ("data", "fsdp", "tensor"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((4, 2, 128, 64)) * 0.35, jnp.float32) for _ in range(3))
    segments = np.zeros((4, 128), np.int32); segments[:, :60] = 1; segments[:, 60:110] = 2
    segments = jnp.asarray(segments)
    batch = NamedSharding(mesh, P("data"))
    q, k, v, segments = (jax.device_put(x, batch) for x in (q, k, v, segments))
    with attention.interpret_splash():
        step = jax.jit(lambda q, k, v, s: attention.attend(q, k, v, s, implementation="splash"))
        text = step.lower(q, k, v, segments).as_text()
        out = step(q, k, v, segments)
    assert "shard_map" in text or "sdy.manual_computation" in text, "no shard_map"
    ref = attention.plain_attention(q, k, v, segments)
    real = (segments > 0)[:, None, :, None]
    print("DIFF", float(jnp.max(jnp.where(real, jnp.abs(out - ref), 0))))
    print("SHARDING", out.sharding.spec)
""")


def test_sharded_splash_runs_in_shard_map():
    """On 4 fake CPU devices (data 2 x tensor 2), batch-sharded inputs: the kernel runs inside
    shard_map (batch over data, heads over tensor) and matches the plain path."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-c", SHARDED], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff = float(proc.stdout.split("DIFF")[1].split()[0])
    assert diff <= TOLERANCE[jnp.float32], proc.stdout


def test_splash_compiles_for_tpu_with_less_memory():
    """Lowered and compiled for an abstract TPU v4 (no TPU needed; 6-10 s), BERT-large shapes in
    bfloat16 at length 512: the program holds the Mosaic kernel and needs under half the plain
    path's temp memory (measured: 393 MiB against 1024 MiB)."""
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.attention_tpu_compile", "--chips", "v4", "--lengths", "512"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    row = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert row["splash"]["has_kernel"] and not row["plain"]["has_kernel"]
    assert row["splash"]["temp_bytes"] < row["plain"]["temp_bytes"] / 2


def test_splash_kernel_with_a_window_matches_plain_attention():
    """The local layers' band (attention.attend window=) through the Pallas kernel in interpret mode,
    padded and packed, equals the plain path's at real positions."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 2, 256, 64)) * 0.35, jnp.float32) for _ in range(3))
    padding = jnp.asarray(np.arange(256)[None, :] < np.array([[256], [150]]))
    segments = np.zeros((2, 256), np.int32)
    segments[0, :100], segments[0, 100:230], segments[1, :180] = 1, 2, 1
    segments = jnp.asarray(segments)
    packed = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
    for name, mask, real in (("padded", padding, padding), ("packed", packed, segments > 0)):
        plain = attention.attend(q, k, v, mask, implementation="plain", window=64)
        with attention.interpret_splash():
            splash = jax.jit(lambda q, k, v, m: attention.attend(q, k, v, m, implementation="splash", window=64))(
                q, k, v, mask)
        diff = float(jnp.abs(plain - splash)[real[:, None, :, None].repeat(2, 1).repeat(64, 3)].max())
        unwindowed = attention.attend(q, k, v, mask, implementation="plain")
        print(f"splash window 64 ({name}): max |splash - plain| {diff:.1e}; window's effect "
              f"{float(jnp.abs(plain - unwindowed).max()):.2f}")
        assert diff < 2e-6 and float(jnp.abs(plain - unwindowed).max()) > 0.1
