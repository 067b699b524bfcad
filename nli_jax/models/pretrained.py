"""Hugging Face checkpoints <-> nli-jax NNX models: `PretrainedModel`, the base of every task
model, with `from_pretrained` / `save_pretrained`, and the map from our parameters to
transformers' names and layouts. Files are read and written by nli_jax.checkpoints.hf (which
knows nothing of the models); each model class declares how transformers names it (`hf_*`),
and the family of its config's model_type (nli_jax.models.families) its class prefix and
parameter names.

Layouts: HF Linear weights are [out, in], ours are [in, out]; our attention projections keep
heads as their own axis ([embed, heads, kv] and [heads, kv, embed]) for tensor parallelism.
Every mismatch is reported by name before any compute.

A scanned encoder (config.scan_layers) holds its layers' parameters stacked; everything here sees
them per layer, as transformers names them, through encoder.unstack_layers / stack_layers.
"""
from __future__ import annotations

import dataclasses
import logging
import re

import jax
import numpy as np
from flax import nnx

from nli_jax.checkpoints import hf
from nli_jax.models import families
from nli_jax.models.families import REVERSED
from nli_jax.models.config import ConfigError, EncoderConfig
from nli_jax.models.encoder import make_rngs, stack_layers, training_flops_per_token, unstack_layers

log = logging.getLogger("nli_jax.checkpoints.hf")


class PretrainedModel(nnx.Module):
    """A task model with Hugging Face-style `from_pretrained` / `save_pretrained`."""

    config: EncoderConfig

    def training_flops_per_token(self, sequence_length: int) -> float:
        """Training FLOPs per token of this model (every encoder it holds): MFU's numerator."""
        return training_flops_per_token(self, sequence_length)

    hf_suffix = "Model"  # the transformers class is the family's name + this (BertForMaskedLM, ...)
    hf_base_model = False  # a bare encoder: saved without the base-model prefix ("bert.")
    hf_id2label = False  # num_labels travels as config.json's id2label (transformers' classifiers)
    hf_roberta_classifier = False  # RoBERTa's sequence head: classifier.dense + classifier.out_proj
    hf_saved_head_arguments: tuple[str, ...] = ()  # read back from config.json's nli_jax.head_arguments

    def head_arguments(self) -> dict:
        """Constructor arguments beyond the config (num_labels, ...), saved with the model."""
        return {}

    def hf_architecture(self, suffix: str | None = None) -> str:
        """The transformers class this model saves as (config.json's architectures)."""
        return families.get(self.config.model_type).hf_prefix + (suffix or self.hf_suffix)

    @classmethod
    def from_pretrained(cls, path: str, **kwargs):
        return from_pretrained(cls, path, **kwargs)

    def save_pretrained(self, path: str, *, tokenizer=None, label_names=None, extra: dict | None = None) -> None:
        save_pretrained(self, path, tokenizer=tokenizer, label_names=label_names, extra=extra)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One parameter: our state path, its Hugging Face name, and how many leading kernel axes
    are input axes (kernels only; 0 for embeddings, biases and norms; REVERSED: transformers'
    layout is ours with every axis reversed, as a convolution's [out, in, width])."""
    path: tuple
    hf_name: str
    in_axes: int = 0
    is_encoder: bool = True


def parameter_entries(model: "PretrainedModel") -> list[Entry]:
    """Every parameter of `model` with its Hugging Face name (base-model prefix included
    for task models, as transformers saves them)."""
    config = model.config
    family = families.get(config.model_type)
    prefix = "" if model.hf_base_model else family.base_model_prefix + "."
    entries = []
    for path in _per_layer_shapes(model):
        if path[0] == "encoder":
            name, in_axes = family.encoder_name(config, path[1:])
            entries.append(Entry(path, prefix + name if family.in_base_model(name) else name, in_axes, True))
        else:
            in_axes = 1 if path[-1] == "kernel" else 0
            entries.append(Entry(path, family.head_name(config, model, path), in_axes, False))
    return entries


def _per_layer_shapes(model: "PretrainedModel") -> dict:
    """{parameter path: ShapeDtypeStruct}, a scanned encoder's layers one by one."""
    return unstack_layers({path: jax.ShapeDtypeStruct(v.shape, v.dtype)
                           for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))})


def _hf_shape(e: Entry, shape: tuple) -> tuple:
    if e.in_axes == REVERSED:
        return tuple(reversed(shape))
    if e.in_axes:  # kernel: ours [in..., out...] -> HF [prod(out), prod(in)]
        return (int(np.prod(shape[e.in_axes:])), int(np.prod(shape[:e.in_axes])))
    if e.path[-1] == "embedding":  # tables have the same layout
        return tuple(shape)
    return (int(np.prod(shape)),)  # biases (ours may be [heads, kv]) and norms


def to_ours(w: np.ndarray, shape: tuple, in_axes: int) -> np.ndarray:
    if in_axes:  # ndarray.T reverses every axis: also REVERSED's inverse
        return np.ascontiguousarray(w.T).reshape(shape)
    return w.reshape(shape)


def to_hf(e: Entry, x: np.ndarray) -> np.ndarray:
    if e.in_axes == REVERSED:
        x = x.T
    elif e.in_axes:
        x = x.reshape(int(np.prod(x.shape[:e.in_axes])), int(np.prod(x.shape[e.in_axes:]))).T
    elif e.path[-1] != "embedding":
        x = x.reshape(-1)
    return np.ascontiguousarray(x, dtype=np.float32)


# Buffers and tied copies transformers may have saved; never parameters of ours.
_IGNORABLE = re.compile(r"(position_ids|token_type_ids|\.decoder\.weight|\.decoder\.bias|generator_lm_head\.weight)$")
# Heads of transformers' task classes: unused when loading into another task's model.
_HEAD_PREFIXES = ("cls.", "predictions.", "lm_head.", "sop_classifier.", "classifier.", "qa_outputs.",
                  "generator_predictions.", "generator_lm_head.", "discriminator_predictions.")


def _canonical(config: EncoderConfig, weights: dict) -> dict:
    """Checkpoint keys with the base-model prefix, whether or not the file had it."""
    family = families.get(config.model_type)
    prefix = family.base_model_prefix + "."
    out = {}
    for k, v in weights.items():
        if family.in_base_model(k):
            k = prefix + k
        out[k] = v
    return out


def from_pretrained(cls, path: str, *, dtype: str | None = None, remat: str | bool | None = None,
                    scan_layers: bool | None = None, seed: int = 0, strict: bool = True, config_overrides: dict | None = None,
                    heads: bool = True, **head_kwargs):
    """Builds `cls` from a Hugging Face model directory (or hub id).

    Heads the checkpoint lacks (a new classifier, say) are freshly initialised and logged;
    `heads=False` initialises every weight outside the base model afresh, whatever the checkpoint
    holds (sequential fine-tuning onto other labels: nli_jax.train.run_init).
    Raises CheckpointError naming every missing encoder weight, shape mismatch and (when
    `strict`) every checkpoint weight that maps to nothing.
    """
    directory = hf.resolve_directory(path)
    config_json = hf.read_config(directory)
    overrides = dict(config_overrides or {})
    if dtype is not None:
        overrides["dtype"] = dtype
    if remat is not None:
        overrides["remat"] = remat
    if scan_layers is not None:
        overrides["scan_layers"] = scan_layers
    config = EncoderConfig.from_hf_dict(config_json, **overrides)
    if cls.hf_id2label and "num_labels" not in head_kwargs:
        if "id2label" not in config_json:
            raise ConfigError(f"{cls.__name__}.from_pretrained({path!r}) needs num_labels= "
                              "(the checkpoint's config.json has no id2label)")
        head_kwargs["num_labels"] = len(config_json["id2label"])
    saved_heads = config_json.get("nli_jax", {}).get("head_arguments", {})
    for key in cls.hf_saved_head_arguments:
        if key not in head_kwargs and key in saved_heads:
            head_kwargs[key] = saved_heads[key]
    weights = _canonical(config, hf.read_weights(directory))
    if not heads:
        prefix = families.get(config.model_type).base_model_prefix + "."
        weights = {k: v for k, v in weights.items() if k.startswith(prefix)}
    model = _model_to_load(cls, config, seed, head_kwargs, weights)
    load_weights(model, weights, source=directory, strict=strict)
    return model


def _model_to_load(cls, config: EncoderConfig, seed: int, head_kwargs: dict, weights: dict):
    """`cls` ready for `weights` to be loaded over it: the parameters the checkpoint holds are left
    abstract (drawing them at random first cost seconds: 3.4 s on a 250k-vocabulary, 12-layer
    model), and everything else (new heads, the RNG streams; a "dropout" stream the train step
    reseeds) gets the very values a full initialisation with `seed` gives, from one compiled
    program that draws nothing else. The model is built once, inside that program's trace (a
    12-layer build is ~0.6 s of Python): its structure comes out of the trace with every value
    abstract, and the drawn values come out of the program."""
    structure = {}

    def initialise_the_rest():
        model = cls(config, rngs=make_rngs(seed), **head_kwargs)
        provided = {e.path for e in _checkpoint_entries(model) if e.hf_name in weights}
        if config.scans_layers:  # a stacked parameter is the checkpoint's when its layers are (else: missing)
            provided = set(stack_layers({path: jax.ShapeDtypeStruct((), np.float32) for path in provided}))
        graphdef, state = nnx.split(model)
        variables, drawn = [], []
        for path, variable in nnx.to_flat_state(state):
            (value,), treedef = jax.tree.flatten(variable)  # a Variable is a pytree of its one value
            variables.append((path, treedef, jax.ShapeDtypeStruct(value.shape, value.dtype)))
            if path not in provided:
                drawn.append(value)
        structure.update(graphdef=graphdef, variables=variables, provided=provided)
        return drawn

    drawn = iter(jax.jit(initialise_the_rest)())
    # Variables made here, outside the trace: the drawn values, and shapes where the checkpoint's go.
    flat = [(path, jax.tree.unflatten(treedef, [abstract if path in structure["provided"] else next(drawn)]))
            for path, treedef, abstract in structure["variables"]]
    return nnx.merge(structure["graphdef"], nnx.from_flat_state(flat))


def _checkpoint_entries(model: "PretrainedModel") -> list[Entry]:
    """parameter_entries under the names a checkpoint's weights have after _canonical."""
    entries = parameter_entries(model)
    if model.hf_base_model:  # canonical keys carry the prefix
        family = families.get(model.config.model_type)
        entries = [dataclasses.replace(e, hf_name=family.base_model_prefix + "." + e.hf_name)
                   if family.in_base_model(e.hf_name) else e for e in entries]
    return entries


def load_weights(model: "PretrainedModel", weights: dict[str, np.ndarray], *, source: str = "checkpoint",
                 strict: bool = True) -> None:
    config = model.config
    family = families.get(config.model_type)
    prefix = family.base_model_prefix + "."
    entries = _checkpoint_entries(model)
    state = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(state))
    shapes = _per_layer_shapes(model)
    missing, mismatched, fresh, used = [], [], [], set()
    new_values = {}
    for e in entries:
        ours = shapes[e.path]
        if e.hf_name not in weights:
            # The pooler and heads are legitimately absent from some checkpoints (MLM-only
            # checkpoints have no pooler; a base model has no classifier): train them from scratch.
            if e.is_encoder and not e.path[1] == "pooler":
                missing.append(e.hf_name)
            else:
                fresh.append(e.hf_name)
            continue
        used.add(e.hf_name)
        w = weights[e.hf_name]
        expected = _hf_shape(e, ours.shape)
        if tuple(w.shape) != expected:
            mismatched.append(f"{e.hf_name}: checkpoint {tuple(w.shape)} vs model {expected}")
            continue
        new_values[e.path] = to_ours(w, ours.shape, e.in_axes)
    unusable = _unusable_weights(weights, sorted(used), source)
    if unusable:
        raise hf.CheckpointError(f"{source}: " + "; ".join(unusable))
    unused = sorted(k for k in weights if k not in used)
    ignorable = lambda k: _IGNORABLE.search(k) or (family.unused_keys is not None and family.unused_keys.search(k))
    unexpected = [k for k in unused if not ignorable(k) and not k.startswith(_HEAD_PREFIXES + family.head_keys)
                  and not k.startswith(prefix + "pooler.")]
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {missing}")
    if mismatched:
        problems.append(f"shape mismatches: {mismatched}")
    if strict and unexpected:
        problems.append(f"checkpoint weights that map to nothing in {type(model).__name__}: {unexpected}")
    if problems:
        raise hf.CheckpointError(f"{source} does not match {type(model).__name__} ({config.model_type}): " + "; ".join(problems))
    heads_unused = [k for k in unused if not ignorable(k) and k not in unexpected]
    if fresh:
        log.warning("%s: newly initialised (not in %s): %s", type(model).__name__, source, fresh)
    if heads_unused:
        log.info("%s: unused checkpoint weights (other heads): %s", type(model).__name__, heads_unused)
    for path, value in (stack_layers(new_values) if config.scans_layers else new_values).items():
        flat[path].set_value(jax.numpy.asarray(value, dtype=flat[path].get_value().dtype))
    nnx.update(model, nnx.from_flat_state(flat))


def _unusable_weights(weights: dict, names: list[str], source: str) -> list[str]:
    """What makes the checkpoint tensors that become parameters unusable, one entry per kind:
    a dtype that is not a floating-point weight (int32, bool: a quantized or damaged file; refused,
    never cast silently) and NaN or Inf values (a diverged or damaged save: every step would
    compute nan). float64 is converted to float32 with a log line."""
    not_float, not_finite, widened = [], [], []
    for name in names:
        w = weights[name]
        if not np.issubdtype(w.dtype, np.floating):
            not_float.append(f"{name} ({w.dtype})")
            continue
        if w.dtype.name not in hf.WEIGHT_DTYPES:
            widened.append(name)
        bad = w.size - int(np.count_nonzero(np.isfinite(w)))
        if bad:
            not_finite.append(f"{name} ({bad} of {w.size} values)")
    if widened:
        log.info("%s: %d tensor(s) of float64 converted to float32 (e.g. %s)", source, len(widened), widened[:3])
    problems = []
    if not_float:
        problems.append(f"tensors that are not float32, bfloat16 or float16 weights (a quantized or damaged "
                        f"checkpoint; nli-jax does not cast them): {not_float[:5]}"
                        f"{f' and {len(not_float) - 5} more' if len(not_float) > 5 else ''}")
    if not_finite:
        problems.append(f"tensors holding NaN or Inf (a diverged or damaged save: every step would compute nan): "
                        f"{not_finite[:5]}{f' and {len(not_finite) - 5} more' if len(not_finite) > 5 else ''}")
    return problems


def state_dict(model: "PretrainedModel") -> dict[str, np.ndarray]:
    """Our parameters under Hugging Face names and layouts (float32 numpy)."""
    flat = unstack_layers({path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))})
    return {e.hf_name: to_hf(e, flat[e.path]) for e in parameter_entries(model)}


def save_pretrained(model: "PretrainedModel", path: str, *, tokenizer=None, label_names=None,
                    extra: dict | None = None) -> None:
    """`model` as a Hugging Face directory (local or gs://) that transformers' PyTorch classes
    load with no missing or unexpected weights. `label_names`: the classes in output order,
    written as id2label / label2id (transformers' pipelines and model cards show them); LABEL_i
    without them. `extra`: more of nli-jax's own fields in config.json's "nli_jax" (e.g. the
    calibration temperature)."""
    config = model.config.to_hf_dict([model.hf_architecture()])
    head_arguments = model.head_arguments()
    n = head_arguments.get("num_labels")
    if label_names is not None and n is not None and len(label_names) != n:
        raise ValueError(f"{len(label_names)} label names for a head with {n} labels")
    if n is not None and model.hf_id2label:
        names = list(label_names) if label_names is not None else [f"LABEL_{i}" for i in range(n)]
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    config["nli_jax"] = {"class": type(model).__name__, "head_arguments": head_arguments}
    if label_names is not None:
        config["nli_jax"]["labels"] = list(label_names)  # multi-aspect heads: one softmax over these per aspect
    config["nli_jax"].update(extra or {})
    config["tie_word_embeddings"] = True
    if tokenizer is not None:
        for key, attribute in families.get(model.config.model_type).tokenizer_ids.items():
            if key not in config and getattr(tokenizer, attribute, None) is not None:
                config[key] = int(getattr(tokenizer, attribute))
    hf.write_directory(path, state_dict(model), config, tokenizer=tokenizer)
