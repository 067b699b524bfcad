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
import os
import random
import threading
from multiprocessing import get_context

import numpy as np

from nli_jax import storage

META = "examples.json"


def _segment_pairs(document: list[list[int]], all_documents: list[list[list[int]]], doc_index: int, *,
                   max_seq_length: int, short_seq_prob: float, sentence_task: str, rng: random.Random):
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
                    a = [t for s in chunk for t in s]
                    b, label = [], 0
                else:
                    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                    a = [t for s in chunk[:a_end] for t in s]
                    b, label = [], 0
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
                        for s in random_doc[start:]:
                            b.extend(s)
                            if len(b) >= b_target:
                                break
                        # The unused sentences go back: they start the next chunk.
                        i -= len(chunk) - a_end
                    else:
                        b = [t for s in chunk[a_end:] for t in s]
                        if sentence_task == "sop" and not b and len(a) >= 2:
                            # one-sentence chunk (tweets): split it at a random token instead
                            cut = rng.randint(1, len(a) - 1)
                            a, b = a[:cut], a[cut:]
                        if sentence_task == "sop" and b and rng.random() < 0.5:
                            a, b, label = b, a, 1
                _truncate_pair(a, b, max_tokens, rng)
                if a and (b or sentence_task == "none"):
                    yield label, a, b
            chunk, length = [], 0
        i += 1


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def encode_record(label: int, a: list[int], b: list[int], dtype) -> bytes:
    return np.asarray([label, len(a), *a, *b], dtype=dtype).tobytes()


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
                from nli_jax.data.readers import DataError
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


def _shard_job(args):
    (index, path, vocab_dir, output_dir, max_seq_length, short_seq_prob, sentence_task, dupe_factor, seed,
     heldout_permille, dtype_name) = args
    from array_record.python.array_record_module import ArrayRecordWriter
    from nli_jax.pretraining.vocab import load_fast_tokenizer
    tokenizer = load_fast_tokenizer(vocab_dir)
    dtype = np.dtype(dtype_name)
    splits = {"train": [], "heldout": []}
    words = 0
    for doc in _documents(path):
        words += sum(len(s.split()) for s in doc)
        ids = [e.ids for e in tokenizer.encode_batch(doc, add_special_tokens=False)]
        ids = [s for s in ids if s]
        if ids:
            splits["heldout" if _is_heldout(doc, heldout_permille) else "train"].append(ids)
    counts = {}
    for split, documents in splits.items():
        out = os.path.join(output_dir, f"{split}-{index:05d}.array_record")
        # Uncompressed: token ids do not compress, and the default codec triples the read time.
        writer = ArrayRecordWriter(out + ".tmp", "group_size:1,uncompressed")
        n = 0
        for dupe in range(dupe_factor if split == "train" else 1):
            rng = random.Random(seed * 1_000_003 + index * 1009 + dupe)
            for d, document in enumerate(documents):
                for label, a, b in _segment_pairs(document, documents, d, max_seq_length=max_seq_length,
                                                  short_seq_prob=short_seq_prob, sentence_task=sentence_task, rng=rng):
                    writer.write(encode_record(label, a, b, dtype))
                    n += 1
        writer.close()
        os.replace(out + ".tmp", out)
        counts[split] = n
    return index, counts, words


def create_examples(corpus_files: list[str], vocab_dir: str, output_dir: str, *, max_seq_length: int = 128,
                    short_seq_prob: float = 0.1, sentence_task: str = "nsp", dupe_factor: int = 1, seed: int = 12345,
                    heldout_permille: int = 10, workers: int = 2, progress: bool = True) -> dict:
    """One output shard per corpus shard (train-SSSSS.array_record, heldout-SSSSS.array_record),
    processed in parallel; writes examples.json with the settings and counts."""
    if sentence_task not in ("nsp", "sop", "none"):
        raise ValueError(f"sentence_task must be nsp, sop or none, got {sentence_task!r}")
    corpus_files = sorted(corpus_files)
    missing = [f for f in corpus_files if not storage.isfile(f)]
    if missing:
        raise FileNotFoundError(f"corpus files not found: {missing}")
    if not storage.isfile(os.path.join(vocab_dir, "vocab.txt")):
        raise FileNotFoundError(f"{storage.origin(vocab_dir)}/vocab.txt not found")
    # The tokenizer and array_record's writer take local files: gs:// inputs are downloaded to
    # this process's scratch, and a gs:// output_dir is built there and uploaded.
    local_vocab = storage.local_copy(vocab_dir)
    with open(os.path.join(local_vocab, "vocab.txt"), encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    dtype = "uint16" if vocab_size < 65535 else "int32"
    remote_out = storage.is_remote(output_dir)
    local_out = (os.path.join(storage.scratch_dir(), "examples", hashlib.sha256(output_dir.encode()).hexdigest()[:16])
                 if remote_out else output_dir)
    os.makedirs(local_out, exist_ok=True)
    jobs = [(i, storage.local_copy(p), local_vocab, local_out, max_seq_length, short_seq_prob, sentence_task,
             dupe_factor, seed, heldout_permille, dtype) for i, p in enumerate(corpus_files)]
    from tqdm import tqdm
    counts = {"train": 0, "heldout": 0}
    words = 0
    with get_context("spawn").Pool(max(1, workers)) as pool:
        for _, c, w in tqdm(pool.imap_unordered(_shard_job, jobs), total=len(jobs), desc="examples",
                            disable=not progress):
            counts = {k: counts[k] + c[k] for k in counts}
            words += w
    meta = {"max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob, "sentence_task": sentence_task,
            "dupe_factor": dupe_factor, "seed": seed, "dtype": dtype, "vocab_size": vocab_size, "vocab_dir":
            storage.origin(vocab_dir), "counts": counts, "words": words, "shards": len(jobs),
            "heldout_permille": heldout_permille, "corpus": [storage.origin(f) for f in corpus_files]}
    if remote_out:
        for name in sorted(os.listdir(local_out)):
            if name.endswith(".array_record"):
                storage.copy(os.path.join(local_out, name), os.path.join(output_dir, name))
    # examples.json last: it marks a complete directory.
    storage.write_text(os.path.join(output_dir, META), json.dumps(meta, indent=2))
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
            from array_record.python.array_record_module import ArrayRecordReader
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
