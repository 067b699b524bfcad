"""The package's shape, checked from source so that CI fails when it erodes: no import cycles
(imports inside functions included), the config read by the planner only, nli_jax/train's
modules each saying what they own, no function there longer than a screen, and no import inside a
function without a comment saying why."""
import ast
import io
import pathlib
import re
import tokenize

import pytest

from conftest import REPO

PACKAGES = ("nli_jax", "finetune", "pretrain", "configs", "launch")
# Packages whose __init__ imports every module in them (plugin registries, docs/extending.md).
IMPORTS_ALL_MODULES = ("nli_jax.tasks",)


def modules(root: pathlib.Path = REPO, packages=PACKAGES) -> dict[str, pathlib.Path]:
    out = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """module -> the project's modules it imports, anywhere in its source. Importing a.b.c also
    runs the packages a.b and a (their __init__), except those the importer is inside of."""
    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in mods}
    for module, path in mods.items():
        is_package = path.name == "__init__.py"
        own = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                target = resolve(name)
                if not target:
                    continue
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    ancestor = ".".join(parts[:i])
                    if ancestor in mods and ancestor != module and (ancestor == target or ancestor not in own):
                        graph[module].add(ancestor)
    for package in IMPORTS_ALL_MODULES:
        if package in graph:
            graph[package] |= {m for m in mods if m.rpartition(".")[0] == package}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycles():
    found = cycles(import_graph(modules()))
    assert not found, f"import cycles: {found}"


def test_the_cycle_check_finds_cycles_through_function_level_and_package_imports(tmp_path):
    """The check itself, on a package written here: a registry importing its package back inside
    a function (as tasks/base.get_task once did), and a module whose import of a sibling
    package's submodule runs that package's __init__, which imports the module back."""
    files = {
        "pkg/__init__.py": "", "pkg/tasks/__init__.py": "from pkg.tasks import base\n",
        "pkg/tasks/base.py": "def get_task(name):\n    import pkg.tasks\n    return pkg.tasks\n",
        "pkg/train/__init__.py": "from pkg.train import loop\n", "pkg/train/loop.py": "import pkg.data.reader\n",
        "pkg/train/util.py": "", "pkg/data/__init__.py": "",
        "pkg/data/reader.py": "def read():\n    from pkg.train.util import x\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = cycles(import_graph(modules(tmp_path, ("pkg",))))
    assert ["pkg.tasks", "pkg.tasks.base"] in found
    assert ["pkg.data.reader", "pkg.train", "pkg.train.loop"] in found


def _comment_lines(source: str) -> set[int]:
    """Lines that carry a comment (other than a bare `# noqa`)."""
    return {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT and not token.string.lstrip("# ").startswith("noqa")}


def late_imports_without_reason(root: pathlib.Path = REPO / "nli_jax") -> list[str]:
    """'path:line' of each import inside a function with no comment on its lines or the line above."""
    out = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        commented = _comment_lines(source)
        late = {node for function in _functions(ast.parse(source)) for node in ast.walk(function)
                if isinstance(node, (ast.Import, ast.ImportFrom))}
        out += [f"{path.relative_to(root.parent)}:{node.lineno}" for node in sorted(late, key=lambda n: n.lineno)
                if not commented & set(range(node.lineno - 1, node.end_lineno + 1))]
    return out


def test_imports_inside_functions_say_why():
    """Imports are at the module top; one kept inside a function (an optional or heavy dependency
    a light command must not pay for, an environment variable to set first, a cycle) says why in a
    comment on its line or the line above, so that each is deliberate."""
    missing = late_imports_without_reason()
    assert not missing, f"imports inside functions without a comment saying why (move them to the top?): {missing}"


def test_the_late_import_check_finds_an_uncommented_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "import os\n\n\ndef a():\n    import json  # late: why\n\n\ndef b():\n    # late: why\n"
        "    from json import (dumps,\n                      loads)\n\n\ndef c():\n    import re  # noqa\n"
        "    from json import (dumps,\n                      loads)\n")
    assert late_imports_without_reason(tmp_path / "pkg") == ["pkg/m.py:15", "pkg/m.py:16"]


def test_only_the_planner_reads_the_config():
    """Defaults live in configs/ only; the planner turns a config into a typed plan."""
    pattern = re.compile(r"config(\.[a-z_]+)*\.get\(")
    readers = sorted(str(path.relative_to(REPO)) for package in ("nli_jax", "finetune", "pretrain")
                     for path in (REPO / package).rglob("*.py") if pattern.search(path.read_text(encoding="utf-8")))
    assert readers in ([], ["nli_jax/planner.py"]), readers


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


@pytest.mark.parametrize("path", sorted((REPO / "nli_jax" / "train").glob("*.py")), ids=lambda p: p.name)
def test_train_modules_say_what_they_own_and_keep_functions_short(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if path.name != "__init__.py":
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"
    long = [(f.name, f.end_lineno - f.lineno + 1) for f in _functions(tree) if f.end_lineno - f.lineno + 1 > 80]
    assert not long, f"functions over 80 lines in {path.name}: {long}"


def test_every_config_override_the_docs_suggest_names_a_key():
    """--config.KEY=... in README.md and docs/ (docs/errors.md shows mistyped keys on purpose)
    names a key of the fine-tuning or pretraining configs: a user who copies one is not refused."""
    import re
    from configs import finetune_common
    from configs.pretrain.common import pretrain_config
    from nli_jax.planner import has_key
    from nli_jax.tasks import TASKS
    configs = [*(finetune_common.base_config(task) for task in TASKS), pretrain_config("indobert-base", None)]
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    suggested = {(page.name, m.group(1)) for page in pages if page.name != "errors.md"
                 for m in re.finditer(r"--config\.([A-Za-z_][\w.]*)=", page.read_text(encoding="utf-8"))}
    assert len(suggested) > 30
    unknown = sorted((page, key) for page, key in suggested if not any(has_key(c, key) is True for c in configs))
    assert not unknown, unknown


# The shared modules every run reads: a component (schedule, hook, model family, task) is named in
# its own module and its registry, never here. Defaults of a shared field are the one exception.
SHARED_MODULES = ("nli_jax/plan.py", "nli_jax/planner.py", "nli_jax/models/config.py", "nli_jax/train")
SHARED_DEFAULTS = {("nli_jax/plan.py", "constant"),  # OptimizerPlan.schedule's default
                   ("nli_jax/models/config.py", "bert")}  # EncoderConfig.model_type's default


def _named_components() -> dict[str, set[str]]:
    from nli_jax.hooks import HOOKS
    from nli_jax.models import families
    from nli_jax.schedules import SCHEDULES
    from nli_jax.tasks import TASKS
    return {"schedule": set(SCHEDULES.names()), "hook": set(HOOKS.names()),
            "model family": set(families.model_types()), "task": set(TASKS)}


def _string_literals(tree) -> list[ast.Constant]:
    """String constants of `tree` other than docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and ast.get_docstring(node) is not None}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_shared_modules_name_no_component():
    """No schedule, hook, model family or task name is a string in plan.py, the planner, the shared
    EncoderConfig or the loop's package: each lives with its component (issue 48)."""
    components = _named_components()
    paths = [path for name in SHARED_MODULES for path in
             (sorted((REPO / name).glob("*.py")) if (REPO / name).is_dir() else [REPO / name])]
    found = sorted((str(path.relative_to(REPO)), node.lineno, kind, node.value)
                   for path in paths for node in _string_literals(ast.parse(path.read_text(encoding="utf-8")))
                   for kind, names in components.items() if node.value in names
                   and (str(path.relative_to(REPO)), node.value) not in SHARED_DEFAULTS)
    assert not found, found
