"""Readers (errors name file and line), the IndoNLI builder, and the grain pipeline pieces."""
import json

import numpy as np
import pytest

from nli_jax.data import fixture_path, nli, pipeline
from nli_jax.data.readers import DataError
from nli_jax.tasks.indonli import INDONLI


def _write_indonli(tmp_path, train_lines, val_lines=None):
    (tmp_path / "train.jsonl").write_bytes(train_lines if isinstance(train_lines, bytes) else
                                           "\n".join(train_lines).encode("utf-8"))
    good = json.dumps({"premise": "Budi makan.", "hypothesis": "Budi lapar.", "label": "n"})
    (tmp_path / "val.jsonl").write_text("\n".join(val_lines or [good]), encoding="utf-8")
    return str(tmp_path)


GOOD = json.dumps({"premise": "Ani membaca buku.", "hypothesis": "Ani membaca.", "label": "e"})


@pytest.mark.parametrize("bad,message", [
    ('{"premise": "a", "hypothesis": ', r"train.jsonl:2: malformed JSON"),
    ('{"premise": "a", "hypothesis": "b", "label": "x"}', r"train.jsonl:2: unknown label 'x'"),
    ('{"premise": "a", "label": "e"}', r"train.jsonl:2: missing field 'hypothesis'"),
    ('{"premise": "  ", "hypothesis": "b", "label": "e"}', r"train.jsonl:2: field 'premise' is empty"),
    ('{"premise": "a", "hypothesis": "b"}', r"train.jsonl:2: missing field 'label'"),
    ('["premise"]', r"train.jsonl:2: expected a JSON object"),
])
def test_bad_rows_name_file_and_line(tmp_path, bad, message):
    source = _write_indonli(tmp_path, [GOOD, bad, GOOD])
    with pytest.raises(DataError, match=message):
        nli.load_examples(INDONLI, source)


def test_non_utf8_file_names_the_line(tmp_path):
    source = _write_indonli(tmp_path, GOOD.encode() + b"\n" + GOOD.encode() + b"\n" +
                            '{"premise": "caf\xe9", "hypothesis": "b", "label": "e"}'.encode("latin-1"))
    with pytest.raises(DataError, match=r"train.jsonl:3: not UTF-8"):
        nli.load_examples(INDONLI, source)


def test_missing_required_split_is_named(tmp_path):
    (tmp_path / "val.jsonl").write_text(GOOD)
    with pytest.raises(FileNotFoundError, match=r"train.jsonl not found"):
        nli.load_examples(INDONLI, str(tmp_path))


def test_diagnostic_is_one_json_array_and_tags_come_from_the_file(tmp_path):
    source = _write_indonli(tmp_path, [GOOD])
    (tmp_path / "diagnostic.jsonl").write_text(json.dumps([
        {"pair_id": 1, "label": "c", "premise": "a b", "hypothesis": "c", "inference_phenomena": ["NEG", "QUANT"]},
        {"pair_id": 2, "label": "e", "premise": "a", "hypothesis": "a", "inference_phenomena": ["NEWTAG"]}]))
    examples = nli.load_examples(INDONLI, source)
    assert [e["tags"] for e in examples["diagnostic"]] == [["NEG", "QUANT"], ["NEWTAG"]]
    assert [e["label"] for e in examples["diagnostic"]] == [2, 0]


def test_fixed_label_order():
    assert nli.NLI_LABELS == ("entailment", "neutral", "contradiction")


def test_builder_writes_array_record_and_reads_it_back(tmp_path):
    splits = nli.prepare("indonli", fixture_path("nli_tiny"), str(tmp_path / "tfds"))
    assert {k: len(v) for k, v in splits.items()} == {"train": 300, "validation": 60, "test_lay": 60,
                                                      "test_expert": 60, "diagnostic": 30}
    files = list((tmp_path / "tfds").rglob("*.array_record*"))
    assert files, "expected array_record files"
    expected = nli.load_examples(INDONLI, fixture_path("nli_tiny"))["validation"]
    got = sorted((splits["validation"][i] for i in range(60)), key=lambda e: e["idx"])
    assert got == expected


def _record_order(splits):
    return {name: [source[i]["idx"] for i in range(len(source))] for name, source in splits.items()}


def test_a_split_past_tfds_memory_buffer_is_written_without_tensorflow(tmp_path, monkeypatch):
    """tfds spills a split of over 1 GiB (its MAX_MEM_BUFFER_SIZE) through tf.io.gfile, and
    TensorFlow is not installed: with the buffer at 1 byte every split crosses it here, and the
    records come back complete and in the order of an ordinary build."""
    from tensorflow_datasets.core import shuffle
    ordinary = _record_order(nli.prepare("indonli", fixture_path("nli_tiny"), str(tmp_path / "ordinary")))
    monkeypatch.setattr(shuffle, "MAX_MEM_BUFFER_SIZE", 1)
    splits = nli.prepare("indonli", fixture_path("nli_tiny"), str(tmp_path / "spilled"))
    assert _record_order(splits) == ordinary
    assert shuffle.MAX_MEM_BUFFER_SIZE == 1  # the library's own limit is restored


@pytest.mark.slow
def test_a_training_split_over_one_gib_is_written_and_read_back(tmp_path):
    """1.1 GiB of training records (1,100 pairs with 1 MiB premises), past tfds' own in-memory
    limit, through the same writer (array_record compresses them to a few MiB on disk)."""
    from tensorflow_datasets.core import shuffle
    from nli_jax.data import records
    premise = "kata " * 209_716  # 1 MiB
    train = [{"idx": i, "premise": premise, "hypothesis": f"hipotesis {i}", "label": i % 3} for i in range(1100)]
    (tmp_path / "source.txt").write_text("one source file")
    splits = records.prepare_records("big", {"train": train}, [str(tmp_path / "source.txt")], str(tmp_path / "tfds"))
    assert len(premise.encode()) * len(train) > max(shuffle.MAX_MEM_BUFFER_SIZE, 1 << 30)
    got = splits["train"]
    assert len(got) == 1100 and sorted(got[i]["idx"] for i in range(1100)) == list(range(1100))
    assert got[7]["premise"] == premise


def test_real_indonli_counts(shared_data, tmp_path):
    examples = nli.load_examples(INDONLI, str(shared_data / "indonli"))
    assert len(examples["train"]) == 10330 and len(examples["validation"]) == 2197
    sizes = {e["categories"]["sentence_size"] for e in examples["train"]}
    assert sizes == {"single", "double", "multiple"}


def test_download_from_a_local_server(tmp_path):
    """The download path for real users, served from 127.0.0.1."""
    import functools
    import http.server
    import threading
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=fixture_path("nli_tiny"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        target = nli.download_corpus(INDONLI, str(tmp_path / "dl"), base_url=base)
        assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == sorted(
            ["train.jsonl", "val.jsonl", "test_lay.jsonl", "test_expert.jsonl", "diagnostic.jsonl"])
        assert len(nli.load_examples(INDONLI, target)["train"]) == 300
    finally:
        server.shutdown()


def test_pad_batch_uses_the_smallest_bucket():
    rows = [{"input_ids": np.arange(5), "label": np.int32(1)}, {"input_ids": np.arange(9), "label": np.int32(0)}]
    out = pipeline.Batching(buckets=(8, 16, 32), pad_values=(("input_ids", 0),)).pad(rows)
    assert out["input_ids"].shape == (2, 16) and out["label"].tolist() == [1, 0]
    assert out["input_ids"][0, 5:].sum() == 0


def test_eval_batches_visit_every_example_once_per_process():
    source = [{"x": i} for i in range(11)]
    encode = lambda e: {"idx": np.int32(e["x"])}
    stack = pipeline.Batching(buckets=(8,), pad_values=())  # no token fields: rows are stacked
    seen, counts = [], []
    for pi in range(2):
        batches = list(pipeline.eval_batches(source, encode, stack, local_batch_size=4,
                                             dummy={"idx": np.int32(-1)}, process_index=pi, process_count=2))
        counts.append(len(batches))
        for b in batches:
            seen += [int(i) for i, w in zip(b["idx"], b["weight"]) if w > 0]
            assert all(i == -1 for i, w in zip(b["idx"], b["weight"]) if w == 0)
    assert counts[0] == counts[1] == 2
    assert sorted(seen) == list(range(11))


def test_train_dataset_reshuffles_each_epoch_and_resumes_from_state():
    source = [{"x": i} for i in range(8)]
    encode = lambda e: {"x": np.int32(e["x"])}
    stack = pipeline.Batching(buckets=(8,), pad_values=())  # no token fields: rows are stacked
    make = lambda: iter(pipeline.train_dataset(source, encode, stack, local_batch_size=4, seed=3, num_epochs=3))
    it = make()
    batches = [next(it)["x"].tolist() for _ in range(6)]
    epochs = [sorted(batches[0] + batches[1]), sorted(batches[2] + batches[3])]
    assert epochs[0] == epochs[1] == list(range(8))
    assert batches[0] + batches[1] != batches[2] + batches[3]
    it = make()
    next(it), next(it), next(it)
    state = it.get_state()
    resumed = make()
    resumed.set_state(state)
    assert [next(resumed)["x"].tolist() for _ in range(3)] == batches[3:]


def test_shuffled_index_is_a_permutation_per_epoch():
    for n in (1, 7, 100, 1000, 4099):
        first = pipeline.EpochPermutations(n, seed=3)(np.arange(n))
        second = pipeline.EpochPermutations(n, seed=3)(np.arange(n, 2 * n))
        assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(n))
        if n > 10:
            assert first.tolist() != second.tolist() and first.tolist() != list(range(n))
    np.testing.assert_array_equal(pipeline.EpochPermutations(50, seed=1)(np.arange(50)),
                                  pipeline.EpochPermutations(50, seed=1)(np.arange(50)))
