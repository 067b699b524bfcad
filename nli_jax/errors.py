"""Errors that stop a run before compute because of its input. Their messages are complete (the
key, or the file and line); the command line prints them as one line, without a traceback
(nli_jax.train.cli). Data files: nli_jax.data.readers.DataError; model directories:
nli_jax.checkpoints.CheckpointError; model configs: ConfigError (also nli_jax.models.ConfigError)."""


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
    import errno
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
    import shutil
    try:
        free = f"{shutil.disk_usage(where).free / 2**20:,.0f} MiB free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(f"no space left on the device of {where} ({free}) while writing {what}: free some space "
                         f"and rerun the same command; {after}")
