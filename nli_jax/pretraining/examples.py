"""Pretraining examples: documents -> token ids (once) -> document-aware segment pairs, written
as array_record shards. Masking is not applied here: the grain pipeline masks on the fly, so
every epoch sees new masks (nli_jax.pretraining.masking).

Segment pairs follow BERT's create_pretraining_data: fill a chunk with whole sentences up to a
target length (max_seq_length - 3, or with probability short_seq_prob a random shorter one),
split it at a random sentence boundary into A and B; then
  nsp  - with probability 0.5 B is replaced by a span of another document (label 1 = random);
  sop  - with probability 0.5 A and B are swapped (label 1 = swapped), ALBERT's sentence order;
  none - a single segment.
Pairs are truncated from the longer side, alternating front and back, to fit.

Record format: int32 (or uint16 when the vocabulary allows) [label, len_a, a..., b...].
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
from multiprocessing import get_context

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter
from tqdm import tqdm

from nli_jax import storage
from nli_jax.checkpoints.hf import check_special_tokens
from nli_jax.data.readers import DataError
from nli_jax.errors import RunError
from nli_jax.pretraining.vocab import load_fast_tokenizer

META = "examples.json"


_EMPTY = np.zeros(0, np.int32)


def _join(segments) -> np.ndarray:
    return np.concatenate(segments) if segments else _EMPTY


def _segment_pairs(document, all_documents, doc_index: int, *, max_seq_length: int, short_seq_prob: float,
                   sentence_task: str, rng: random.Random):
    """(label, a, b) segment pairs of one document (a list of sentences, each a sequence of
    token ids); a and b are int arrays."""
    max_tokens = max_seq_length - (3 if sentence_task != "none" else 2)
    # As in BERT: one target length per document, sometimes short to match fine-tuning inputs.
    target = max_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_tokens)
    chunk, length, i = [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            if chunk:
                if sentence_task == "none":
                    a, b, label = _join(chunk), _EMPTY, 0
                else:
                    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                    a = _join(chunk[:a_end])
                    b, label = _EMPTY, 0
                    if sentence_task == "nsp" and (len(chunk) == 1 or rng.random() < 0.5) and len(all_documents) > 1:
                        label = 1
                        b_target = target - len(a)
                        other = doc_index
                        for _ in range(10):
                            other = rng.randint(0, len(all_documents) - 1)
                            if other != doc_index:
                                break
                        random_doc = all_documents[other]
                        start = rng.randint(0, len(random_doc) - 1)
                        parts, taken = [], 0
                        for sentence in random_doc[start:]:
                            parts.append(sentence)
                            taken += len(sentence)
                            if taken >= b_target:
                                break
                        b = _join(parts)
                        # The unused sentences go back: they start the next chunk.
                        i -= len(chunk) - a_end
                    else:
                        b = _join(chunk[a_end:])
                        if sentence_task == "sop" and not len(b) and len(a) >= 2:
                            # one-sentence chunk (tweets): split it at a random token instead
                            cut = rng.randint(1, len(a) - 1)
                            a, b = a[:cut], a[cut:]
                        if sentence_task == "sop" and len(b) and rng.random() < 0.5:
                            a, b, label = b, a, 1
                a, b = _truncate_pair(a, b, max_tokens, rng)
                if len(a) and (len(b) or sentence_task == "none"):
                    yield label, a, b
            chunk, length = [], 0
        i += 1


def _truncate_pair(a, b, max_tokens: int, rng: random.Random):
    """(a, b) cut to `max_tokens` together as BERT does: one token at a time from the longer
    segment (b when they are equal), from the front or the back with even odds. Which segment
    loses each token follows from the lengths alone, so the coin flips are drawn as one integer
    of random bits and each segment is sliced once."""
    len_a, len_b = len(a), len(b)
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return a, b
    first = min(excess, abs(len_a - len_b))  # from the longer one until they are equal
    flips = format(rng.getrandbits(excess), f"0{excess}b")
    # Then alternately b, a, b, ...
    a_flips = (flips[:first] if len_a > len_b else "") + flips[first + 1::2]
    b_flips = (flips[:first] if len_b > len_a else "") + flips[first::2]
    out = []
    for segment, segment_flips in ((a, a_flips), (b, b_flips)):
        front = segment_flips.count("1")
        out.append(segment[front:len(segment) - (len(segment_flips) - front)])
    return out[0], out[1]


def encode_record(label: int, a, b, dtype) -> bytes:
    return np.concatenate(([label, len(a)], a, b)).astype(dtype).tobytes()


def decode_record(record: bytes, dtype) -> tuple[int, np.ndarray, np.ndarray]:
    values = np.frombuffer(record, dtype=dtype)  # views; widened when assembled into a batch
    label, len_a = int(values[0]), int(values[1])
    return label, values[2:2 + len_a], values[2 + len_a:]


def _documents(path: str):
    doc = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                decoded = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{number}: not UTF-8 (byte {raw[e.start]:#x} at column {e.start + 1}); "
                                "prepare the corpus with `python -m pretrain.prepare_corpus`") from None
            # Universal newlines, as text mode reads them ("\r\n", "\r" and "\n" end a line).
            decoded = decoded.replace("\r\n", "\n").replace("\r", "\n")
            for line in (decoded[:-1] if decoded.endswith("\n") else decoded).split("\n"):
                line = line.strip()
                if line:
                    doc.append(line)
                elif doc:
                    yield doc
                    doc = []
    if doc:
        yield doc


def _is_heldout(doc: list[str], permille: int) -> bool:
    key = hashlib.blake2b("\n".join(doc).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(key, "little") % 1000 < permille


# Text tokenised and paired at a time per worker: memory stays bounded by the window (a few
# hundred MB of token lists at most), not by the shard, so a 23 GB corpus builds like a 30 MB one.
# NSP's random second segments come from the same window (BERT's tool draws them from all the
# documents it holds in memory, which is the same idea at a smaller, fixed size).
WINDOW_CHARS = 8 << 20
# Upper bound of tokens per corpus byte for the disk-space check (WordPiece on Indonesian text:
# 0.55 measured with an English vocabulary, fewer with an Indonesian one).
TOKENS_PER_BYTE = 0.75


def _bounded_documents(documents, max_chars: int):
    """Documents longer than `max_chars` (a source without document breaks) cut at sentence
    boundaries into pieces of about that size, so a window is bounded and holds several documents
    to draw NSP's random segments from."""
    for doc in documents:
        piece, size = [], 0
        for line in doc:
            if piece and size + len(line) > max_chars:
                yield piece
                piece, size = [], 0
            piece.append(line)
            size += len(line)
        if piece:
            yield piece


def _windows(path: str, window_chars: int):
    """Documents in windows of about `window_chars`; a tail under half a window joins the window
    before it, so no window is too small to draw NSP's random segments from."""
    held, window, size = None, [], 0
    for doc in _bounded_documents(_documents(path), max(1, window_chars // 4)):
        window.append(doc)
        size += sum(len(line) for line in doc)
        if size >= window_chars:
            if held is not None:
                yield held
            held, window, size = window, [], 0
    if held is not None and size < window_chars // 2:
        held, window = held + window, []
    if held is not None:
        yield held
    if window:
        yield window


def encode_sentences(tokenizer, sentences: list[str]) -> tuple[list[np.ndarray], int]:
    """(token ids of each sentence as int32 arrays, whitespace-separated words) with the WordPiece tokenizer, each
    distinct word encoded once: sentences are cut at spaces, the distinct words encoded by the
    Rust tokenizer in pre-tokenized batches (parallel), and the sentences' ids gathered from
    theirs with numpy. Identical to encoding whole sentences: BERT's normaliser works character
    by character and its pre-tokenizer splits at spaces anyway (Python's split() is not used:
    it also splits at characters BERT deletes). About 10% of a window's words are distinct."""
    if not sentences:
        return [], 0
    index: dict[str, int] = {}
    occurrences, per_sentence = [], []
    for sentence in sentences:
        words = [index.setdefault(w, len(index)) for w in sentence.split(" ") if w]
        occurrences.extend(words)
        per_sentence.append(len(words))
    distinct = list(index)
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    chunk = 4096
    batches = [distinct[i:i + chunk] for i in range(0, len(distinct), chunk)]
    token_parts, lengths = [], []
    for words, encoding in zip(batches, inner.encode_batch(batches, is_pretokenized=True, add_special_tokens=False)):
        word_ids = np.asarray([-1 if w is None else w for w in encoding.word_ids], np.int64)
        ids = np.asarray(encoding.ids, np.int32)
        token_parts.append(ids[word_ids >= 0])  # a word's tokens are contiguous, in word order
        lengths.append(np.bincount(word_ids[word_ids >= 0], minlength=len(words)))
    tokens = np.concatenate(token_parts) if token_parts else np.zeros(0, np.int32)
    word_length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    word_start = np.cumsum(word_length) - word_length
    occurrence = np.asarray(occurrences, np.int64)
    length = word_length[occurrence]
    out_end = np.cumsum(length)
    # Ragged gather: position j of the output block of occurrence k reads tokens[word_start + j].
    gather = np.repeat(word_start[occurrence] - (out_end - length), length) + np.arange(int(out_end[-1]) if len(out_end) else 0)
    stream = tokens[gather]
    ends = np.concatenate([[0], out_end]).astype(np.int64)[np.cumsum(np.asarray(per_sentence, np.int64))]
    return np.split(stream, ends[:-1]), sum(len(sentence.split()) for sentence in sentences)


def _shard_files(output_dir: str, index: int) -> dict[str, str]:
    return {"train": os.path.join(output_dir, f"train-{index:05d}.array_record"),
            "heldout": os.path.join(output_dir, f"heldout-{index:05d}.array_record"),
            "done": os.path.join(output_dir, f"shard-{index:05d}.json")}


def _shard_job(args):
    (index, path, vocab_dir, output_dir, max_seq_length, short_seq_prob, sentence_task, dupe_factor, seed,
     heldout_permille, dtype_name, fingerprint, window_chars) = args
    tokenizer = load_fast_tokenizer(vocab_dir)
    dtype = np.dtype(dtype_name)
    files = _shard_files(output_dir, index)
    # Uncompressed: token ids do not compress, and the default codec triples the read time.
    writers = {split: ArrayRecordWriter(storage.output_file(storage.under(output_dir, os.path.basename(files[split])
                                                                          + ".tmp")), "group_size:1,uncompressed")
               for split in ("train", "heldout")}
    # One generator per (split, pass over the corpus), continued across windows: deterministic.
    rngs = {(split, dupe): random.Random(seed * 1_000_003 + index * 1009 + dupe)
            for split in ("train", "heldout") for dupe in range(dupe_factor if split == "train" else 1)}
    counts, words = {"train": 0, "heldout": 0}, 0

    def write_pairs(split, documents):
        for (name, _), rng in rngs.items():
            if name != split:
                continue
            for d, document in enumerate(documents):
                for label, a, b in _segment_pairs(document, documents, d, max_seq_length=max_seq_length,
                                                  short_seq_prob=short_seq_prob, sentence_task=sentence_task, rng=rng):
                    writers[split].write(encode_record(label, a, b, dtype))
                    counts[split] += 1

    # Held-out documents (about 1%) are kept for the whole shard and paired at its end, so NSP
    # draws their random segments from more than the few a window holds.
    heldout = []
    try:
        for window in _windows(path, window_chars):
            ids, window_words = encode_sentences(tokenizer, [line for doc in window for line in doc])
            words += window_words
            train, start = [], 0
            for doc in window:
                document = [s for s in ids[start:start + len(doc)] if len(s)]
                start += len(doc)
                if not document:
                    continue
                if _is_heldout(doc, heldout_permille):
                    # Copies: the sentences are views of the window's whole token stream, which
                    # a kept view would hold in memory to the end of the shard.
                    heldout.append([s.copy() for s in document])
                else:
                    train.append(document)
            write_pairs("train", train)
            # Released before the next window is read, so at most one window's ids are alive.
            del ids, train, window
        write_pairs("heldout", heldout)
    finally:
        for writer in writers.values():
            writer.close()
    sizes = {}
    for split in writers:
        _fsync(files[split] + ".tmp")  # on disk before the marker that vouches for it
        storage.move(files[split] + ".tmp", storage.under(output_dir, os.path.basename(files[split])))
        sizes[split] = os.path.getsize(files[split])
    # Written last: a shard without its marker is rebuilt on restart, never read as complete.
    marker = os.path.basename(files["done"])
    with storage.open_output(storage.under(output_dir, marker + ".tmp")) as f:
        json.dump({"fingerprint": fingerprint, "counts": counts, "words": words, "bytes": sizes}, f)
        f.flush()
        os.fsync(f.fileno())
    storage.move(files["done"] + ".tmp", storage.under(output_dir, marker))
    _fsync(output_dir)
    return index, counts, words


def _fsync(path: str) -> None:
    """A file's (or a directory's entries') data to disk: a host crash after the marker is
    written cannot leave the marker beside a truncated shard."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SHARD_NAME = re.compile(r"^(?:(?:train|heldout)-\d{5}\.array_record|shard-\d{5}\.json)(?:\.tmp)?$")


def _read_marker(path: str) -> dict | None:
    try:
        marker = storage.read_json_object(path)
    except (OSError, ValueError, storage.StorageError):
        return None
    return marker if isinstance(marker, dict) else None


def _finished_shards(out: str, fingerprints: list[str]) -> set[int]:
    """Indices of the shards in `out` (local or gs://) already complete with these settings:
    a marker with their fingerprint beside both files at the sizes it recorded."""
    if not storage.isdir(out):
        return set()
    present = set(storage.listdir(out))
    done = set()
    for index, fingerprint in enumerate(fingerprints):
        files = _shard_files(out, index)
        if os.path.basename(files["done"]) not in present:
            continue
        marker = _read_marker(files["done"])
        if not (marker and marker.get("fingerprint") == fingerprint and isinstance(marker.get("bytes"), dict)):
            continue
        if all(os.path.basename(files[split]) in present
               and storage.path(files[split]).stat().length == marker["bytes"].get(split)
               for split in ("train", "heldout")):
            done.add(index)
    return done


def _stale_files(out: str, done: set[int]) -> list[str]:
    """Files of `out` (local or gs://) that a build keeping shards `done` deletes: partial (.tmp)
    files and shards of other settings or beyond the corpus. Only the builder's own names."""
    keep = {os.path.basename(f) for i in done for f in _shard_files(out, i).values()}
    return [os.path.join(out, name) for name in storage.listdir(out)
            if _SHARD_NAME.match(name) and name not in keep]


def _fingerprint(settings: dict, tokenizer_sha: str, path: str, local_path: str, index: int) -> str:
    """Settings, vocabulary and corpus file of a shard. A local file is identified by its path,
    size and mtime; a gs:// file by its URL and contents (its download's mtime is this process's)."""
    stat = os.stat(local_path)
    identity = {"bytes": stat.st_size}
    path = storage.origin(path)  # a download names its URL
    if storage.is_remote(path):
        digest = hashlib.blake2b(digest_size=16)
        with open(local_path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                digest.update(chunk)
        identity["blake2b"] = digest.hexdigest()
    else:
        identity["mtime_ns"] = stat.st_mtime_ns
    payload = json.dumps({**settings, "tokenizer_sha256": tokenizer_sha, "corpus_file": path,
                          **identity, "index": index}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def vocabulary_fingerprint(vocab_dir: str) -> dict | None:
    """{"fingerprint", "size"} of the vocabulary that tokenises the corpus into ids: the entries
    of vocab.txt in order, and whether the text is lowercased (tokenizer_config.json's
    do_lower_case, true by default). None when the directory has no vocab.txt."""
    vocab = os.path.join(vocab_dir, "vocab.txt")
    if not storage.isfile(vocab):
        return None
    entries = storage.read_text(vocab).split("\n")
    if entries and entries[-1] == "":
        entries.pop()
    lowercase = True
    config = os.path.join(vocab_dir, "tokenizer_config.json")
    if storage.isfile(config):
        try:
            lowercase = bool((storage.read_json_object(config) or {}).get("do_lower_case", True))
        except ValueError:
            pass
    digest = hashlib.sha256(json.dumps({"entries": entries, "lowercase": lowercase}).encode("utf-8"))
    return {"fingerprint": digest.hexdigest()[:32], "size": len(entries)}


def check_vocabulary(directory: str, meta: dict, vocab_dir: str) -> None:
    """Examples in `directory` (their examples.json `meta`) hold the token ids of the vocabulary
    they were built with: a run whose tokenizer (`vocab_dir`) has another is refused before
    compute (its ids would select other embeddings: loss nan past the vocabulary)."""
    if not vocab_dir:
        return
    ours = vocabulary_fingerprint(storage.local_copy(vocab_dir) if storage.is_remote(vocab_dir) else vocab_dir)
    theirs = meta.get("vocab_fingerprint")
    if ours is None or theirs is None:  # no vocab.txt to compare, or examples of an older nli-jax: the size
        if ours is not None and meta.get("vocab_size") not in (None, ours["size"]):
            theirs = {"fingerprint": None, "size": meta["vocab_size"]}
        else:
            if theirs is None:
                logging.getLogger("nli_jax").info("%s/%s has no vocabulary fingerprint (built by an older nli-jax): "
                                                  "only its vocabulary size is checked", directory, META)
            return
    if ours["fingerprint"] != theirs["fingerprint"]:
        raise RunError(f"{directory} holds examples tokenised with another vocabulary ({meta.get('vocab_dir')}: "
                       f"{theirs['size']} entries, fingerprint {theirs['fingerprint']}) than this run's tokenizer "
                       f"({storage.origin(vocab_dir)}: {ours['size']} entries, fingerprint {ours['fingerprint']}): "
                       "their token ids would select other embeddings. Build the examples with this tokenizer "
                       "(python -m pretrain.create_examples --vocab_dir=...) or use the tokenizer they were built with")


def create_examples(corpus_files: list[str], vocab_dir: str, output_dir: str, *, max_seq_length: int = 128,
                    short_seq_prob: float = 0.1, sentence_task: str = "nsp", dupe_factor: int = 1, seed: int = 12345,
                    heldout_permille: int = 10, workers: int = 2, progress: bool = True,
                    window_chars: int = WINDOW_CHARS) -> dict:
    """One output shard per corpus shard (train-SSSSS.array_record, heldout-SSSSS.array_record),
    processed in parallel in bounded memory; writes examples.json with the settings and counts.

    Restartable: each finished shard leaves a marker (shard-SSSSS.json) with a fingerprint of
    its settings, corpus file and vocabulary; a rerun keeps those shards and builds the rest,
    and examples.json, which readers require, is written only once every shard is complete.
    Free disk space is checked before any shard is written."""
    if sentence_task not in ("nsp", "sop", "none"):
        raise ValueError(f"sentence_task must be nsp, sop or none, got {sentence_task!r}")
    # A pair is [CLS] A [SEP] B [SEP]; without a sentence task [CLS] A [SEP]; and 2 tokens of text
    # at least (the shortest target length _segment_pairs draws).
    special = 3 if sentence_task != "none" else 2
    if max_seq_length < special + 2:
        raise RunError(f"--max_seq_length={max_seq_length}: too short for --sentence_task={sentence_task}: an example "
                       f"({'[CLS] A [SEP] B [SEP]' if special == 3 else '[CLS] A [SEP]'}) needs {special} special "
                       f"tokens and 2 of text, at least {special + 2} (BERT's phases: 128, then 512)")
    corpus_files = sorted(corpus_files)
    missing = [f for f in corpus_files if not storage.exists(f) and not os.path.islink(f)]
    if missing:
        raise FileNotFoundError(f"corpus files not found: {missing}")
    for f in corpus_files:  # the workers read them: each a regular file, before any is opened
        storage.readable_file(f, "corpus file")
    if not storage.exists(os.path.join(vocab_dir, "vocab.txt")):
        raise FileNotFoundError(f"{storage.origin(vocab_dir)}/vocab.txt not found")
    # The tokenizer and array_record's writer take local files: gs:// inputs are downloaded to
    # this process's scratch, and a gs:// output_dir is built there and uploaded.
    local_vocab = storage.local_copy(vocab_dir)
    vocab_bytes = storage.read_bytes(os.path.join(local_vocab, "vocab.txt"))
    # [MASK] above all: masking would draw a token the vocabulary does not have.
    check_special_tokens(storage.origin(vocab_dir), vocab_bytes.decode("utf-8", errors="replace").splitlines())
    vocab_size = vocab_bytes.count(b"\n") + (0 if vocab_bytes.endswith(b"\n") or not vocab_bytes else 1)
    tokenizer_hash = hashlib.sha256(vocab_bytes)
    config_path = os.path.join(local_vocab, "tokenizer_config.json")  # do_lower_case
    if os.path.lexists(config_path):
        tokenizer_hash.update(storage.read_bytes(config_path))
    dtype = "uint16" if vocab_size < 65535 else "int32"
    remote_out = storage.is_remote(output_dir)
    local_out = (os.path.join(storage.scratch_dir(), "examples", hashlib.sha256(output_dir.encode()).hexdigest()[:16])
                 if remote_out else output_dir)
    settings = {"max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob, "sentence_task": sentence_task,
                "dupe_factor": dupe_factor, "seed": seed, "dtype": dtype, "heldout_permille": heldout_permille,
                "window_chars": window_chars}
    local_files = [storage.local_copy(p) for p in corpus_files]
    sizes = [os.path.getsize(p) for p in local_files]
    fingerprints = [_fingerprint(settings, tokenizer_hash.hexdigest(), p, local, i)
                    for i, (p, local) in enumerate(zip(corpus_files, local_files))]
    # A gs:// output_dir keeps its markers in the bucket: a rerun on another host (or after the
    # scratch directory is gone) reuses the shards that were uploaded complete.
    done = _finished_shards(output_dir, fingerprints)
    todo = [i for i in range(len(local_files)) if i not in done]
    needed = int(sum(sizes[i] for i in todo) * TOKENS_PER_BYTE * np.dtype(dtype).itemsize * max(1, dupe_factor))
    # Checked before anything is removed (a refused rebuild leaves the previous build as it was),
    # counting the space the stale files of this directory will free.
    stale = _stale_files(local_out, done) if not remote_out else []
    needed -= sum(os.path.getsize(f) for f in stale)
    storage.check_free_space(local_out, needed, what=f"examples for {len(todo)} corpus shard(s)")
    if storage.isfile(os.path.join(output_dir, META)):
        storage.remove(os.path.join(output_dir, META))  # a rebuild in progress never looks complete
    for f in _stale_files(output_dir, done) if remote_out else stale:
        storage.remove(f)
    storage.makedirs(storage.under(local_out))
    jobs = [(i, local_files[i], local_vocab, local_out, max_seq_length, short_seq_prob, sentence_task, dupe_factor,
             seed, heldout_permille, dtype, fingerprints[i], window_chars) for i in todo]
    if jobs:
        with get_context("spawn").Pool(max(1, min(workers, len(jobs)))) as pool:
            for index, _, _ in tqdm(pool.imap_unordered(_shard_job, jobs), total=len(jobs), desc="examples",
                                    disable=not progress):
                if remote_out:  # each shard as it finishes, its marker last; the local copy freed
                    local, remote = _shard_files(local_out, index), _shard_files(output_dir, index)
                    for kind in ("train", "heldout", "done"):
                        storage.copy(local[kind], storage.under(output_dir, os.path.basename(remote[kind])))
                        os.remove(local[kind])
    counts = {"train": 0, "heldout": 0}
    words = 0
    for i in range(len(local_files)):
        marker = _read_marker(_shard_files(output_dir, i)["done"])
        counts = {k: counts[k] + marker["counts"][k] for k in counts}
        words += marker["words"]
    meta = {"max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob, "sentence_task": sentence_task,
            "dupe_factor": dupe_factor, "seed": seed, "dtype": dtype, "vocab_size": vocab_size, "vocab_dir":
            storage.origin(vocab_dir), "vocab_fingerprint": vocabulary_fingerprint(local_vocab), "counts": counts, "words": words, "shards": len(local_files),
            "heldout_permille": heldout_permille, "corpus": [storage.origin(f) for f in corpus_files],
            "reused_shards": len(done)}
    # examples.json last: it marks a complete directory.
    storage.write_text(storage.under(output_dir, META), json.dumps(meta, indent=2))
    return meta


class ExampleSource:
    """Random access to the segment pairs of one split across shards.

    Reads go straight to array_record's C++ readers (batched and parallel in `get_many`); the
    readers are reopened lazily after pickling, so grain worker processes can use the source.
    """

    def __init__(self, directory: str, split: str):
        meta_path = os.path.join(directory, META)
        if not storage.isfile(meta_path):
            raise FileNotFoundError(f"{meta_path} not found: run `python -m pretrain.create_examples` first")
        self.meta = json.loads(storage.read_text(meta_path))
        names = [p for p in storage.listdir(directory) if p.startswith(split + "-") and p.endswith(".array_record")]
        if not names:
            raise FileNotFoundError(f"no {split}-*.array_record shards in {directory}")
        # array_record's C++ reader takes local files: a gs:// directory is downloaded once per process.
        local = storage.local_copy(directory)
        self.files = [os.path.join(local, p) for p in names]
        self._dtype = np.dtype(self.meta["dtype"])
        self._readers = None
        self._lock = threading.Lock()  # grain's prefetch threads read concurrently
        sizes = [reader.num_records() for reader in self._open()]
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def _open(self):
        if self._readers is None:
            self._readers = [ArrayRecordReader(f, "readahead_buffer_size:0") for f in self.files]
        return self._readers

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_readers", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _readers=None, _lock=threading.Lock())

    def __len__(self):
        return int(self._starts[-1])

    def __getitem__(self, index):
        return self.get_many([index])[0]

    def get_many(self, indices):
        """One batched read per shard for a list of indices."""
        indices = np.asarray(indices, np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"index out of range for {len(self)} examples")
        shard = np.searchsorted(self._starts, indices, side="right") - 1
        records = [None] * len(indices)
        with self._lock:
            readers = self._open()
            for k in np.unique(shard):
                where = np.flatnonzero(shard == k)
                for j, record in zip(where, readers[k].read((indices[where] - self._starts[k]).tolist())):
                    records[j] = record
        out = []
        for index, record in zip(indices.tolist(), records):
            label, a, b = decode_record(record, self._dtype)
            out.append({"idx": index, "label": label, "a": a, "b": b})
        return out
