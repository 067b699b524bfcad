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
