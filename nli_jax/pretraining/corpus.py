"""Corpus preparation: raw text -> documents of one sentence per line, blank line between
documents, exact duplicates removed, written as N shards.

Streaming and parallel so a 23 GB corpus never has to fit in memory:
  pass 1 (one worker per input file): split into documents and sentences, normalise, and route
          each document to bucket hash(document) % N (duplicates always meet in one bucket);
  pass 2 (one worker per bucket): drop exact duplicates inside the bucket, write shard i.
Memory is bounded by one bucket (corpus / N).

Input: text files where a blank line separates documents (paragraphs). Lines may hold several
sentences: `split_sentences` cuts them (Indonesian abbreviations kept intact).
"""
from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
from multiprocessing import get_context
from typing import Iterator

from tqdm import tqdm
from nli_jax import storage
from nli_jax.data.readers import DataError
from nli_jax.errors import RunError

# Twitter normalisation of the IndoNLU paper (Twitter UI data): these become placeholders.
_USERNAME = re.compile(r"(?<![\w@])@\w{1,30}")
_HASHTAG = re.compile(r"(?<![\w#])#\w+")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(\.[\w-]+)+\b")
_LINK = re.compile(r"\b(?:https?://|www\.)\S+", re.IGNORECASE)


def normalise_twitter(text: str) -> str:
    text = _EMAIL.sub("<email>", text)  # before usernames: an email contains @
    text = _LINK.sub("<links>", text)
    text = _USERNAME.sub("<username>", text)
    return _HASHTAG.sub("<hashtag>", text)


# Abbreviations after which a period does not end a sentence.
ABBREVIATIONS = {
    "dll", "dsb", "dst", "dkk", "tsb", "yth", "no", "hlm", "jl", "jln", "kab", "kec", "kel", "prov", "dr", "drs", "dra",
    "ir", "prof", "h", "hj", "st", "s.h", "s.e", "s.pd", "m.si", "sdr", "sdri", "bpk", "ibu", "tn", "ny", "nn", "mr",
    "mrs", "ms", "vs", "a.n", "u.p", "d.a", "s.d", "sbb", "tgl", "thn", "rp", "gg", "km", "kg", "p.t", "pt", "cv",
    "tbk", "inc", "ltd", "co", "e.g", "i.e", "etc", "al", "ca", "ft", "jr", "sr",
}
_BOUNDARY = re.compile(r"([.!?]+[\"'”’)\]]*)\s+(?=[\"'“‘(\[]?[A-Z0-9])")


def split_sentences(paragraph: str) -> list[str]:
    """Rule-based sentence splitting for Indonesian paragraphs."""
    paragraph = " ".join(paragraph.split())
    if not paragraph:
        return []
    out, start = [], 0
    for m in _BOUNDARY.finditer(paragraph):
        end = m.end(1)
        word = paragraph[start:end].rstrip(".!?\"'”’)]").split(" ")[-1].lower()
        if m.group(1).startswith(".") and (word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())):
            continue  # "Dr. Budi", "H. Agus", "Jl. Sudirman"
        out.append(paragraph[start:end].strip())
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return out


def read_documents(path: str, *, lines_are_sentences: bool = False, max_lines_per_document: int = 0
                   ) -> Iterator[list[str]]:
    """Documents (lists of lines) of a text file: blank lines separate documents. Without
    `lines_are_sentences` each line is a paragraph and is split into sentences."""
    doc: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if "\0" in line:  # text holds no NUL bytes: a binary (or zero-filled, damaged) file
                raise DataError(f"{path}:{number}: NUL byte at column {line.index(chr(0)) + 1} (a damaged or binary "
                                "file): not a text corpus; nothing was written")
            line = line.strip()
            if not line:
                if doc:
                    yield doc
                doc = []
                continue
            doc.extend([line] if lines_are_sentences else split_sentences(line))
            if max_lines_per_document and len(doc) >= max_lines_per_document:
                yield doc
                doc = []
    if doc:
        yield doc


def open_files_for(needed: int, what: str) -> None:
    """Raises this process's open-file limit (its workers inherit it) to `needed` when the hard
    limit allows; else one error naming `what` and the limit, before anything is written."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed <= soft:
        return
    if hard == resource.RLIM_INFINITY or needed <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return
    raise RunError(f"{what}: {needed} open files, more than this process may open ({hard}, ulimit -Hn); "
                   "ask for fewer shards, or raise the limit")


def _bucket_of(document: str, buckets: int) -> int:
    return int.from_bytes(hashlib.blake2b(document.encode("utf-8"), digest_size=8).digest(), "little") % buckets


def _pass1(args):
    index, path, tmp_dir, buckets, options = args
    handles = [storage.open_output(storage.under(tmp_dir, f"b{b:05d}.f{index:05d}")) for b in range(buckets)]
    docs = sentences = 0
    try:
        for doc in read_documents(path, lines_are_sentences=options["lines_are_sentences"],
                                  max_lines_per_document=options["max_lines_per_document"]):
            if options["twitter"]:
                doc = [normalise_twitter(s) for s in doc]
            doc = [s for s in doc if len(s) >= options["min_sentence_chars"]]
            if len(doc) < options["min_sentences"]:
                continue
            text = "\n".join(doc)
            handles[_bucket_of(text, buckets)].write(text + "\n\n")
            docs += 1
            sentences += len(doc)
    finally:
        for h in handles:
            h.close()
    return docs, sentences


def _stored_documents(path: str):
    """Documents of a bucket part file (blank-line separated), one at a time."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line == "\n":
                if lines:
                    yield "".join(lines)[:-1]
                lines = []
            else:
                lines.append(line)
    if lines:
        yield "".join(lines).rstrip("\n")


def _pass2(args):
    bucket, tmp_dir, output = args
    # 16-byte digests only: memory grows with the bucket's document count, never with its text.
    seen, kept, dropped = set(), 0, 0
    parts = sorted(p for p in os.listdir(tmp_dir) if p.startswith(f"b{bucket:05d}."))
    directory, name = os.path.split(output)
    tmp_out = output + ".tmp"
    with storage.open_output(storage.under(directory, name + ".tmp")) as out:
        for part in parts:  # file order, then document order: deterministic output
            for doc in _stored_documents(os.path.join(tmp_dir, part)):
                key = hashlib.blake2b(doc.encode("utf-8"), digest_size=16).digest()
                if key in seen:
                    dropped += 1
                    continue
                seen.add(key)
                out.write(doc + "\n\n")
                kept += 1
            os.remove(os.path.join(tmp_dir, part))
    storage.move(tmp_out, storage.under(directory, name))
    return kept, dropped


def prepare_corpus(inputs: list[str], output_dir: str, *, shards: int = 8, workers: int = 2,
                   lines_are_sentences: bool = False, twitter: bool = False, max_lines_per_document: int = 0,
                   min_sentence_chars: int = 1, min_sentences: int = 1, progress: bool = True) -> dict:
    """Writes <output_dir>/corpus-SSSSS-of-NNNNN.txt; returns counts."""
    missing = [p for p in inputs if not os.path.lexists(p)]
    if missing:
        raise FileNotFoundError(f"input files not found: {missing}")
    for p in inputs:  # the workers read them: each a regular file, before any is opened
        storage.readable_file(p, "input file")
    open_files_for(shards + 64, f"--shards={shards}: a worker holds one bucket file per shard open")
    storage.makedirs(storage.under(output_dir))
    tmp_dir = os.path.join(output_dir, ".buckets")
    shutil.rmtree(tmp_dir, ignore_errors=True)  # parts of an interrupted run would be mixed in
    # Bucket files hold the corpus once; while a bucket is deduplicated its shard grows before
    # each part is deleted, by up to one part (an input's share of a bucket) per worker. 10% over
    # for --twitter's placeholders, which can be longer than what they replace.
    sizes = [os.path.getsize(p) for p in inputs]
    needed = sum(sizes) + min(max(1, workers), shards) * -(-max(sizes, default=0) // shards)
    storage.check_free_space(output_dir, int(1.1 * needed), what=f"the prepared corpus of {len(inputs)} file(s)")
    storage.makedirs(storage.under(output_dir, ".buckets"))
    options = dict(lines_are_sentences=lines_are_sentences, twitter=twitter,
                   max_lines_per_document=max_lines_per_document, min_sentence_chars=min_sentence_chars,
                   min_sentences=min_sentences)
    ctx = get_context("spawn")  # no fork after JAX/threads have started
    try:
        return _run_passes(ctx, inputs, output_dir, tmp_dir, shards, workers, options, progress)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)  # an input refused mid-way leaves no partial buckets
        raise


def _run_passes(ctx, inputs, output_dir, tmp_dir, shards, workers, options, progress) -> dict:
    with ctx.Pool(max(1, workers)) as pool:
        jobs = [(i, p, tmp_dir, shards, options) for i, p in enumerate(inputs)]
        docs = sentences = 0
        for d, s in tqdm(pool.imap_unordered(_pass1, jobs), total=len(jobs), desc="split", disable=not progress):
            docs, sentences = docs + d, sentences + s
        outputs = [os.path.join(output_dir, f"corpus-{b:05d}-of-{shards:05d}.txt") for b in range(shards)]
        kept = dropped = 0
        for k, d in tqdm(pool.imap(_pass2, [(b, tmp_dir, outputs[b]) for b in range(shards)]), total=shards,
                         desc="dedup", disable=not progress):
            kept, dropped = kept + k, dropped + d
    os.rmdir(tmp_dir)
    return {"documents_in": docs, "sentences_in": sentences, "documents_kept": kept, "duplicates_dropped": dropped,
            "shards": outputs}
