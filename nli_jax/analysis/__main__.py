"""python -m nli_jax.analysis <name> [flags]: runs the analysis module nli_jax.analysis.<name>
(its `define_flags()` and `main(argv)`); without a name, `artifacts`. See nli_jax.analysis."""
from __future__ import annotations

import importlib
import pkgutil
import sys

from absl import app

import nli_jax.analysis
from nli_jax.cli.command_help import empty_path_problem, given_flags, list_command_flags

DEFAULT = "artifacts"


def analyses() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(nli_jax.analysis.__path__) if not m.name.startswith("_"))


def main() -> None:
    argv = sys.argv
    name = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else DEFAULT
    if name not in analyses():
        sys.exit(f"nli_jax.analysis: error: unknown analysis {name!r}; analyses: {', '.join(analyses())}")
    module = importlib.import_module(f"nli_jax.analysis.{name}")
    module.define_flags()
    list_command_flags()  # --help lists the analysis' own flags
    sys.modules["__main__"].__doc__ = module.__doc__  # and --help describes the analysis, not this dispatcher
    rest = argv[2:] if len(argv) > 1 and argv[1] == name else argv[1:]
    app.run(_paths_given(module.main), argv=[f"{argv[0]} {name}", *rest])


def _paths_given(main):
    """`main`, after a path flag given empty is refused in one line (nli_jax.cli.command_help)."""
    def checked(argv):
        problem = empty_path_problem(given_flags())
        if problem is not None:
            sys.exit(f"error: {problem}")
        return main(argv)
    return checked


if __name__ == "__main__":
    main()
