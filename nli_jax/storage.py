"""One file-system layer for every path nli-jax reads or writes: local paths and gs:// URLs.

Paths stay strings everywhere else (os.path.join/dirname/basename are plain string operations
and keep a URL intact); what touches the file system goes through here, on etils.epath (gcsfs
for gs://, tensorstore for orbax's arrays). A local path is expanded (~) and made absolute; a
URL keeps its scheme. `local_copy` downloads what only a local reader understands (a Hugging
Face directory for transformers, array_record files for the C++ reader) into this process's
scratch directory; `synced_local_file`/`synced_local_dir` give appenders (train.log,
metrics.jsonl, TensorBoard) a local file that is uploaded every few seconds while the run goes.

One way to write: every file nli-jax writes goes through the writer below (`under(directory,
name, ...)` and the functions that take it), which never writes outside the directory it was
given nor through a symbolic link inside it. One gate for every read: `readable_file` refuses a
FIFO, device or directory where a file is expected, by its stat, before anything opens it.

Credentials: on Cloud TPU VMs and GCE the clients use Application Default Credentials. With
STORAGE_EMULATOR_HOST set (tests: gcp-storage-emulator on 127.0.0.1) every client is pointed at
the emulator and sends no credentials.
"""
from __future__ import annotations

import atexit
import errno
import glob as glob_lib
import hashlib
import json
import logging
import os
import shutil
import stat as stat_lib
import sys
import tempfile
import threading
import time
import urllib.parse

import fsspec

from nli_jax.errors import RunError, environment_problem

REMOTE_SCHEMES = ("gs",)
SUPPORTED = "local paths and gs://bucket/path"
# How long a first request to a bucket may take before the run stops naming the path: an
# endpoint that does not answer must fail in seconds, not after gcsfs's minutes of retries.
REACH_TIMEOUT_S = 15.0
SYNC_EVERY_S = 5.0


class StorageError(RunError):
    """A path that cannot be used: unsupported scheme, missing bucket, unreachable endpoint."""


_configured_host: str | None = None


def _configure_emulator() -> None:
    """Points gcsfs and tensorstore at STORAGE_EMULATOR_HOST, without credentials. Only then:
    real runs keep Application Default Credentials and the real endpoint."""
    global _configured_host
    host = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if host == _configured_host or not host:
        return
    _configured_host = host
    if not host.startswith(("http://", "https://")):
        host = "http://" + host
    # gcsfs' hierarchical-namespace probe speaks gRPC to the real control plane: one minute
    # of timeouts per bucket against an emulator.
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = host
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "anonymous")  # tensorstore: no ADC lookup
    for protocol in ("gs", "gcs"):
        # The plain client also when gcsfs was imported before the variable above was set.
        fsspec.register_implementation(protocol, "gcsfs.core.GCSFileSystem", clobber=True)
        fsspec.config.conf.setdefault(protocol, {})["token"] = "anon"


def _configure_gcsfs() -> None:
    """No cached directory listings: other hosts (and a rerun) write the same bucket, and a
    stale listing would hide a file they wrote (process 0's examples.json) or cut a read short
    at an old size (a log another process appended to)."""
    for protocol in ("gs", "gcs"):
        fsspec.config.conf.setdefault(protocol, {})["use_listings_cache"] = False


_configure_gcsfs()
_configure_emulator()


def scheme(p: str) -> str:
    """'' for a local path, else the URL scheme ('gs')."""
    p = os.fspath(p)
    if "://" not in p:
        return ""
    return p.split("://", 1)[0].lower()


def is_remote(p) -> bool:
    return scheme(p) != ""


def check(p) -> str:
    """The path itself, or a StorageError for a scheme nli-jax cannot use."""
    p = os.fspath(p)
    s = scheme(p)
    if s and s not in REMOTE_SCHEMES:
        raise StorageError(f"{p}: unsupported URL scheme {s}:// (nli-jax reads and writes {SUPPORTED})")
    if s and not urllib.parse.urlsplit(p).netloc:
        raise StorageError(f"{p}: no bucket in the URL (expected gs://bucket/path)")
    return p


def resolve(p) -> str:
    """A local path expanded and absolute, a URL without a trailing slash."""
    p = check(p)
    if is_remote(p):
        return p.rstrip("/") if p.rstrip("/") != f"{scheme(p)}:/" else p
    return os.path.abspath(os.path.expanduser(p))


def path(p):
    """etils.epath.Path of a local path or URL (scheme checked)."""
    from etils import epath  # late: ~40 ms of imports that a command line's start (--help) does not need
    p = resolve(p)
    if is_remote(p):
        _configure_emulator()
    return epath.Path(p)


def exists(p) -> bool:
    return path(p).exists()


def isdir(p) -> bool:
    return path(p).is_dir()


def isfile(p) -> bool:
    q = path(p)
    return q.exists() and not q.is_dir()


def listdir(p) -> list[str]:
    """Names in a directory (sorted); [] when it does not exist."""
    q = path(p)
    if not q.is_dir():
        return []
    return sorted(c.name for c in q.iterdir())


def glob(pattern: str) -> list[str]:
    """Files matching a pattern (wildcards in the last components), sorted."""
    pattern = resolve(pattern)
    if not is_remote(pattern):
        return sorted(glob_lib.glob(pattern))
    root, parts = pattern, []
    while any(c in os.path.basename(root) for c in "*?["):
        parts.insert(0, os.path.basename(root))
        root = os.path.dirname(root)
    if not parts:
        return [pattern] if exists(pattern) else []
    return sorted(os.fspath(m) for m in path(root).glob("/".join(parts)))


def open(p, mode: str = "r", encoding: str | None = None):  # noqa: A001 - the storage layer's open
    """A file opened for reading, through the read gate (`readable_file`). Writing goes through
    `open_output` / `open_append`, which take an OutputPath."""
    if any(c in mode for c in "wax+"):
        raise TypeError(f"storage.open({p!r}, {mode!r}): files are written through storage.open_output / "
                        "open_append / write_bytes with storage.under(directory, name, ...)")
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    q = path(readable_file(p))
    return q.open(mode, encoding=encoding) if "b" not in mode else q.open(mode)


def read_bytes(p) -> bytes:
    return path(readable_file(p)).read_bytes()


def read_text(p) -> str:
    return path(readable_file(p)).read_text(encoding="utf-8")


# --- JSON within bounds: what a file holds cannot crash the parser ----------------------------
# Python's json recurses once per nesting level (a RecursionError deep inside it, naming no file)
# and converts integers of any length (a ValueError past 4,300 digits, quadratic time before it).
# Nothing nli-jax reads nests deeper than a few levels or holds integers of more than a few digits.
MAX_JSON_DEPTH = 64
MAX_JSON_DIGITS = 100


class JSONLimitError(ValueError):
    """JSON nested deeper than MAX_JSON_DEPTH or with an integer longer than MAX_JSON_DIGITS."""


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_JSON_DIGITS:
        raise JSONLimitError(f"an integer of {digits} digits (at most {MAX_JSON_DIGITS} are read)")
    return int(text)


def json_decoder(object_pairs_hook=None):
    """A json.JSONDecoder whose integers are bounded (decode with `decode_json`)."""
    return json.JSONDecoder(object_pairs_hook=object_pairs_hook, parse_int=_bounded_int)


def decode_json(decoder, text: str, position: int = 0):
    """(value, end) of the JSON value at `position` of `text`, its nesting depth and integers
    bounded: JSONLimitError (no position: the caller names the file and line) when either is
    exceeded, json.JSONDecodeError for malformed JSON."""
    try:
        value, end = decoder.raw_decode(text, position)
    except RecursionError:
        raise JSONLimitError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    pending = [(value, 1)]
    while pending:  # iteratively: flat rows cost a few steps
        node, depth = pending.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise JSONLimitError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            pending.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return value, end


def loads_json(text: str, object_pairs_hook=None):
    """json.loads within bounds (see decode_json): the whole text is one value."""
    decoder = json_decoder(object_pairs_hook)
    start = len(text) - len(text.lstrip())
    value, end = decode_json(decoder, text, start)
    if text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def read_json_object(p) -> dict | None:
    """The JSON object in file `p`, or None when there is no such file. ValueError (a message
    without the path: callers say what the file is for) when it is not a JSON object, including
    bytes that are not UTF-8, and JSON beyond the bounds of `decode_json`."""
    if not isfile(p):
        return None
    value = loads_json(read_text(p))
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _kind(mode: int) -> str:
    """What a stat mode is, in words (for a path that is not the regular file it should be)."""
    return ("a directory" if stat_lib.S_ISDIR(mode) else "a FIFO" if stat_lib.S_ISFIFO(mode) else
            "a device" if stat_lib.S_ISCHR(mode) or stat_lib.S_ISBLK(mode) else
            "a socket" if stat_lib.S_ISSOCK(mode) else "not a regular file")


# --- the read gate: every file nli-jax reads is a regular, readable file ---------------------
# A FIFO never ends a read (or an open), a device such as /dev/zero never stops giving bytes, a
# directory is not the file that was meant: each is refused by its stat, before anything opens,
# hashes or reads it. storage's own readers pass through here; what a library reads itself
# (safetensors, torch, transformers' tokenizers, ml_collections' config files, the corpus
# workers) is passed through `readable_file` / `readable_files` first.

class NotAFileError(StorageError):
    """A path where a file is expected that is not a regular, readable file; names it."""


def readable_file(p, what: str = "file") -> str:
    """`p` itself when it is a regular file this process can read, else a NotAFileError (a
    directory, FIFO, device or socket, also behind a link) or FileNotFoundError naming it; the
    size of a regular file is known from the same stat. Never opens the path."""
    p = check(os.fspath(p))
    if is_remote(p):
        if not isfile(p):
            raise FileNotFoundError(f"{what} {p} not found")
        return p
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} not found") from None
    except OSError as e:  # ELOOP, ENOTDIR, EACCES on a parent
        raise NotAFileError(f"{what} {p} cannot be read ({os.strerror(e.errno)})") from None
    if not stat_lib.S_ISREG(mode):
        target = f" (a link to {os.path.realpath(p)})" if os.path.islink(p) else ""
        raise NotAFileError(f"{p}{target} is {_kind(mode)}, not a regular file: not read")
    if not os.access(p, os.R_OK):
        raise NotAFileError(f"{what} {p} is not readable by this user (permissions {stat_lib.filemode(mode)})")
    return p


def readable_files(patterns, what: str = "file") -> list[str]:
    """The files that `patterns` (files or globs, local or gs://) name, sorted, each through
    `readable_file`; a pattern that matches nothing is kept, so that the caller names it."""
    files = sorted({f for pattern in patterns if pattern for f in (glob(pattern) or [check(pattern)])})
    for f in files:
        if exists(f) or os.path.islink(f):
            readable_file(f, what)
    return files


# --- the writer: every file nli-jax writes ----------------------------------------------------
# A write names the directory it belongs to and the names under it: `under(directory, name, ...)`
# gives an OutputPath, and every writer here takes only that. Each name is one path component
# (split, task and label names that become file names are checked here, whatever their source),
# so nothing lands outside the directory; and locally nothing below the directory may be a
# symbolic link (lstat on the way down, O_NOFOLLOW on the file itself), so a link planted in a
# workdir (`W/train.log -> ~/.bashrc`, `W/.lock -> another file`, `W/best -> elsewhere`) is
# refused instead of written through. gs:// has no links. The directory itself may be a link
# (a workdir on another disk). Writers nli-jax does not own (orbax, TensorBoard, safetensors,
# the tokenizers' save_pretrained, array_record, tfds) are given a directory checked by
# `output_dir` and write their own names in it.

class UnsafePathError(StorageError):
    """A write outside its directory, through a link inside it, or to a name that is not one
    path component; names the path."""


class OutputPath(str):
    """A path to write, made by `under`: the directory it belongs to (`root`) and the names below it."""
    root: str
    names: tuple

    def __new__(cls, root: str, names: tuple):
        joined = root if not names else (f"{root.rstrip('/')}/{'/'.join(names)}" if is_remote(root)
                                         else os.path.join(root, *names))
        out = super().__new__(cls, joined)
        out.root, out.names = root, names
        return out


def component(name, what: str = "file name") -> str:
    """`name` when it can be one path component (a split, task or label name that becomes part
    of a file name), else an UnsafePathError naming it (`what`: the flag or field it came from)."""
    text = str(name)
    if text in ("", ".", "..") or "/" in text or "\0" in text:
        raise UnsafePathError(f"{what} {text!r} cannot be part of a file name: it must be one path component "
                              "(no '/', not empty, '.' or '..')")
    return text


def under(directory, *names) -> OutputPath:
    """The path `directory/names...` to write, each name one path component (so nothing lands
    outside `directory`)."""
    root = resolve(directory)
    for name in names:
        component(name, f"{root}: the name")
    return OutputPath(root, tuple(str(n) for n in names))


def check_output(p) -> str:
    """The local path or URL of an OutputPath, every existing step below its directory checked
    not to be a symbolic link."""
    if not isinstance(p, OutputPath):
        raise TypeError(f"{p!r}: storage writes take storage.under(directory, name, ...), which names the "
                        "directory a write belongs to")
    if is_remote(p.root):
        return str(p)
    current = p.root
    for name in p.names:
        current = os.path.join(current, name)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break  # created below, by this process
        if stat_lib.S_ISLNK(mode):
            raise UnsafePathError(f"{current} is a symbolic link (to {os.readlink(current)}): nli-jax does not write "
                                  f"through links inside {p.root}; remove the link")
    return str(p)


def _nofollow_open(target: str, flags: int) -> int:
    """os.open without following a link at the file itself, and refusing what is not a regular
    file (a FIFO opened for writing would wait for a reader)."""
    try:
        fd = os.open(target, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{target} is a symbolic link (to {os.readlink(target)}): nli-jax does not write "
                                  "through links; remove the link") from None
        if e.errno == errno.ENXIO:  # a FIFO without a reader
            raise UnsafePathError(f"{target} is a FIFO, not a regular file: not written") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat_lib.S_ISREG(mode):
        os.close(fd)
        raise UnsafePathError(f"{target} is {_kind(mode)}, not a regular file: not written")
    os.set_blocking(fd, True)
    return fd


def makedirs(p) -> str:
    """The directory of an OutputPath, created (with the missing directories above it)."""
    target = check_output(p)
    if not is_remote(target):
        os.makedirs(target, exist_ok=True)
    return target


def output_dir(p, *, synced: bool = False, entries: bool = False) -> str:
    """A checked directory (OutputPath) for a writer nli-jax does not own: created, not a link,
    and with `entries` none of the names already in it a link either (an export's files). With
    `synced`, for gs:// a local directory uploaded every few seconds (TensorBoard)."""
    target = makedirs(p)
    if is_remote(target):
        return synced_local_dir(target) if synced else target
    if entries:
        for name in os.listdir(target):
            check_output(OutputPath(p.root, (*p.names, name)))
    return target


def output_file(p) -> str:
    """A checked file path (OutputPath) for a writer nli-jax does not own that writes one named
    file (safetensors' save_file, array_record's writer): its directory created, nothing on the
    way a link, the file not a link."""
    target = check_output(p)
    if not is_remote(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
    return target


def write_bytes(p, data: bytes) -> None:
    """Atomic: a reader sees the old file or the new one, never a part (a GCS object is
    replaced whole; a local file goes through a temporary name and a rename)."""
    target = check_output(p)
    if is_remote(target):
        path(target).write_bytes(data)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600: readable like every other file
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text(p, text: str) -> None:
    write_bytes(p, text.encode("utf-8"))


def open_output(p, mode: str = "w", encoding: str | None = None):
    """A file (OutputPath) opened for writing from its start ("w", "wb") as a stream: corpus
    shards and buckets, markers. Not atomic: callers write to a temporary name and `move` it."""
    if mode not in ("w", "wb"):
        raise ValueError(f"open_output: mode 'w' or 'wb', got {mode!r}")
    target = check_output(p)
    if is_remote(target):
        return path(target).open(mode) if "b" in mode else path(target).open(mode, encoding=encoding or "utf-8")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd = _nofollow_open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding=encoding or "utf-8")


def append_file(p) -> str:
    """The local file that appends to an OutputPath stand for: itself locally, for gs:// a file
    in the scratch directory uploaded every few seconds (an object cannot be appended to)."""
    target = check_output(p)
    if is_remote(target):
        return synced_local_file(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    return target


def open_append(p):
    """An OutputPath opened for appending (train.log, metrics.jsonl), never through a link."""
    return os.fdopen(_nofollow_open(append_file(p), os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", encoding="utf-8")


def open_lock(p) -> int:
    """A file descriptor of an OutputPath opened read-write, created if absent (a lock file)."""
    target = check_output(p)
    if is_remote(target):
        raise ValueError(f"{target}: a lock file descriptor is local")
    return _nofollow_open(target, os.O_RDWR | os.O_CREAT)


class LogFile(logging.FileHandler):
    """A log handler appending to an OutputPath (train.log, sweep.log) through `open_append`."""

    def __init__(self, p):
        super().__init__(append_file(p), mode="a", encoding="utf-8", delay=True)
        self.stream = self._open()  # opened now: a refused path fails at set-up, not at the first line

    def _open(self):
        return os.fdopen(_nofollow_open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a",
                         encoding="utf-8")

    def handleError(self, record):  # noqa: N802 - logging's name
        """A log line the file system refuses (full disk, read-only) is one warning line, once,
        instead of logging's traceback per line; the command's own error says the rest."""
        error = sys.exc_info()[1]
        problem = environment_problem(error) if error is not None else None
        if problem is None:
            return super().handleError(record)
        if not getattr(self, "_warned", False):
            self._warned = True
            sys.stderr.write(f"warning: {self.baseFilename} stopped taking log lines: {problem}\n")


def remove(p) -> None:
    path(p).unlink()


def rmtree(p) -> None:
    q = path(p)
    if q.exists():
        q.rmtree()


def move(src, dst) -> None:
    """A file or directory to a new name (an OutputPath; GCS: copy, then delete)."""
    target = check_output(dst)
    if not is_remote(src) and not is_remote(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(resolve(src), target)
        return
    if isdir(src):
        copytree(src, dst)
        rmtree(src)
    else:
        copy(src, dst)
        remove(src)


def copy(src, dst) -> None:
    """One file, between any two places (local <-> gs://); `dst` an OutputPath."""
    target = check_output(dst)
    if not is_remote(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
    path(readable_file(src)).copy(path(target), overwrite=True)


def copytree(src, dst) -> None:
    """Every file under `src` to the same relative place under `dst` (an OutputPath)."""
    src = resolve(src)
    check_output(dst)
    for rel in walk_files(src):
        copy(os.path.join(src, rel), OutputPath(dst.root, (*dst.names, *rel.split("/"))))


def walk_files(p) -> list[str]:
    """Every file under a directory, as paths relative to it, sorted."""
    root = resolve(p)
    out = []
    for d, _, files in path(root).walk():
        d = os.fspath(d).rstrip("/")
        if is_remote(root) and not is_remote(d):  # fsspec walks without the scheme
            d = f"{scheme(root)}://{d}"
        rel = "" if d == root else os.path.relpath(d, root)
        out += [os.path.join(rel, f) if rel else f for f in files]
    return sorted(out)


def check_reachable(p, *, what: str = "path") -> None:
    """For a gs:// path: the bucket exists and the endpoint answers within REACH_TIMEOUT_S,
    else a StorageError naming the path. Nothing for a local path. Called before compute."""
    p = check(p)
    if not is_remote(p):
        return
    _configure_emulator()
    parts = urllib.parse.urlsplit(p)
    bucket, prefix = parts.netloc, parts.path.lstrip("/")
    outcome: dict = {}

    def probe():
        try:
            fs = fsspec.filesystem("gs")
            # Listing one object needs only object permissions (a bucket GET needs more).
            fs.call("GET", "b/{}/o", bucket, maxResults=1, prefix=prefix, json_out=True)
            outcome["ok"] = True
        except BaseException as e:  # reported below, in the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(REACH_TIMEOUT_S)
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
    if "ok" in outcome:
        return
    error = outcome.get("error")
    if error is None:
        raise StorageError(f"{what} {p}: no answer from {endpoint} within {REACH_TIMEOUT_S:.0f} s "
                           "(is the storage endpoint reachable from this machine?)")
    if isinstance(error, FileNotFoundError):
        raise StorageError(f"{what} {p}: bucket gs://{bucket} does not exist (at {endpoint})")
    raise StorageError(f"{what} {p}: cannot reach gs://{bucket} at {endpoint} "
                       f"({type(error).__name__}: {' '.join(str(error).split())[:200]})")


# --- this process's scratch directory: downloads and the local side of synced files --------

_scratch_dir: str | None = None
_lock = threading.Lock()


class DiskSpaceError(RunError):
    """Not enough free space for what a tool is about to write."""


def check_free_space(p: str, needed: int, *, what: str) -> None:
    """Refuses, before anything is written, to put `what` (about `needed` bytes) in local
    directory `p` when its file system has less free. gs:// paths are not checked."""
    if is_remote(p) or needed <= 0:
        return
    existing = os.path.abspath(os.path.expanduser(p))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise DiskSpaceError(f"{p}: {what} need about {needed / 1e9:.2f} GB but its file system has "
                             f"{free / 1e9:.2f} GB free; free some space or choose another directory")


def scratch_dir() -> str:
    """A temporary directory of this process (removed at exit)."""
    global _scratch_dir
    with _lock:
        if _scratch_dir is None:
            _scratch_dir = tempfile.mkdtemp(prefix="nli_jax_")
            atexit.register(shutil.rmtree, _scratch_dir, ignore_errors=True)
        return _scratch_dir


_copies: dict[str, str] = {}


def local_copy(p) -> str:
    """A local path with the contents of `p` (file or directory): `p` itself when local, else a
    download into this process's scratch directory (once per process)."""
    p = resolve(p)
    if not is_remote(p):
        return p
    if p in _copies:
        return _copies[p]
    target = under(scratch_dir(), "copies", hashlib.sha256(p.encode()).hexdigest()[:16], os.path.basename(p) or "root")
    if isdir(p):
        copytree(p, target)
    elif exists(p):
        copy(p, target)
    else:
        raise FileNotFoundError(f"{p} not found")
    _copies[p] = str(target)
    return str(target)


def origin(p: str) -> str:
    """The URL a `local_copy` path came from (fingerprints and messages name the bucket, not
    this process's scratch directory); any other path resolved."""
    p = resolve(p)
    for remote, local in _copies.items():
        if p == local or p.startswith(local + os.sep):
            return remote + p[len(local):]
    return p


def upload(local: str, remote) -> None:
    """A local file or directory to `remote` (an OutputPath)."""
    if os.path.isdir(local):
        copytree(local, remote)
    else:
        copy(local, remote)


def local_inputs(patterns, what: str = "input file") -> list[str]:
    """Local paths of the files that `patterns` (files or globs, local or gs://) name, sorted,
    each through the read gate: for tools that read with plain open() in worker processes
    (corpus preparation, vocabulary training). Remote files are downloaded once into this
    process's scratch directory; a pattern that matches nothing is kept, so that the tool names
    it in its error."""
    files = readable_files(patterns, what)
    return [local_copy(f) if is_remote(f) and exists(f) else f for f in files]


def local_output_dir(p) -> str:
    """A local directory to write what will end up at `p`: `p` itself when local (the root of the
    tool's writes, created by the tool once its input is checked); for gs:// an empty directory
    in the scratch directory, which `upload(local, under(p))` copies when it is complete (a
    half-written output never appears in the bucket)."""
    p = resolve(check(p))
    if not is_remote(p):
        return p
    check_reachable(p, what="output directory")
    return makedirs(under(scratch_dir(), "outputs", hashlib.sha256(p.encode()).hexdigest()[:16]))


# --- appended files (logs, metrics, TensorBoard) on gs:// ----------------------------------
# A GCS object cannot be appended to: the appender writes a local file and a background thread
# uploads it whole every SYNC_EVERY_S seconds (and at sync() / exit), so the run's progress is
# visible in the bucket while it goes.

_synced: dict[str, str] = {}  # local path -> remote path (file or directory)
_uploaded: dict[str, tuple] = {}
_sync_thread: threading.Thread | None = None


def synced_local_file(p: str) -> str:
    """A local file that stands for gs:// file `p` (reached through `append_file`): a file in the
    scratch directory that starts with the object's current contents (a resumed run appends to
    its log) and is uploaded every few seconds."""
    p = resolve(p)
    with _lock:
        for local, remote in _synced.items():
            if remote == p:
                return local
    local = str(output_file(under(scratch_dir(), "synced", hashlib.sha256(p.encode()).hexdigest()[:16],
                                  os.path.basename(p))))
    if exists(p):
        copy(p, under(local))
    _register(local, p)
    return local


def synced_local_dir(p: str) -> str:
    """A local directory standing for gs:// directory `p` (TensorBoard's event files, reached
    through `output_dir(..., synced=True)`): new and grown files in it are uploaded every few
    seconds."""
    p = resolve(p)
    local = makedirs(under(scratch_dir(), "synced", hashlib.sha256(p.encode()).hexdigest()[:16], os.path.basename(p)))
    _register(local, p)
    return local


def _register(local: str, remote: str) -> None:
    global _sync_thread
    with _lock:
        _synced[local] = remote
        if _sync_thread is None:
            _sync_thread = threading.Thread(target=_sync_forever, name="nli_jax storage sync", daemon=True)
            _sync_thread.start()
            atexit.register(sync)


def _sync_forever() -> None:
    while True:
        time.sleep(SYNC_EVERY_S)
        try:
            sync()
        except Exception:  # a failed upload is retried on the next round; sync() at the end raises
            pass


_sync_lock = threading.Lock()


def sync() -> None:
    """Uploads every synced file that changed since its last upload."""
    with _sync_lock:
        with _lock:
            pairs = list(_synced.items())
        for local, remote in pairs:
            files = ([(local, remote)] if not os.path.isdir(local) else
                     [(os.path.join(d, f), os.path.join(remote, os.path.relpath(os.path.join(d, f), local)))
                      for d, _, names in os.walk(local) for f in names])
            for src, dst in files:
                if not os.path.exists(src):
                    continue
                st = os.stat(src)
                key = (st.st_size, st.st_mtime_ns)
                if _uploaded.get(src) == key:
                    continue
                copy(src, under(dst))
                _uploaded[src] = key
