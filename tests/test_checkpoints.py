"""Parity with transformers' PyTorch models (fp32, padded batches, max |diff| <= 1e-4),
export -> transformers load round trips, and the errors of a bad checkpoint."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nli_jax
from nli_jax.checkpoints import CheckpointError
from nli_jax.models import (ConfigError, EncoderModel, ForMaskedLM, ForMultiAspectClassification,
                            ForSequenceClassification, ForTokenClassification, preset)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
# Real sentences of mixed length (written for these tests), so the batch has padding.
SENTENCES = [
    "Saya suka makan nasi goreng di warung dekat rumah.",
    "Hujan turun sejak pagi.",
    "Kereta terakhir berangkat pukul sembilan malam dari stasiun kota, penuh penumpang yang pulang kampung.",
    "Ok.",
]


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


def _torch_inputs(batch):
    return {k: torch.tensor(np.asarray(v)) for k, v in batch.items()}


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    tokenizer = nli_jax.load_tokenizer(minilm_dir)
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="np"))
    reference = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        ref = reference(**_torch_inputs(batch))
    return tokenizer, batch, ref


def test_real_checkpoint_hidden_states_match_transformers(minilm_dir, minilm):
    _, batch, ref = minilm
    assert batch["attention_mask"].min() == 0, "the batch must contain padding"
    model = EncoderModel.from_pretrained(minilm_dir)
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    hidden_diff = _max_diff(out["hidden_states"], ref.last_hidden_state)
    pooled_diff = _max_diff(out["pooled"], ref.pooler_output)
    print(f"MiniLM-L6 parity: hidden max|diff| {hidden_diff:.2e}, pooled {pooled_diff:.2e}")
    assert hidden_diff <= TOLERANCE and pooled_diff <= TOLERANCE


@pytest.mark.parametrize("rows_per_block", [1, 2])
def test_cache_sized_attention_blocks_match_transformers(minilm_dir, minilm, monkeypatch, rows_per_block):
    """Evaluation on one CPU device runs attention a few batch rows at a time; the jitted forward
    must still match transformers."""
    import jax

    from nli_jax.models import encoder
    _, batch, ref = minilm
    shape = (batch["input_ids"].shape[0], 12, batch["input_ids"].shape[1], 32)
    monkeypatch.setattr(encoder, "_SCORES_BLOCK_BYTES", rows_per_block * 12 * shape[2] ** 2 * 4)
    assert encoder._cache_sized_rows(shape) == rows_per_block
    model = EncoderModel.from_pretrained(minilm_dir)
    out = jax.jit(lambda ids, mask, types: model(ids, mask, types)["hidden_states"])(
        batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert _max_diff(out, ref.last_hidden_state) <= TOLERANCE


def test_parity_check_catches_a_perturbed_weight(minilm_dir, minilm):
    """The parity test can fail: one perturbed entry of one weight breaks it."""
    _, batch, ref = minilm
    model = EncoderModel.from_pretrained(minilm_dir)
    kernel = model.encoder.layers[3].mlp_in.kernel
    kernel.set_value(kernel[...].at[5, 7].add(0.05))
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert _max_diff(out["hidden_states"], ref.last_hidden_state) > TOLERANCE


def test_tokenizer_vocab_size_equals_vocab_file(minilm_dir):
    tokenizer = nli_jax.load_tokenizer(minilm_dir)
    with open(os.path.join(minilm_dir, "vocab.txt"), encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    assert len(tokenizer.get_vocab()) == lines == 30522


def test_wordpiece_tokenizer_loads_for_an_albert_directory(tmp_path, minilm_dir):
    """IndoBERT-lite ships vocab.txt (not spiece.model) with model_type albert."""
    shutil.copy(os.path.join(minilm_dir, "vocab.txt"), tmp_path / "vocab.txt")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "albert"}))
    tokenizer = nli_jax.load_tokenizer(str(tmp_path))
    assert len(tokenizer.get_vocab()) == 30522
    assert tokenizer.tokenize("makan nasi")[0] != "[UNK]"


def _randomise(torch_model, seed=0):
    """Every parameter random (LayerNorm and biases too), so a swapped name cannot hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in torch_model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.05
            p.copy_(1.0 + noise if name.endswith("LayerNorm.weight") or "layer_norm.weight" in name else noise)
    return torch_model.eval()


def _random_batch(vocab, pad_id, batch=3, length=16, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(pad_id + 3, vocab, (batch, length))
    mask = np.ones((batch, length), np.int64)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = pad_id
    types = np.zeros_like(ids)
    types[0, 8:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


LITE = dict(vocab_size=30000, embedding_size=128, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
            hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _save(torch_model, path):
    torch_model.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("groups", [(2, 1, 1), (4, 2, 2)], ids=["lite-shape-2-layers", "4-layers-2-groups-2-inner"])
def test_albert_masked_lm_matches_transformers(tmp_path, groups):
    layers, num_groups, inner = groups
    config = transformers.AlbertConfig(**LITE, num_hidden_layers=layers, num_hidden_groups=num_groups,
                                       inner_group_num=inner)
    reference = _randomise(transformers.AlbertForMaskedLM(config))
    model = ForMaskedLM.from_pretrained(_save(reference, tmp_path))
    batch = _random_batch(30000, 0)
    with torch.no_grad():
        ref = reference(**_torch_inputs(batch)).logits.numpy()
    ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])["mlm_logits"]
    assert _max_diff(ours, ref) <= TOLERANCE
    positions = np.array([[0, 3, 15], [1, 8, 2], [3, 0, 1]])
    gathered = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                     masked_positions=positions)["mlm_logits"]
    assert _max_diff(gathered, np.take_along_axis(ref, positions[:, :, None], axis=1)) <= TOLERANCE


def test_xlm_roberta_masked_lm_matches_transformers(tmp_path):
    config = transformers.XLMRobertaConfig(vocab_size=2000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=256, max_position_embeddings=40, type_vocab_size=1,
                                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    reference = _randomise(transformers.XLMRobertaForMaskedLM(config))
    model = ForMaskedLM.from_pretrained(_save(reference, tmp_path))
    assert model.config.position_offset == 2
    batch = _random_batch(2000, 1, length=38)  # 38 + offset 2 = all 40 positions used
    batch["token_type_ids"][:] = 0
    with torch.no_grad():
        ref = reference(**_torch_inputs(batch)).logits.numpy()
    ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])["mlm_logits"]
    assert _max_diff(ours, ref) <= TOLERANCE


@pytest.mark.parametrize("family", ["bert", "albert", "xlm-roberta"])
def test_classifier_logits_match_transformers(tmp_path, family):
    common = dict(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  num_labels=3)
    config = {"bert": lambda: transformers.BertConfig(**common),
              "albert": lambda: transformers.AlbertConfig(**common, embedding_size=32),
              "xlm-roberta": lambda: transformers.XLMRobertaConfig(**common, type_vocab_size=1)}[family]()
    family_name = {"bert": "Bert", "albert": "Albert", "xlm-roberta": "XLMRoberta"}[family]
    batch = _random_batch(500, config.pad_token_id)
    if family == "xlm-roberta":
        batch["token_type_ids"][:] = 0
    for kind, ours_cls in [("ForSequenceClassification", ForSequenceClassification),
                           ("ForTokenClassification", ForTokenClassification)]:
        reference = _randomise(getattr(transformers, family_name + kind)(config))
        path = _save(reference, tmp_path / kind)
        model = ours_cls.from_pretrained(path)  # num_labels from the checkpoint's id2label
        with torch.no_grad():
            ref = reference(**_torch_inputs(batch)).logits.numpy()
        ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        assert _max_diff(ours, ref) <= TOLERANCE, (family, kind)


def test_pytorch_bin_checkpoint_loads_with_weights_only(tmp_path):
    config = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64)
    reference = _randomise(transformers.BertForPreTraining(config))
    config.to_json_file(str(tmp_path / "config.json"))
    state = reference.state_dict()
    # Old-style names, as in early IndoBERT uploads: LayerNorm.gamma / .beta.
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in state.items()}
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = ForMaskedLM.from_pretrained(str(tmp_path), sentence_head=True)
    batch = _random_batch(300, 0)
    with torch.no_grad():
        ref = reference(**_torch_inputs(batch))
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert _max_diff(out["mlm_logits"], ref.prediction_logits) <= TOLERANCE
    assert _max_diff(out["sentence_logits"], ref.seq_relationship_logits) <= TOLERANCE


def test_from_pretrained_draws_only_what_the_checkpoint_lacks(minilm_dir):
    """The encoder is the checkpoint's; the new classifier and the RNG streams are what a full
    initialisation with the seed gives (drawn in one compiled program: within float32 rounding
    of the eager draw), so a run starts as it did when every parameter was drawn first."""
    from nli_jax.checkpoints import hf
    from nli_jax.models import make_rngs
    from nli_jax.models.config import EncoderConfig
    model = ForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, seed=7)
    full = ForSequenceClassification(EncoderConfig.from_hf_dict(hf.read_config(minilm_dir)), rngs=make_rngs(7),
                                     num_labels=3)
    loaded = dict(nnx.to_flat_state(nnx.state(model)))
    drawn = dict(nnx.to_flat_state(nnx.state(full)))
    assert loaded.keys() == drawn.keys()
    weights = hf.read_weights(minilm_dir)
    np.testing.assert_array_equal(loaded[("encoder", "embeddings", "word", "embedding")].get_value(),
                                  weights["embeddings.word_embeddings.weight"])
    # Not from the checkpoint: the classifier, and every RNG stream (the encoder's dropouts' too).
    fresh = [p for p, v in loaded.items() if p[0] != "encoder" or not isinstance(v, nnx.Param)]
    assert ("classifier", "out", "kernel") in fresh and ("encoder", "embeddings", "dropout", "rngs", "key") in fresh
    for path in fresh:
        a, b = loaded[path].get_value(), drawn[path].get_value()
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-7, err_msg=str(path))
    # Another seed draws another head: the values come from the seed, not from the checkpoint.
    other = ForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, seed=8)
    assert not np.allclose(nnx.state(other)["classifier"]["out"]["kernel"].get_value(),
                           loaded[("classifier", "out", "kernel")].get_value())


def test_bfloat16_safetensors_checkpoint_loads(tmp_path):
    """numpy has no bfloat16: such a file is read through the flax framework, to float32."""
    from safetensors.torch import save_file
    config = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64)
    reference = _randomise(transformers.BertForMaskedLM(config)).to(torch.bfloat16).float()
    config.to_json_file(str(tmp_path / "config.json"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in reference.state_dict().items()
               if "position_ids" not in k and k != "cls.predictions.decoder.weight"},
              str(tmp_path / "model.safetensors"))
    model = ForMaskedLM.from_pretrained(str(tmp_path))
    batch = _random_batch(300, 0)
    with torch.no_grad():
        ref = reference(**_torch_inputs(batch)).logits
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert _max_diff(out["mlm_logits"], ref) <= TOLERANCE


EXPORTS = [
    ("tiny-bert", ForMaskedLM, {}, "BertForMaskedLM"),
    ("tiny-bert", ForMaskedLM, {"sentence_head": True}, "BertForPreTraining"),
    ("tiny-bert", EncoderModel, {}, "BertModel"),
    ("tiny-bert", ForSequenceClassification, {"num_labels": 3}, "BertForSequenceClassification"),
    ("tiny-albert", ForMaskedLM, {}, "AlbertForMaskedLM"),
    ("tiny-albert", ForMaskedLM, {"sentence_head": True}, "AlbertForPreTraining"),
    ("tiny-albert", EncoderModel, {}, "AlbertModel"),
    ("tiny-albert", ForTokenClassification, {"num_labels": 5}, "AlbertForTokenClassification"),
    ("tiny-xlmr", ForMaskedLM, {}, "XLMRobertaForMaskedLM"),
    ("tiny-xlmr", EncoderModel, {}, "XLMRobertaModel"),
    ("tiny-xlmr", ForSequenceClassification, {"num_labels": 3}, "XLMRobertaForSequenceClassification"),
]


def _tiny(name):
    if name == "tiny-xlmr":
        return preset("tiny-bert", model_type="xlm-roberta", pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5,
                      max_position_embeddings=130)
    return preset(name)


@pytest.mark.parametrize("name,cls,kwargs,hf_class", EXPORTS, ids=[e[3] for e in EXPORTS])
def test_export_loads_in_transformers_without_missing_weights(tmp_path, name, cls, kwargs, hf_class):
    config = _tiny(name).replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = cls(config, rngs=nnx.Rngs(1), **kwargs)
    # Non-trivial LayerNorm and bias values so a misnamed one would show in the outputs.
    rng = np.random.default_rng(0)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path[-1] in ("bias", "scale"):
            var.set_value(var[...] + jnp.asarray(rng.normal(0, 0.05, var.shape), jnp.float32))
    model.save_pretrained(str(tmp_path))
    reference, info = getattr(transformers, hf_class).from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    reference.eval()
    batch = _random_batch(1000, config.pad_token_id)
    if config.type_vocab_size == 1:
        batch["token_type_ids"][:] = 0
    with torch.no_grad():
        ref = reference(**_torch_inputs(batch))
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    if cls is ForMaskedLM:
        ref_logits = ref.logits if hasattr(ref, "logits") else ref.prediction_logits
        assert _max_diff(out["mlm_logits"], ref_logits) <= TOLERANCE
        if kwargs.get("sentence_head"):
            assert _max_diff(out["sentence_logits"], ref.seq_relationship_logits if name == "tiny-bert"
                             else ref.sop_logits) <= TOLERANCE
    elif cls is EncoderModel:
        assert _max_diff(out["hidden_states"], ref.last_hidden_state) <= TOLERANCE
        assert _max_diff(out["pooled"], ref.pooler_output) <= TOLERANCE
    else:
        assert _max_diff(out, ref.logits) <= TOLERANCE
    # And back: re-importing gives the very same parameters.
    again = cls.from_pretrained(str(tmp_path), **kwargs)
    for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model, nnx.Param)),
                              nnx.to_flat_state(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(a[...], b[...], err_msg=str(p))


def test_multi_aspect_model_round_trips(tmp_path):
    model = ForMultiAspectClassification(preset("tiny-bert"), num_aspects=6, num_labels=3, rngs=nnx.Rngs(0))
    model.save_pretrained(str(tmp_path))
    again = nli_jax.from_pretrained(str(tmp_path), task="multi_aspect_classification")
    batch = _random_batch(1000, 0)
    np.testing.assert_array_equal(model(**batch), again(**batch))
    # The encoder loads in transformers as BertModel.
    transformers.BertModel.from_pretrained(str(tmp_path))


# --- errors: named, before any compute ---------------------------------------------------------

def test_missing_directory_is_named():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        EncoderModel.from_pretrained("./no/such/model-dir")


def test_missing_config_and_weights_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        EncoderModel.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(preset("tiny-bert").to_hf_dict()))
    with pytest.raises(FileNotFoundError, match="no weights in .*model.safetensors"):
        EncoderModel.from_pretrained(str(tmp_path))


def test_unknown_model_type_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(ConfigError, match="unsupported model_type 'gpt2'"):
        EncoderModel.from_pretrained(str(tmp_path))


def test_shape_mismatch_and_unknown_names_are_listed(tmp_path):
    model = ForMaskedLM(preset("tiny-bert"), rngs=nnx.Rngs(0))
    model.save_pretrained(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"bert\.encoder\.layer\.0\.intermediate\.dense\.weight: checkpoint "
                                              r"\(128, 64\) vs model \(96, 64\)"):
        ForMaskedLM.from_pretrained(str(tmp_path))

    from safetensors.numpy import load_file, save_file
    config["intermediate_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["bert.encoder.layer.0.attention.self.rotary.weight"] = np.zeros(3, np.float32)
    del weights["bert.encoder.layer.1.output.dense.bias"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as error:
        ForMaskedLM.from_pretrained(str(tmp_path))
    assert "bert.encoder.layer.1.output.dense.bias" in str(error.value)
    assert "bert.encoder.layer.0.attention.self.rotary.weight" in str(error.value)


def test_classifier_without_num_labels_is_a_clear_error(tmp_path):
    EncoderModel(preset("tiny-bert"), rngs=nnx.Rngs(0)).save_pretrained(str(tmp_path))
    with pytest.raises(ConfigError, match="needs num_labels"):
        ForSequenceClassification.from_pretrained(str(tmp_path))
    model = ForSequenceClassification.from_pretrained(str(tmp_path), num_labels=3)  # fresh head
    assert model.classifier.out.kernel.shape == (64, 3)


def test_a_bert_tokenizer_config_loads_as_autotokenizer_does_without_importing_torch(minilm_dir):
    """tokenizer_config.json naming BertTokenizer for a BERT model (MiniLM's; nli-jax's exports):
    loaded directly, the same tokenizer and ids as AutoTokenizer's, and torch is never imported."""
    import subprocess
    import sys
    from transformers import AutoTokenizer
    ours, auto = nli_jax.load_tokenizer(minilm_dir), AutoTokenizer.from_pretrained(minilm_dir)
    assert type(ours) is type(auto)
    firsts = ["Budi membaca buku di perpustakaan kota.", "Harga cabai naik menjelang lebaran!"]
    seconds = ["Seseorang sedang membaca.", "Cabai menjadi lebih murah."]
    assert ours(firsts, seconds)["input_ids"] == auto(firsts, seconds)["input_ids"]
    assert ours.get_vocab() == auto.get_vocab()
    code = "import sys, nli_jax; nli_jax.load_tokenizer(sys.argv[1]); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code, str(minilm_dir)], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
