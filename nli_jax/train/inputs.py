"""The workdir's fingerprint of a run's inputs (`inputs.json`): every dataset file the run read,
the tokenizer's files, the files of `model.init` and any other input a task names (the
pretraining corpus). A rerun in the same workdir (a resume, or a finished run evaluated again)
on different inputs is refused, naming what changed, as config.json does for config keys.

Files up to 64 MiB are hashed whole (sha256); bigger ones (checkpoints, corpora) by their size
and the sha256 of their first, middle and last MiB, so a 1.3 GB checkpoint costs milliseconds.
Paths are absolute; a file is "changed", "added" or "removed".
"""
from __future__ import annotations

import hashlib
import json
import os

import jax

from nli_jax import storage
from nli_jax.errors import RunError

INPUTS_FILE = "inputs.json"
FORMAT = 1
WHOLE_FILE_LIMIT = 64 << 20
_MIB = 1 << 20

# Files of a tokenizer directory (others in it, such as weights, are not the tokenizer's).
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "spiece.model", "sentencepiece.bpe.model", "spm.model", "vocab.json", "merges.txt")


class InputsChangedError(RunError):
    """The workdir trained on other inputs than this command's; names the files."""


def file_digest(path: str) -> str:
    """The digest of a regular file (the read gate first: a FIFO or /dev/zero would never end)."""
    size = storage.path(storage.readable_file(path, "input file")).stat().length
    h = hashlib.sha256()
    with storage.open(path, "rb") as f:
        if size <= WHOLE_FILE_LIMIT:
            for chunk in iter(lambda: f.read(_MIB), b""):
                h.update(chunk)
            return f"sha256:{h.hexdigest()}"
        for offset in (0, size // 2, size - _MIB):
            f.seek(offset)
            h.update(f.read(_MIB))
    return f"size:{size},sha256-first-middle-last-MiB:{h.hexdigest()}"


def _directory_files(directory: str, keep) -> dict[str, str]:
    return {storage.origin(os.path.join(directory, name)): file_digest(os.path.join(directory, name))
            for name in storage.listdir(directory)
            if keep(name) and storage.isfile(os.path.join(directory, name))}


def tokenizer_files(directory: str) -> dict[str, str]:
    return _directory_files(directory, lambda name: name in TOKENIZER_FILES)


def model_files(directory: str) -> dict[str, str]:
    """config.json and the weights (safetensors, PyTorch pickles and their shard indexes)."""
    return _directory_files(directory, lambda name: name == "config.json" or name.endswith(
        (".safetensors", ".bin", ".index.json", ".msgpack")))


def fingerprint(*, data: dict[str, str] | None = None, files=None, tokenizer_dir: str | None = None,
                model_dir: str | None = None) -> dict:
    """{"format", "data", "files", "tokenizer", "model.init"}: each {path: digest}, for the parts
    given. `data`: digests of the dataset files the readers read (readers.recording_reads);
    `files`: other input files a task names (Task.input_files, e.g. the pretraining corpus)."""
    out = {"format": FORMAT}
    if data is not None:
        out["data"] = dict(sorted(data.items()))
    if files is not None:
        out["files"] = {storage.origin(p): file_digest(p) for p in sorted(files)}
    if tokenizer_dir:
        out["tokenizer"] = tokenizer_files(tokenizer_dir)
    if model_dir:
        out["model.init"] = model_files(model_dir)
    return out


def read_inputs(workdir: str) -> dict | None:
    path = os.path.join(workdir, INPUTS_FILE)
    try:
        return storage.read_json_object(path)
    except ValueError as e:  # UnicodeDecodeError included
        raise InputsChangedError(f"{path} is unreadable ({type(e).__name__}: {e}); the inputs this workdir trained "
                                 "on are unknown: use a new --workdir, or delete the old one to start over") from None


def differences(recorded: dict, current: dict, parts=None) -> list[str]:
    """What changed between two fingerprints, part by part ("data file X changed", ...)."""
    out = []
    for part in parts or [p for p in current if p != "format"]:
        if part not in recorded or part not in current:
            continue
        before, now = recorded[part], current[part]
        label = {"data": "data file", "files": "input file", "tokenizer": "tokenizer file",
                 "model.init": "model.init file"}.get(part, part)
        for path in sorted(set(before) | set(now)):
            if path not in now:
                out.append(f"{label} {path} is no longer read (removed or renamed)")
            elif path not in before:
                out.append(f"{label} {path} was not read before (added)")
            elif before[path] != now[path]:
                out.append(f"{label} {path} changed")
    return out


def check_inputs(workdir: str, current: dict, *, trained: bool, parts=None) -> None:
    """Refuses a workdir that trained on other inputs (those of `parts`, default all in
    `current`). Without trained state there is nothing to mix, and the new inputs are recorded."""
    recorded = read_inputs(workdir)
    if recorded is None or not trained:
        return
    changed = differences(recorded, current, parts)
    if changed:
        shown = "; ".join(changed[:8]) + (f"; and {len(changed) - 8} more" if len(changed) > 8 else "")
        raise InputsChangedError(
            f"workdir {workdir} trained on other inputs than this command's ({shown}). Resuming would mix them: "
            "restore the original files, or use a new --workdir (or delete the old one) to start over; to evaluate "
            "its parameters on other data, use python -m finetune.evaluate.")


def write_inputs(workdir: str, current: dict) -> None:
    if jax.process_index() != 0:
        return
    storage.write_text(storage.under(workdir, INPUTS_FILE), json.dumps(current, indent=2, sort_keys=True))
