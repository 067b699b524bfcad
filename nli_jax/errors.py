"""Errors that stop a run before compute because of its input. Their messages are complete (the
key, or the file and line); the command line prints them as one line, without a traceback
(nli_jax.cli). Data files: nli_jax.data.readers.DataError; model directories:
nli_jax.checkpoints.CheckpointError; model configs: ConfigError (also nli_jax.models.ConfigError)."""

import errno
import re
import resource
import shutil


class RunError(ValueError):
    """Input that stops a run before compute; the CLI prints the message as one line."""


class ConfigValueError(RunError):
    """A config value out of its range, or inconsistent with another value, the devices, the
    tokenizer, the model or the data; the message names the key(s)."""


class ConfigError(ValueError):
    """A model configuration (EncoderConfig, a checkpoint's config.json) that cannot be built;
    the message names the offending key."""


class DiskFullError(RunError):
    """No space left on the device a run writes to; names what was being written."""


def no_space_left(error: BaseException) -> bool:
    """Whether an error (or one it was raised from) is ENOSPC, as an OSError or in the message
    of a library's own error (tensorstore, which orbax writes arrays with)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def disk_full(error: BaseException, what: str, where: str, after: str) -> DiskFullError:
    """The one-line error for a full disk while writing `what` to `where`."""
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:,.0f} MiB free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(f"no space left on the device of {where} ({free}) while writing {what}: free some space "
                         f"and rerun the same command; {after}")


# --- the machine, not the input: one line for what the file system or the process refuses ----

def _os_errors():
    return {errno.EROFS: ("read-only file system", "give a directory on a writable file system"),
            errno.ENOSPC: ("no space left on the device", "free some space and rerun the same command"),
            errno.EDQUOT: ("disk quota exceeded", "free some space and rerun the same command"),
            errno.EFBIG: ("file too large for the file system or this process's file-size limit (ulimit -f)",
                          "raise the limit or write to another file system"),
            errno.EMFILE: ("too many open files", None),
            errno.ENFILE: ("too many open files in the system", None),
            errno.EACCES: ("permission denied", "give a path this user may read and write"),
            errno.EPERM: ("operation not permitted", "give a path this user may read and write")}


def _texts():
    """What libraries that write with their own code (tensorstore under orbax) put in their messages."""
    return {"No space left on device": errno.ENOSPC, "Read-only file system": errno.EROFS,
            "Disk quota exceeded": errno.EDQUOT, "File too large": errno.EFBIG, "Too many open files": errno.EMFILE}


def _errno_of(error: BaseException) -> tuple[int, BaseException] | None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _os_errors():
            return error.errno, error
        text = str(error)
        code = re.search(r"os_error_code='(\d+)'", text)
        if code and int(code.group(1)) in _os_errors():
            return int(code.group(1)), error
        for fragment, number in _texts().items():
            if fragment in text:
                return number, error
        error = error.__cause__ or error.__context__
    return None


def environment_problem(error: BaseException) -> str | None:
    """One line for an error of the machine rather than of the input or the program: a read-only
    file system, a full disk or quota, a file-size limit, too many open files, a permission
    refused; it names the file (or what the library said) and what to do. None for any other
    error (its traceback is kept)."""
    found = _errno_of(error)
    if found is None:
        return None
    number, cause = found
    reason, advice = _os_errors()[number]
    where = getattr(cause, "filename", None)
    # A library's own error (tensorstore's) names the file in its text; a bare OSError says no more.
    said = "" if isinstance(cause, OSError) else f": {' '.join(str(cause).split())[:300]}"
    if number in (errno.EMFILE, errno.ENFILE):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        advice = (f"this process may open {soft} files (ulimit -n; at most {hard}): raise the limit, or read fewer, "
                  "larger files (python -m pretrain.prepare_corpus --shards=N writes N shards)")
        return f"{f'cannot open {where}: ' if where else ''}{reason} ({advice}){said}"
    if number in (errno.EACCES, errno.EPERM):
        return f"{f'{where}: ' if where else ''}{reason} ({advice}){said}"
    return f"{f'cannot write {where}: ' if where else ''}{reason} ({advice}){said}"


class EnvironmentLogFilter:
    """A logging filter that drops the records (with their tracebacks) a library logs for an
    error of the machine (orbax's background writers on a full disk: hundreds of lines) that the
    command reports itself, in one line, when the error reaches it."""

    def filter(self, record) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and environment_problem(error):
            return False
        return not (record.levelno >= 40 and _errno_of(Exception(record.getMessage())))
