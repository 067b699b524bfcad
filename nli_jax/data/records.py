"""One tfds builder for every corpus: validated examples written once as array_record (each
example a JSON record), read back without TensorFlow through `as_data_source`.

The dataset directory is keyed by a fingerprint of the source files, so edited files are never
served stale. With several processes, process 0 writes and the others wait, then read.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
import urllib.request

import jax
import numpy as np
from jax.experimental import multihost_utils

from nli_jax import storage
from nli_jax.errors import disk_full, no_space_left

log = logging.getLogger(__name__)


def download_files(files: dict[str, str], destination: str, required=()) -> str:
    """{filename: url} into `destination` (atomically; existing files are kept). A missing
    optional file (held-out split) is skipped; a missing required one is an error."""
    for filename, url in files.items():
        target = os.path.join(destination, filename)
        if storage.isfile(target):
            continue
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
        except OSError as e:
            if filename in required:
                raise FileNotFoundError(f"could not download {url} ({e}); pass a local directory with "
                                        "data.source instead") from e
            log.info("no %s at %s (%s)", filename, url, e)
            continue
        storage.write_bytes(storage.under(destination, filename), data)  # atomic, mode 0666 less the umask
    return destination


# Part of every dataset directory's key: bump when the stored record format changes, so data
# written by an older nli-jax is never read with the new format.
RECORD_FORMAT = "json-records-v1"


def fingerprint(paths) -> str:
    h = hashlib.sha256(RECORD_FORMAT.encode())
    for path in sorted(paths):
        h.update(os.path.basename(path).encode())
        h.update(hashlib.sha256(storage.read_bytes(path)).digest())
    return h.hexdigest()[:12]


def _builder_class():
    import tensorflow_datasets as tfds  # late: tensorflow_datasets (seconds), only for TFDS-backed data

    class RecordsBuilder(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def __init__(self, *, dataset_name: str, examples: dict[str, list[dict]], description: str = "", **kwargs):
            self._dataset_name, self._examples, self._description = dataset_name, examples, description
            super().__init__(**kwargs)

        @property
        def name(self):  # one directory per corpus
            return self._dataset_name

        # grain's worker processes (data.workers) receive the sources pickled: tfds rebuilds a
        # builder from the arguments it recorded, which lack these. The dataset is prepared by
        # then: a worker reads its files and needs no examples.
        def __getstate__(self):
            return dict(super().__getstate__(), _nli_jax=(self._dataset_name, self._description))

        def __setstate__(self, state):
            name, description = state["_nli_jax"]
            self.__init__(dataset_name=name, examples={}, description=description, **state["_original_state"])

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, description=self._description, features=tfds.features.FeaturesDict(
                {"idx": np.int64, "record": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(split) for split in self._examples}

        def _generate_examples(self, split):
            for ex in self._examples[split]:
                yield ex["idx"], {"idx": ex["idx"], "record": json.dumps(ex, ensure_ascii=False, sort_keys=True)}

    return RecordsBuilder


_SORT_LOCK = threading.Lock()


@contextlib.contextmanager
def _records_sorted_in_memory():
    """tfds' writer sorts a split's records by key in memory up to 1 GiB and spills beyond that
    into temporary buckets through tf.io.gfile, i.e. TensorFlow, which nli-jax does not install.
    The examples are in memory already (the reader made them), so sorting their records there
    costs their size once more and writes them in the same order as the buckets would."""
    from tensorflow_datasets.core import shuffle  # late: as tensorflow_datasets above
    with _SORT_LOCK:
        limit = shuffle.MAX_MEM_BUFFER_SIZE
        shuffle.MAX_MEM_BUFFER_SIZE = float("inf")
        try:
            yield
        finally:
            shuffle.MAX_MEM_BUFFER_SIZE = limit


def prepare_records(name: str, examples: dict[str, list[dict]], source_files, data_dir: str,
                    description: str = "") -> dict[str, "RecordSource"]:
    """Writes {split: [example dicts with 'idx']} as array_record; returns random-access sources."""
    import tensorflow_datasets as tfds  # late: tensorflow_datasets (seconds), only for TFDS-backed data
    tfds.disable_progress_bar()
    config = tfds.core.BuilderConfig(name=f"files_{fingerprint(source_files)}", description=description)
    remote = storage.is_remote(data_dir)
    # array_record's C++ reader and writer take local files: a gs:// data_dir is a shared cache
    # of the prepared dataset, built once (by process 0) and copied into each process's scratch.
    local_dir = (os.path.join(storage.scratch_dir(), "tfds", hashlib.sha256(data_dir.encode()).hexdigest()[:16])
                 if remote else storage.output_dir(storage.under(data_dir)))  # tfds writes in it

    def make_builder():  # tfds reads a prepared dataset's info when the builder is made
        return _builder_class()(dataset_name=name, examples=examples, description=description, config=config,
                                data_dir=local_dir, file_format="array_record")

    builder = make_builder()
    local = os.fspath(builder.data_dir)
    shared = os.path.join(data_dir, os.path.relpath(local, local_dir)) if remote else None
    marker = "dataset_info.json"  # uploaded last: its presence in the bucket means complete

    def prepare(builder):
        try:
            with _records_sorted_in_memory():
                builder.download_and_prepare()
        except Exception as e:
            if no_space_left(e):
                raise disk_full(e, f"the array_record copy of {name}", local_dir,
                                "the partial copy is rebuilt (or set --config.data.tfds_dir to another disk)") from None
            raise

    def build_once():
        if remote and storage.isfile(os.path.join(shared, marker)):
            return
        prepare(builder)
        if remote:
            for rel in storage.walk_files(local):
                if rel != marker:
                    storage.copy(os.path.join(local, rel), storage.under(shared, *rel.split("/")))
            storage.copy(os.path.join(local, marker), storage.under(shared, marker))

    if jax.process_count() > 1:
        if jax.process_index() == 0:
            build_once()
        multihost_utils.sync_global_devices(f"nli_jax prepare {name} {config.name}")
    elif remote:
        build_once()
    if remote and not os.path.isfile(os.path.join(local, marker)):
        storage.copytree(shared, storage.under(local))
    with _building(local_dir, name):  # concurrent first runs sharing a tfds_dir: one builds, the others wait
        builder = verified(make_builder, prepare, examples)
    return {split: RecordSource(builder.as_data_source(split=split)) for split in examples}


# --- what the copy holds is what this run reads ---------------------------------------------
# A prepared copy records the digest of the examples it was built from (the validated rows of
# the source files, as the run has them in memory) and of each of its own files. A copy whose
# record differs (built from other files and put in this one's place, a shard truncated or
# swapped, an older nli-jax's copy without a record) is built again, said in one log line.
VERIFIED_FILE = "nli_jax_records.json"


def examples_digest(examples: dict[str, list[dict]]) -> str:
    digest = hashlib.sha256(RECORD_FORMAT.encode())
    for split in sorted(examples):
        digest.update(f"\0{split}\0".encode())
        for example in examples[split]:
            digest.update(json.dumps(example, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n")
    return "sha256:" + digest.hexdigest()


def files_digest(directory: str) -> dict[str, str]:
    """{file: sha256} of every file of a prepared copy but its record."""
    out = {}
    for rel in storage.walk_files(directory):
        if rel != VERIFIED_FILE:
            out[rel] = "sha256:" + hashlib.sha256(storage.read_bytes(os.path.join(directory, rel))).hexdigest()
    return out


def copy_problem(directory: str, expected: str) -> str | None:
    """Why the prepared copy in `directory` is not one of these examples, or None."""
    try:
        record = storage.read_json_object(os.path.join(directory, VERIFIED_FILE))
    except ValueError as e:
        return f"its {VERIFIED_FILE} is unreadable ({e})"
    if record is None:
        return f"it has no {VERIFIED_FILE} (an interrupted build, or an older nli-jax's copy)"
    if record.get("examples") != expected:
        return "it was built from other examples than this run's files hold"
    files, written = files_digest(directory), record.get("files") or {}
    changed = sorted(set(files) ^ set(written) | {f for f in files if f in written and files[f] != written[f]})
    if changed:
        return f"its files differ from those written ({', '.join(changed[:3])})"
    return None


def verified(make_builder, prepare, examples):
    """The prepared builder of `examples`, its copy checked against its record (rebuilt when
    that differs) and the record written after a build."""
    builder = make_builder()
    directory = os.fspath(builder.data_dir)
    expected = examples_digest(examples)
    if os.path.isfile(os.path.join(directory, "dataset_info.json")):
        problem = copy_problem(directory, expected)
        if problem is None:
            return builder
        log.warning("%s: %s; building it again", directory, problem)
        storage.rmtree(directory)
        builder = make_builder()
    prepare(builder)
    record = {"examples": expected, "files": files_digest(directory)}
    storage.write_text(storage.under(os.path.dirname(directory), os.path.basename(directory), VERIFIED_FILE),
                       json.dumps(record, indent=1, sort_keys=True))
    return builder


@contextlib.contextmanager
def _building(local_dir: str, name: str):
    """An flock on <local_dir>/.<name>.lock while the copy is checked or built (released by the
    kernel when the holder dies)."""
    fd = storage.open_lock(storage.under(local_dir, f".{name}.lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class RecordSource:
    """Decoded examples of one split. Records come back in tfds' write order; `idx` gives the
    order of the original file."""

    def __init__(self, source):
        self._source = source
        # grain's prefetch threads read concurrently; the tfds source is not thread-safe.
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"_source": self._source}

    def __setstate__(self, state):
        self.__init__(state["_source"])

    def __len__(self):
        return len(self._source)

    def __getitem__(self, index):
        return self.get_many([index])[0]

    def get_many(self, indices):
        with self._lock:
            records = self._source.__getitems__([int(i) for i in indices])
        return [json.loads(r["record"].decode("utf-8") if isinstance(r["record"], bytes) else r["record"])
                for r in records]


def read_many(source, indices, chunk: int = 4096):
    """The examples of `source` at `indices`, in order: batched reads of `chunk` where the source
    has `get_many` (array_record reads a batch in parallel; one read per example costs a thread
    pool's start each: 10 of a 25 s SmSA run went there), one by one otherwise."""
    indices = [int(i) for i in indices]
    get_many = getattr(source, "get_many", None)
    if get_many is None:
        return [source[i] for i in indices]
    out = []
    for start in range(0, len(indices), chunk):
        out.extend(get_many(indices[start:start + chunk]))
    return out


class InMemorySource(list):
    """A list of examples standing in for a RecordSource (carved and mixed splits)."""
