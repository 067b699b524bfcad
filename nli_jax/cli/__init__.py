"""The command line shared by finetune.main and pretrain.main (absl flags + ml_collections), the
tools' flags (finetune.evaluate / predict / export: `--override`, the multi-host flags), and the
error handling of every nli-jax command (`run`):

- a mistyped config key (`--config.train.batchsize=8`) is one line naming the key and the
  closest valid keys, before anything is loaded;
- input that stops a run before compute (a bad dataset row, a config value out of range, a
  workdir of another config or other inputs, an unreadable checkpoint) is one line `error: ...`
  (also in the workdir's train.log when there is one) and exit status 1, without a traceback;
  unexpected errors keep theirs.
"""
from __future__ import annotations

import ast
import gc
import logging
import os
import re
import sys

from absl import app, flags, logging as absl_logging
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as implementation

from nli_jax.cli import platforms
from nli_jax.cli.command_help import empty_path_problem, given_flags, list_command_flags
from nli_jax.errors import ConfigError, EnvironmentLogFilter, RunError, environment_problem
from nli_jax.migrations import moved_key
from nli_jax.train import compilation

FLAGS = flags.FLAGS


class CommandLineError(RunError, app.UsageError):
    """A flag value nli-jax cannot use (an --override naming no field, a malformed list): one
    line, without absl's usage text."""


def user_errors() -> tuple[type, ...]:
    """Exceptions that are input problems with a complete message (printed as one line)."""
    from nli_jax.checkpoints.hf import CheckpointError  # late: numpy & co.; `import nli_jax` stays light
    from nli_jax.data.readers import DataError  # late: numpy & co.; `import nli_jax` stays light
    return DataError, ConfigError, CheckpointError, RunError, FileNotFoundError


def _quiet_closed_loops(hook):
    """sys.unraisablehook without the tracebacks of callbacks that land on an asyncio event loop
    that has closed: tensorstore completing the writes of a save that orbax stopped waiting for
    (a full disk failed one of them), one per array. Nothing is lost: the save's own error is the
    command's one line."""
    def quiet(unraisable):
        value = unraisable.exc_value
        if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
            return
        hook(unraisable)
    quiet.__wrapped__ = hook
    return quiet


def report_error(error: BaseException, prefix: str = "error: ") -> None:
    message = prefix + " ".join(str(error).split()) if str(error) else f"{prefix}{type(error).__name__}"
    logger = logging.getLogger("nli_jax")
    if logger.handlers:  # the run's log: stderr and <workdir>/train.log
        logger.error("%s", message)
    else:
        sys.stderr.write(message + "\n")


def _reporting_input_errors(main):
    """`main` with config-key mistakes, input errors and errors of the machine (a read-only file
    system, a full disk, too many open files: nli_jax.errors.environment_problem) reported as one
    line (exit status 1). What libraries log about the latter on their own (orbax's background
    writers' tracebacks) is dropped: the one line says it. A Ctrl-C is one line too (exit status 130)."""
    def wrapped(argv):
        for handler in logging.getLogger().handlers:  # absl's handler: where orbax's records go
            handler.addFilter(EnvironmentLogFilter())
        sys.unraisablehook = _quiet_closed_loops(sys.unraisablehook)
        try:
            problem = empty_path_problem(given_flags())  # before anything is read or written
            if problem is not None:
                raise CommandLineError(problem)
            return main(argv)
        except user_errors() as e:
            report_error(e)
            sys.exit(1)
        except KeyboardInterrupt as e:  # Ctrl-C: one line (a run's says how to resume), as a SIGINT's exit status
            report_error(e if str(e) else KeyboardInterrupt("interrupted (Ctrl-C)"), prefix="")
            sys.exit(130)
        except Exception as e:
            problem = environment_problem(e)
            if problem is None:
                raise
            report_error(RunError(problem))
            sys.exit(1)
    return wrapped


flags.DEFINE_string("compilation_cache", compilation.DEFAULT_DIR,
                    "Directory (or gs:// path, e.g. on Cloud TPU) of JAX's persistent compilation cache, shared by "
                    "runs, seeds and sweep cells: a program compiled once is read back, not compiled again. Empty: "
                    "off. JAX_COMPILATION_CACHE_DIR, when set, wins.")


def run(main) -> None:
    """app.run with one-line reports of config-key mistakes and input errors (exit status 1),
    and the persistent compilation cache (--compilation_cache) configured before main runs.

    On a CPU-only machine, the host allocator is set first (nli_jax.cli.host_memory: step
    temporaries on transparent huge pages, which may re-execute the interpreter once): this must
    precede anything JAX runs."""
    from nli_jax.cli import host_memory  # late: ctypes & co. only for a command line, not `import nli_jax`
    platforms.skip_absent_tpu()  # before JAX starts: no libtpu start-up on a CPU-only machine
    try:
        host_memory.configure()
        compilation.forward_dots()
    except ValueError as e:  # an unknown NLI_JAX_HOST_MALLOC or NLI_JAX_CPU_FORWARD_DOTS: one line, before any compute
        sys.stderr.write(f"error: {e}\n")
        sys.exit(1)

    def with_cache(argv):
        compilation.configure_cache(FLAGS.compilation_cache)
        compilation.listen()
        result = main(argv)
        # The run is over: what is left is freed by reference counting as the interpreter exits.
        # Frozen, the objects of every imported module (JAX, Flax, transformers, torch) are not
        # traversed again by the interpreter's last garbage collections (1-2 s of every run).
        gc.freeze()
        return result
    list_command_flags()
    app.run(_reporting_input_errors(with_cache), flags_parser=parse_flags)


def run_offline(main) -> None:
    """app.run with one-line reports of config-key mistakes and input errors, and nothing else:
    no host allocator setting or compilation cache (launch.compile compiles for another platform)."""
    list_command_flags()
    app.run(_reporting_input_errors(main), flags_parser=parse_flags)


def run_tool(main) -> None:
    """app.run for the corpus tools (plain absl flags, no config): input errors such as a
    missing file or too little disk space as one line, exit status 1."""
    platforms.skip_absent_tpu()
    list_command_flags()
    app.run(_reporting_input_errors(main))


def parse_flags(argv):
    """absl's flag parsing; a config override naming no field, a config file that is not a
    regular file (a FIFO would block its import) and an error of the config file's own (an
    unknown variant) are reported as one line."""
    problem = _config_file_problem(argv)
    if problem is None:
        try:
            return FLAGS(argv)
        except flags.Error as e:
            problem = (_config_key_problem(argv) or _config_load_problem(argv, e)
                       or f"flag parsing: {' '.join(str(e).split())}")
        except Exception as e:  # ml_collections raises AttributeError/KeyError for unknown fields
            problem = _config_key_problem(argv) or f"flag parsing: {type(e).__name__}: {' '.join(str(e).split())}"
    sys.stderr.write(f"error: {problem}\n")
    sys.exit(1)


def _config_values(argv):
    """(flag name, value) of every --<config flag>=FILE[:variant] of the command line."""
    for arg in argv[1:]:
        match = re.match(r"^--?(\w+)=(.*)$", arg)
        if match and match.group(1) in FLAGS and _is_config_flag(FLAGS[match.group(1)]):
            yield match.group(1), match.group(2)


def _config_file_problem(argv) -> str | None:
    """The read gate for config files, before ml_collections imports them."""
    from nli_jax import storage  # late: fsspec (~25 ms) is not for `import nli_jax`
    for name, value in _config_values(argv):
        try:
            storage.readable_file(value.split(":", 1)[0], "config file")
        except (storage.StorageError, FileNotFoundError) as e:
            return f"--{name}={value}: {e}"
    return None


def _config_load_problem(argv, error: BaseException) -> str | None:
    """`--config=FILE:variant: <the config file's own error>` for an exception its get_config
    raised (ml_collections passes it on as a whole traceback in the flag error's text)."""
    text = str(error)
    if "Error whilst parsing config file" not in text:
        return None
    last = [line for line in text.splitlines() if line.strip()][-1].strip()
    message = re.sub(r"^(?:[\w.]+(?:Error|Exception)): ", "", last)
    value = next((f"--{n}={v}" for n, v in _config_values(argv) if v in text), "--config")
    return f"{value}: {message}"


def _is_config_flag(flag) -> bool:
    return isinstance(flag, getattr(implementation, "_ConfigFlag", ())) or type(flag).__name__ == "_ConfigFlag"


def _config_key_problem(argv) -> str | None:
    """'unknown config key ...; did you mean ...' for the first --<config>.<key> override that
    names no field of its config file, or None."""
    from nli_jax.planner import close_keys, config_keys, has_key  # late: JAX; `import nli_jax` stays light
    for arg in argv[1:]:
        match = re.match(r"^--?(no)?(\w+)\.([^=]+)(=.*)?$", arg)
        if not match or match.group(2) not in FLAGS or not _is_config_flag(FLAGS[match.group(2)]):
            continue
        name, key = match.group(2), match.group(3)
        value = next((a.split("=", 1)[1] for a in argv[1:] if re.match(rf"^--?{name}=", a)), None)
        if value is None:
            return f"--{name}.{key} given without --{name}=<config file>"
        try:
            config = FLAGS[name].parser.parse(value)
        except Exception as e:
            return f"--{name}={value}: the config cannot be loaded ({type(e).__name__}: {' '.join(str(e).split())})"
        depth = has_key(config, key)
        if depth is True:
            continue
        if moved_key(key):
            return (f"unknown config key {key!r} ({arg}); it is its component's own option now: "
                    f"--{name}.{moved_key(key)}=")
        keys = config_keys(config)
        suggestions = close_keys(key, keys)
        parent = ".".join(key.split(".")[:depth])
        hint = (f"did you mean {' or '.join(suggestions)}?" if suggestions else
                f"the keys under {parent or 'the config'} are: "
                f"{', '.join(sorted(k for k in keys if k.startswith(parent)))[:400]}")
        return f"unknown config key {key!r} ({arg}); {hint}"
    return None


def define_multihost_flags() -> None:
    """--multihost, or --coordinator_address/--num_processes/--process_id off TPU: every command
    that runs collectives (training, evaluate, predict, export) takes these."""
    flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (TPU pods detect the rest).")
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs off TPU.")
    flags.DEFINE_integer("num_processes", None, "Number of processes, for multi-process runs off TPU.")
    flags.DEFINE_integer("process_id", None, "This process's index, for multi-process runs off TPU.")


def define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:variant]).", lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs, results.json.")
    define_multihost_flags()
    flags.mark_flags_as_required(["config", "workdir"])


def define_tool_flags(checkpoint_help: str) -> None:
    """finetune.evaluate / predict / export: --config (default: the run's config.json),
    --checkpoint, --override and the multi-host flags."""
    config_flags.DEFINE_config_file("config", None, "config file (path[:variant]); default: the run's config.json",
                                    lock_config=True)
    flags.DEFINE_string("checkpoint", None, checkpoint_help)
    flags.DEFINE_multi_string("override", [], "config assignment key=value, e.g. data.source=/data/indonli")
    flags.DEFINE_bool("allow_unfinished", False, "Use the parameters of a run that has not finished (interrupted, "
                      "killed or still training): its best so far.")
    define_multihost_flags()


def main(argv) -> None:
    """finetune.main / pretrain.main: `cli.run(cli.main)`."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it writes at INFO
    init_distributed()
    from nli_jax.train.loop import train_and_evaluate  # late: JAX; `import nli_jax` stays light
    train_and_evaluate(FLAGS.config, FLAGS.workdir)


def apply_overrides(config, assignments) -> None:
    """'a.b.c=value' assignments (a Python literal, else a string) into a ConfigDict, through
    ml_collections' update_from_flattened_dict; a key that names no field is refused with the
    closest ones (update_from_flattened_dict would add it)."""
    from nli_jax.planner import close_keys, config_keys, has_key  # late: JAX; `import nli_jax` stays light
    updates = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep:
            raise CommandLineError(f"--override {assignment!r}: expected key=value")
        if has_key(config, key) is not True:
            suggestions = close_keys(key, config_keys(config))
            raise CommandLineError(f"--override {assignment!r}: no config field {key!r}"
                                 + (f"; did you mean {' or '.join(suggestions)}?" if suggestions else ""))
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        updates[key] = tuple(value) if isinstance(value, list) else value
    config.update_from_flattened_dict(updates)


def checkpoint_config(config, checkpoint: str, overrides=()):
    """The config to evaluate or predict with: --config when given, else the config.json of the
    run in `checkpoint` (keys an older nli-jax did not write take the config files' defaults);
    then --override key=value assignments."""
    if config is None:
        from nli_jax import storage  # late: fsspec (~25 ms) is not for `import nli_jax`
        from nli_jax.planner import saved_config  # late: JAX; `import nli_jax` stays light
        if not storage.isdir(checkpoint):
            raise FileNotFoundError(f"--checkpoint={checkpoint}: no such directory")
        config = saved_config(checkpoint)
        if config is None:
            raise RunError(f"--checkpoint={checkpoint} is not a run directory (it has no config.json): a Hugging Face "
                           "directory needs --config=<the task's config file> to say which task it is for")
    else:
        config = config.copy_and_resolve_references()
    apply_overrides(config, overrides)
    return config


def parse_files(assignments, flag: str = "--file") -> dict[str, str]:
    """['name=path', ...] (or bare paths: named by their file stem) -> {name: path}. A name is a
    split name, which becomes part of file names (reliability_<name>.png): one path component."""
    from nli_jax import storage  # late: fsspec (~25 ms) is not for `import nli_jax`
    out = {}
    for item in assignments:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = os.path.splitext(os.path.basename(item))[0], item
        try:
            storage.component(name, "split name")
        except storage.UnsafePathError as e:
            raise CommandLineError(f"{flag}={item}: {e}") from None
        if name in out:
            raise CommandLineError(f"input name {name!r} given twice")
        out[name] = path
    return out


def init_distributed() -> None:
    import jax  # late: JAX; `import nli_jax` stays light
    if FLAGS.multihost or FLAGS.coordinator_address:
        jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                                   num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
