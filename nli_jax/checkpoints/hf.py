"""Hugging Face model directories as files: config.json, the weights (model.safetensors, or
pytorch_model.bin read with `torch.load(weights_only=True)`; sharded indexes too) and the
tokenizer. Knows nothing of nli-jax's models: nli_jax.models.pretrained maps these weights
onto them (the models depend on this module, never the other way).

Every damaged or missing file is a CheckpointError / FileNotFoundError naming it.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil

import numpy as np
from huggingface_hub import snapshot_download
from safetensors import safe_open
from safetensors.numpy import save_file

from nli_jax import storage
from nli_jax.errors import ConfigError

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
# SentencePiece models: ALBERT/T5's, XLM-R's, DeBERTa-v2/v3's.
SENTENCEPIECE_FILES = ("spiece.model", "sentencepiece.bpe.model", "spm.model")
# Files of a tokenizer directory (those transformers reads besides the vocabulary).
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "merges.txt")
# A tokenizer directory needs one of these (tokenizer_config.json alone loads as an empty vocabulary).
VOCABULARY_FILES = ("vocab.txt", "tokenizer.json", *SENTENCEPIECE_FILES, "vocab.json")
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"


class CheckpointError(ValueError):
    """A checkpoint that does not match the model; the message lists the offending names."""


# --- reading checkpoints --------------------------------------------------------------------

_LEGACY = [(re.compile(r"LayerNorm\.gamma$"), "LayerNorm.weight"), (re.compile(r"LayerNorm\.beta$"), "LayerNorm.bias")]


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
    log.info("downloading %s from the Hugging Face hub", path)
    return snapshot_download(repo_id=path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "pytorch_model*.bin"])


def read_config(directory: str) -> dict:
    file = os.path.join(directory, CONFIG_NAME)
    if not os.path.lexists(file):
        raise FileNotFoundError(f"{file} not found: a model directory needs {CONFIG_NAME}")
    try:
        return json.loads(storage.read_text(file))  # through the read gate: a regular file
    except json.JSONDecodeError as e:
        raise ConfigError(f"{file}: not valid JSON ({e})") from e


def _load_torch(file: str) -> dict[str, np.ndarray]:
    try:
        import torch  # late: optional dependency (.[torch]), only for pytorch_model.bin
    except ImportError as e:
        raise ImportError(f"{file} is a PyTorch pickle; install torch (pip install 'nli-jax[torch]') "
                          "or convert the checkpoint to safetensors") from e
    storage.readable_file(file, "weights file")  # torch reads it itself: a regular file first
    # weights_only=True: never unpickle arbitrary objects from a downloaded file.
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
        # float16 / bfloat16 widen to float32 exactly; any other dtype (float64, integers) keeps
        # its own: models.pretrained.load_weights converts or refuses it by name.
        return {k: (v.detach().float() if v.dtype in (torch.float16, torch.bfloat16) else v.detach()).numpy()
                for k, v in state.items()}
    except Exception as e:  # truncated or not a state dict
        raise CheckpointError(f"{file}: unreadable PyTorch weights ({type(e).__name__}: {_first_line(e)}); "
                              "the file is damaged or incomplete: download or export it again") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


# Weight dtypes read as float32 (exactly); others are kept for load_weights to convert or refuse.
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")


def _widened(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float32) if array.dtype.name in WEIGHT_DTYPES else np.asarray(array)


def _load_safetensors(file: str) -> dict[str, np.ndarray]:
    storage.readable_file(file, "weights file")  # safetensors maps it itself: a regular file first
    out = {}
    try:
        # numpy (bfloat16 through ml_dtypes, which JAX brings): 4x faster than the "flax" framework
        # (0.3 s against 1.4 s for a 470 MB checkpoint).
        with safe_open(file, framework="numpy") as f:
            for k in f.keys():
                out[k] = _widened(f.get_tensor(k))
    except Exception as e:  # SafetensorError (truncated header or data), OSError
        raise CheckpointError(f"{file}: unreadable safetensors file ({type(e).__name__}: {_first_line(e)}); the file "
                              "is damaged or incomplete (size {:,} bytes): download or export it again"
                              .format(os.path.getsize(file))) from None
    return out


def shard_files(directory: str, index_name: str) -> list[str]:
    """The weight files a shard index names, each a file of `directory` itself: a name with a
    directory part ('../x.safetensors', '/abs/x.bin', 'sub/x.bin') is refused, naming the index."""
    index = os.path.join(directory, index_name)
    try:
        names = sorted(set(json.loads(storage.read_text(index))["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index}: not a shard index with a 'weight_map' ({type(e).__name__}: "
                              f"{_first_line(e)})") from None
    for name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise CheckpointError(f"{index}: its weight_map names {name!r}, not a file of {directory}: a shard "
                                  "index may name only files in its own directory")
    return [os.path.join(directory, name) for name in names]


def read_weights(directory: str) -> dict[str, np.ndarray]:
    def sharded(index_name, loader):
        out = {}
        for file in shard_files(directory, index_name):
            if not os.path.lexists(file):
                raise FileNotFoundError(f"{file} (listed in {index_name}) not found")
            out.update(loader(file))
        return out

    present = lambda name: os.path.lexists(os.path.join(directory, name))  # noqa: E731 - a FIFO or device too
    if present(SAFE_WEIGHTS):
        weights = _load_safetensors(os.path.join(directory, SAFE_WEIGHTS))
    elif present(SAFE_INDEX):
        weights = sharded(SAFE_INDEX, _load_safetensors)
    elif present(TORCH_WEIGHTS):
        weights = _load_torch(os.path.join(directory, TORCH_WEIGHTS))
    elif present(TORCH_INDEX):
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


def write_directory(path: str, weights: dict[str, np.ndarray], config: dict, *, tokenizer=None) -> None:
    """A Hugging Face model directory: model.safetensors, config.json and the tokenizer's files,
    readable by the group. A gs:// path is written locally, then uploaded."""
    if storage.is_remote(path):  # written locally (safetensors, transformers), then uploaded
        local = os.path.join(storage.scratch_dir(), "export", hashlib.sha256(path.encode()).hexdigest()[:16])
        shutil.rmtree(local, ignore_errors=True)
        write_directory(local, weights, config, tokenizer=tokenizer)
        storage.upload(local, storage.under(path))
        return
    # Its own files and the tokenizer's are written by safetensors and transformers into a
    # directory whose entries are checked: none of them a link.
    storage.output_dir(storage.under(path), entries=True)
    written = [os.path.join(path, SAFE_WEIGHTS), os.path.join(path, CONFIG_NAME)]
    save_file(weights, storage.output_file(storage.under(path, SAFE_WEIGHTS)), metadata={"format": "pt"})
    storage.write_text(storage.under(path, CONFIG_NAME), json.dumps(config, indent=2, sort_keys=True))
    if tokenizer is not None:
        before = set(os.listdir(path))
        tokenizer.save_pretrained(path)
        vocab = tokenizer.get_vocab()
        if "Bert" in type(tokenizer).__name__ and not os.path.isfile(os.path.join(path, "vocab.txt")):
            # IndoBERT checkpoints ship a WordPiece vocab.txt; transformers v5 writes tokenizer.json only.
            storage.write_text(storage.under(path, "vocab.txt"),
                               "\n".join(t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])) + "\n")
        source = getattr(tokenizer, "vocab_file", None)
        if (isinstance(source, str) and os.path.basename(source) in SENTENCEPIECE_FILES and os.path.isfile(source)
                and not os.path.exists(os.path.join(path, os.path.basename(source)))):
            # transformers v5 saves tokenizer.json only; the SentencePiece model it was converted
            # from travels too, for readers that load it (transformers v4's slow DeBERTa-v2 tokenizer).
            storage.write_bytes(storage.under(path, os.path.basename(source)),
                                storage.read_bytes(storage.readable_file(source, "SentencePiece model")))
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


def _names_a_bert_tokenizer(directory: str, files: set) -> bool:
    """Whether tokenizer_config.json names BERT's tokenizer for a BERT model (or no config.json),
    as nli-jax's exports and transformers-saved BERT checkpoints do. AutoTokenizer resolves that
    to BertTokenizerFast; loading it directly skips AutoTokenizer's import of every model
    configuration, which imports torch (~1 s of every run)."""
    if "tokenizer_config.json" not in files:
        return False
    try:
        declared = json.loads(storage.read_text(os.path.join(directory, "tokenizer_config.json")))
        model_type = read_config(directory).get("model_type", "bert") if CONFIG_NAME in files else "bert"
    except (OSError, ValueError, AttributeError):  # ConfigError is a ValueError
        return False  # AutoTokenizer's own error, then
    return (isinstance(declared, dict) and "auto_map" not in declared and model_type == "bert"
            and declared.get("tokenizer_class") in ("BertTokenizer", "BertTokenizerFast"))


BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def check_special_tokens(directory: str, entries) -> None:
    """A WordPiece vocab.txt (its entries) must hold BERT's special tokens: the tokenizer
    would add its own ids past the model's embeddings, and pretraining examples would be
    masked with a [MASK] the vocabulary does not have."""
    present = set(entries)
    missing = [t for t in BERT_SPECIAL_TOKENS if t not in present]
    if missing:
        raise CheckpointError(f"{directory}/vocab.txt lacks the special token(s) {missing}: a BERT vocabulary "
                              "has [PAD], [UNK], [CLS], [SEP] and [MASK] (python -m pretrain.build_vocab "
                              "writes them first); without them the tokenizer would add its own ids past the "
                              "model's embeddings")


def load_tokenizer(path: str):
    """The checkpoint's tokenizer through transformers.

    IndoBERT and IndoBERT-lite ship a WordPiece vocab.txt (lite too, no spiece.model), so a
    directory with vocab.txt and no SentencePiece model loads as a BERT WordPiece tokenizer
    whatever its model_type says.
    """
    from transformers import BertTokenizerFast  # late: transformers (~1 s), only to read a tokenizer
    directory = resolve_directory(path)
    files = set(os.listdir(directory))
    for name in sorted(files & (set(VOCABULARY_FILES) | set(TOKENIZER_FILES))):
        storage.readable_file(os.path.join(directory, name), "tokenizer file")  # transformers reads them itself
    vocabularies = files & set(VOCABULARY_FILES)
    if not vocabularies:
        raise CheckpointError(f"tokenizer directory {directory} has no vocabulary: expected one of "
                              f"{', '.join(VOCABULARY_FILES)}; found {sorted(files) or 'nothing'}")
    has_sentencepiece = bool(files & {*SENTENCEPIECE_FILES, "tokenizer.json"})
    try:
        if ("vocab.txt" in files and not has_sentencepiece) or _names_a_bert_tokenizer(directory, files):
            tokenizer = BertTokenizerFast.from_pretrained(directory)
        else:
            from transformers import AutoTokenizer  # late: transformers (~1 s), only to read a tokenizer
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
        entries = [line.rstrip("\n") for line in io.StringIO(storage.read_text(os.path.join(directory, "vocab.txt")),
                                                             newline=None)]
        lines = len(entries)
        if "Bert" in type(tokenizer).__name__:
            check_special_tokens(directory, entries)
        if len(tokenizer.get_vocab()) != lines:
            raise CheckpointError(f"{directory}/vocab.txt has {lines} entries but the loaded tokenizer has "
                                  f"{len(tokenizer.get_vocab())}")
    return tokenizer
