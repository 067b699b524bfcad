"""Every family's and head's initial parameters against transformers' (issue 51, item 1a).

Each family (nli_jax.models.families: BERT, ALBERT, RoBERTa, XLM-R, ELECTRA, DeBERTa-v2 in its v3
and v2 variants, ModernBERT) is built from one config.json by nli-jax and by transformers 5 (its
`_init_weights` run on every module, tied weights tied, as `cls(config)` does), with each head
transformers has for it: the base model, masked LM, pretraining (BERT's NSP, ALBERT's SOP, ELECTRA's
discriminator and generator sharing embeddings), sequence and token classification. Tensors are
matched by the library's own checkpoint names (nli_jax.models.pretrained.state_dict) and compared
one by one; the multi-aspect head (no transformers class) against the family's sequence classifier.

Per tensor, with n elements and s transformers' standard deviation (six standard errors of the
difference of two independent samples, tolerances below):
  - constants (zeros, ones: biases, norms) equal exactly; exact zeros and ones at the same places
    (the padding rows transformers zeroes);
  - std within 6 s / sqrt(n), mean within 6 s sqrt(2 / n);
  - cut-off: at most CUTOFF_EXCEEDANCES elements of either side beyond the other's largest |x|
    (for two samples of one distribution the count exceeds k with probability about 2^-k; a normal
    against one truncated at 2 std has 2.3% of its elements beyond: caught from ~900 elements);
  - tied tensors: every name transformers holds that nli-jax does not is a tied alias of one it does;
  - independence: no two of our tensors of one shape, and no two halves or thirds of a fused one
    (Wqkv, Wi), correlated beyond 6 / sqrt(n) (a key reused between layers would pass the rest).
"""
import itertools

import numpy as np
import pytest

from nli_jax.models import (EncoderConfig, EncoderModel, ForMaskedLM, ForMultiAspectClassification,
                            ForSequenceClassification, ForTokenClassification, families, make_rngs)
from nli_jax.models.electra import ForElectraPretraining, generator_config
from nli_jax.models.models import ForReplacedTokenDetection
from nli_jax.models.pretrained import state_dict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIGMAS = 6.0
CUTOFF_EXCEEDANCES = 20
LABELS = 8  # classifier heads of 8 x 64 elements: their std is checked to +-27%

SHAPE = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
             pad_token_id=0)
_DEBERTA_V3 = dict(model_type="deberta-v2", relative_attention=True, position_buckets=32, max_relative_positions=-1,
                   norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                   position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7)
FAMILIES = {
    "bert": dict(model_type="bert", type_vocab_size=2),
    "albert": dict(model_type="albert", embedding_size=32, type_vocab_size=2),
    "roberta": dict(model_type="roberta", type_vocab_size=1, pad_token_id=1),
    "xlm-roberta": dict(model_type="xlm-roberta", type_vocab_size=1, pad_token_id=1),
    "electra": dict(model_type="electra", embedding_size=32, type_vocab_size=2),
    "deberta-v3": _DEBERTA_V3,
    # DeBERTa-v2-xlarge's kind: absolute positions, token types, separate position projections, the
    # convolution, factorised embeddings.
    "deberta-v2": dict(_DEBERTA_V3, share_att_key=False, pos_att_type="p2c|c2p", position_biased_input=True,
                       type_vocab_size=2, conv_kernel_size=3, conv_act="gelu", embedding_size=32),
    # 4 layers: global and local attention, the per-depth std of the output projections.
    "modernbert": dict(model_type="modernbert", num_hidden_layers=4, local_attention=16, cls_token_id=2,
                       sep_token_id=3, bos_token_id=2, eos_token_id=3),
}
# nli-jax's model class and its keyword arguments, transformers' class suffix.
HEADS = {
    "base": (EncoderModel, {}, "Model"),
    "masked_lm": (ForMaskedLM, {}, "ForMaskedLM"),
    "sequence": (ForSequenceClassification, {"num_labels": LABELS}, "ForSequenceClassification"),
    "token": (ForTokenClassification, {"num_labels": LABELS}, "ForTokenClassification"),
    "sentence": (ForMaskedLM, {"sentence_head": True}, "ForPreTraining"),
    "replaced_token": (ForReplacedTokenDetection, {}, "ForPreTraining"),
}
FAMILY_HEADS = {name: ("base", "masked_lm", "sequence", "token") + {"bert": ("sentence",), "albert": ("sentence",),
                                                                     "electra": ("replaced_token",)}.get(name, ())
                for name in FAMILIES}
_BUFFERS = ("position_ids", "token_type_ids")


def hf_config(family: str, **changes):
    return transformers.AutoConfig.for_model(**{**SHAPE, **FAMILIES[family], **changes})


def theirs(family: str, suffix: str, seed: int = 0, **changes):
    """({name: array}, {name: the names of the tensors tied to it, itself included}) of
    transformers' model built from scratch."""
    config = hf_config(family, **changes)
    torch.manual_seed(seed)
    model = getattr(transformers, families.get(config.model_type).hf_prefix + suffix)(config)
    tensors, groups = {}, {}
    for name, tensor in model.state_dict().items():
        if not name.endswith(_BUFFERS):
            tensors[name] = tensor.detach().float().numpy()
            groups.setdefault(tensor.data_ptr(), set()).add(name)
    return tensors, {name: group for group in groups.values() for name in group}


def our_config(family: str, **changes) -> EncoderConfig:
    return EncoderConfig.from_hf_dict(hf_config(family, **changes).to_dict())


def differences(ours: np.ndarray, reference: np.ndarray) -> list[str]:
    """What tells `ours` from `reference` beyond sampling error (the module docstring's checks)."""
    if ours.shape != reference.shape:
        return [f"shape {ours.shape} vs {reference.shape}"]
    n = ours.size
    if np.all(reference == reference.flat[0]) or np.all(ours == ours.flat[0]):
        return [] if np.array_equal(ours, reference) else [f"constant: {np.unique(ours)[:3]} vs {np.unique(reference)[:3]}"]
    found = []
    for value in (0.0, 1.0):
        if not np.array_equal(ours == value, reference == value):
            found.append(f"exact {value:g}s: {int((ours == value).sum())} vs {int((reference == value).sum())} "
                         "(or not at the same places)")
    s = reference.std()
    if abs(ours.std() - s) > SIGMAS * s / np.sqrt(n):
        found.append(f"std {ours.std():.5f} vs {s:.5f}")
    if abs(ours.mean() - reference.mean()) > SIGMAS * s * np.sqrt(2.0 / n):
        found.append(f"mean {ours.mean():.5f} vs {reference.mean():.5f}")
    beyond_theirs = int((np.abs(ours) > np.abs(reference).max()).sum())
    beyond_ours = int((np.abs(reference) > np.abs(ours).max()).sum())
    if max(beyond_theirs, beyond_ours) > CUTOFF_EXCEEDANCES:
        found.append(f"cut-off: {beyond_theirs} of ours beyond their max |x| {np.abs(reference).max():.5f}, "
                     f"{beyond_ours} of theirs beyond ours {np.abs(ours).max():.5f}")
    return found


def compare(ours: dict, reference: dict, tied: dict) -> list[str]:
    """Every difference of two state dicts under transformers' names, one line each."""
    problems = [f"{name}: only nli-jax has it" for name in sorted(set(ours) - set(reference))]
    problems += [f"{name}: only transformers has it (and it is tied to nothing nli-jax has)"
                 for name in sorted(set(reference) - set(ours)) if not tied[name] & set(ours)]
    for name in sorted(set(ours) & set(reference)):
        problems += [f"{name} {ours[name].shape}: {d}" for d in differences(ours[name], reference[name])]
    return problems


def correlated(ours: dict) -> list[str]:
    """Pairs of our tensors (same shape), or halves / thirds of one, correlated beyond sampling error."""
    random = {k: v for k, v in ours.items() if v.size >= 64 and v.std() > 0}
    pairs = [(a, b, random[a], random[b]) for a, b in itertools.combinations(sorted(random), 2)
             if random[a].shape == random[b].shape]
    for name, x in random.items():
        for parts in (2, 3):
            if x.ndim == 2 and x.shape[0] % parts == 0:
                pieces = np.split(x, parts)
                pairs += [(f"{name}[{i}/{parts}]", f"[{j}/{parts}]", pieces[i], pieces[j])
                          for i, j in itertools.combinations(range(parts), 2)]
    found = []
    for a, b, x, y in pairs:
        r = np.corrcoef(x.ravel(), y.ravel())[0, 1]
        if abs(r) > SIGMAS / np.sqrt(x.size):
            found.append(f"{a} and {b} correlated: r = {r:.3f}")
    return found


def _report(problems: list[str]) -> str:
    return "\n".join(problems[:40]) + (f"\n... and {len(problems) - 40} more" if len(problems) > 40 else "")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_head_starts_as_transformers_does(family):
    problems = []
    for head in FAMILY_HEADS[family]:
        cls, kwargs, suffix = HEADS[head]
        hf_changes = {"num_labels": LABELS} if "num_labels" in kwargs else {}
        reference, tied = theirs(family, suffix, **hf_changes)
        ours = state_dict(cls(our_config(family), **kwargs, rngs=make_rngs(0)))
        problems += [f"[{head}] {p}" for p in compare(ours, reference, tied) + correlated(ours)]
    assert not problems, f"{family}: initial parameters differ from transformers' beyond sampling error:\n" \
                         + _report(problems)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_scanned_layers_start_as_transformers_does(family):
    """Layers stacked for nn.scan draw their own keys (nli_jax.models.encoder.stacked_layers)."""
    ours = state_dict(ForMaskedLM(our_config(family, num_hidden_layers=4).replace(scan_layers=True),
                                  rngs=make_rngs(0)))
    reference, tied = theirs(family, "ForMaskedLM", num_hidden_layers=4)
    problems = compare(ours, reference, tied) + correlated(ours)
    assert not problems, _report(problems)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_multi_aspect_head_starts_as_the_sequence_classifier(family):
    """No transformers class: the encoder as the base model with a pooler, the aspects' classifier
    as the family's sequence classifier (6 aspects x 3 labels wide)."""
    reference, tied = theirs(family, "ForSequenceClassification", num_labels=18)
    ours = state_dict(ForMultiAspectClassification(our_config(family), num_aspects=6, num_labels=3,
                                                   rngs=make_rngs(0)))
    # RoBERTa's and ELECTRA's sequence heads end in classifier.out_proj (initialised alike).
    reference = {("classifier." + k.split(".")[-1] if k.startswith("classifier.out_proj.") else k): v
                 for k, v in reference.items() if not k.startswith("classifier.dense.")}
    assert {"classifier.weight", "classifier.bias"} <= set(ours) & set(reference), sorted(ours)
    problems = compare({k: v for k, v in ours.items() if k in reference}, reference, tied) + correlated(ours)
    assert not problems, _report(problems)


def test_electra_pretraining_starts_as_transformers_discriminator_and_generator():
    """ForElectraPretraining: the discriminator as ElectraForPreTraining, the generator (a quarter
    of the width, the discriminator's embeddings) as ElectraForMaskedLM of its shape."""
    model = ForElectraPretraining(our_config("electra"), generator_fraction=0.25, rngs=make_rngs(0))
    reference, tied = theirs("electra", "ForPreTraining")
    problems = compare(state_dict(model.discriminator), reference, tied)
    generator = generator_config(model.config, 0.25)
    reference, tied = theirs("electra", "ForMaskedLM", hidden_size=generator.hidden_size,
                             num_attention_heads=generator.num_attention_heads,
                             intermediate_size=generator.intermediate_size)
    problems += compare(state_dict(model.generator), reference, tied)
    assert not problems, _report(problems)


def test_the_comparison_sees_a_changed_std_a_cut_off_a_padding_row_and_a_reused_key():
    """The checks themselves, on transformers' own BERT MLM tensors altered one way at a time."""
    reference, tied = theirs("bert", "ForMaskedLM")
    same, _ = theirs("bert", "ForMaskedLM", seed=1)
    assert compare(same, reference, tied) == []
    kernel, table = "bert.encoder.layer.0.intermediate.dense.weight", "bert.embeddings.word_embeddings.weight"
    rng = np.random.default_rng(0)
    for name, altered, expected in (
            (table, same[table] * 1.05, "std"),
            (kernel, np.clip(same[kernel], -0.04, 0.04) / 0.88, "cut-off"),
            (table, np.where(np.arange(1000)[:, None] == 0, rng.normal(0, 0.02, same[table].shape), same[table]),
             "exact 0s"),
            ("bert.embeddings.LayerNorm.weight", same["bert.embeddings.LayerNorm.weight"] * 0.5, "constant")):
        problems = compare({**same, name: altered.astype(np.float32)}, reference, tied)
        assert any(expected in p for p in problems), (name, expected, problems)
    assert correlated({"a": same[kernel], "b": same[kernel] + rng.normal(0, 0.01, same[kernel].shape)})
