"""ModernBERT (nli_jax/models/modernbert.py) against transformers' ModernBert* classes, on random
checkpoints made here (nothing from a hub): the logits of every head at three shapes (tiny; base
width with sequences longer than the 128-token window; mmBERT's published config with 4 of its
22 layers), padded batches, packed rows against padded ones, scan / remat / dropout, export and
reload in transformers, config.json as transformers 4 and 5 write it, a locally trained
tokenizer, the presets, and fine-tuning through the command line (NLI fixture, IndoNLU NERP;
configs/indonli_mmbert.py) and on FSDP / tensor meshes."""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import REPO, encoded_rows
from nli_jax.data import pipeline
from nli_jax.errors import ConfigError
from nli_jax.models import (EncoderConfig, ForMaskedLM, ForMultiAspectClassification, ForSequenceClassification,
                            ForTokenClassification, count_parameters, make_rngs, preset)
from nli_jax.models import modernbert
from nli_jax.models.encoder import example_tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Max |ours - transformers| of logits, float32 on CPU. Measured maxima over the four heads (printed
# by test_parity_with_transformers): tiny 1.6e-6, base width 6.3e-6, mmBERT 7.0e-6, with logits up
# to 2-4; the window or a rotary base wrong moves them by 7e-2 to 2.7.
TOLERANCE = 1e-4
PACKED_TOLERANCE = 1e-5  # packed rows vs the same examples padded (float32 summation order only)

_IDS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
SHAPES = {
    # Every bias on (attention_bias, mlp_bias, norm_bias, classifier_bias) and an 8-token window.
    "tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                 global_attn_every_n_layers=3, local_attention=8, max_position_embeddings=128,
                 global_rope_theta=160000.0, local_rope_theta=10000.0, attention_bias=True, mlp_bias=True,
                 norm_bias=True, classifier_bias=True, **_IDS),
    # ModernBERT-base's width and window, 4 layers (global, local, local, global), rows of 320 tokens.
    "base": dict(vocab_size=512, hidden_size=768, intermediate_size=1152, num_hidden_layers=4, num_attention_heads=12,
                 global_attn_every_n_layers=3, local_attention=128, max_position_embeddings=1024,
                 global_rope_theta=160000.0, local_rope_theta=10000.0, **_IDS),
    # jhu-clsp/mmBERT-base's config.json (modernbert.MMBERT_BASE_CONFIG: vocabulary 256,000, theta
    # 160k in both kinds of layer, window 128) with 4 of its 22 layers, to save CPU time.
    "mmbert": dict(modernbert.MMBERT_BASE_CONFIG, num_hidden_layers=4),
}
LENGTHS = {"tiny": (24, 15, 5), "base": (320, 200, 64), "mmbert": (160, 100)}
# Attention's weights (Wqkv, Wo) scaled up from the 0.02 initialisation so that attention is peaked
# and moves the hidden states: positions (RoPE theta) and the window then change the logits by far
# more than the tolerance (test_the_window_and_the_rotary_bases_matter_at_these_shapes).
ATTENTION_SCALE = {"tiny": 10.0, "base": 2.5, "mmbert": 2.5}
HEADS = {"mlm": ("ModernBertForMaskedLM", ForMaskedLM, "cls"),
         "cls": ("ModernBertForSequenceClassification", ForSequenceClassification, "cls"),
         "mean": ("ModernBertForSequenceClassification", ForSequenceClassification, "mean"),
         "token": ("ModernBertForTokenClassification", ForTokenClassification, "cls")}


def _batch(shape, seed=0):
    """input_ids and attention_mask [rows, longest]: right-padded rows of LENGTHS[shape]."""
    lengths = LENGTHS[shape]
    vocab = SHAPES[shape]["vocab_size"]
    rng = np.random.default_rng(seed)
    mask = (np.arange(max(lengths))[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    ids = rng.integers(5, min(vocab, 50000), mask.shape) * mask
    ids[:, 0] = 2  # [CLS]
    return ids, mask


def _hf_model(shape, head, seed=0):
    """A random transformers model of `shape` with `head`: weights N(0, 0.02) (attention's scaled
    by ATTENTION_SCALE), norms and biases moved off their initial ones, so that none of them can
    be mapped wrongly unseen. Drawn here: transformers' own truncated-normal initialisation takes
    two minutes for mmBERT's 256,000 x 768 embeddings on two cores."""
    from transformers.initialization import no_init_weights
    name, _, pooling = HEADS[head]
    fields = {k: v for k, v in SHAPES[shape].items() if k not in ("architectures", "model_type")}
    config = transformers.ModernBertConfig(**{**fields, "classifier_pooling": pooling, "num_labels": 3})
    with no_init_weights():
        model = getattr(transformers, name)(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in parameter_name:
                parameter.copy_((1.0 if parameter_name.endswith("weight") else 0.0) + 0.1 * noise)
            elif parameter_name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                scale = ATTENTION_SCALE[shape] if parameter_name.endswith(("Wqkv.weight", "attn.Wo.weight")) else 1.0
                parameter.copy_(0.02 * scale * noise)
    model.tie_weights()
    return model


def _reference(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.float().numpy()


def _ours(model, ids, mask):
    out = model(jnp.asarray(ids), jnp.asarray(mask))
    return np.asarray(out["mlm_logits"] if isinstance(out, dict) else out)


def _max_diff(head, ours, reference, mask):
    """Over real tokens (token-level heads) or examples."""
    diff = np.abs(ours - reference)
    return float(diff[mask.astype(bool)].max() if head in ("mlm", "token") else diff.max())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The directory of a random ModernBertForMaskedLM of `shape` (_hf_model), as transformers saves
    it: what fine-tuning starts from. Made on first use; the 1 GB mmBERT one is removed when
    another shape is asked for."""
    made = {}

    def get(shape):
        if shape not in made:
            for other in [s for s in made if s == "mmbert"]:
                import shutil
                shutil.rmtree(made.pop(other), ignore_errors=True)
            directory = tmp_path_factory.mktemp(shape)
            _hf_model(shape, "mlm").save_pretrained(directory)
            made[shape] = directory
        return made[shape]
    return get


def _head_pair(directory, head, *, scan_layers=False):
    """(transformers' model, ours) with `head` from the MLM checkpoint in `directory`, as
    fine-tuning starts: the encoder and ModernBertPredictionHead from the checkpoint, a new
    classifier (its bias moved off zero), which ours takes over from transformers' state dict."""
    from nli_jax.models.pretrained import load_weights
    name, cls, pooling = HEADS[head]
    if head == "mlm":
        return transformers.ModernBertForMaskedLM.from_pretrained(directory).eval(), \
            ForMaskedLM.from_pretrained(str(directory), scan_layers=scan_layers)
    torch.manual_seed(2)
    theirs = getattr(transformers, name).from_pretrained(directory, num_labels=3, classifier_pooling=pooling).eval()
    with torch.no_grad():
        theirs.classifier.bias.add_(0.1 * torch.randn(theirs.classifier.bias.shape))
    options = modernbert.options(EncoderConfig.from_hf_dict(json.loads((directory / "config.json").read_text())))
    ours = cls.from_pretrained(str(directory), num_labels=3, scan_layers=scan_layers,
                               config_overrides={"family_options": dataclasses.replace(options,
                                                                                       classifier_pooling=pooling)})
    load_weights(ours, {k: v.numpy() for k, v in theirs.state_dict().items()})
    return theirs, ours


@pytest.mark.parametrize("shape,head", [(s, h) for s in SHAPES for h in HEADS])
def test_parity_with_transformers(checkpoint, shape, head):
    """The same logits as transformers on padded rows longer than the window, with the layers in a
    loop and scanned (model.scan_layers; mmBERT: the loop only, to save CPU time)."""
    directory = checkpoint(shape)
    ids, mask = _batch(shape)
    for scan in (False, True) if shape != "mmbert" else (False,):
        theirs, ours = _head_pair(directory, head, scan_layers=scan)
        assert ours.config.model_type == "modernbert" and ours.config.scans_layers == scan
        reference = _reference(theirs, ids, mask)
        diff = _max_diff(head, _ours(ours, ids, mask), reference, mask)
        print(f"modernbert parity {shape:6s} {head:5s} {'scan' if scan else 'loop'}: max |ours - transformers| "
              f"{diff:.2e} (logits up to {np.abs(reference).max():.2f}, rows {tuple(ids.shape)})")
        assert diff <= TOLERANCE, (shape, head, scan, diff)


@pytest.mark.parametrize("shape", ["tiny", "base"])
def test_the_window_and_the_rotary_bases_matter_at_these_shapes(checkpoint, shape):
    """What the parity test would miss if it could not fail: without the window, or with either
    theta wrong, the same checkpoint's logits leave the tolerance by far."""
    theirs, ours = _head_pair(checkpoint(shape), "token")
    ids, mask = _batch(shape)
    reference = _reference(theirs, ids, mask)
    options = modernbert.options(ours.config)
    broken = {"no window": dataclasses.replace(options, local_attention=100000),
              "window + 1": dataclasses.replace(options, local_attention=options.local_attention + 2),
              "local theta": dataclasses.replace(options, local_rope_theta=options.global_rope_theta),
              "global theta": dataclasses.replace(options, global_rope_theta=options.local_rope_theta)}
    for what, wrong in broken.items():
        broken_model = ForTokenClassification(ours.config.replace(family_options=wrong), num_labels=3,
                                              rngs=make_rngs(0))
        nnx.update(broken_model, nnx.state(ours, nnx.Param))
        diff = _max_diff("token", _ours(broken_model, ids, mask), reference, mask)
        print(f"modernbert {shape} with {what}: max |ours - transformers| {diff:.2e}")
        assert diff > 100 * TOLERANCE, (shape, what, diff)


def test_irregular_layer_types_and_both_config_generations():
    """config.json as transformers 5 writes it (layer_types, rope_parameters) and as 4.48+ does
    (global_attn_every_n_layers, global/local_rope_theta) give one config; an export carries both
    (the older keys only when the layers follow their pattern), and transformers reads it back."""
    v4 = dict(SHAPES["tiny"], model_type="modernbert")
    v5 = transformers.ModernBertConfig(**SHAPES["tiny"]).to_dict()
    for older in ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"):
        v5.pop(older, None)  # transformers 5 keeps what it was given; its own fields say the same
    assert v5["layer_types"][:4] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert EncoderConfig.from_hf_dict(v4) == EncoderConfig.from_hf_dict(v5)
    exported = EncoderConfig.from_hf_dict(v5).to_hf_dict()
    assert exported["global_attn_every_n_layers"] == 3 and exported["local_rope_theta"] == 10000.0
    again = transformers.ModernBertConfig(**exported)
    assert again.layer_types == v5["layer_types"] and again.rope_parameters == v5["rope_parameters"]

    kinds = ["full_attention", "sliding_attention", "full_attention", "full_attention"]
    irregular = transformers.ModernBertConfig(**SHAPES["tiny"], layer_types=kinds, num_labels=3)
    config = EncoderConfig.from_hf_dict(irregular.to_dict())
    assert modernbert.layer_kinds(config) == tuple(kinds)
    assert "global_attn_every_n_layers" not in config.to_hf_dict()
    torch.manual_seed(0)
    hf = transformers.ModernBertForTokenClassification(irregular).eval()
    ours = ForTokenClassification(config, num_labels=3, rngs=make_rngs(0))
    from nli_jax.models.pretrained import load_weights
    load_weights(ours, {k: v.numpy() for k, v in hf.state_dict().items()})
    ids, mask = _batch("tiny")
    diff = _max_diff("token", _ours(ours, ids, mask), _reference(hf, ids, mask), mask)
    print(f"modernbert irregular layer_types: max |ours - transformers| {diff:.2e}")
    assert diff <= TOLERANCE


def test_config_errors_name_the_key():
    d = dict(SHAPES["tiny"], model_type="modernbert",
             rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}})
    with pytest.raises(ConfigError, match=r"rope_parameters\.full_attention\.rope_type 'linear'"):
        EncoderConfig.from_hf_dict(d)
    with pytest.raises(ConfigError, match="classifier_pooling"):
        EncoderConfig.from_hf_dict(dict(SHAPES["tiny"], model_type="modernbert", classifier_pooling="max"))
    with pytest.raises(ConfigError, match="config.json layer_types has 3 entries for num_hidden_layers 4"):
        EncoderConfig.from_hf_dict(dict(SHAPES["tiny"], model_type="modernbert", layer_types=["full_attention"] * 3))
    kinds = ("full_attention", "sliding_attention", "full_attention")  # irregular: kept as they are
    three = preset("tiny-modernbert", family_options=modernbert.ModernBertOptions(layer_types=kinds))
    with pytest.raises(ConfigError, match="layer_types has 3 entries for num_hidden_layers 4"):
        ForSequenceClassification(three, num_labels=2, rngs=make_rngs(0))


# --- packed rows, scan, remat ----------------------------------------------------------------

def _tiny_model(cls, **kwargs):
    config = preset("tiny-modernbert", vocab_size=128, pad_token_id=0, **kwargs)
    model = cls(config, rngs=make_rngs(0), **({"num_labels": 3} if cls is not ForMaskedLM else {}))
    # Attention scaled as _hf_model's: peaked, so that a token outside its example would show.
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for path, variable in flat.items():
        if "attn" in path and path[-1] == "kernel":
            variable.set_value(variable.get_value() * ATTENTION_SCALE["tiny"])
    nnx.update(model, nnx.from_flat_state(flat))
    return model


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_rows_give_the_padded_logits(pooling):
    """Several examples per row (data.packing): each attends to itself only, in its own window,
    with positions from 0: the same logits as the examples padded one per row."""
    lengths = [20, 7, 12, 30, 3, 25, 9, 14]  # longer and shorter than the +-8 window
    rows = encoded_rows(lengths, vocab=128)
    pad = tuple({"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}.items())
    packed = pipeline.Batching(buckets=(16, 32, 64), pad_values=pad, packing_groups=2).pack(rows)
    padded = pipeline.Batching(buckets=(16, 32, 64), pad_values=pad).pad(rows)
    assert packed["input_ids"].shape[0] < len(rows)
    packing = {k: jnp.asarray(packed[k]) for k in ("segment_ids", "position_ids", "cls_index")}
    options = dataclasses.replace(preset("tiny-modernbert").family_options, classifier_pooling=pooling)
    for cls in (ForSequenceClassification, ForTokenClassification):
        model = _tiny_model(cls, family_options=options)
        ours = model(jnp.asarray(packed["input_ids"]), jnp.asarray(packed["attention_mask"]), packing=packing)
        reference = model(jnp.asarray(padded["input_ids"]), jnp.asarray(padded["attention_mask"]))
        if cls is ForTokenClassification:
            ours = example_tokens(ours, packing["cls_index"], reference.shape[1])
            real = padded["attention_mask"].astype(bool)
            diff = float(jnp.abs(ours - reference)[real].max())
        else:
            diff = float(jnp.abs(ours - reference).max())
        print(f"modernbert packed vs padded ({cls.__name__}, {pooling}): max |diff| {diff:.2e}")
        assert diff <= PACKED_TOLERANCE, (cls.__name__, pooling, diff)
        # Without the per-example mask the packed rows mix examples: the comparison can fail.
        leaky = dict(packing, segment_ids=jnp.where(packing["segment_ids"] > 0, 1, 0))
        mixed = model(jnp.asarray(packed["input_ids"]), jnp.asarray(packed["attention_mask"]), packing=leaky)
        if cls is ForTokenClassification:
            mixed = example_tokens(mixed, packing["cls_index"], reference.shape[1])[real]
            reference = reference[real]
        assert float(jnp.abs(mixed - reference).max()) > 100 * PACKED_TOLERANCE


@pytest.mark.parametrize("remat", ["none", "full", "dots_saveable"])
def test_scan_and_remat_train_like_the_loop(remat):
    """Gradients of a training step (dropout on) with scanned layers and remat policies equal the
    plain loop's: the scanned stack holds layers 1.. and says per layer which attention it has."""
    lengths = [20, 7, 12, 30]
    rows = encoded_rows(lengths, vocab=128)
    batch = pipeline.Batching(buckets=(32,), pad_values=(("input_ids", 0), ("attention_mask", 0),
                                                          ("token_type_ids", 0))).pad(rows)
    labels = jnp.asarray(batch["label"])

    def grads(scan):
        model = _tiny_model(ForSequenceClassification, scan_layers=scan, remat=remat)
        if scan:
            loop = _tiny_model(ForSequenceClassification)
            from nli_jax.models.encoder import stack_layers
            flat = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(loop, nnx.Param))}
            stacked = stack_layers(flat)
            target = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
            for path, variable in target.items():
                variable.set_value(stacked[path])
            nnx.update(model, nnx.from_flat_state(target))

        def loss(model):
            logits = model(jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"]), deterministic=True)
            return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1).mean()
        value, g = nnx.value_and_grad(loss)(model)
        from nli_jax.models.encoder import unstack_layers
        return value, unstack_layers({p: v.get_value() for p, v in nnx.to_flat_state(g)})

    (loop_loss, loop_grads), (scan_loss, scan_grads) = grads(False), grads(True)
    assert loop_grads.keys() == scan_grads.keys()
    worst = max(float(jnp.abs(loop_grads[p] - scan_grads[p]).max()) for p in loop_grads)
    print(f"modernbert scan + remat={remat} vs loop: loss {abs(loop_loss - scan_loss):.1e}, gradients {worst:.1e}")
    assert abs(loop_loss - scan_loss) < 1e-6 and worst < 1e-5


def test_dropout_everywhere_trains_in_a_loop_and_scanned():
    """ModernBERT's dropouts (embedding_dropout; mlp_dropout = hidden_dropout_prob; attention_dropout
    = attention_probs_dropout_prob, on the probabilities and the output; classifier_dropout) draw
    from the "dropout" stream the train step reseeds: masks differ between calls, evaluation has
    none, and the scanned stack (whose layers choose their attention under lax.cond) draws too."""
    from nli_jax.train.steps import check_dropout_streams
    ids, mask = _batch("tiny")
    options = dataclasses.replace(preset("tiny-modernbert").family_options, embedding_dropout=0.1)
    for scan in (False, True):
        model = _tiny_model(ForSequenceClassification, scan_layers=scan, family_options=options,
                            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, classifier_dropout=0.1)
        check_dropout_streams(model)
        plain = _tiny_model(ForSequenceClassification, scan_layers=scan)
        nnx.update(plain, nnx.state(model, nnx.Param))
        evaluation = _ours(model, ids, mask)
        np.testing.assert_allclose(evaluation, _ours(plain, ids, mask), atol=1e-6)
        first, second = (np.asarray(model(jnp.asarray(ids), jnp.asarray(mask), deterministic=False)) for _ in range(2))
        assert np.abs(first - second).max() > 1e-3 and np.abs(first - evaluation).max() > 1e-3, scan


# --- export, presets, tokenizer ------------------------------------------------------------------

def test_export_loads_in_transformers_with_every_weight_and_the_same_logits(tmp_path):
    """Models built here (from the preset, at random) saved as Hugging Face directories: transformers'
    ModernBert* classes load them with no missing or unexpected weights and compute our logits."""
    ids, mask = _batch("tiny")
    for cls, name in ((ForMaskedLM, "ModernBertForMaskedLM"), (ForSequenceClassification,
                                                               "ModernBertForSequenceClassification"),
                      (ForTokenClassification, "ModernBertForTokenClassification")):
        model = _tiny_model(cls)
        model.save_pretrained(str(tmp_path / name), label_names=None if cls is ForMaskedLM else ["a", "b", "c"])
        saved = json.loads((tmp_path / name / "config.json").read_text())
        assert saved["architectures"] == [name] and saved["layer_types"][:4] == [
            "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
        hf, info = getattr(transformers, name).from_pretrained(str(tmp_path / name), output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
        head = "mlm" if cls is ForMaskedLM else "token" if cls is ForTokenClassification else "cls"
        diff = _max_diff(head, _ours(model, ids, mask), _reference(hf.eval(), ids, mask), mask)
        print(f"modernbert export {name}: max |ours - transformers| {diff:.2e}")
        assert diff <= TOLERANCE
        # And back: nli-jax reads its own export to the same parameters.
        again = cls.from_pretrained(str(tmp_path / name))
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                                                        jax.tree.leaves(nnx.state(again, nnx.Param))))
    # Multi-aspect (CASA, HoASA): ModernBertModel plus the aspect classifier, read back by nli-jax.
    model = ForMultiAspectClassification(preset("tiny-modernbert", vocab_size=128), num_aspects=2, num_labels=3,
                                         rngs=make_rngs(0))
    model.save_pretrained(str(tmp_path / "aspects"))
    again = ForMultiAspectClassification.from_pretrained(str(tmp_path / "aspects"))
    np.testing.assert_array_equal(_ours(model, ids, mask), _ours(again, ids, mask))
    assert _ours(model, ids, mask).shape == (3, 2, 3)


def test_a_from_scratch_export_carries_its_tokenizers_special_ids(tmp_path):
    """ModernBertConfig defaults [CLS] / [SEP] (bos / eos) to 50281 / 50282, ids of ModernBERT's own
    vocabulary: a model built from a preset with another tokenizer writes that tokenizer's ids, so
    transformers sees ids inside the vocabulary; an imported checkpoint keeps its own."""
    import nli_jax
    from nli_jax.data import fixture_path
    tokenizer = nli_jax.load_tokenizer(fixture_path("tiny_wordpiece"))
    model = ForMaskedLM(preset("tiny-modernbert", vocab_size=len(tokenizer)), rngs=make_rngs(0))
    model.save_pretrained(str(tmp_path / "scratch"), tokenizer=tokenizer)
    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "scratch"))
    expected = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert (config.cls_token_id, config.sep_token_id, config.bos_token_id, config.eos_token_id) == expected
    assert max(expected) < len(tokenizer) == config.vocab_size
    imported = _hf_model("tiny", "mlm")  # its config.json's ids, not the tokenizer's
    imported.config.cls_token_id = 7
    imported.save_pretrained(str(tmp_path / "published"))
    ForMaskedLM.from_pretrained(str(tmp_path / "published")).save_pretrained(str(tmp_path / "again"), tokenizer=tokenizer)
    assert json.loads((tmp_path / "again" / "config.json").read_text())["cls_token_id"] == 7


def test_a_checkpoint_with_the_tied_decoder_copied_loads(tmp_path):
    """Some published ModernBERT checkpoints hold decoder.weight beside the embeddings it is tied to."""
    from safetensors.torch import save_file
    model = _hf_model("tiny", "mlm")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["decoder.weight"] = state["model.embeddings.tok_embeddings.weight"].clone()
    model.config.save_pretrained(tmp_path)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ours = ForMaskedLM.from_pretrained(str(tmp_path))
    ids, mask = _batch("tiny")
    assert _max_diff("mlm", _ours(ours, ids, mask), _reference(model, ids, mask), mask) <= TOLERANCE


def test_presets_have_the_published_parameter_counts():
    """From-scratch shapes (model.preset) with their own vocabularies: ModernBERT-base 149M and
    -large 395M (Warner et al., 2024), mmBERT-base 307M and -small 140M (Marone et al., 2025), and
    exactly transformers' count for the same config.json."""
    published = {"modernbert-base": 149e6, "modernbert-large": 395e6, "mmbert-base": 307e6, "mmbert-small": 140e6}
    for name, count in published.items():
        config = preset(name)
        ours = count_parameters(nnx.eval_shape(lambda: ForMaskedLM(config, rngs=make_rngs(0))))
        with torch.device("meta"):
            theirs = sum(p.numel() for p in transformers.ModernBertForMaskedLM(
                transformers.ModernBertConfig(**config.to_hf_dict())).parameters())
        print(f"preset {name}: {ours / 1e6:.1f}M parameters (published {count / 1e6:.0f}M)")
        assert ours == theirs and abs(ours - count) / count < 0.01, name
    # MFU's numerator: 6 x the non-embedding parameters, and attention over the keys a query sees
    # (8 global layers of 22 see all 512; 14 local ones their 129).
    config = preset("mmbert-base")
    model = nnx.eval_shape(lambda: ForSequenceClassification(config, num_labels=3, rngs=make_rngs(0)))
    embeddings = config.vocab_size * config.hidden_size + config.hidden_size
    expected = 6 * (count_parameters(model) - embeddings) + 12 * 768 * (8 * 512 + 14 * 129)
    assert model.training_flops_per_token(512) == expected
    assert EncoderConfig.from_hf_dict(modernbert.MMBERT_BASE_CONFIG) == preset("mmbert-base", pad_token_id=0)


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory):
    """A byte-pair tokenizer trained here on the NLI fixture's text (SentencePiece-style "▁" word
    starts, ModernBERT's [CLS] / [SEP] / [PAD] / [MASK] / [UNK]), saved as a transformers fast
    tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    texts = []
    for name in ("train.jsonl", "val.jsonl", "test_lay.jsonl"):
        for line in (REPO / "nli_jax" / "data" / "fixtures" / "nli_tiny" / name).read_text().splitlines():
            row = json.loads(line)
            texts += [row["premise"], row["hypothesis"]]
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
    tokenizer.decoder = decoders.Metaspace()
    alphabet = [chr(c) for c in range(33, 127)]  # every printable ASCII character: few [UNK] in other text
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=special,
                                                             initial_alphabet=alphabet, show_progress=False))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=8192)
    directory = tmp_path_factory.mktemp("bpe_tokenizer")
    fast.save_pretrained(directory)
    return directory


def test_the_local_tokenizer_loads_through_nli_jax(bpe_tokenizer):
    from nli_jax.checkpoints import load_tokenizer
    tokenizer = load_tokenizer(str(bpe_tokenizer))
    assert sorted(os.listdir(bpe_tokenizer)) == ["tokenizer.json", "tokenizer_config.json"]
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokenizer.pad_token_id == 0 and tokenizer.mask_token_id == 4
    pair = tokenizer("Budi membeli buku di pasar.", "Budi membeli buku.")
    tokens = tokenizer.convert_ids_to_tokens(pair["input_ids"])
    assert tokens == ["[CLS]", "▁Budi", "▁membeli", "▁buku", "▁di", "▁pasar", ".", "[SEP]", "▁Budi", "▁membeli",
                      "▁buku", ".", "[SEP]"], tokens
    words = tokenizer(["Budi", "membeli", "Zq"], is_split_into_words=True)
    assert words.word_ids()[0] is None and words.word_ids()[-1] is None
    assert [w for w in words.word_ids() if w is not None][:2] == [0, 1] and 2 in words.word_ids()
    assert tokenizer.unk_token_id not in words["input_ids"]  # unseen letters fall back to characters


# --- through the workflow ------------------------------------------------------------------------

def _cli(module, *args, timeout=900, env=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, bpe_tokenizer):
    """A random tiny ModernBertForMaskedLM (what a pretrained checkpoint is) with the local
    tokenizer beside it, as transformers saves both."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(bpe_tokenizer)
    config = transformers.ModernBertConfig(
        vocab_size=-(-len(tokenizer) // 64) * 64, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, local_attention=16, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id, classifier_pooling="mean")
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny_modernbert")
    transformers.ModernBertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_fine_tunes_on_the_nli_fixture_and_exports_what_it_predicts(tmp_path, tiny_checkpoint):
    """finetune.main with the NLI cpu_test recipe from a ModernBERT checkpoint (model.init) and its
    own tokenizer: training learns, predictions are written, and the best parameters exported as
    ModernBertForSequenceClassification predict in transformers what nli-jax predicted."""
    workdir = tmp_path / "run"
    _cli("finetune.main", "--config=configs/indonli_large.py:cpu_test", f"--workdir={workdir}",
         f"--config.model.init={tiny_checkpoint}", "--config.model.tokenizer=", "--config.export_best=True",
         "--config.train.num_epochs=4", "--config.eval_splits=('validation',)", f"--config.data.tfds_dir={tmp_path}")
    results = json.loads((workdir / "results.json").read_text())
    losses = [json.loads(line)["train/loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()
              if "train/loss" in json.loads(line)]
    print(f"modernbert NLI fixture: train loss {losses[0]:.3f} -> {losses[-1]:.3f}, validation accuracy "
          f"{results['splits']['validation']['accuracy']:.3f}")
    assert losses[-1] < losses[0]
    export = workdir / "export_best"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(export).eval()
    assert type(model).__name__ == "ModernBertForSequenceClassification"
    assert model.config.classifier_pooling == "mean" and model.config.id2label[2] == "contradiction"
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    ours = [r for r in _jsonl(workdir / "predictions.jsonl") if r["split"] == "validation"]
    rows = _jsonl(REPO / "nli_jax" / "data" / "fixtures" / "nli_tiny" / "val.jsonl")
    batch = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True, truncation=True,
                      max_length=64, return_tensors="pt")
    with torch.no_grad():
        probabilities = torch.softmax(model(**batch).logits, -1).numpy()
    assert [model.config.id2label[int(i)] for i in probabilities.argmax(-1)] == [r["prediction"] for r in ours]
    np.testing.assert_allclose(probabilities, [r["probabilities"] for r in ours], atol=1e-5)


@pytest.mark.slow  # end to end on real IndoNLU files: python -m pytest -m slow
def test_fine_tunes_on_indonlu_nerp_and_exports_token_classification(shared_data, tmp_path, tiny_checkpoint):
    """A tagging task (NERP, real files: 200 training sentences) from the ModernBERT checkpoint:
    word-level predictions for every validation sentence, and an export that transformers loads as
    ModernBertForTokenClassification with nli-jax's token logits."""
    real = shared_data / "indonlu" / "nerp_ner-prosa"
    if not real.is_dir():
        pytest.skip(f"{real} not found")
    source = tmp_path / "indonlu" / "nerp_ner-prosa"
    source.mkdir(parents=True)
    for name, n in (("train", 200), ("valid", 40)):
        blocks = [b for b in (real / f"{name}_preprocess.txt").read_text(encoding="utf-8").split("\n\n") if b.strip()]
        (source / f"{name}_preprocess.txt").write_text("\n\n".join(blocks[:n]) + "\n", encoding="utf-8")
    workdir = tmp_path / "nerp"
    _cli("finetune.main", "--config=configs/indonlu.py:task=nerp,model=large,cpu_test", f"--workdir={workdir}",
         f"--config.model.init={tiny_checkpoint}", "--config.model.tokenizer=", f"--config.data.source={source.parent}",
         "--config.eval_splits=('validation',)", "--config.export_best=True", f"--config.data.tfds_dir={tmp_path}")
    predictions = [r for r in _jsonl(workdir / "predictions.jsonl") if r["split"] == "validation"]
    assert len(predictions) == 40 and all(len(r["prediction"]) == len(r["tokens"]) for r in predictions)
    results = json.loads((workdir / "results.json").read_text())
    print(f"modernbert NERP (200 sentences, 20 steps): validation {json.dumps(results['splits']['validation'])[:200]}")
    export = workdir / "export_best"
    hf = transformers.AutoModelForTokenClassification.from_pretrained(export).eval()
    assert type(hf).__name__ == "ModernBertForTokenClassification" and len(hf.config.id2label) > 3
    ours = ForTokenClassification.from_pretrained(str(export))
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    batch = tokenizer([r["tokens"] for r in predictions[:8]], is_split_into_words=True, padding=True,
                      truncation=True, max_length=64, return_tensors="np")
    diff = _max_diff("token", _ours(ours, batch["input_ids"], batch["attention_mask"]),
                     _reference(hf, batch["input_ids"], batch["attention_mask"]), batch["attention_mask"])
    print(f"modernbert NERP export: max |ours - transformers| {diff:.2e}")
    assert diff <= TOLERANCE


def test_the_mmbert_recipe_config_and_its_cpu_test():
    """configs/indonli_mmbert.py: the ModernBERT authors' GLUE recipe on jhu-clsp/mmBERT-base, and a
    :cpu_test that builds the tiny ModernBERT preset offline."""
    from configs import indonli_mmbert
    from nli_jax.planner import build_plan
    config = indonli_mmbert.get_config()
    assert config.model.init == "jhu-clsp/mmBERT-base"
    assert (config.optimizer.name, config.optimizer.lr, config.optimizer.b2, config.optimizer.eps,
            config.optimizer.weight_decay, config.optimizer.schedule) == ("adamw", 8e-5, 0.98, 1e-6, 8e-6, "linear")
    assert (config.train.batch_size, config.train.num_epochs) == (32, 2)
    plan = build_plan(indonli_mmbert.get_config("cpu_test"))
    assert plan.model.preset == "tiny-modernbert" and not plan.model.init


# On 8 fake CPU devices (a subprocess): the loop's per-step losses on FSDP and tensor meshes equal
# data parallelism's, with the new parameters in the shardings their logical axes give.
MESHES = {"data8": {"data": 8}, "data2_fsdp4": {"data": 2, "fsdp": 4}, "data2_tensor4": {"data": 2, "tensor": 4},
          "fsdp2_tensor4": {"fsdp": 2, "tensor": 4}}
LOSS_TOLERANCE = 2e-5  # as tests/test_sharding.py: float32 sums reduced in another order
MESH_SCRIPT = r"""
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
from configs import indonli_mmbert
from nli_jax.train import loop
meshes, root = json.loads(sys.argv[1]), sys.argv[2]
train, kept = loop.train, []
def keep_state(*args, **kwargs):
    out = train(*args, **kwargs)
    kept.append(out[0])
    return out
loop.train = keep_state
report = {}
for name, shape in meshes.items():
    config = indonli_mmbert.get_config("cpu_test")
    config.mesh.shape = dict(shape)
    config.data.tfds_dir = root + "/tfds"
    config.data.packing = False  # the same rows on every mesh (tests/test_sharding.py)
    config.data.pad_to_max_length = True  # one shape: each step compiled once a mesh, not once a bucket
    config.train.max_steps = 6
    config.train.log_every_steps = 1
    config.eval_splits = ("validation",)
    workdir = f"{root}/{name}"
    loop.train_and_evaluate(config, workdir)
    state = kept.pop()
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    specs = {jax.tree_util.keystr(p): [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]
             for p, x in leaves if hasattr(x, "sharding")}
    losses = [json.loads(line)["train/loss"] for line in open(workdir + "/metrics.jsonl") if "train/loss" in line]
    report[name] = {"losses": losses, "specs": specs}
print("REPORT" + json.dumps(report))
"""
# tiny-modernbert: embed 64, 4 heads of 16, GeGLU 2 x 96, vocabulary 185 (the fixture tokenizer's).
QKV = "['encoder']['first_layer']['attn']['qkv']['kernel']"  # [embed, 3, heads, kv]
ATTN_OUT = "['encoder']['layers'][0]['attn']['output']['kernel']"  # [heads, kv, embed]
WI = "['encoder']['layers'][1]['mlp']['wi']['kernel']"  # [embed, 2, mlp]
WO = "['encoder']['layers'][2]['mlp']['wo']['kernel']"  # [mlp, embed]
HEAD = "['classifier']['head']['dense']['kernel']"  # [embed, hidden]
EXPECTED_SPECS = {
    "data8": {QKV: [None] * 4, ATTN_OUT: [None] * 3, WI: [None] * 3, WO: [None] * 2, HEAD: [None] * 2},
    "data2_fsdp4": {QKV: ["fsdp", None, None, None], ATTN_OUT: [None, None, "fsdp"], WI: ["fsdp", None, None],
                    WO: [None, "fsdp"], HEAD: ["fsdp", None]},
    "data2_tensor4": {QKV: [None, None, "tensor", None], ATTN_OUT: ["tensor", None, None], WI: [None, None, "tensor"],
                      WO: ["tensor", None], HEAD: [None, None]},
    "fsdp2_tensor4": {QKV: ["fsdp", None, "tensor", None], ATTN_OUT: ["tensor", None, "fsdp"],
                      WI: ["fsdp", None, "tensor"], WO: ["tensor", "fsdp"], HEAD: ["fsdp", None]},
}


@pytest.mark.slow  # 4 runs of the loop on 8 fake devices: python -m pytest -m slow
def test_fsdp_and_tensor_meshes_train_like_data_parallel(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT, json.dumps(MESHES), str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = json.loads(proc.stdout.split("REPORT", 1)[1])
    reference = reports["data8"]["losses"]
    assert len(reference) == 6
    for name, report in reports.items():
        diff = max(abs(a - b) for a, b in zip(report["losses"], reference))
        print(f"modernbert {name} vs data8: max |loss diff| {diff:.2e} over {len(reference)} steps")
        assert len(report["losses"]) == 6 and diff <= LOSS_TOLERANCE, (name, diff)
        for path, spec in EXPECTED_SPECS[name].items():
            for tree in ("['params']", ".mu", ".nu"):  # the parameter and its Adam moments
                found = [s for p, s in report["specs"].items() if p.endswith(tree + path)]
                assert found == [spec], (name, tree, path, found)
