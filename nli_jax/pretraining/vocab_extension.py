"""Vocabulary extension for teaching an encoder new languages (NusaBERT, IndoBERTweet): pieces
trained on the new text that the tokenizer lacks are appended after its own (every old token keeps
its id), and a model continued with the larger tokenizer grows its vocabulary rows, each new row
the mean of the rows of the pieces the old tokenizer splits that string into (IndoBERTweet), or
drawn at random for comparison.

Two tokenizer kinds, as transformers' fast tokenizers hold them (tokenizer.json, or a WordPiece
vocab.txt alone):
  WordPiece (BERT, IndoBERT): a WordPiece trainer with the tokenizer's own normaliser and
            pre-tokeniser; "##x" pieces are continuations, found by greedy longest match;
  Unigram   (SentencePiece unigram, XLM-R, multilingual-e5): a Unigram trainer likewise; a new
            piece keeps the score the new text gave it. The SentencePiece model file
            (sentencepiece.bpe.model) is not carried over: transformers' slow tokenizer would read
            it without the new pieces (and XLM-R's fairseq id offset puts <mask> where they go).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile

import numpy as np
from flax import nnx
from tokenizers import Tokenizer, models, trainers

from nli_jax import storage
from nli_jax.checkpoints import load_tokenizer
from nli_jax.errors import RunError
from nli_jax.models import make_rngs
from nli_jax.pretraining.vocab import check_text_file, sample_lines
from nli_jax.train.inputs import TOKENIZER_FILES

log = logging.getLogger("nli_jax")

EXTENSION_FILE = "vocab_extension.json"  # written beside the extended tokenizer: what was added, fertility
KINDS = ("WordPiece", "Unigram")
SLOW_TOKENIZER_FILES = ("sentencepiece.bpe.model", "spiece.model", "spm.model")
# Lines of each language's text the fertility is measured on (the first ones, in file order).
FERTILITY_LINES = 5000


def load_hf_tokenizer(directory: str):
    """The directory's tokenizer as nli-jax's runs load it (nli_jax.checkpoints.load_tokenizer:
    a transformers fast tokenizer)."""
    return load_tokenizer(directory)


def tokenizer_kind(tokenizer, directory: str) -> str:
    """WordPiece or Unigram (the backend model of a transformers fast tokenizer); refuses others."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    kind = type(backend.model).__name__ if backend is not None else type(tokenizer).__name__
    if kind not in KINDS:
        raise RunError(f"--tokenizer={directory}: a {kind} tokenizer; vocabulary extension handles WordPiece (BERT) "
                       "and SentencePiece unigram (XLM-R) tokenizers")
    return kind


# --- the old tokenizer's pieces of a string ---------------------------------------------------

def old_pieces(tokenizer, kind: str, token: str) -> list[int]:
    """The ids the old tokenizer's model splits `token` (a piece of the new vocabulary, already
    normalised) into, as it would inside a word: a WordPiece "##x" as a continuation (greedy
    longest match of "##"-prefixed pieces), a Unigram piece by the unigram model itself (its
    word-initial "▁" included). [] when the old model has no pieces for it (an unknown character)."""
    model = tokenizer.backend_tokenizer.model
    vocab = tokenizer.get_vocab()
    if kind == "Unigram":
        ids = [vocab.get(t.value) for t in model.tokenize(token)]
        unk = tokenizer.unk_token_id
        return [] if any(i is None or i == unk for i in ids) else ids
    prefix = model.continuing_subword_prefix
    continuation = token.startswith(prefix) and len(token) > len(prefix)
    word = token[len(prefix):] if continuation else token
    ids, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end]
            if start > 0 or continuation:
                piece = prefix + piece
            if piece in vocab:
                ids.append(vocab[piece])
                start = end
                break
        else:
            return []  # WordPiece makes the whole word [UNK]: nothing of the old vocabulary to average
    return ids


# --- training the new pieces ------------------------------------------------------------------

def _trained_pieces(kind: str, backend, files: list[str], vocab_size: int, special: list[str]) -> list[str]:
    """Pieces a trainer of `kind` finds in `files` with the old tokenizer's normaliser and
    pre-tokeniser, most useful first (WordPiece: the merge order; Unigram: by score)."""
    if kind == "WordPiece":
        prefix = backend.model.continuing_subword_prefix
        tokenizer = Tokenizer(models.WordPiece(unk_token=backend.model.unk_token, continuing_subword_prefix=prefix))
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=special,
                                            continuing_subword_prefix=prefix, show_progress=False)
    else:
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                          unk_token=special[0] if special else None)
    tokenizer.normalizer = backend.normalizer
    tokenizer.pre_tokenizer = backend.pre_tokenizer
    tokenizer.train(files, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    if kind == "WordPiece":
        return [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    return [piece for piece, _ in sorted(model["vocab"], key=lambda ps: -ps[1])], dict(map(tuple, model["vocab"]))


def new_pieces_for(tokenizer, kind: str, files: list[str], count: int) -> tuple[list[str], dict[str, float]]:
    """Up to `count` pieces trained on `files` that the tokenizer lacks, most useful first, and
    (Unigram) their scores. The trainer is asked for more pieces until `count` new ones come out
    or the text has no more."""
    backend = tokenizer.backend_tokenizer
    old = tokenizer.get_vocab()
    special = [t for t in tokenizer.all_special_tokens]
    if kind == "Unigram" and tokenizer.unk_token:
        special = [tokenizer.unk_token] + [t for t in special if t != tokenizer.unk_token]
    size, previous = 2 * count + 500, -1
    while True:
        trained = _trained_pieces(kind, backend, files, size, special)
        pieces, scores = trained if kind == "Unigram" else (trained, {})
        new = [p for p in pieces if p not in old and p not in special and p.strip()]
        if len(new) >= count or len(pieces) < size or len(new) == previous:
            break  # enough, or the text yields no more
        previous, size = len(new), size * 2
    if len(new) < count:
        log.warning("the text yields %d new pieces, fewer than the %d asked for", len(new), count)
    new = new[:count]
    return new, {p: scores[p] for p in new} if scores else {}


# --- writing the extended tokenizer -------------------------------------------------------------

def _extended_tokenizer_json(data: dict, kind: str, pieces: list[str], scores: dict[str, float], first_id: int) -> dict:
    model = data["model"]
    if kind == "WordPiece":
        model["vocab"].update({p: first_id + i for i, p in enumerate(pieces)})
    else:
        model["vocab"].extend([[p, float(scores[p])] for p in pieces])
    return data


def write_extended_tokenizer(directory: str, output_dir: str, tokenizer, kind: str, old_size: int, pieces: list[str],
                             scores: dict[str, float]) -> list[str]:
    """The tokenizer files of `directory` copied to `output_dir` with `pieces` appended (ids
    old_size, old_size + 1, ...): vocab.txt's lines and tokenizer.json's model vocabulary (a
    SentencePiece directory without tokenizer.json gets one, from the loaded fast tokenizer).
    Returns the files left out (SentencePiece model files, which cannot hold the new pieces)."""
    storage.makedirs(storage.under(output_dir))
    names = sorted(n for n in os.listdir(directory) if n in TOKENIZER_FILES and os.path.isfile(os.path.join(directory, n)))
    left_out = [n for n in names if n in SLOW_TOKENIZER_FILES]
    if kind == "Unigram" and "tokenizer.json" not in names:
        names.append("tokenizer.json")
    for name in names:
        source = os.path.join(directory, name)
        if name in SLOW_TOKENIZER_FILES:
            continue
        if name == "vocab.txt":
            lines = storage.read_text(source).splitlines()
            if len(lines) != old_size:
                raise RunError(f"{source} has {len(lines)} lines but the tokenizer has {old_size} entries")
            storage.write_text(storage.under(output_dir, name), "\n".join(lines + pieces) + "\n")
        elif name == "tokenizer.json":
            text = storage.read_text(source) if os.path.isfile(source) else tokenizer.backend_tokenizer.to_str()
            data = _extended_tokenizer_json(json.loads(text), kind, pieces, scores, old_size)
            storage.write_text(storage.under(output_dir, name), json.dumps(data, ensure_ascii=False))
        elif name == "tokenizer_config.json" and left_out:
            config = json.loads(storage.read_text(source))
            config.pop("vocab_file", None)  # the SentencePiece model left out
            storage.write_text(storage.under(output_dir, name), json.dumps(config, indent=2, ensure_ascii=False))
        else:
            storage.write_bytes(storage.under(output_dir, name), storage.read_bytes(source))
    return left_out


# --- fertility ------------------------------------------------------------------------------------

def read_lines(files: list[str], limit: int) -> list[str]:
    """The first `limit` non-blank lines of `files`, in order."""
    out = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    out.append(line.strip())
                    if len(out) >= limit:
                        return out
    return out


def _encodings(tokenizer, lines: list[str]):
    """`lines` encoded without special tokens, padding or truncation (a tokenizer.json may pad to 128)."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend.encode_batch(lines, add_special_tokens=False)


def fertility(tokenizer, lines: list[str]) -> float:
    """Pieces per whitespace-separated word of `lines` (no special tokens)."""
    words = sum(len(line.split()) for line in lines)
    encodings = _encodings(tokenizer, lines)
    return sum(len(e.ids) for e in encodings) / max(words, 1)


def new_piece_usage(tokenizer, lines: list[str], first_new_id: int) -> int:
    """How many pieces of `lines`' encodings are new pieces (ids from first_new_id)."""
    encodings = _encodings(tokenizer, lines)
    return sum(sum(1 for i in e.ids if i >= first_new_id) for e in encodings)


@dataclasses.dataclass(frozen=True)
class ExtensionReport:
    kind: str
    base_vocab_size: int
    vocab_size: int
    pieces: tuple[str, ...]
    fertility: dict  # {language: {"before", "after", "words", "lines"}}
    left_out: tuple[str, ...]

    def table(self) -> str:
        rows = ["| language | lines | words | pieces per word before | after |", "|---|---|---|---|---|"]
        for name, f in self.fertility.items():
            rows.append(f"| {name} | {f['lines']} | {f['words']} | {f['before']:.3f} | {f['after']:.3f} |")
        return "\n".join(rows)


def extend_vocabulary(tokenizer_dir: str, corpora: dict[str, list[str]], new_pieces: int, output_dir: str, *,
                      sample_sentences: int = 2_000_000, fertility_lines: int = FERTILITY_LINES,
                      seed: int = 12345) -> ExtensionReport:
    """Trains pieces on the text of `corpora` ({language: files}, one sentence per line), appends
    up to `new_pieces` the tokenizer lacks, writes the extended tokenizer (and vocab_extension.json)
    to `output_dir`, and measures each language's fertility before and after."""
    if new_pieces < 1:
        raise RunError(f"--new_pieces={new_pieces}: must be at least 1")
    files = [f for fs in corpora.values() for f in fs]
    empty = [name for name, fs in corpora.items() if not fs]
    if empty:
        raise RunError(f"--corpus: {', '.join(empty)} match(es) no files")
    for f in files:
        storage.readable_file(f, "corpus file")
        check_text_file(f)
    if os.path.abspath(output_dir) == os.path.abspath(tokenizer_dir):
        raise RunError(f"--output={output_dir}: the tokenizer's own directory; write the extension elsewhere")
    old = load_hf_tokenizer(tokenizer_dir)
    kind = tokenizer_kind(old, tokenizer_dir)
    old_vocab = old.get_vocab()
    old_size = len(old_vocab)
    if sorted(old_vocab.values()) != list(range(old_size)):
        raise RunError(f"--tokenizer={tokenizer_dir}: its ids are not 0..{old_size - 1} (added tokens beyond its "
                       "vocabulary); new pieces would collide with them")
    storage.makedirs(storage.under(output_dir))
    with tempfile.TemporaryDirectory(dir=output_dir) as tmp:
        inputs = sample_lines(files, sample_sentences, storage.under(tmp, "sample.txt"), seed=seed)
        pieces, scores = new_pieces_for(old, kind, inputs, new_pieces)
    if not pieces:
        raise RunError(f"--corpus: the text yields no pieces that {tokenizer_dir} lacks (nothing was written)")
    left_out = write_extended_tokenizer(tokenizer_dir, output_dir, old, kind, old_size, pieces, scores)
    extended = load_hf_tokenizer(output_dir)
    added = {t: i for t, i in extended.get_vocab().items() if t not in old_vocab}
    if len(extended) != old_size + len(pieces) or sorted(added.values()) != list(range(old_size, old_size + len(pieces))):
        raise RunError(f"{output_dir}: the extended tokenizer loads with {len(extended)} entries, not "
                       f"{old_size} + {len(pieces)} new at the end")
    report = {}
    used = 0
    for name, fs in corpora.items():
        lines = read_lines(fs, fertility_lines)
        report[name] = {"lines": len(lines), "words": sum(len(line.split()) for line in lines),
                        "before": fertility(old, lines), "after": fertility(extended, lines)}
        used += new_piece_usage(extended, lines, old_size)
    if not used:  # a tokenizer file that loads but does not tokenize with what it lists
        raise RunError(f"{output_dir}: the extended tokenizer never uses its {len(pieces)} new pieces on the text")
    result = ExtensionReport(kind, old_size, old_size + len(pieces), tuple(pieces), report, tuple(left_out))
    storage.write_text(storage.under(output_dir, EXTENSION_FILE), json.dumps(
        {"base_tokenizer": storage.origin(tokenizer_dir), "kind": kind, "base_vocab_size": old_size,
         "vocab_size": result.vocab_size, "new_pieces": list(pieces), "fertility": report,
         "corpora": {name: [storage.origin(f) for f in fs] for name, fs in corpora.items()},
         "left_out": list(left_out)}, indent=2, ensure_ascii=False))
    return result


# --- growing a model's vocabulary -----------------------------------------------------------------

NEW_TOKEN_INITS = ("mean", "random")


class ExtensionNotGrown(RunError):
    """A tokenizer that extends the checkpoint's vocabulary, in a run that does not grow it."""


@dataclasses.dataclass(frozen=True)
class VocabularyGrowth:
    """A checkpoint's vocabulary (old_vocab_size rows) grown to vocab_size for a tokenizer that
    extends its own: each new id's old pieces (empty: no old piece covers it; drawn at random)."""
    old_vocab_size: int
    vocab_size: int
    pieces: tuple[tuple[int, tuple[int, ...]], ...]  # (new id, old ids)
    init: str  # mean | random


def vocabulary_growth(tokenizer, tokenizer_path: str, checkpoint_tokenizer, model_dir: str, checkpoint_vocab_size: int,
                      init: str | None) -> VocabularyGrowth | None:
    """The growth a run with `tokenizer` over a checkpoint trained with `checkpoint_tokenizer`
    needs: None when the vocabularies are the same; refused when `tokenizer` does not keep every
    old token at its id, or when the run does not grow vocabularies (`init` None)."""
    own, given = checkpoint_tokenizer.get_vocab(), tokenizer.get_vocab()
    if own == given:
        return None
    moved = [t for t, i in own.items() if given.get(t) != i]
    if moved or init is None:
        differing = sorted(t for t in set(own) | set(given) if own.get(t) != given.get(t))
        why = ("its token ids would select the wrong embeddings; use the checkpoint's tokenizer" if moved else
               "it extends the checkpoint's vocabulary, which only continued pretraining grows (pretrain.main with "
               "model.init and this tokenizer); fine-tune the continued run's export")
        raise (RunError if moved else ExtensionNotGrown)(
            f"--config.model.tokenizer={tokenizer_path!r}: its vocabulary differs from the one model.init "
            f"({model_dir}) was trained with ({len(differing)} of {max(len(own), len(given))} tokens "
            f"differ, e.g. {differing[:5]}): {why}")
    kind = tokenizer_kind(checkpoint_tokenizer, model_dir)
    new = sorted((i, t) for t, i in given.items() if t not in own)
    pieces = tuple((i, tuple(old_pieces(checkpoint_tokenizer, kind, t))) for i, t in new)
    uncovered = [t for (i, t), (_, p) in zip(new, pieces) if not p]
    if uncovered and init == "mean":
        log.warning("%d of %d new tokens have no pieces in the old vocabulary (e.g. %s): drawn at random",
                    len(uncovered), len(new), uncovered[:5])
    size = max(checkpoint_vocab_size, max(given.values()) + 1)
    return VocabularyGrowth(checkpoint_vocab_size, size, pieces, init)


def _vocab_axis(variable) -> int | None:
    names = variable.get_metadata().get("out_sharding") or ()
    return list(names).index("vocab") if "vocab" in names else None


def grow_rows(value: np.ndarray, axis: int, growth: VocabularyGrowth, rng: np.random.Generator,
              initializer_range: float) -> np.ndarray:
    """`value` with its vocabulary axis grown to growth.vocab_size: each new row the mean of its
    old pieces' rows (mean) or, for random and for rows no old piece covers, N(0, initializer_range)
    for tables and 0 for biases (BERT's own initialisation)."""
    moved = np.moveaxis(np.asarray(value, np.float32), axis, 0)
    grown = np.zeros((growth.vocab_size, *moved.shape[1:]), np.float32)
    grown[:growth.old_vocab_size] = moved
    for new_id, old_ids in growth.pieces:
        if growth.init == "mean" and old_ids:
            grown[new_id] = moved[list(old_ids)].mean(axis=0)
        elif moved.ndim > 1:
            grown[new_id] = rng.normal(0.0, initializer_range, moved.shape[1:])
    return np.moveaxis(grown, 0, axis).astype(np.asarray(value).dtype)


def grow_model(model, growth: VocabularyGrowth, seed: int):
    """A copy of `model` (an nnx module loaded at the checkpoint's vocabulary) whose vocabulary
    parameters (every parameter with a "vocab" logical axis: the word embeddings, the MLM decoder's
    bias, an untied decoder) have growth.vocab_size rows, the new ones initialised by `grow_rows`."""
    config = dataclasses.replace(model.config, vocab_size=growth.vocab_size)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(seed)
    flat = []
    for path, variable in nnx.to_flat_state(state):
        axis = _vocab_axis(variable) if isinstance(variable, nnx.Param) else None
        if axis is not None and variable.shape[axis] == growth.old_vocab_size:
            variable = variable.replace(grow_rows(np.asarray(variable[...]), axis, growth, rng,
                                                  model.config.initializer_range))
        flat.append((path, variable))
    abstract = nnx.eval_shape(lambda: _rebuilt(model, config))
    new_graphdef, _ = nnx.split(abstract)
    return nnx.merge(new_graphdef, nnx.from_flat_state(flat))


def _rebuilt(model, config):
    """A model of `model`'s class and head arguments with `config` (shapes only, under eval_shape)."""
    return type(model)(config, rngs=make_rngs(0), **model.head_arguments())
