"""`--help` of every nli-jax command lists the flags it takes. absl's `--help` lists only the
flags its main module defines, so a command whose flags live in a shared module (finetune.main's
--config and --workdir in nli_jax.cli, an analysis' in nli_jax.analysis.<name>) listed none;
`list_command_flags` makes every flag an nli-jax module defined a key flag of the main module.
Called by the commands' launchers (nli_jax.cli.run / run_offline / run_tool and
python -m nli_jax.analysis) before absl parses the command line."""
from __future__ import annotations

import sys

from absl import flags

# Packages whose flags a command lists (absl's, JAX's and other libraries' stay under --helpfull).
OWN_PACKAGES = ("nli_jax", "finetune", "pretrain", "launch", "benchmarks")


def list_command_flags(main_module: str | None = None) -> None:
    values = flags.FLAGS
    main_module = main_module or sys.argv[0]
    for module, defined in values.flags_by_module_dict().items():
        if module != main_module and module.split(".")[0] in OWN_PACKAGES:
            for flag in defined:
                values.register_key_flag_for_module(main_module, flag)


# Flags that name a file or directory. Given empty (`--workdir=`), such a path is the current
# directory: a whole run, predictions or an export were written into it. Refused, whatever the
# command (`--compilation_cache=` is not one: empty turns the cache off, as its help says).
PATH_FLAGS = frozenset({"workdir", "output", "output_dir", "checkpoint", "vocab_dir", "source", "predictions",
                        "corpus", "inputs", "input", "file", "runs", "run", "zip"})


def empty_path_problem(given: dict) -> str | None:
    """The one-line refusal of path flags given empty ({flag name: value as parsed}; a list
    flag's value is a list: empty, or with an empty entry), or None."""
    empty = []
    for name, value in sorted(given.items()):
        if name not in PATH_FLAGS or value is None:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        if not items or any(isinstance(item, str) and not item.strip() for item in items):
            empty.append(f"--{name}={','.join(map(str, items))!r}")
    if not empty:
        return None
    return (f"{', '.join(empty)}: an empty path names the current directory (a command would write or read its "
            f"files there); give the path")


def given_flags() -> dict:
    """{name: value} of the absl flags the command line gave (present), for empty_path_problem."""
    values = flags.FLAGS
    return {name: values[name].value for name in values if values[name].present}
