"""DeBERTa-v2/v3 (nli_jax/models/deberta.py) against transformers' PyTorch DebertaV2 classes:
logits of ForSequenceClassification, ForTokenClassification and ForMaskedLM within 1e-4 (max
|diff|, float32) on random checkpoints made here, of a tiny and a base-like shape (768 wide, 12
heads, 2 layers to keep CPU time down) in the variants the published configs use, and of
mDeBERTa-v3-base's published config (2 of its 12 layers); padded batches with attention masks
(logits compared at real tokens: transformers' padding rows attend to nothing, ours to the
row, and nothing reads them); packed rows equal to padded ones; export to a DebertaV2
directory that transformers loads with the same logits; the SentencePiece tokenizer of a
DebertaV2 directory. Each check prints its maxima (python -m pytest tests/test_deberta.py -s; the
base-like and mDeBERTa shapes are marked slow: -m slow)."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import nli_jax
from nli_jax.checkpoints import CheckpointError
from nli_jax.models import ConfigError, EncoderConfig, ForMaskedLM, ForSequenceClassification, ForTokenClassification
from nli_jax.models import deberta
from nli_jax.models.encoder import example_tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
# Packed and padded rows compute the same sums in other orders: float32 rounding only.
PACKED_TOLERANCE = 1e-5

HEADS = {"ForSequenceClassification": ForSequenceClassification, "ForTokenClassification": ForTokenClassification,
         "ForMaskedLM": ForMaskedLM}

# DeBERTa-v3 (and mDeBERTa-v3): relative attention with log buckets, shared keys, no absolute
# positions, no token types.
V3 = dict(relative_attention=True, position_buckets=256, max_relative_positions=-1, norm_rel_ebd="layer_norm",
          share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
          layer_norm_eps=1e-7)
# Each variant changes V3 in one respect (the last two in the ways DeBERTa-v2-xlarge differs).
VARIANTS = {
    "v3": {},
    "buckets_0": dict(position_buckets=0),  # no bucketing: the table has 2 x 512 rows
    "separate_position_keys": dict(share_att_key=False),  # pos_key_proj / pos_query_proj
    "no_rel_layer_norm": dict(norm_rel_ebd="none"),
    "c2p_only": dict(pos_att_type=["c2p"]),
    "v2_absolute_types_conv": dict(position_biased_input=True, type_vocab_size=2, pos_att_type="p2c|c2p",
                                   conv_kernel_size=3, conv_groups=2, conv_act="gelu", embedding_size=32),
}
TINY = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
BASE_LIKE = dict(vocab_size=1000, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                 intermediate_size=3072)
# microsoft/mdeberta-v3-base's config.json as published, at 2 of its 12 layers (CPU time).
MDEBERTA_V3_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        vocab_size=251000, max_position_embeddings=512, relative_attention=True, position_buckets=256,
                        norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                        position_biased_input=False, max_relative_positions=-1, type_vocab_size=0,
                        layer_norm_eps=1e-7, hidden_act="gelu", hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1, initializer_range=0.02)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _config(shape, variant="v3", **changes):
    return transformers.DebertaV2Config(**{**V3, **shape, **VARIANTS[variant], **NO_DROPOUT, "num_labels": 3,
                                           **changes})


def _randomise(torch_model, seed=0):
    """Every parameter random (LayerNorms and biases too), so that a swapped name cannot hide, at
    1.6 / sqrt(hidden_size) (0.2 at width 64): attention scores of order one, so that the
    relative-position terms move the logits by far more than the tolerance. (At 0.05, the scale of
    tests/test_checkpoints.py, dropping every relative term moved a tiny classifier's logits by
    6e-4 only; here by 4.3.)"""
    g = torch.Generator().manual_seed(seed)
    std = 1.6 / np.sqrt(torch_model.config.hidden_size)
    with torch.no_grad():
        for name, p in torch_model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1.0 + noise if name.endswith("LayerNorm.weight") else noise)
    return torch_model.eval()


def _batch(vocab, length, types=False, seed=0):
    """Three rows, two of them padded (at 60% and 25% of the length), ids never the pad id."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (3, length))
    mask = np.ones((3, length), np.int64)
    mask[1, int(length * 0.6):] = 0
    mask[2, length // 4:] = 0
    ids[mask == 0] = 0
    token_types = np.zeros_like(ids)
    if types:
        token_types[0, length // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}


def _reference(config, kind, directory, seed=0):
    reference = _randomise(getattr(transformers, "DebertaV2" + kind)(config), seed)
    reference.save_pretrained(str(directory))
    return reference


def _logits(model, batch, **kwargs):
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], **kwargs)
    return np.asarray(out["mlm_logits"] if isinstance(out, dict) else out)


def _torch_logits(reference, batch):
    with torch.no_grad():
        return reference(**{k: torch.tensor(v) for k, v in batch.items()}).logits.numpy()


def _max_diff(ours, ref, batch, kind):
    """max |diff| over examples (sequence heads) or real tokens (token heads)."""
    diff = np.abs(np.asarray(ours, np.float32) - np.asarray(ref, np.float32))
    return float(diff.max() if kind == "ForSequenceClassification" else diff[batch["attention_mask"] == 1].max())


def _check_parity(tmp_path, config, length, label, kinds=tuple(HEADS)):
    batch = _batch(config.vocab_size, length, types=config.type_vocab_size > 0)
    diffs = {}
    for kind in kinds:
        reference = _reference(config, kind, tmp_path / kind)
        model = HEADS[kind].from_pretrained(str(tmp_path / kind))
        diffs[kind] = _max_diff(_logits(model, batch), _torch_logits(reference, batch), batch, kind)
    print(f"\nDeBERTa parity {label}, length {length}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= TOLERANCE for v in diffs.values()), diffs
    return diffs


# Rows of 150 tokens: distances up to 149 reach the log buckets of 256 (beyond 128).
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tiny_models_match_transformers(tmp_path, variant):
    _check_parity(tmp_path, _config(TINY, variant), 150, f"tiny (64 x 4 heads x 2 layers) {variant}")


@pytest.mark.slow  # 15-45 s each on 2 cores: python -m pytest -m slow tests/test_deberta.py
@pytest.mark.parametrize("variant", ["v3", "separate_position_keys", "v2_absolute_types_conv"])
def test_base_like_models_match_transformers(tmp_path, variant):
    _check_parity(tmp_path, _config(BASE_LIKE, variant), 150, f"base-like (768 x 12 heads x 2 layers) {variant}")


@pytest.mark.slow  # ~100 s and 5 GB: a 251,000 x 768 embedding table, written and read back
def test_mdeberta_v3_base_config_matches_transformers(tmp_path):
    """mDeBERTa-v3-base's published config with random weights, 2 of its 12 layers; 300-token
    rows reach its log buckets up to distance 299. The MLM head at 40 tokens: 250k logits a token."""
    config = transformers.DebertaV2Config(**{**MDEBERTA_V3_BASE, "num_hidden_layers": 2, "num_labels": 3})
    _check_parity(tmp_path, config, 300, "mDeBERTa-v3-base config (2 of 12 layers)",
                  kinds=("ForSequenceClassification", "ForTokenClassification"))
    _check_parity(tmp_path, config, 40, "mDeBERTa-v3-base config (2 of 12 layers)", kinds=("ForMaskedLM",))


def test_the_published_config_json_reads_as_transformers_reads_it():
    """Its pos_att_type as a list or "|"-joined (as DeBERTa-v2's config.json files write it);
    DebertaV2Config's defaults for the keys a file omits."""
    published = {**MDEBERTA_V3_BASE, "model_type": "deberta-v2", "pos_att_type": "p2c|c2p"}
    config = EncoderConfig.from_hf_dict(published)
    o = config.family_options
    assert (o.pos_att_type, o.position_buckets, o.share_att_key, o.norm_rel_ebd, o.position_biased_input) == (
        ("p2c", "c2p"), 256, True, "layer_norm", False)
    assert o.span(config) == 256 and o.max_relative(config) == 512 and config.type_vocab_size == 0
    assert EncoderConfig.from_hf_dict({**published, "pos_att_type": ["p2c", "c2p"]}) == config
    assert EncoderConfig.from_hf_dict(config.to_hf_dict()) == config
    bare = EncoderConfig.from_hf_dict({"model_type": "deberta-v2", "hidden_size": 64, "num_attention_heads": 4})
    assert (bare.layer_norm_eps, bare.type_vocab_size, bare.family_options.relative_attention) == (1e-7, 0, False)


# --- relative positions --------------------------------------------------------------------

@pytest.mark.parametrize("buckets,max_position", [(256, 512), (8, 40), (32, 128), (64, 24)])
def test_log_buckets_equal_transformers(buckets, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    distance = np.arange(-2047, 2048)
    ours = deberta.log_bucket_position(distance, buckets, max_position)
    theirs = make_log_bucket_position(torch.tensor(distance), buckets, max_position).long().numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(ours)) > 2 * (buckets // 2)  # beyond the linear range: the log buckets are reached


def test_only_the_rows_a_length_reaches_are_read():
    config = EncoderConfig.from_hf_dict({**MDEBERTA_V3_BASE, "model_type": "deberta-v2"})
    rows, first, count = deberta.relative_rows(config, 128)
    assert rows.shape == (255,) and (first, count) == (256 - 127, 255)  # distances -127..127: no bucketing yet
    assert (rows[0] + first, rows[127] + first, rows[-1] + first) == (256 - 127, 256, 256 + 127)
    rows, first, count = deberta.relative_rows(config, 512)
    assert rows.shape == (1023,) and first + count <= 512 and count < 512  # log buckets share rows


def test_skew_lays_per_distance_scores_out_per_pair():
    """skew(x)[i, j] = x[i, j + n - 1 - i], against the gather it replaces."""
    for n in (1, 2, 7, 16):
        x = np.random.default_rng(n).normal(size=(2, 3, n, 2 * n - 1)).astype(np.float32)
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        np.testing.assert_array_equal(np.asarray(deberta.skew(jnp.asarray(x))), x[..., i, j + n - 1 - i])


# --- packed rows ---------------------------------------------------------------------------

def _packed(examples, rows, length):
    """Examples (ids, token types) laid first-fit into `rows` rows of `length` tokens, one group:
    the packing fields of nli_jax.data.pipeline.Batching.pack."""
    ids, types = np.zeros((rows, length), np.int64), np.zeros((rows, length), np.int64)
    segments, positions = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.int32)
    cls_index, used = [], [0] * rows
    for example_ids, example_types in examples:
        n = len(example_ids)
        row = next(r for r in range(rows) if used[r] + n <= length)
        offset = used[row]
        ids[row, offset:offset + n], types[row, offset:offset + n] = example_ids, example_types
        segments[row, offset:offset + n] = 1 + int(segments[row].max())
        positions[row, offset:offset + n] = np.arange(n)
        cls_index.append(row * length + offset)
        used[row] += n
    packing = {"segment_ids": jnp.asarray(segments), "position_ids": jnp.asarray(positions),
               "cls_index": jnp.asarray([cls_index], jnp.int32)}
    return ids, (segments > 0).astype(np.int64), types, packing


@pytest.mark.parametrize("variant", ["v3", "separate_position_keys", "v2_absolute_types_conv"])
def test_packed_rows_equal_padded_rows(tmp_path, variant):
    """Several examples per row, each attending to itself with its own positions (absolute ones
    from position_ids, relative ones the same within an example; the convolution's window inside
    its example): the classifier's and the tagger's logits equal those of the padded batch."""
    config = _config(TINY, variant)
    lengths = [37, 20, 9, 61, 14, 45]
    rng = np.random.default_rng(3)
    examples = [(rng.integers(3, config.vocab_size, n), (np.arange(n) >= n // 2).astype(np.int64)) for n in lengths]
    padded = {"input_ids": np.zeros((6, 64), np.int64), "attention_mask": np.zeros((6, 64), np.int64),
              "token_type_ids": np.zeros((6, 64), np.int64)}
    for i, (ids, types) in enumerate(examples):
        padded["input_ids"][i, :len(ids)], padded["token_type_ids"][i, :len(ids)] = ids, types
        padded["attention_mask"][i, :len(ids)] = 1
    ids, mask, types, packing = _packed(examples, rows=3, length=80)
    diffs = {}
    for kind in ("ForSequenceClassification", "ForTokenClassification"):
        _reference(config, kind, tmp_path / kind)
        model = HEADS[kind].from_pretrained(str(tmp_path / kind))
        expected = _logits(model, padded)
        got = np.asarray(model(ids, mask, types, packing=packing))
        if kind == "ForTokenClassification":
            got = np.asarray(example_tokens(got, packing["cls_index"], 64))
            real = padded["attention_mask"] == 1
            diffs[kind] = float(np.abs(got - expected)[real].max())
        else:
            diffs[kind] = float(np.abs(got - expected).max())
    print(f"\nDeBERTa packed vs padded {variant}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= PACKED_TOLERANCE for v in diffs.values()), diffs


def test_scanned_layers_equal_the_loop(tmp_path):
    config = _config(TINY, "separate_position_keys")
    _reference(config, "ForSequenceClassification", tmp_path)
    batch = _batch(config.vocab_size, 40)
    loop = ForSequenceClassification.from_pretrained(str(tmp_path))
    scanned = ForSequenceClassification.from_pretrained(str(tmp_path), scan_layers=True)
    np.testing.assert_allclose(_logits(scanned, batch), _logits(loop, batch), atol=PACKED_TOLERANCE)
    with pytest.raises(ConfigError, match="scan_layers=True with conv_kernel_size 3"):
        ForSequenceClassification(EncoderConfig.from_hf_dict(
            _config(TINY, "v2_absolute_types_conv").to_dict(), scan_layers=True), num_labels=3, rngs=nnx.Rngs(0))


# --- the parity checks can fail ------------------------------------------------------------

@pytest.mark.parametrize("parameter", ["relative", "relative_norm", "attention_key", "pooler"])
def test_parity_check_catches_a_perturbed_position_parameter(tmp_path, parameter):
    """One perturbed entry of the relative table, its LayerNorm, a layer's key projection (which
    the shared c2p term reads too) or the ContextPooler breaks parity: none of them is unused."""
    config = _config(TINY, "v3")
    reference = _reference(config, "ForSequenceClassification", tmp_path)
    batch = _batch(config.vocab_size, 150)
    model = ForSequenceClassification.from_pretrained(str(tmp_path))
    encoder = model.encoder
    variable, index = {"relative": (encoder.relative.embedding, (256 + 5, 7)),
                       "relative_norm": (encoder.relative_norm.scale, (7,)),
                       "attention_key": (encoder.layers[1].attention.key.kernel, (7, 1, 3)),
                       "pooler": (encoder.pooler.dense.bias, (7,))}[parameter]
    variable.set_value(variable[...].at[index].add(0.5))
    diff = _max_diff(_logits(model, batch), _torch_logits(reference, batch), batch, "ForSequenceClassification")
    assert diff > TOLERANCE, diff


# --- export ----------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["v3", "separate_position_keys", "v2_absolute_types_conv"])
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, variant):
    """Ours -> save_pretrained -> transformers' DebertaV2For* without missing or unexpected
    weights and the same logits; re-imported, the very same parameters."""
    config = EncoderConfig.from_hf_dict(_config(TINY, variant).to_dict())
    batch = _batch(config.vocab_size, 150, types=config.type_vocab_size > 0)
    rng = np.random.default_rng(0)
    diffs = {}
    for kind, cls in HEADS.items():
        kwargs = {} if kind == "ForMaskedLM" else {"num_labels": 3}
        model = cls(config, rngs=nnx.Rngs(1), **kwargs)
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):  # no zero biases, no unit norms
            var.set_value(var[...] + jnp.asarray(rng.normal(0, 0.05, var.shape), jnp.float32))
        directory = str(tmp_path / kind)
        model.save_pretrained(directory, label_names=None if kind == "ForMaskedLM" else ["a", "b", "c"])
        reference, info = getattr(transformers, "DebertaV2" + kind).from_pretrained(directory, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        diffs[kind] = _max_diff(_logits(model, batch), _torch_logits(reference.eval(), batch), batch, kind)
        again = cls.from_pretrained(directory, **kwargs)
        for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model, nnx.Param)),
                                  nnx.to_flat_state(nnx.state(again, nnx.Param))):
            np.testing.assert_array_equal(a[...], b[...], err_msg=str(p))
    print(f"\nDeBERTa export -> transformers {variant}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= TOLERANCE for v in diffs.values()), diffs


def test_original_mlm_head_names_load_with_legacy_false(tmp_path):
    """legacy false: the MLM head of the original checkpoints (lm_predictions.lm_head.*)."""
    config = _config(TINY, "v3", legacy=False)
    _check_parity(tmp_path, config, 40, "tiny v3, legacy=False", kinds=("ForMaskedLM",))
    names = json.loads((tmp_path / "ForMaskedLM" / "config.json").read_text())
    assert names["legacy"] is False


def test_v3_checkpoints_unused_position_embeddings_are_ignored_and_heads_of_others_are_unused(tmp_path):
    """DeBERTa-v3 checkpoints carry absolute position embeddings they never use, and a sequence
    classifier's pooler is no part of a token classifier: both load without complaint; a weight
    that maps to nothing is still named."""
    from safetensors.numpy import load_file, save_file
    config = _config(TINY, "v3")
    _reference(config, "ForSequenceClassification", tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["deberta.embeddings.position_embeddings.weight"] = np.zeros((512, 64), np.float32)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ForTokenClassification.from_pretrained(str(tmp_path))
    weights["deberta.encoder.layer.0.attention.self.rotary.weight"] = np.zeros(3, np.float32)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"deberta\.encoder\.layer\.0\.attention\.self\.rotary\.weight"):
        ForTokenClassification.from_pretrained(str(tmp_path))


# --- config errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("change,message", [
    ({"pos_att_type": ["c2p", "p2p"]}, r"config.json pos_att_type \['c2p', 'p2p'\]: \['p2p'\] not supported"),
    ({"norm_rel_ebd": "batch_norm"}, "config.json norm_rel_ebd 'batch_norm'"),
    ({"conv_kernel_size": 4}, "config.json conv_kernel_size 4: expected 0 .* or an odd window"),
    ({"pooler_hidden_act": "swishy"}, "config.json pooler_hidden_act 'swishy'"),
    ({"pooler_hidden_size": 32}, "config.json pooler_hidden_size 32 differs from hidden_size 64"),
])
def test_unsupported_config_json_values_are_named(change, message):
    d = {**_config(TINY, "v3").to_dict(), **change}
    with pytest.raises(ConfigError, match=message):
        EncoderConfig.from_hf_dict(d)


def test_the_splash_kernel_is_refused():
    config = EncoderConfig.from_hf_dict(_config(TINY, "v3").to_dict(), attention="splash")
    with pytest.raises(ConfigError, match="splash"):
        ForSequenceClassification(config, num_labels=3, rngs=nnx.Rngs(0))


# --- tokenizer -------------------------------------------------------------------------------

SENTENCES = ["Saya suka makan nasi goreng di warung dekat rumah.", "Hujan turun sejak pagi.",
             "Kereta terakhir berangkat pukul sembilan malam dari stasiun kota, penuh penumpang."]


def make_spm_tokenizer_dir(directory, text, vocab_size=48):
    """A DeBERTa-v3-style tokenizer directory, as the hub's: a SentencePiece unigram model
    (spm.model, trained here on `text`) with [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, [MASK], and a
    tokenizer_config.json naming DebertaV2Tokenizer. Returns the directory."""
    import sentencepiece as spm
    os.makedirs(directory, exist_ok=True)
    corpus = os.path.join(directory, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(text))
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(directory, "spm"), vocab_size=vocab_size,
                                   model_type="unigram", pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]",
                                   bos_piece="[CLS]", eos_piece="[SEP]", unk_piece="[UNK]",
                                   user_defined_symbols=["[MASK]"], character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2)
    os.remove(corpus)
    os.remove(os.path.join(directory, "spm.vocab"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False, "vocab_type": "spm"}, f)
    return str(directory)


def test_a_debertav2_sentencepiece_tokenizer_directory_loads_with_its_pieces(tmp_path):
    """spm.model + tokenizer_config.json (as mDeBERTa-v3 ships): load_tokenizer gives
    SentencePiece's own pieces and ids, [CLS] a [SEP] b [SEP] with token types 0/1; the export
    carries spm.model and tokenizes the same."""
    import sentencepiece as spm
    directory = make_spm_tokenizer_dir(tmp_path / "tokenizer", SENTENCES * 20)
    tokenizer = nli_jax.load_tokenizer(directory)
    processor = spm.SentencePieceProcessor(model_file=os.path.join(directory, "spm.model"))
    for sentence in SENTENCES + ["Pagi ini kereta penuh."]:
        assert tokenizer.tokenize(sentence) == processor.encode(sentence, out_type=str)
    encoded = tokenizer(SENTENCES[0], SENTENCES[1])
    assert encoded["input_ids"] == [1, *processor.encode(SENTENCES[0]), 2, *processor.encode(SENTENCES[1]), 2]
    assert encoded["token_type_ids"] == [0] * (len(processor.encode(SENTENCES[0])) + 2) + [1] * (
        len(processor.encode(SENTENCES[1])) + 1)
    assert (tokenizer.pad_token_id, tokenizer.mask_token_id, len(tokenizer)) == (0, processor.piece_to_id("[MASK]"),
                                                                                  processor.get_piece_size())
    model = ForSequenceClassification(EncoderConfig.from_hf_dict(_config(TINY, "v3").to_dict()), num_labels=3,
                                      rngs=nnx.Rngs(0))
    model.save_pretrained(str(tmp_path / "export"), tokenizer=tokenizer)
    with open(os.path.join(directory, "spm.model"), "rb") as a, open(tmp_path / "export" / "spm.model", "rb") as b:
        assert a.read() == b.read()
    for loaded in (nli_jax.load_tokenizer(str(tmp_path / "export")),
                   transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))):
        assert [loaded.tokenize(s) for s in SENTENCES] == [tokenizer.tokenize(s) for s in SENTENCES]


def test_a_tokenizer_saved_without_its_vocabulary_is_refused(tmp_path):
    """transformers v5's DebertaV2Tokenizer(vocab_file=...) ignores the file and has its 7 special
    tokens only: saved, that directory is refused (every word would be [UNK]), not loaded."""
    directory = make_spm_tokenizer_dir(tmp_path / "tokenizer", SENTENCES * 20)
    transformers.DebertaV2Tokenizer(vocab_file=os.path.join(directory, "spm.model")).save_pretrained(
        str(tmp_path / "empty"))
    with pytest.raises(CheckpointError, match="only its .* special tokens and no vocabulary"):
        nli_jax.load_tokenizer(str(tmp_path / "empty"))


def test_flops_count_the_relative_terms():
    config = EncoderConfig.from_hf_dict({**MDEBERTA_V3_BASE, "model_type": "deberta-v2"})
    model = nnx.eval_shape(lambda: ForSequenceClassification(config, num_labels=3, rngs=nnx.Rngs(0)))
    plain = EncoderConfig.from_hf_dict({**MDEBERTA_V3_BASE, "model_type": "deberta-v2", "pos_att_type": []})
    without = nnx.eval_shape(lambda: ForSequenceClassification(plain, num_labels=3, rngs=nnx.Rngs(0)))
    # c2p and p2c at 128 tokens: 255 distances each, 6 x layers x hidden x distances x 2 more FLOPs a token
    assert model.training_flops_per_token(128) - without.training_flops_per_token(128) == 6 * 12 * 768 * 255 * 2


# --- through the workflow (slow: a fine-tuning run each) ------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "nli_jax", "data", "fixtures", "nli_tiny")


def _jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_tiny_deberta(directory, text, hf_class="DebertaV2ForMaskedLM", vocab_size=120, **changes):
    """A DeBERTa-v3-style checkpoint made here: a SentencePiece tokenizer trained on `text`
    (make_spm_tokenizer_dir) and a random 2 x 64 model of `hf_class` with DeBERTa-v3's attention
    (32 log buckets: 64-token rows reach them), as transformers saves it."""
    make_spm_tokenizer_dir(directory, text, vocab_size=vocab_size)
    vocabulary = len(nli_jax.load_tokenizer(str(directory)))
    config = transformers.DebertaV2Config(**{**V3, **TINY, "vocab_size": vocabulary, "max_position_embeddings": 128,
                                             "position_buckets": 32, **changes})
    getattr(transformers, hf_class)(config).save_pretrained(str(directory))
    return str(directory)


def _fixture_text():
    rows = [row for name in ("train.jsonl", "val.jsonl", "test_lay.jsonl", "test_expert.jsonl")
            for row in _jsonl(os.path.join(FIXTURE, name))]
    return [text for row in rows for text in (row["premise"], row["hypothesis"])]


def _cli(module, *args, timeout=900):
    import subprocess
    import sys
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.mark.slow  # a fine-tuning run: ~70 s on 2 cores
def test_a_tiny_deberta_fine_tunes_on_the_nli_fixture_and_transformers_predicts_as_its_export(tmp_path):
    """finetune.main's NLI cpu_test from a DeBERTa-v3-style checkpoint made here (model.init, its
    own SentencePiece tokenizer): it learns the fixture, finetune.predict labels unlabelled pairs
    as the run did, and the export loads in transformers' DebertaV2ForSequenceClassification
    with its tokenizer and predicts the run's probabilities."""
    init = make_tiny_deberta(tmp_path / "init", _fixture_text())
    workdir = tmp_path / "run"
    _cli("finetune.main", "--config=configs/indonli_large.py:cpu_test", f"--workdir={workdir}",
         f"--config.model.init={init}", "--config.model.tokenizer=", "--config.export_best=True",
         f"--config.data.tfds_dir={tmp_path / 'tfds'}")
    results = json.loads((workdir / "results.json").read_text())
    accuracy = results["splits"]["validation"]["accuracy"]
    print(f"\nDeBERTa (2 x 64) on the NLI fixture: validation accuracy {accuracy:.3f}")
    assert accuracy >= 0.6  # chance is 1/3
    trained = [r for r in _jsonl(workdir / "predictions.jsonl") if r["split"] == "validation"]

    rows = _jsonl(os.path.join(FIXTURE, "val.jsonl"))
    with open(tmp_path / "pairs.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({k: v for k, v in row.items() if k != "label"}) + "\n" for row in rows)
    _cli("finetune.predict", f"--checkpoint={workdir}", f"--output={tmp_path / 'predicted'}",
         f"--input=mine={tmp_path / 'pairs.jsonl'}")
    predicted = _jsonl(tmp_path / "predicted" / "predictions.jsonl")
    assert [r["prediction"] for r in predicted] == [r["prediction"] for r in trained]

    export = workdir / "export_best"
    assert (export / "spm.model").is_file()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(export)).eval()
    assert type(model).__name__ == "DebertaV2ForSequenceClassification"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
    batch = tokenizer([r["premise"] for r in rows], [r["hypothesis"] for r in rows], padding=True, truncation=True,
                      max_length=64, return_tensors="pt")
    with torch.no_grad():
        probabilities = torch.softmax(model(**batch).logits, -1).numpy()
    assert [model.config.id2label[int(i)] for i in probabilities.argmax(-1)] == [r["prediction"] for r in trained]
    np.testing.assert_allclose(probabilities, [r["probabilities"] for r in trained], atol=1e-5)


@pytest.mark.slow  # a few training steps and NERP's validation split: ~2 minutes
def test_a_tiny_deberta_fine_tunes_on_an_indonlu_tagging_task_and_exports(tmp_path, shared_data):
    """NERP (word-level tags, packed rows read back per example) from a DeBERTa checkpoint whose
    SentencePiece tokenizer is trained here on NERP's training words: the loss falls, every
    validation sentence is predicted, and the export is a DebertaV2ForTokenClassification whose
    token logits transformers computes as nli-jax does."""
    source = shared_data / "indonlu"
    train_file = source / "nerp_ner-prosa" / "train_preprocess.txt"
    if not train_file.is_file():
        pytest.skip(f"{train_file} not found: IndoNLU's NERP is needed (set NLI_JAX_SHARED_DATA)")
    sentences, words = [], []
    for line in train_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            words.append(line.split("\t")[0])
        elif words:
            sentences.append(" ".join(words))
            words = []
    init = make_tiny_deberta(tmp_path / "init", sentences[:2000], hf_class="DebertaV2Model", vocab_size=1000)
    workdir = tmp_path / "run"
    _cli("finetune.main", "--config=configs/indonlu.py:task=nerp,model=scratch,cpu_test", f"--workdir={workdir}",
         f"--config.data.source={source}", f"--config.model.init={init}", "--config.model.tokenizer=",
         "--config.export_best=True", f"--config.data.tfds_dir={tmp_path / 'tfds'}")
    losses = [json.loads(line)["train/loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()
              if "train/loss" in line]
    assert losses[-1] < 0.7 * losses[0], losses
    validation = [r for r in _jsonl(workdir / "predictions.jsonl") if r["split"] == "validation"]
    assert len(validation) == json.loads((workdir / "results.json").read_text())["splits"]["validation"]["count"] > 0

    export = str(workdir / "export_best")
    reference = transformers.DebertaV2ForTokenClassification.from_pretrained(export).eval()
    ours = ForTokenClassification.from_pretrained(export)
    tokenizer = nli_jax.load_tokenizer(export)
    batch = dict(tokenizer(sentences[:4], padding=True, truncation=True, max_length=64, return_tensors="np"))
    diff = _max_diff(_logits(ours, batch), _torch_logits(reference, batch), batch, "ForTokenClassification")
    print(f"\nDeBERTa NERP export: token logits max |diff| {diff:.2e} against transformers")
    assert diff <= TOLERANCE
    assert set(reference.config.id2label.values()) >= {"O", "B-PPL", "I-PPL"}


SHARDING_SCRIPT = r"""
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
from configs import indonli_large
from nli_jax.train import loop

def shardings_of(tree):
    return {jax.tree_util.keystr(path): [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(x, "sharding")}

meshes, init, root = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
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
    config.model.init = init
    config.model.tokenizer = ""
    config.data.tfds_dir = root + "/tfds"
    config.train.max_steps = 6
    config.train.log_every_steps = 1
    config.eval_splits = ("validation",)
    config.data.packing = False  # padded rows: the same rows and dropout masks on every mesh
    workdir = f"{root}/{name}"
    loop.train_and_evaluate(config, workdir)
    losses = [json.loads(line)["train/loss"] for line in open(workdir + "/metrics.jsonl") if "train/loss" in line]
    report[name] = {"losses": losses, "specs": shardings_of(kept.pop())}
print("REPORT" + json.dumps(report))
"""


@pytest.mark.slow  # three short runs on 8 fake CPU devices: ~3 minutes
def test_fsdp_and_tensor_meshes_shard_deberta_and_train_as_data_parallel(tmp_path):
    """Every DeBERTa parameter kind (relative table and its LayerNorm, pos_key/pos_query
    projections, the convolution, absolute positions, token types, the ContextPooler) carries
    logical axis names that nli_jax.plan.MESH_RULES map: on {fsdp 4} and {fsdp 2, tensor 4} they
    are held split as the rules say, and the per-step losses equal {data 8}'s within 2e-5 (as
    tests/test_sharding.py asks of BERT)."""
    import subprocess
    import sys
    init = make_tiny_deberta(tmp_path / "init", _fixture_text(), hf_class="DebertaV2ForMaskedLM",
                             **VARIANTS["separate_position_keys"], position_biased_input=True, type_vocab_size=2,
                             conv_kernel_size=3, conv_groups=2)
    meshes = {"data8": {"data": 8}, "data2_fsdp4": {"data": 2, "fsdp": 4}, "fsdp2_tensor4": {"fsdp": 2, "tensor": 4}}
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", SHARDING_SCRIPT, json.dumps(meshes), init, str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.split("REPORT", 1)[1])
    reference = report["data8"]["losses"]
    assert len(reference) == 6
    for name in ("data2_fsdp4", "fsdp2_tensor4"):
        gap = max(abs(a - b) for a, b in zip(report[name]["losses"], reference))
        print(f"\nDeBERTa {name} vs data8: per-step train loss max |diff| {gap:.1e}")
        assert len(report[name]["losses"]) == 6 and gap <= 2e-5, (name, report[name]["losses"], reference)

    def spec(name, path):
        matches = [s for p, s in report[name]["specs"].items() if p.endswith("['params']" + path)]
        assert len(matches) == 1, (path, sorted(report[name]["specs"])[:20])
        mu = [s for p, s in report[name]["specs"].items() if p.endswith(".mu" + path)]
        assert mu == matches, (name, path, mu)  # Adam's first moment lives where its parameter lives
        return matches[0]
    expected = {  # (path suffix in the parameters, {mesh: PartitionSpec})
        "['encoder']['relative']['embedding']": {"data2_fsdp4": [None, "fsdp"], "fsdp2_tensor4": [None, "fsdp"]},
        "['encoder']['relative_norm']['scale']": {"data2_fsdp4": ["fsdp"], "fsdp2_tensor4": ["fsdp"]},
        "['encoder']['layers'][0]['attention']['pos_key']['kernel']": {"data2_fsdp4": ["fsdp", None, None],
                                                                    "fsdp2_tensor4": ["fsdp", "tensor", None]},
        "['encoder']['layers'][1]['attention']['pos_query']['bias']": {"data2_fsdp4": [None, None],
                                                                    "fsdp2_tensor4": ["tensor", None]},
        "['encoder']['conv']['kernel']": {"data2_fsdp4": [None, "fsdp", None], "fsdp2_tensor4": [None, "fsdp", None]},
        "['encoder']['embeddings']['position']['embedding']": {"data2_fsdp4": [None, "fsdp"],
                                                               "fsdp2_tensor4": [None, "fsdp"]},
        "['encoder']['pooler']['dense']['kernel']": {"data2_fsdp4": ["fsdp", None], "fsdp2_tensor4": ["fsdp", None]},
    }
    for path, by_mesh in expected.items():
        for name, want in by_mesh.items():
            assert spec(name, path) == want, (name, path, spec(name, path))


def test_the_mdeberta_config_carries_its_model_cards_xnli_recipe():
    """configs/indonli_mdeberta.py: mDeBERTa-v3-base's model card's run_xnli.py command (8 x 4,
    lr 2e-5, 6 epochs, 3000 warmup steps, 256 tokens) with the Trainer's defaults; its cpu_test
    plans the tiny-deberta-v3 preset from scratch."""
    from conftest import config_for
    from nli_jax.models import preset
    from nli_jax.planner import build_plan
    c = config_for("indonli_mdeberta")
    assert (c.model.init, c.optimizer.name, c.optimizer.lr, c.optimizer.schedule, c.optimizer.weight_decay,
            c.optimizer.eps, c.optimizer.grad_clip, c.train.batch_size, c.train.num_epochs, c.data.max_seq_length,
            c.train.early_stopping_patience) == ("microsoft/mdeberta-v3-base", "adamw", 2e-5, "linear", 0.0, 1e-8, 1.0,
                                                 32, 6, 256, 0)
    assert round(c.optimizer.warmup_ratio * 6 * 12_272) == 3000  # 392,702 MNLI pairs at 32: 12,272 steps an epoch
    plan = build_plan(config_for("indonli_mdeberta:cpu_test"), training=False)
    assert (plan.model.init, plan.model.preset) == ("", "tiny-deberta-v3")
    config = preset("tiny-deberta-v3")
    assert config.model_type == "deberta-v2" and config.family_options.share_att_key
    assert EncoderConfig.from_hf_dict(config.to_hf_dict()) == config


def test_the_base_model_and_the_multi_aspect_model_round_trip(tmp_path):
    """EncoderModel exports as DebertaV2Model (no pooler: the base model has none) with its hidden
    states; a multi-aspect model (CASA, HoASA) reads the ContextPooler and round-trips in
    nli-jax, its encoder loading in transformers as DebertaV2Model."""
    from nli_jax.models import EncoderModel, ForMultiAspectClassification, preset
    config = preset("tiny-deberta-v3")
    batch = _batch(config.vocab_size, 40)
    model = EncoderModel(config, rngs=nnx.Rngs(0))
    assert model.encoder.pooler is None
    model.save_pretrained(str(tmp_path / "base"))
    reference, info = transformers.DebertaV2Model.from_pretrained(str(tmp_path / "base"), output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        hidden = reference.eval()(input_ids=torch.tensor(batch["input_ids"]),
                                  attention_mask=torch.tensor(batch["attention_mask"])).last_hidden_state.numpy()
    ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])["hidden_states"]
    assert np.abs(np.asarray(ours) - hidden)[batch["attention_mask"] == 1].max() <= TOLERANCE
    aspects = ForMultiAspectClassification(config, num_aspects=6, num_labels=3, rngs=nnx.Rngs(0))
    aspects.save_pretrained(str(tmp_path / "aspects"))
    again = nli_jax.from_pretrained(str(tmp_path / "aspects"), task="multi_aspect_classification")
    np.testing.assert_array_equal(_logits(aspects, batch), _logits(again, batch))
    _, info = transformers.DebertaV2Model.from_pretrained(str(tmp_path / "aspects"), output_loading_info=True)
    assert not info["missing_keys"] and set(info["unexpected_keys"]) == {
        "pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"}
