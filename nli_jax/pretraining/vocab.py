"""Vocabulary training, saved as the released IndoBERT models ship theirs: a WordPiece
`vocab.txt` with the BERT special tokens (IndoBERT-lite too), loadable by transformers'
BertTokenizer(Fast).

Two algorithms:
  wordpiece         - the `tokenizers` library's WordPiece trainer (default);
  sentencepiece-bpe - SentencePiece BPE, as the IndoNLU paper says, with its pieces converted
                      to WordPiece form (word-initial "▁x" -> "x", continuation "x" -> "##x").
Either way the saved tokenizer encodes with WordPiece (greedy longest match). transformers'
own conversion of a SentencePiece BPE model is treated as unigram and encodes differently,
so nli-jax never relies on it.
"""
from __future__ import annotations

import codecs
import json
import logging
import os
import random
import tempfile

import sentencepiece as spm
from tokenizers import BertWordPieceTokenizer

from nli_jax import storage
from nli_jax.errors import RunError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Placeholders of the Twitter normalisation stay whole tokens.
PLACEHOLDERS = ["<username>", "<hashtag>", "<email>", "<links>"]


def train_vocabulary(files: list[str], output_dir: str, *, vocab_size: int = 30522, algorithm: str = "wordpiece",
                     lowercase: bool = True, min_frequency: int = 2, limit_alphabet: int = 1000,
                     sample_sentences: int = 2_000_000, seed: int = 12345) -> str:
    """Trains on `files` (one sentence per line) and writes <output_dir>/vocab.txt plus
    tokenizer_config.json; returns output_dir.

    As BERT's and SentencePiece's tools do, a corpus of more than `sample_sentences` lines is
    trained on a sample of that many (each line kept with the same probability, seeded), so
    time and memory stay those of the sample however large the corpus; 0 = every line."""
    missing = [f for f in files if not os.path.lexists(f)]
    if missing:
        raise FileNotFoundError(f"corpus files not found: {missing}")
    for f in files:  # the trainers read them themselves: each a regular file first
        storage.readable_file(f, "corpus file")
    if algorithm not in ("wordpiece", "sentencepiece-bpe"):
        raise ValueError(f"unknown vocabulary algorithm {algorithm!r}; expected wordpiece or sentencepiece-bpe")
    fixed = len(SPECIAL_TOKENS) + len(PLACEHOLDERS)
    if vocab_size <= fixed:
        raise RunError(f"--vocab_size={vocab_size}: not more than the {fixed} special tokens and placeholders "
                       f"({', '.join(SPECIAL_TOKENS + PLACEHOLDERS)}); a vocabulary needs room for words")
    storage.makedirs(storage.under(output_dir))
    with tempfile.TemporaryDirectory(dir=output_dir) as tmp:
        inputs = sample_lines(files, sample_sentences, storage.under(tmp, "sample.txt"), seed=seed)
        try:
            if algorithm == "wordpiece":
                vocab = _wordpiece(inputs, vocab_size, lowercase, min_frequency, limit_alphabet)
            else:
                vocab = _sentencepiece_bpe(inputs, vocab_size, lowercase, sample_sentences)  # 0: every sentence
        except Exception:  # the trainers' own message ("stream did not contain valid UTF-8") names no file
            for f in files:
                check_text_file(f)
            raise
    if len(vocab) > vocab_size:  # the trainers keep every character of the alphabet whatever the size
        raise RunError(f"--vocab_size={vocab_size}: the corpus needs at least {len(vocab)} entries ({fixed} special "
                       f"tokens and placeholders and its alphabet, each character as a word start and a "
                       f"continuation): ask for {len(vocab)} or more (nothing was written)")
    if len(vocab) < vocab_size:  # the trainers stop where the corpus runs out of words and pieces
        logging.getLogger("nli_jax").warning(
            "--vocab_size=%d: the corpus yields %d entries (%d special tokens and placeholders, %d words and pieces%s), "
            "fewer than asked: vocab.txt has %d", vocab_size, len(vocab), fixed, len(vocab) - fixed,
            f" seen at least {min_frequency} times" if algorithm == "wordpiece" else "", len(vocab))
    storage.write_text(storage.under(output_dir, "vocab.txt"), "\n".join(vocab) + "\n")
    storage.write_text(storage.under(output_dir, "tokenizer_config.json"), json.dumps(
        {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, "model_max_length": 512,
         "strip_accents": None, "tokenize_chinese_chars": True}, indent=2))
    storage.write_text(storage.under(output_dir, "special_tokens_map.json"), json.dumps(
        {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
         "mask_token": "[MASK]", "additional_special_tokens": PLACEHOLDERS}, indent=2))
    return output_dir


def check_text_file(path: str) -> None:
    """A RunError naming the file and line of the first bytes that are not UTF-8, or of the first
    NUL byte (a binary or damaged file); nothing when it is text. Reads lines of at most 16 MiB."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line, offset = 1, 0
    with open(path, "rb") as f:  # a regular file: through storage.readable_file before
        while True:
            raw = f.readline(1 << 24)
            if not raw:
                break
            try:
                decoder.decode(raw)
            except UnicodeDecodeError as e:
                raise RunError(f"{path}:{line}: not UTF-8 (near byte offset {offset + max(0, e.start)}): not a text "
                               "corpus (prepare one with python -m pretrain.prepare_corpus)") from None
            nul = raw.find(b"\0")
            if nul >= 0:
                raise RunError(f"{path}:{line}: NUL byte at offset {offset + nul} (a binary or damaged file): not a "
                               "text corpus")
            offset += len(raw)
            line += raw.endswith(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise RunError(f"{path}:{line}: not UTF-8 (a character cut at the end of the file)") from None


def _count_lines(path: str) -> int:
    """Non-blank lines, about (the corpus format's single blank lines between documents)."""
    count = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            count += chunk.count(b"\n") - chunk.count(b"\n\n")
    return count


def sample_lines(files: list[str], sample: int, output, *, seed: int = 12345) -> list[str]:
    """`files` themselves when they hold at most `sample` lines (or sample is 0), else `output`
    holding about `sample` of their non-blank lines, each kept with probability sample / lines
    (a seeded draw per line, in file order: one pass, constant memory)."""
    if not sample:
        return list(files)
    total = sum(_count_lines(f) for f in files)
    if total <= sample:
        return list(files)
    rng, keep = random.Random(seed), sample / total
    with storage.open_output(output) as out:  # an OutputPath
        for path in files:
            check_text_file(path)  # a binary file would be sampled as U+FFFD characters, silently
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if rng.random() < keep and line.strip():
                        out.write(line.rstrip("\n") + "\n")
    return [str(output)]


def _wordpiece(files, vocab_size, lowercase, min_frequency, limit_alphabet):
    tokenizer = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=None if lowercase else False)
    tokenizer.train(files, vocab_size=vocab_size, min_frequency=min_frequency, limit_alphabet=limit_alphabet,
                    special_tokens=SPECIAL_TOKENS + PLACEHOLDERS, wordpieces_prefix="##")
    vocab = tokenizer.get_vocab()
    return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def _sentencepiece_bpe(files, vocab_size, lowercase, sample):
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "bpe")
        spm.SentencePieceTrainer.train(
            input=",".join(files), model_prefix=prefix, model_type="bpe",
            vocab_size=vocab_size - len(SPECIAL_TOKENS) - len(PLACEHOLDERS), character_coverage=0.9999,
            input_sentence_size=sample, shuffle_input_sentence=True, normalization_rule_name="nmt_nfkc_cf" if lowercase
            else "nmt_nfkc", user_defined_symbols=PLACEHOLDERS, bos_id=-1, eos_id=-1, unk_id=0, num_threads=2,
            minloglevel=2)
        processor = spm.SentencePieceProcessor(model_file=prefix + ".model")
        pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab, seen = list(SPECIAL_TOKENS) + list(PLACEHOLDERS), set(SPECIAL_TOKENS) | set(PLACEHOLDERS)
    for piece in pieces:
        if piece in ("<unk>", "<s>", "</s>") or piece in PLACEHOLDERS:
            continue
        token = piece[1:] if piece.startswith("\u2581") else "##" + piece
        if token and token != "##" and token not in seen:
            vocab.append(token)
            seen.add(token)
    # WordPiece needs every single character as a word start and as a continuation; room for them
    # is made by dropping the last (lowest-scored) multi-character pieces, so the size is kept.
    fixed = len(SPECIAL_TOKENS) + len(PLACEHOLDERS)
    characters = sorted({c for t in vocab[fixed:] for c in t.removeprefix("##")})
    single = {token for ch in characters for token in (ch, "##" + ch)}
    pieces = [t for t in vocab[fixed:] if t not in single]
    del pieces[max(0, vocab_size - fixed - len(single)):]
    return vocab[:fixed] + pieces + [token for ch in characters for token in (ch, "##" + ch)]


def load_fast_tokenizer(vocab_dir: str, lowercase: bool | None = None):
    """nli-jax's own encoder for pretraining data: the `tokenizers` WordPiece pipeline on the
    same vocab.txt (batch encoding in Rust threads)."""
    if lowercase is None:
        config = os.path.join(vocab_dir, "tokenizer_config.json")
        lowercase = True
        if os.path.lexists(config):
            lowercase = bool(json.loads(storage.read_text(config)).get("do_lower_case", True))
    tokenizer = BertWordPieceTokenizer(os.path.join(vocab_dir, "vocab.txt"), lowercase=lowercase,
                                       strip_accents=None if lowercase else False)
    for placeholder in PLACEHOLDERS:
        if tokenizer.token_to_id(placeholder) is not None:
            tokenizer.add_special_tokens([placeholder])
    return tokenizer
