"""Hugging Face PyTorch checkpoints <-> nli-jax NNX models.

Import reads config.json plus model.safetensors (or pytorch_model.bin with
`torch.load(weights_only=True)`; sharded indexes too) and maps names and layouts onto an NNX
model; export writes a directory that transformers' PyTorch classes load with no missing or
unexpected weights. Every mismatch is reported by name before any compute.

Layouts: HF Linear weights are [out, in], ours are [in, out]; our attention projections keep
heads as their own axis ([embed, heads, kv] and [heads, kv, embed]) for tensor parallelism.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil

import jax
import numpy as np
from flax import nnx

from nli_jax import storage
from nli_jax.models.config import ConfigError, EncoderConfig
from nli_jax.models import make_rngs
from nli_jax.models import models as M

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
# A tokenizer directory needs one of these (tokenizer_config.json alone loads as an empty vocabulary).
VOCABULARY_FILES = ("vocab.txt", "tokenizer.json", "spiece.model", "sentencepiece.bpe.model", "vocab.json")
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"


class CheckpointError(ValueError):
    """A checkpoint that does not match the model; the message lists the offending names."""


# --- naming ---------------------------------------------------------------------------------

_FAMILY = {"bert": "Bert", "albert": "Albert", "xlm-roberta": "XLMRoberta", "roberta": "Roberta"}
_PREFIX = {"bert": "bert", "albert": "albert", "xlm-roberta": "roberta", "roberta": "roberta"}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One parameter: our state path, its Hugging Face name, and how many leading kernel axes
    are input axes (kernels only; 0 for embeddings, biases and norms)."""
    path: tuple
    hf_name: str
    in_axes: int = 0
    is_encoder: bool = True


def _encoder_names(config: EncoderConfig, rest: tuple) -> tuple[str, int]:
    """HF name (without the base-model prefix) and input-axis count for an encoder path."""
    leaf = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}[rest[-1]]
    kernel_in = 1 if rest[-1] == "kernel" else 0
    head = rest[0]
    if head == "embeddings":
        table = {"word": "word_embeddings", "position": "position_embeddings",
                 "token_type": "token_type_embeddings", "norm": "LayerNorm"}[rest[1]]
        return f"embeddings.{table}.{leaf}", 0
    if head == "embedding_projection":
        return f"encoder.embedding_hidden_mapping_in.{leaf}", kernel_in
    if head == "pooler":
        return (f"pooler.{leaf}" if config.is_albert else f"pooler.dense.{leaf}"), kernel_in
    assert head == "layers", rest
    index, module = rest[1], rest[2:-1]
    if config.is_albert:
        group, inner = divmod(index, config.inner_group_num)
        base = f"encoder.albert_layer_groups.{group}.albert_layers.{inner}."
        sub = {("attention", "query"): "attention.query", ("attention", "key"): "attention.key",
               ("attention", "value"): "attention.value", ("attention", "output"): "attention.dense",
               ("attention_norm",): "attention.LayerNorm", ("mlp_in",): "ffn", ("mlp_out",): "ffn_output",
               ("mlp_norm",): "full_layer_layer_norm"}[module]
    else:
        base = f"encoder.layer.{index}."
        sub = {("attention", "query"): "attention.self.query", ("attention", "key"): "attention.self.key",
               ("attention", "value"): "attention.self.value", ("attention", "output"): "attention.output.dense",
               ("attention_norm",): "attention.output.LayerNorm", ("mlp_in",): "intermediate.dense",
               ("mlp_out",): "output.dense", ("mlp_norm",): "output.LayerNorm"}[module]
    if module == ("attention", "output") and kernel_in:
        kernel_in = 2  # [heads, kv, embed]
    return base + sub + "." + leaf, kernel_in


def _head_name(config: EncoderConfig, model, rest: tuple) -> str:
    """HF name of a head parameter, as transformers' task classes name it."""
    t = config.model_type
    leaf = {"kernel": "weight", "bias": "bias", "scale": "weight"}[rest[-1]]
    if rest[0] == "mlm":
        if rest == ("mlm", "bias"):
            return {"bert": "cls.predictions.bias", "albert": "predictions.bias"}.get(t, "lm_head.bias")
        module = rest[1]
        if t == "bert":
            return {"transform": "cls.predictions.transform.dense", "norm": "cls.predictions.transform.LayerNorm"}[module] + "." + leaf
        if t == "albert":
            return {"transform": "predictions.dense", "norm": "predictions.LayerNorm"}[module] + "." + leaf
        return {"transform": "lm_head.dense", "norm": "lm_head.layer_norm"}[module] + "." + leaf
    if rest[0] == "sentence":
        if t == "bert":
            return f"cls.seq_relationship.{leaf}"
        if t == "albert":
            return f"sop_classifier.classifier.{leaf}"
        raise CheckpointError(f"{t} has no next-sentence/sentence-order head in transformers")
    if rest[0] == "classifier":
        if isinstance(model, M.ForSequenceClassification) and config.is_roberta:
            return {"dense": "classifier.dense", "out": "classifier.out_proj"}[rest[1]] + "." + leaf
        return f"classifier.{leaf}"
    raise KeyError(rest)


def parameter_entries(model: M.PretrainedModel) -> list[Entry]:
    """Every parameter of `model` with its Hugging Face name (base-model prefix included
    for task models, as transformers saves them)."""
    config = model.config
    prefix = "" if isinstance(model, M.EncoderModel) else _PREFIX[config.model_type] + "."
    entries = []
    for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path[0] == "encoder":
            name, in_axes = _encoder_names(config, path[1:])
            entries.append(Entry(path, prefix + name, in_axes, True))
        else:
            in_axes = 1 if path[-1] == "kernel" else 0
            entries.append(Entry(path, _head_name(config, model, path), in_axes, False))
    return entries


def _hf_shape(e: Entry, shape: tuple) -> tuple:
    if e.in_axes:  # kernel: ours [in..., out...] -> HF [prod(out), prod(in)]
        return (int(np.prod(shape[e.in_axes:])), int(np.prod(shape[:e.in_axes])))
    if e.path[-1] == "embedding":  # tables have the same layout
        return tuple(shape)
    return (int(np.prod(shape)),)  # biases (ours may be [heads, kv]) and norms


def to_ours(w: np.ndarray, shape: tuple, in_axes: int) -> np.ndarray:
    if in_axes:
        return np.ascontiguousarray(w.T).reshape(shape)
    return w.reshape(shape)


def to_hf(e: Entry, x: np.ndarray) -> np.ndarray:
    if e.in_axes:
        x = x.reshape(int(np.prod(x.shape[:e.in_axes])), int(np.prod(x.shape[e.in_axes:]))).T
    elif e.path[-1] != "embedding":
        x = x.reshape(-1)
    return np.ascontiguousarray(x, dtype=np.float32)


# --- reading checkpoints --------------------------------------------------------------------

_LEGACY = [(re.compile(r"LayerNorm\.gamma$"), "LayerNorm.weight"), (re.compile(r"LayerNorm\.beta$"), "LayerNorm.bias")]
# Buffers and tied copies transformers may have saved; never parameters of ours.
_IGNORABLE = re.compile(r"(position_ids|token_type_ids|\.decoder\.weight|\.decoder\.bias)$")
# Heads of transformers' task classes: unused when loading into another task's model.
_HEAD_PREFIXES = ("cls.", "predictions.", "lm_head.", "sop_classifier.", "classifier.", "qa_outputs.")


def resolve_directory(path: str) -> str:
    """A local model directory, or a hub id (`org/name`) downloaded for real users."""
    path = os.fspath(path)
    if storage.is_remote(path):
        # transformers and safetensors read local files: one download per process.
        storage.check_reachable(path, what="model directory")
        if not storage.isdir(path):
            raise FileNotFoundError(f"model directory {path!r} does not exist (expected a directory with "
                                    f"{CONFIG_NAME} and {SAFE_WEIGHTS} or {TORCH_WEIGHTS})")
        return storage.local_copy(path)
    if os.path.isdir(path):
        return path
    looks_local = path.startswith((".", "/", "~")) or os.sep in path.strip("/").replace("/", "", 1) or os.path.exists(path)
    if looks_local or path.count("/") != 1:
        raise FileNotFoundError(f"model directory {path!r} does not exist (expected a directory with "
                                f"{CONFIG_NAME} and {SAFE_WEIGHTS} or {TORCH_WEIGHTS}, or a hub id 'org/name')")
    from huggingface_hub import snapshot_download  # only for real users with network access
    log.info("downloading %s from the Hugging Face hub", path)
    return snapshot_download(repo_id=path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "pytorch_model*.bin"])


def read_config(directory: str) -> dict:
    file = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found: a model directory needs {CONFIG_NAME}")
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{file}: not valid JSON ({e})") from e


def _load_torch(file: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"{file} is a PyTorch pickle; install torch (pip install 'nli-jax[torch]') "
                          "or convert the checkpoint to safetensors") from e
    # weights_only=True: never unpickle arbitrary objects from a downloaded file.
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
        return {k: v.detach().float().numpy() for k, v in state.items()}
    except Exception as e:  # truncated or not a state dict
        raise CheckpointError(f"{file}: unreadable PyTorch weights ({type(e).__name__}: {_first_line(e)}); "
                              "the file is damaged or incomplete: download or export it again") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def _load_safetensors(file: str) -> dict[str, np.ndarray]:
    from safetensors import safe_open
    out = {}
    try:
        # The "flax" framework reads bfloat16 too (numpy has no bfloat16).
        with safe_open(file, framework="flax") as f:
            for k in f.keys():
                out[k] = np.asarray(f.get_tensor(k), dtype=np.float32)
    except Exception as e:  # SafetensorError (truncated header or data), OSError
        raise CheckpointError(f"{file}: unreadable safetensors file ({type(e).__name__}: {_first_line(e)}); the file "
                              "is damaged or incomplete (size {:,} bytes): download or export it again"
                              .format(os.path.getsize(file))) from None
    return out


def read_weights(directory: str) -> dict[str, np.ndarray]:
    def sharded(index_name, loader):
        index = os.path.join(directory, index_name)
        try:
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a shard index with a 'weight_map' ({type(e).__name__}: "
                                  f"{_first_line(e)})") from None
        out = {}
        for name in files:
            file = os.path.join(directory, name)
            if not os.path.isfile(file):
                raise FileNotFoundError(f"{file} (listed in {index_name}) not found")
            out.update(loader(file))
        return out

    if os.path.isfile(os.path.join(directory, SAFE_WEIGHTS)):
        weights = _load_safetensors(os.path.join(directory, SAFE_WEIGHTS))
    elif os.path.isfile(os.path.join(directory, SAFE_INDEX)):
        weights = sharded(SAFE_INDEX, _load_safetensors)
    elif os.path.isfile(os.path.join(directory, TORCH_WEIGHTS)):
        weights = _load_torch(os.path.join(directory, TORCH_WEIGHTS))
    elif os.path.isfile(os.path.join(directory, TORCH_INDEX)):
        weights = sharded(TORCH_INDEX, _load_torch)
    else:
        raise FileNotFoundError(f"no weights in {directory}: expected {SAFE_WEIGHTS}, {SAFE_INDEX}, {TORCH_WEIGHTS} "
                                f"or {TORCH_INDEX}; found {sorted(os.listdir(directory))}")
    renamed = {}
    for k, v in weights.items():
        for pattern, new in _LEGACY:
            k = pattern.sub(new, k)
        renamed[k] = v
    return renamed


def _canonical(config: EncoderConfig, weights: dict) -> dict:
    """Checkpoint keys with the base-model prefix, whether or not the file had it."""
    prefix = _PREFIX[config.model_type] + "."
    out = {}
    for k, v in weights.items():
        if k.startswith(("embeddings.", "encoder.", "pooler.")):
            k = prefix + k
        out[k] = v
    return out


# --- public API -----------------------------------------------------------------------------

def from_pretrained(cls, path: str, *, dtype: str | None = None, remat: bool | None = None, seed: int = 0,
                    strict: bool = True, config_overrides: dict | None = None, **head_kwargs):
    """Builds `cls` from a Hugging Face model directory (or hub id).

    Heads the checkpoint lacks (a new classifier, say) are freshly initialised and logged.
    Raises CheckpointError naming every missing encoder weight, shape mismatch and (when
    `strict`) every checkpoint weight that maps to nothing.
    """
    directory = resolve_directory(path)
    hf_config = read_config(directory)
    overrides = dict(config_overrides or {})
    if dtype is not None:
        overrides["dtype"] = dtype
    if remat is not None:
        overrides["remat"] = remat
    config = EncoderConfig.from_hf_dict(hf_config, **overrides)
    if cls in (M.ForSequenceClassification, M.ForTokenClassification) and "num_labels" not in head_kwargs:
        if "id2label" not in hf_config:
            raise ConfigError(f"{cls.__name__}.from_pretrained({path!r}) needs num_labels= "
                              "(the checkpoint's config.json has no id2label)")
        head_kwargs["num_labels"] = len(hf_config["id2label"])
    saved_heads = hf_config.get("nli_jax", {}).get("head_arguments", {})
    if cls is M.ForMultiAspectClassification:
        for key in ("num_aspects", "num_labels"):
            if key not in head_kwargs and key in saved_heads:
                head_kwargs[key] = saved_heads[key]
    weights = _canonical(config, read_weights(directory))
    model = cls(config, rngs=make_rngs(seed), **head_kwargs)  # a "dropout" stream: the train step reseeds it
    load_weights(model, weights, source=directory, strict=strict)
    return model


def load_weights(model: M.PretrainedModel, weights: dict[str, np.ndarray], *, source: str = "checkpoint",
                 strict: bool = True) -> None:
    config = model.config
    prefix = _PREFIX[config.model_type] + "."
    entries = parameter_entries(model)
    if isinstance(model, M.EncoderModel):  # canonical keys carry the prefix
        entries = [dataclasses.replace(e, hf_name=prefix + e.hf_name) for e in entries]
    state = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(state))
    missing, mismatched, fresh, used = [], [], [], set()
    new_values = {}
    for e in entries:
        ours = flat[e.path]
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
    unused = sorted(k for k in weights if k not in used)
    unexpected = [k for k in unused if not _IGNORABLE.search(k) and not k.startswith(_HEAD_PREFIXES)
                  and not k.startswith(prefix + "pooler.")]
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {missing}")
    if mismatched:
        problems.append(f"shape mismatches: {mismatched}")
    if strict and unexpected:
        problems.append(f"checkpoint weights that map to nothing in {type(model).__name__}: {unexpected}")
    if problems:
        raise CheckpointError(f"{source} does not match {type(model).__name__} ({config.model_type}): " + "; ".join(problems))
    heads_unused = [k for k in unused if not _IGNORABLE.search(k) and k not in unexpected]
    if fresh:
        log.warning("%s: newly initialised (not in %s): %s", type(model).__name__, source, fresh)
    if heads_unused:
        log.info("%s: unused checkpoint weights (other heads): %s", type(model).__name__, heads_unused)
    for path, value in new_values.items():
        flat[path].set_value(jax.numpy.asarray(value, dtype=flat[path][...].dtype))
    nnx.update(model, nnx.from_flat_state(flat))


def _architecture(model: M.PretrainedModel) -> str:
    family = _FAMILY[model.config.model_type]
    if isinstance(model, M.EncoderModel):
        return family + "Model"
    if isinstance(model, M.ForMaskedLM):
        if model.sentence is not None:
            if model.config.is_roberta:
                raise CheckpointError("transformers has no RoBERTa/XLM-R class with a sentence head")
            return family + "ForPreTraining"
        return family + "ForMaskedLM"
    if isinstance(model, M.ForSequenceClassification):
        return family + "ForSequenceClassification"
    if isinstance(model, M.ForTokenClassification):
        return family + "ForTokenClassification"
    # No transformers class has per-aspect heads: the encoder loads as the base model and the
    # aspect classifier travels as extra weights nli-jax reads back.
    return family + "Model"


def state_dict(model: M.PretrainedModel) -> dict[str, np.ndarray]:
    """Our parameters under Hugging Face names and layouts (float32 numpy)."""
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    return {e.hf_name: to_hf(e, np.asarray(flat[e.path][...])) for e in parameter_entries(model)}


def save_pretrained(model: M.PretrainedModel, path: str, *, tokenizer=None, label_names=None) -> None:
    """`label_names`: the classes in output order, written as id2label / label2id (transformers'
    pipelines and model cards show them); LABEL_i without them."""
    from safetensors.numpy import save_file
    if storage.is_remote(path):  # written locally (safetensors, transformers), then uploaded
        local = os.path.join(storage.scratch_dir(), "export", hashlib.sha256(path.encode()).hexdigest()[:16])
        shutil.rmtree(local, ignore_errors=True)
        save_pretrained(model, local, tokenizer=tokenizer, label_names=label_names)
        storage.upload(local, path)
        return
    os.makedirs(path, exist_ok=True)
    architecture = _architecture(model)
    config = model.config.to_hf_dict([architecture])
    head_arguments = model.head_arguments()
    n = head_arguments.get("num_labels")
    if label_names is not None and n is not None and len(label_names) != n:
        raise ValueError(f"{len(label_names)} label names for a head with {n} labels")
    if n is not None and not isinstance(model, M.ForMultiAspectClassification):
        names = list(label_names) if label_names is not None else [f"LABEL_{i}" for i in range(n)]
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    config["nli_jax"] = {"class": type(model).__name__, "head_arguments": head_arguments}
    if label_names is not None:
        config["nli_jax"]["labels"] = list(label_names)  # multi-aspect heads: one softmax over these per aspect
    config["tie_word_embeddings"] = True
    weights = state_dict(model)
    written = [os.path.join(path, SAFE_WEIGHTS), os.path.join(path, CONFIG_NAME)]
    save_file(weights, written[0], metadata={"format": "pt"})
    with open(written[1], "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    if tokenizer is not None:
        before = set(os.listdir(path))
        tokenizer.save_pretrained(path)
        vocab = tokenizer.get_vocab()
        if "Bert" in type(tokenizer).__name__ and not os.path.isfile(os.path.join(path, "vocab.txt")):
            # IndoBERT checkpoints ship a WordPiece vocab.txt; transformers v5 writes tokenizer.json only.
            with open(os.path.join(path, "vocab.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])) + "\n")
        written += [os.path.join(path, name) for name in sorted(set(os.listdir(path)) - before)]
        written += [os.path.join(path, name) for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                                                           "special_tokens_map.json")]
    ordinary_permissions(written)


def ordinary_permissions(paths) -> None:
    """Mode 0666 less the umask (0644 under the usual 022), as open() gives: some writers
    (safetensors' save_file, tempfile) create files 0600, unreadable by the group."""
    umask = os.umask(0)
    os.umask(umask)
    for file in paths:
        if os.path.isfile(file) and not os.path.islink(file):
            os.chmod(file, 0o666 & ~umask)


def load_tokenizer(path: str):
    """The checkpoint's tokenizer through transformers.

    IndoBERT and IndoBERT-lite ship a WordPiece vocab.txt (lite too, no spiece.model), so a
    directory with vocab.txt and no SentencePiece model loads as a BERT WordPiece tokenizer
    whatever its model_type says.
    """
    from transformers import AutoTokenizer, BertTokenizerFast
    directory = resolve_directory(path)
    files = set(os.listdir(directory))
    vocabularies = files & set(VOCABULARY_FILES)
    if not vocabularies:
        raise CheckpointError(f"tokenizer directory {directory} has no vocabulary: expected one of "
                              f"{', '.join(VOCABULARY_FILES)}; found {sorted(files) or 'nothing'}")
    has_sentencepiece = bool(files & {"spiece.model", "sentencepiece.bpe.model", "tokenizer.json"})
    try:
        if "vocab.txt" in files and not has_sentencepiece:
            tokenizer = BertTokenizerFast.from_pretrained(directory)
        else:
            tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as e:  # damaged tokenizer.json / spiece.model, unknown tokenizer class
        raise CheckpointError(f"tokenizer in {directory} cannot be loaded ({type(e).__name__}: {_first_line(e)}); "
                              f"its files: {sorted(vocabularies)}") from None
    special = set(tokenizer.all_special_tokens)
    ordinary = [t for t in tokenizer.get_vocab() if t not in special]
    if not ordinary:
        raise CheckpointError(f"tokenizer in {directory} has only its {len(special)} special tokens and no vocabulary "
                              f"(files: {sorted(vocabularies)}): every word would be {tokenizer.unk_token}")
    if "vocab.txt" in files:
        with open(os.path.join(directory, "vocab.txt"), encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if len(tokenizer.get_vocab()) != lines:
            raise CheckpointError(f"{directory}/vocab.txt has {lines} entries but the loaded tokenizer has "
                                  f"{len(tokenizer.get_vocab())}")
    return tokenizer
