"""Corpus tools at Indo4B scale: create_examples restarts where it stopped after a SIGKILL and
never leaves shards a run would read as complete; settings changes rebuild; free disk space is
checked before anything is written; the vocabulary trains on a seeded sample of a large corpus.
(Memory and throughput on 0.3 GB and 3 GB corpora: python -m benchmarks.corpus_at_scale.)"""
import collections
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from nli_jax import storage
from nli_jax.pretraining.corpus import prepare_corpus
from nli_jax.pretraining.examples import META, ExampleSource, create_examples
from nli_jax.pretraining.vocab import sample_lines, train_vocabulary

CORPUS_FILES = ("detik_news_2025.txt", "panl_bppt.txt", "wiki_tydiqa_idkmrc.txt", "tweets_indolem_threads.txt")


@pytest.fixture(scope="module")
def corpus(shared_data):
    return [str(shared_data / "id_corpus_sample" / name) for name in CORPUS_FILES]


def _records(directory):
    """{file name: [record bytes]} of every array_record shard in `directory`."""
    from array_record.python.array_record_module import ArrayRecordReader
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".array_record"):
            reader = ArrayRecordReader(os.path.join(directory, name))
            out[name] = list(reader.read(list(range(reader.num_records()))))
            reader.close()
    return out


def _cli(output_dir, corpus, vocab, *extra):
    return [sys.executable, "-m", "pretrain.create_examples", f"--corpus={','.join(corpus)}", f"--vocab_dir={vocab}",
            f"--output_dir={output_dir}", "--workers=1", *extra]


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_create_examples_killed_then_rerun_keeps_finished_shards_and_matches(corpus, minilm_dir, tmp_path):
    reference = tmp_path / "reference"
    meta = create_examples(corpus, minilm_dir, str(reference), workers=1, progress=False)
    assert meta["counts"]["train"] > 10_000 and meta["reused_shards"] == 0

    run = tmp_path / "run"
    proc = subprocess.Popen(_cli(run, corpus, minilm_dir), cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (run / "shard-00000.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its worker, mid-run
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    finished = sorted(p.name for p in run.glob("shard-*.json"))
    assert 1 <= len(finished) < len(corpus), finished
    # Interrupted: no examples.json, so neither a pretraining run nor ExampleSource takes it as built.
    assert not (run / META).exists()
    with pytest.raises(FileNotFoundError, match="create_examples"):
        ExampleSource(str(run), "train")
    finished_records = {name: records for name, records in _records(run).items()
                        if name.split("-")[1].split(".")[0] in {f.split("-")[1].split(".")[0] for f in finished}}

    rerun = subprocess.run(_cli(run, corpus, minilm_dir), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    rebuilt = storage.read_json_object(str(run / META))
    assert rebuilt["reused_shards"] == len(finished)
    assert rebuilt["counts"] == meta["counts"] and rebuilt["words"] == meta["words"]
    # The finished shards were kept as they were, and the whole set is what an uninterrupted run writes.
    after = _records(run)
    for name, records in finished_records.items():
        assert after[name] == records
    assert after == _records(reference)
    assert not [p for p in os.listdir(run) if p.endswith(".tmp")]
    assert len(ExampleSource(str(run), "train")) == meta["counts"]["train"]


def test_create_examples_rebuilds_shards_of_other_settings_and_drops_extra_ones(corpus, minilm_dir, tmp_path):
    out = tmp_path / "examples"
    create_examples(corpus, minilm_dir, str(out), max_seq_length=128, workers=2, progress=False)
    assert create_examples(corpus, minilm_dir, str(out), max_seq_length=128, workers=2,
                           progress=False)["reused_shards"] == len(corpus)  # same settings: nothing to redo
    meta = create_examples(corpus[:3], minilm_dir, str(out), max_seq_length=64, workers=2, progress=False)
    assert meta["reused_shards"] == 0 and meta["shards"] == 3
    names = sorted(os.listdir(out))
    assert "train-00003.array_record" not in names and "shard-00003.json" not in names
    source = ExampleSource(str(out), "train")
    assert len(source) == meta["counts"]["train"]
    assert max(len(r["a"]) + len(r["b"]) for r in source.get_many(range(0, len(source), 97))) <= 64 - 3


def test_a_shard_truncated_under_its_marker_is_rebuilt(corpus, minilm_dir, tmp_path):
    """A host crash can leave a marker beside a shard cut short (the markers record each
    file's size; data is fsynced before them): that shard is rebuilt, the others kept."""
    out = tmp_path / "examples"
    meta = create_examples(corpus[:2], minilm_dir, str(out), workers=1, progress=False)
    reference = _records(out)
    train = out / "train-00001.array_record"
    with open(train, "r+b") as f:
        f.truncate(train.stat().st_size // 2)
    rebuilt = create_examples(corpus[:2], minilm_dir, str(out), workers=1, progress=False)
    assert rebuilt["reused_shards"] == 1 and rebuilt["counts"] == meta["counts"]
    assert _records(out) == reference


def test_free_space_counts_what_a_rebuild_deletes(corpus, minilm_dir, tmp_path, monkeypatch):
    """Rebuilding in place with other settings on a disk that holds one build is not refused:
    the previous build's shards, deleted first, count as free."""
    out = tmp_path / "examples"
    create_examples(corpus[:2], minilm_dir, str(out), workers=1, progress=False)
    built = sum(p.stat().st_size for p in out.iterdir())
    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: Usage(10 << 30, (10 << 30) - built // 2, built // 2))
    meta = create_examples(corpus[:2], minilm_dir, str(out), seed=7, workers=1, progress=False)
    assert meta["reused_shards"] == 0 and meta["seed"] == 7
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: Usage(10 << 30, (10 << 30) - 1000, 1000))
    with pytest.raises(storage.DiskSpaceError):  # and with the disk full, refused before deleting anything
        create_examples(corpus[:2], minilm_dir, str(out), seed=8, workers=1, progress=False)
    assert (out / "examples.json").exists() and (out / "train-00000.array_record").exists()


def test_a_document_longer_than_a_window_is_cut_into_bounded_pieces(tmp_path):
    """A source without document breaks (one 'document' of 4,000 lines) still tokenises in
    bounded windows, each with several documents for NSP's random segments."""
    from nli_jax.pretraining.examples import _windows
    path = tmp_path / "one_document.txt"
    lines = [f"kalimat nomor {i} " + "kata " * (i % 17) for i in range(4000)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    windows = list(_windows(str(path), 20_000))
    assert len(windows) > 5
    assert all(sum(len(line) for doc in w for line in doc) <= 1.75 * 20_000 and len(w) >= 2 for w in windows)
    assert [line for w in windows for doc in w for line in doc] == [line.strip() for line in lines]


def test_free_disk_space_is_checked_before_anything_is_written(corpus, minilm_dir, tmp_path, monkeypatch):
    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda p: Usage(10 << 30, (10 << 30) - 5_000_000, 5_000_000))
    out = tmp_path / "examples"
    with pytest.raises(storage.DiskSpaceError, match=rf"{out}: examples for 4 corpus shard\(s\) need about 0.0\d GB "
                                                     r"but its file system has 0.01 GB free"):
        create_examples(corpus, minilm_dir, str(out), workers=1, progress=False)
    assert not out.exists() or not os.listdir(out)
    with pytest.raises(storage.DiskSpaceError, match="the prepared corpus of 4 file"):
        prepare_corpus(corpus, str(tmp_path / "corpus"), shards=2, workers=1, lines_are_sentences=True, progress=False)
    assert not os.path.exists(tmp_path / "corpus" / ".buckets")


def test_vocabulary_trains_on_a_seeded_sample_of_a_large_corpus(corpus, tmp_path):
    lines = sum(1 for f in corpus for _ in open(f, encoding="utf-8"))
    first = sample_lines(corpus, 20_000, storage.under(tmp_path, "a.txt"), seed=1)
    second = sample_lines(corpus, 20_000, storage.under(tmp_path, "b.txt"), seed=1)
    other = sample_lines(corpus, 20_000, storage.under(tmp_path, "c.txt"), seed=2)
    sampled = open(first[0], encoding="utf-8").read().splitlines()
    assert lines > 100_000 and abs(len(sampled) - 20_000) < 1_000  # non-blank lines of ~20,000 drawn
    assert open(second[0]).read() == open(first[0]).read() != open(other[0]).read()
    source = set(line.rstrip("\n") for f in corpus for line in open(f, encoding="utf-8"))
    assert all(line in source and line.strip() for line in sampled)
    assert sample_lines(corpus, lines, storage.under(tmp_path, "d.txt")) == corpus  # small enough: every line
    vocab = train_vocabulary(corpus, str(tmp_path / "vocab"), vocab_size=3000, sample_sentences=20_000)
    tokens = open(os.path.join(vocab, "vocab.txt"), encoding="utf-8").read().splitlines()
    assert len(tokens) == 3000 and {"yang", "dan", "[MASK]"} <= set(tokens)
    assert not [p for p in os.listdir(vocab) if p.startswith("tmp")]  # the sample is not left behind


def test_word_cache_encoding_equals_whole_sentences_and_windows_cover_the_shard(corpus, minilm_dir, tmp_path):
    """encode_sentences (each distinct word encoded once) gives the ids of encoding whole
    sentences, on real text and on characters BERT deletes or splits at; shards processed in
    many small windows give the words and about the examples of one window."""
    from nli_jax.pretraining.examples import _windows, encode_sentences
    from nli_jax.pretraining.vocab import load_fast_tokenizer
    tokenizer = load_fast_tokenizer(minilm_dir)
    lines = [line.strip() for line in open(corpus[0], encoding="utf-8") if line.strip()][:20_000]
    lines += ["a\x1cb c", "x\u2028y z", "naïve CAFÉ \u0301e", "double  space", "中文字符 mixed", "\x85nel", "\x1c",
              "tab\tand\u00a0nbsp", "[MASK]ed", "x" * 150]
    ids, words = encode_sentences(tokenizer, lines)
    assert [list(i) for i in ids] == [e.ids for e in tokenizer.encode_batch(lines, add_special_tokens=False)]
    assert words == sum(len(line.split()) for line in lines)

    windows = list(_windows(corpus[0], 200_000))
    assert len(windows) > 5 and sum(map(len, windows)) == sum(1 for _ in _windows(corpus[0], 1 << 30) for _ in _)
    assert sum(len(line) for line in windows[-1][0]) and sum(len(l) for d in windows[-1] for l in d) >= 100_000
    small = create_examples(corpus[:1], minilm_dir, str(tmp_path / "small"), window_chars=200_000, workers=1,
                            progress=False)
    whole = create_examples(corpus[:1], minilm_dir, str(tmp_path / "whole"), workers=1, progress=False)
    assert small["words"] == whole["words"] and small["counts"]["heldout"] == whole["counts"]["heldout"]
    assert abs(small["counts"]["train"] / whole["counts"]["train"] - 1) < 0.02


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_shard_memory_does_not_grow_with_the_number_of_windows(corpus, minilm_dir, tmp_path):
    """A shard 4x longer (4x the windows) peaks at about the same Python/numpy memory: nothing
    of a finished window is kept but the held-out documents' own tokens. (Held-out sentences
    kept as views of their window's token stream held every such window to the shard's end:
    2.6x the peak here, 0.65 -> 1.29 GB RSS for a 0.13 -> 0.44 GB shard.)"""
    import tracemalloc
    from nli_jax.pretraining.examples import _shard_job
    text = open(corpus[0], encoding="utf-8").read()
    peaks = {}
    for copies in (1, 4):
        path = tmp_path / f"corpus-{copies}.txt"
        path.write_text(text * copies, encoding="utf-8")
        out = tmp_path / f"examples-{copies}"
        out.mkdir()
        tracemalloc.start()
        try:
            # 10% held out, 100 KB windows: most windows hold a held-out document.
            _, counts, _ = _shard_job((0, str(path), minilm_dir, str(out), 128, 0.1, "nsp", 1, 1, 100, "uint16",
                                       "fingerprint", 100_000))
            peaks[copies] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert counts["heldout"] > 0
    assert peaks[4] < 1.6 * peaks[1], {k: f"{v / 2**20:.1f} MiB" for k, v in peaks.items()}
