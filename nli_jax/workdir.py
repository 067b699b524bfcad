"""A run's workdir as a unit: one run at a time holds it (`lock`), its config.json says what
the run is, its run.json how far it got (running, interrupted at step N, finished), and whether
it holds trained state. The other files inside it are owned by the modules that write them:
checkpoints/ and best/ (nli_jax.train.checkpointing), inputs.json (nli_jax.train.inputs),
results.json, predictions.jsonl, train.log, metrics.jsonl and tensorboard/
(nli_jax.train.reporting), dynamics/ and calibration.json (nli_jax.hooks.dynamics, calibration).

A workdir holds one config: rerunning it with a config whose keys differ (other than those
in RESUMABLE_CHANGES) is refused, naming the keys. A key that an older nli-jax did not have is
no difference when this command gives it the config files' default (the behaviour the older
run had), so a workdir survives an upgrade that adds keys.

The lock (`.lock` in the workdir) is held for the whole command by process 0: a second command
on the same workdir is refused in one line naming the holder. Locally it is an flock (the
kernel releases it when the holder dies, so a killed run's rerun takes over at once); on gs://
it is an object created only if absent (a generation precondition) and renewed by a lease that
a killed run's successor takes over once it expires (LEASE_S).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import sys
import threading
import time

from nli_jax import storage
from nli_jax.errors import RunError
from nli_jax.migrations import upgrade_config_json
from nli_jax.plan import LEGACY_VALUES, NoOptions, default_config, section_defaults

LOCK_FILE = ".lock"
RUN_STATE_FILE = "run.json"
# How long a gs:// lock stays valid without renewal (renewed every LEASE_S / 3 while held).
LEASE_S = float(os.environ.get("NLI_JAX_LOCK_LEASE_S", "300"))


class WorkdirLockedError(RunError):
    """Another command holds the workdir; names it."""

CONFIG_FILE = "config.json"
UNREADABLE_DIR = "checkpoints_unreadable"
# Keys that may change between a run and its resumption without changing what is computed.
# data.allow_overlap only lets a run whose evaluation overlaps its training data go on (and scores the
# overlap apart): a run started before the check existed resumes with it set.
RESUMABLE_CHANGES = ("train.log_every_steps", "data.workers", "data.tfds_dir", "data.allow_overlap")


class WorkdirConfigError(RunError):
    """The workdir holds a run of another config (or an unreadable config.json); names the keys."""


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


def read_config(workdir: str) -> dict | None:
    """The config.json of a workdir, or None; an unreadable one is an error naming it."""
    path = os.path.join(workdir, CONFIG_FILE)
    try:
        return storage.read_json_object(path)
    except ValueError as e:  # UnicodeDecodeError included
        raise WorkdirConfigError(f"{path} is unreadable ({_short(e)}): it is not a config nli-jax wrote. Use a new "
                                 f"--workdir, or delete the old one to start over") from None


def flatten(config_json: dict) -> dict:
    """{dotted key: value} of a config as config.json stores it (mesh.shape is one value)."""
    from flax import traverse_util  # late: JAX, not for the light tools' check_tool_output
    d = json.loads(json.dumps(config_json))
    shape = d["mesh"].pop("shape", None) if isinstance(d.get("mesh"), dict) else None
    flat = traverse_util.flatten_dict(d, sep=".")
    if shape is not None:
        flat["mesh.shape"] = shape
    return flat


def _defaults(task: str, options) -> dict:
    """Every key's default (nli_jax.plan: the sections', the pretraining section's and the task's
    `options` class's)."""
    return flatten(default_config(task, section_defaults(options), pretrain=True).to_dict())


def config_differences(saved: dict, current: dict, options=None) -> list[str]:
    """'key: saved -> current' for every key that differs, except the resumable ones and keys
    the saved config lacks that the current one gives its default. An older nli-jax's keys are
    read where they are now (nli_jax.migrations.upgrade_config_json), for the current run's task
    `options` class (a TaskOptions subclass; none: NoOptions)."""
    options = options or NoOptions
    saved = upgrade_config_json(saved, options)
    # An older nli-jax's value for a key is the same run as today's spelling of it (remat: false = "none").
    ours, theirs = ({key: LEGACY_VALUES.get(key, lambda v: v)(value) for key, value in flatten(c).items()}
                    for c in (current, saved))
    defaults = None
    out = []
    for key in sorted(set(ours) | set(theirs)):
        if key.startswith(RESUMABLE_CHANGES) or ours.get(key) == theirs.get(key):
            continue
        if key not in theirs:
            defaults = _defaults(str(current.get("task", "")), options) if defaults is None else defaults
            if key in defaults and defaults[key] == ours[key]:
                continue  # added after that run: the default is what it ran with
        out.append(f"{key}: {theirs.get(key)!r} -> {ours.get(key)!r}")
    return out


def check_config(workdir: str, config_json: dict, options=None) -> None:
    """Refuses to resume or overwrite a workdir written by a different config, naming the keys
    (`options`: the run's task options class, to read an older config.json's keys)."""
    previous = read_config(workdir)
    if previous is None:
        return
    differing = config_differences(previous, config_json, options)
    if differing:
        raise WorkdirConfigError(f"workdir {workdir} holds a run with a different config ({'; '.join(differing[:20])}). "
                                 "Use a new --workdir, or delete the old one to start over.")


def check_seeds_of_older_run(workdir: str, seeds) -> None:
    """A seeds run written before W's own config.json existed: its results.json names its seeds
    (a different list would replace the aggregate of those runs with another's)."""
    if read_config(workdir) is not None:
        return
    try:
        results = storage.read_json_object(os.path.join(workdir, "results.json"))
    except ValueError:
        results = None
    before = (results or {}).get("seeds")
    if before is not None and sorted(before) != sorted(int(s) for s in seeds):
        raise WorkdirConfigError(f"workdir {workdir} holds a run with a different config (seeds: {before!r} -> "
                                 f"{list(seeds)!r}). Use a new --workdir, or delete the old one to start over.")


def write_config(workdir: str, config_json: dict) -> None:
    """config.json, written atomically by process 0 (kept when present: resumable keys may differ)."""
    import jax  # late: JAX, not for the light tools' check_tool_output
    path = os.path.join(workdir, CONFIG_FILE)
    if jax.process_index() != 0 or storage.isfile(path):
        return
    storage.write_text(storage.under(workdir, CONFIG_FILE), json.dumps(config_json, indent=2, sort_keys=True))


def check_still_there(workdir: str, what: str) -> None:
    """Refuses to write `what` into a workdir whose config.json vanished while the run went on
    (the directory deleted or moved under it): its results would be reported for a run that
    the workdir no longer holds. Process 0 (which wrote config.json) decides for every process."""
    import jax  # late: JAX, not for the light tools' check_tool_output
    present = jax.process_index() != 0 or storage.isfile(os.path.join(workdir, CONFIG_FILE))
    if jax.process_count() > 1:
        import numpy as np  # late: JAX, not for the light tools' check_tool_output
        from jax.experimental import multihost_utils  # late: JAX, not for the light tools' check_tool_output
        present = bool(multihost_utils.broadcast_one_to_all(np.int32(present)))
    if not present:
        raise RunError(f"{workdir}/{CONFIG_FILE} is gone: the workdir was deleted or moved while the run went on; "
                       f"{what} not written and nothing reported finished. Rerun the command to start over")


def has_trained_state(workdir: str) -> bool:
    """Whether any step was trained in `workdir` (a checkpoint, best parameters or results)."""
    for sub in ("checkpoints", "best", UNREADABLE_DIR):
        d = os.path.join(workdir, sub)
        if any(p.split(".")[0].isdigit() for p in storage.listdir(d)):
            return True
    return storage.isfile(os.path.join(workdir, "results.json"))


# --- one run at a time ----------------------------------------------------------------------

def _command() -> str:
    """This process's command line as typed (`python -m finetune.main ...`)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None and spec.name else os.path.basename(sys.argv[0])
    return " ".join([program, *sys.argv[1:]])[:500]


def _holder(purpose: str) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "purpose": purpose, "command": _command(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "expires": time.time() + LEASE_S}


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another process"
    return (f"{holder.get('purpose', 'a command')} by pid {holder.get('pid')} on {holder.get('host')} since "
            f"{holder.get('since')} ({holder.get('command', '')[:200]})")


class _LocalLock:
    """An flock on <workdir>/.lock (released by the kernel when the holder dies)."""

    def __init__(self, path: str, holder: dict):
        self.path = path
        while True:
            fd = storage.open_lock(storage.under(os.path.dirname(path), LOCK_FILE))  # never through a link
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    current = json.loads(os.read(fd, 4096).decode("utf-8") or "null")
                except ValueError:
                    current = None
                os.close(fd)
                raise WorkdirLockedError(f"{os.path.dirname(path)} is in use: {_describe(current)}. One command "
                                         f"at a time per workdir: wait for it, or use another directory "
                                         f"(lock: {path})") from None
            try:
                if os.fstat(fd).st_ino == os.stat(path).st_ino:  # not a file its last holder removed
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        self.fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(holder).encode("utf-8"))

    def release(self) -> None:
        try:
            os.remove(self.path)  # before unlocking: a waiter then finds the file gone and retries
        except FileNotFoundError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class _BucketLock:
    """<workdir>/.lock on GCS: created only if absent; renewed, and taken over once expired,
    with the object's generation as precondition (no two holders, whatever the timing)."""

    def __init__(self, path: str, holder: dict):
        from google.api_core import exceptions  # late: google-cloud-storage, only for gs:// workdirs
        bucket, _, name = path.split("://", 1)[1].partition("/")
        self.blob, self.holder, self.path = _client().bucket(bucket).blob(name), holder, path
        try:
            self.blob.upload_from_string(json.dumps(holder), if_generation_match=0)
        except exceptions.PreconditionFailed:
            self.blob.reload()
            generation = self.blob.generation
            try:
                current = json.loads(self.blob.download_as_bytes(if_generation_match=generation) or b"null")
            except (ValueError, exceptions.PreconditionFailed, exceptions.NotFound):
                current = None
            if current is not None and current.get("expires", 0) > time.time():
                raise WorkdirLockedError(f"{os.path.dirname(path)} is in use: {_describe(current)}, its lease "
                                         f"renewed until {time.ctime(current['expires'])}. One command at a time "
                                         f"per workdir: wait for it, or use another directory (lock: {path})") from None
            try:  # expired (its holder died): taken over, only if nobody else did first
                self.blob.upload_from_string(json.dumps(holder), if_generation_match=generation)
            except exceptions.PreconditionFailed:
                raise WorkdirLockedError(f"{os.path.dirname(path)} is in use: another command took over its expired "
                                         f"lock just now (lock: {path})") from None
            from nli_jax.train.reporting import log  # late: JAX, not for the light tools' check_tool_output
            log.warning("%s: took over the expired lock of %s", path, _describe(current))
        self.blob.reload()
        self.generation = self.blob.generation
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        from google.api_core import exceptions  # late: google-cloud-storage, only for gs:// workdirs
        while not self._stop.wait(LEASE_S / 3):
            self.holder["expires"] = time.time() + LEASE_S
            try:
                self.blob.upload_from_string(json.dumps(self.holder), if_generation_match=self.generation)
                self.blob.reload()
                self.generation = self.blob.generation
            except exceptions.PreconditionFailed:
                from nli_jax.train.reporting import log  # late: JAX, not for the light tools' check_tool_output
                log.error("%s: the lock was taken over by another command: this one should stop", self.path)
                return
            except Exception as e:  # noqa: BLE001 - a transient network error: the next renewal retries
                from nli_jax.train.reporting import log  # late: JAX, not for the light tools' check_tool_output
                log.warning("%s: could not renew the lock (%s)", self.path, e)

    def release(self) -> None:
        from google.api_core import exceptions  # late: google-cloud-storage, only for gs:// workdirs
        self._stop.set()
        self._thread.join(timeout=30)
        try:
            self.blob.delete(if_generation_match=self.generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            pass


def _client():
    from google.cloud import storage as gcs  # late: google-cloud-storage, only for gs:// workdirs
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials  # late: as google.cloud above
        return gcs.Client(project="nli-jax", credentials=AnonymousCredentials())
    return gcs.Client()


class lock:  # noqa: N801 - used as a context manager: `with workdir.lock(path, "training"):`
    """The workdir for this command alone, as long as the block runs: process 0 holds the lock
    (every process learns whether it got it); a second command is refused in one line."""

    def __init__(self, workdir: str, purpose: str):
        self.workdir, self.purpose, self._held = storage.resolve(workdir), purpose, None

    def __enter__(self):
        import jax  # late: JAX, not for the light tools' check_tool_output
        error = None
        if jax.process_index() == 0:
            path = os.path.join(self.workdir, LOCK_FILE)
            try:
                if storage.is_remote(path):
                    self._held = _BucketLock(path, _holder(self.purpose))
                else:
                    storage.makedirs(storage.under(self.workdir))
                    self._held = _LocalLock(path, _holder(self.purpose))
                    check_no_links(self.workdir)  # what the command will write: refused now, not mid-run
            except (WorkdirLockedError, storage.StorageError) as e:
                error = e
                if self._held is not None:
                    self._held.release()
                    self._held = None
        if jax.process_count() > 1:
            import numpy as np  # late: JAX, not for the light tools' check_tool_output
            from jax.experimental import multihost_utils  # late: JAX, not for the light tools' check_tool_output
            locked = bool(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
            if not locked and error is None:
                error = WorkdirLockedError(f"{self.workdir} is in use by another command, or cannot be written (see "
                                           "process 0's error)")
        if error is not None:
            raise error
        return self

    def __exit__(self, *exc):
        if self._held is not None:
            self._held.release()
            self._held = None


# --- where a tool may write ------------------------------------------------------------------
# What a training run writes in its workdir (finetune.main, pretrain.main; with seeds, each seed's
# run in seed_<s>): a tool never writes to these names of a run, nor anywhere else in a run but
# a directory of its own inside the run it reads.
RUN_ENTRIES = frozenset({CONFIG_FILE, RUN_STATE_FILE, LOCK_FILE, UNREADABLE_DIR, "inputs.json", "results.json",
                         "predictions.jsonl", "train.log", "metrics.jsonl", "tensorboard", "checkpoints", "best",
                         "export", "export_best", "examples", "dynamics", "calibration.json"})


def _run_entry(name: str) -> bool:
    return name in RUN_ENTRIES or re.fullmatch(r"seed_\d+|reliability_.*\.png", name) is not None


def check_no_links(workdir: str) -> None:
    """Before a run computes anything: none of the names it writes in its workdir (RUN_ENTRIES,
    reliability_*.png) is a symbolic link, which the writer would refuse later (metrics.jsonl at
    the first logged step, best/ at the first evaluation)."""
    if storage.is_remote(workdir):
        return
    for name in storage.listdir(workdir):
        if _run_entry(name):
            storage.check_output(storage.under(workdir, name))


def is_run(directory: str) -> bool:
    """Whether `directory` holds a training run: its config.json with the inputs, state,
    checkpoints or best parameters of a run, or the results of per-seed runs (seed_<s>)."""
    try:
        names = set(storage.listdir(directory))
    except OSError:  # an ancestor this user cannot list holds no run of theirs
        return False
    if CONFIG_FILE in names and names & {"inputs.json", RUN_STATE_FILE, "checkpoints", "best"}:
        return True
    return "results.json" in names and any(re.fullmatch(r"seed_\d+", n) for n in names)


def check_tool_output(output: str, flag: str, *, reads=(), read_flag: str = "--checkpoint",
                      directory: bool = False) -> None:
    """The one check of where a tool (finetune.evaluate / predict / export, nli_jax.leaderboard,
    nli_jax.analysis, finetune.sweep, the IndoNLU benchmark) may write `output` (named by
    `flag`): never a run directory, nor anything inside one, except a directory of the tool's own
    inside a run it reads (`reads`: e.g. `--checkpoint=R --workdir=R/eval`, cartography's
    R/cartography) whose name is none of the run's own (RUN_ENTRIES, seed_<s>, reliability_*.png).
    A path a tool reads is never its output either (`read_flag`: the flag that names the first of
    `reads`). `directory`: the tool writes a directory there, so an existing file is refused (it
    ended in a FileExistsError traceback, after the checkpoint was read). Checked before anything
    is read or written."""
    out = storage.resolve(output)
    if directory and storage.exists(out) and not storage.isdir(out):
        raise RunError(f"{flag}={output} is a file, not a directory: the tool writes a directory there; give a "
                       "directory of its own (new or existing)")
    own = {storage.resolve(r) for r in reads if r}
    if out in own and storage.isfile(out):
        raise RunError(f"{flag}={output} is a file it reads ({read_flag}): a tool never writes over its input; "
                       "give a path of its own")
    if out in own:
        raise RunError(f"{flag}={output} is the {read_flag} it reads: a tool never rewrites a run (its config.json "
                       "and results.json would be replaced); give a directory of its own")
    directory, child = out, None
    while True:
        if is_run(directory):
            if child is None:
                raise RunError(f"{flag}={output} holds a training run (config.json and checkpoints): a tool writes "
                               "to a directory of its own; give another one")
            if directory not in own:
                raise RunError(f"{flag}={output} is inside the training run {directory}: a tool writes outside "
                               "runs (or in a directory of its own inside the run it reads); give another one")
            if _run_entry(child):
                raise RunError(f"{flag}={output} would write into {os.path.join(directory, child)}, which the run "
                               f"{directory} writes itself: give a directory of the tool's own (e.g. "
                               f"{os.path.join(directory, 'eval')}) or one outside the run")
        parent = os.path.dirname(directory) if not storage.is_remote(directory) else directory.rsplit("/", 1)[0]
        if parent == directory or parent.endswith(":/") or parent.endswith("://"):
            return
        directory, child = parent, os.path.basename(directory)


# --- how far a run got --------------------------------------------------------------------

def write_state(workdir: str, state: str, **fields) -> None:
    """run.json: "running", "interrupted" (SIGTERM or Ctrl-C: the last checkpoint kept), "failed" (a step
    diverged: the reason and the last checkpoint) or "finished", the step and the best step
    (process 0)."""
    import jax  # late: JAX, not for the light tools' check_tool_output
    if jax.process_index() == 0:
        storage.write_text(storage.under(workdir, RUN_STATE_FILE),
                           json.dumps({"state": state, **fields, "updated": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
                                      indent=2))


def read_state(workdir: str) -> dict:
    """How far the run in `workdir` got. A run written before run.json existed is finished when
    it has results.json. "running" whose lock nobody holds is a run that was killed."""
    path = os.path.join(workdir, RUN_STATE_FILE)
    try:
        state = storage.read_json_object(path)
    except ValueError as e:
        raise RunError(f"{path} is unreadable ({e}): not a file nli-jax wrote") from None
    if state is None:
        return {"state": "finished" if storage.isfile(os.path.join(workdir, "results.json")) else "unknown"}
    return state


def require_finished(workdir: str, allow_unfinished: bool, flag: str = "--checkpoint",
                     remedy: str = "or pass --allow_unfinished to use the parameters it has") -> dict:
    """A tool reads a finished run's parameters unless told otherwise (--allow_unfinished)."""
    state = read_state(workdir)
    if state["state"] == "finished" or allow_unfinished:
        return state
    where = {"running": f"is still training, or was killed, at step {state.get('step')} of {state.get('total_steps')}",
             "interrupted": f"was interrupted at step {state.get('step')} of {state.get('total_steps')}",
             "failed": f"failed at {state.get('reason')} (its last checkpoint: step {state.get('last_checkpoint')})",
             }.get(state["state"], "has not finished (no run.json or results.json)")
    best = f"; its best parameters so far are from step {state.get('best_step')}" if state.get("best_step") else ""
    raise RunError(f"{flag}={workdir}: the run {where}{best}. Rerun its command to finish it, {remedy}")
