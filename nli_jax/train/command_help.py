"""`--help` of every nli-jax command lists the flags it takes. absl's `--help` lists only the
flags its main module defines, so a command whose flags live in a shared module (finetune.main's
--config and --workdir in nli_jax.train.cli, an analysis' in nli_jax.analysis.<name>) listed none;
`list_command_flags` makes every flag an nli-jax module defined a key flag of the main module.
Called by the commands' launchers (nli_jax.train.cli.run / run_offline / run_tool and
python -m nli_jax.analysis) before absl parses the command line."""
from __future__ import annotations

import sys

# Packages whose flags a command lists (absl's, JAX's and other libraries' stay under --helpfull).
OWN_PACKAGES = ("nli_jax", "finetune", "pretrain", "launch", "benchmarks")


def list_command_flags(main_module: str | None = None) -> None:
    from absl import flags
    values = flags.FLAGS
    main_module = main_module or sys.argv[0]
    for module, defined in values.flags_by_module_dict().items():
        if module != main_module and module.split(".")[0] in OWN_PACKAGES:
            for flag in defined:
                values.register_key_flag_for_module(main_module, flag)
