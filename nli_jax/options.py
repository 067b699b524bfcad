"""Typed options and the components that own them.

Every value a run reads is declared once, with its type and accepted range (`Check`, in a
dataclass field's metadata). The shared plan (`nli_jax.plan`) declares what every run has; what
one component alone reads (a task, a learning-rate schedule, a run hook, the batch ramp) is that
component's own `Options` subclass, declared beside its code with `option(...)` fields and
registered with it in its kind's `Registry`. The planner reads every kind through the one
function here, `resolve`: a key the config lacks takes the default, each value is checked, and a
key the options do not declare is refused with the declared ones named.

In the config a kind's options sit under one key per component (`config.hooks.<name>.<option>`,
`config.schedules.<name>.<option>`; a task's under `config.task_options`), so that any of them
can be set on the command line; `default_config` lists every registered component's defaults.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import pkgutil
from typing import Any, Callable

@dataclasses.dataclass(frozen=True)
class Check:
    """The accepted values of one config field: its kind and (for numbers) its range."""
    kind: str  # int, float, bool, str, ints, strs, choice, optional_float, any; section, derived (not config values)
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low < value instead of low <= value
    high_open: bool = False
    choices: tuple = ()

    def problem(self, value) -> str | None:
        """Why `value` is not acceptable, or None."""
        kind = self.kind
        if kind in ("any", "section", "derived"):
            return None
        if kind == "optional_float":
            if value is None:
                return None
            kind = "float"
        if kind == "bool":
            return None if isinstance(value, bool) else f"must be True or False, got {value!r}"
        if kind == "str":
            return None if isinstance(value, str) else f"must be a string, got {value!r}"
        if kind == "choice":
            return None if value in self.choices else f"must be one of {list(self.choices)}, got {value!r}"
        if kind in ("ints", "strs"):
            if not isinstance(value, (tuple, list)):
                return f"must be a tuple, got {value!r}"
            inner = Check("int" if kind == "ints" else "str", self.low, self.high, self.low_open, self.high_open)
            for item in value:
                bad = inner.problem(item)
                if bad:
                    return f"element {item!r}: {bad}"
            return None
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"must be an integer, got {value!r}"
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"must be a number, got {value!r}"
            if not math.isfinite(value):
                return f"must be finite, got {value!r}"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {'>' if self.low_open else '>='} {self.low:g}{self._range()}, got {value!r}"
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return f"must be {'<' if self.high_open else '<='} {self.high:g}{self._range()}, got {value!r}"
        return None

    def _range(self) -> str:
        if self.low is None or self.high is None:
            return ""
        return (f" (range {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                f"{')' if self.high_open else ']'})")


def _field(kind: str, low=None, high=None, *, low_open=False, high_open=False, choices=(), default=dataclasses.MISSING,
           **metadata):
    return dataclasses.field(default=default,
                             metadata={"check": Check(kind, low, high, low_open, high_open, tuple(choices)), **metadata})


def _int(default, low=None, high=None):
    return _field("int", low, high, default=default)


def _float(default, low=None, high=None, *, low_open=False, high_open=False):
    return _field("float", low, high, low_open=low_open, high_open=high_open, default=default)


def _choice(default, *choices):
    return _field("choice", choices=choices, default=default)


def _bool(default):
    return _field("bool", default=default)


def _str(default=""):
    return _field("str", default=default)


def option(default, *, low=None, high=None, low_open=False, high_open=False, choices=(), path=False,
           model_input=False):
    """A field of a component's options (`Options`): its default and accepted values, the kind
    taken from the default (or `choices`). `path`: names a file or directory (local or gs://,
    checked before anything is read); `model_input`: changes what the model is given (a
    checkpoint trained with one value is not evaluated with another)."""
    kind = ("choice" if choices else "bool" if isinstance(default, bool) else "int" if isinstance(default, int)
            else "float" if isinstance(default, float) else "str" if isinstance(default, str) else "any")
    return _field(kind, low, high, low_open=low_open, high_open=high_open, choices=choices, default=default, path=path,
                  model_input=model_input)


def check_of(field: dataclasses.Field) -> Check:
    return field.metadata.get("check", Check("any"))


@dataclasses.dataclass(frozen=True)
class Options:
    """A component's own options: fields made with `option(...)`. `problems()`: relations among
    them (refusals naming the flags); `plan_problems(plan, task, key)`: relations with the rest of
    the run (its plan and task), `key` being where the options sit in the config
    (`hooks.dynamics`)."""

    def problems(self) -> list[str]:
        return []

    def plan_problems(self, plan, task, key: str) -> list[str]:
        return []

    @classmethod
    def path_fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("path")]

    @classmethod
    def model_input_fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("model_input")]


def defaults(cls) -> dict[str, Any]:
    """{field: default} of an options class or plan section."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def flag(key: str, value) -> str:
    """A config value as the command line gives it: --config.key=value."""
    return f"--config.{key}={value!r}" if isinstance(value, str) else f"--config.{key}={value}"


def _tuples(value):
    """config.json's lists as the config files' tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def resolve(node, cls: type[Options], key: str, problems: list[str], *, owner: str = "",
            tolerated: Callable[[str, Any], bool] = lambda name, value: False,
            elsewhere: Callable[[str], str] = lambda name: "") -> Options | None:
    """`cls` from the config node at `key` (a ConfigDict, a dict or None): keys the node lacks take
    the class's defaults, each value is checked against its field, and a key `cls` does not declare
    is refused, naming the declared ones and `elsewhere(name)` (where that key belongs), unless
    `tolerated(name, value)`. Problems are appended; None when the values cannot make an instance."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    node = node if node is not None else {}
    values = {}
    for name in sorted(node.keys()):
        value = _tuples(node[name])
        if name not in fields:
            if tolerated(name, value):
                continue
            close = difflib.get_close_matches(name, list(fields), n=2)
            note = elsewhere(name)
            problems.append(f"{key}.{name}: not a config key of {owner or key} (its options: "
                            f"{', '.join(sorted(fields)) or 'none'}{'; ' + note if note else ''})"
                            + (f" (did you mean {' or '.join(f'{key}.{c}' for c in close)}?)" if close else ""))
            continue
        bad = check_of(fields[name]).problem(value)
        if bad:
            problems.append(f"{flag(f'{key}.{name}', value)}: {key}.{name} {bad}")
        values[name] = value
    try:
        options = cls(**values)
    except TypeError as e:  # a wrong type the checks above already name
        problems.append(f"{key}: {e}")
        return None
    problems.extend(options.problems())
    return options


class Registry:
    """The components of one kind (tasks, schedules, hooks): name -> (the component, its options
    class). Every module of `package` is imported on first use, so a new component is one module
    that calls `register`."""

    def __init__(self, kind: str, package: str, skip: tuple[str, ...] = ()):
        self.kind, self.package, self.skip = kind, package, skip
        self._components: dict[str, Any] = {}
        self._options: dict[str, type[Options]] = {}
        self._loaded = False

    def register(self, name: str, options: type[Options]):
        def wrap(component):
            if name in self._components:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._components[name], self._options[name] = component, options
            return component
        return wrap

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            package = importlib.import_module(self.package)
            for module in pkgutil.iter_modules(package.__path__):
                if module.name not in self.skip:
                    importlib.import_module(f"{self.package}.{module.name}")

    def names(self) -> list[str]:
        self._load()
        return sorted(self._components)

    def __contains__(self, name) -> bool:
        self._load()
        return name in self._components

    def get(self, name: str):
        self._load()
        if name not in self._components:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}")
        return self._components[name]

    def options_class(self, name: str) -> type[Options]:
        self.get(name)  # an unknown name: one error naming the registered ones
        return self._options[name]

    def default_options(self) -> dict[str, dict[str, Any]]:
        """{name: {option: default}} of every registered component: the config's section."""
        return {name: defaults(self.options_class(name)) for name in self.names()}

    def resolve_all(self, node, section: str, problems: list[str]) -> tuple:
        """((name, options), ...) of every registered component from config.<section>.<name>; a
        name that is no component of this kind is refused."""
        node = node if node is not None else {}
        for name in sorted(set(node.keys()) - set(self.names())):
            close = difflib.get_close_matches(name, self.names(), n=2)
            problems.append(f"{section}.{name}: not a {self.kind} (registered: {', '.join(self.names())})"
                            + (f"; did you mean {' or '.join(close)}?" if close else ""))
        out = []
        for name in self.names():
            options = resolve(node[name] if name in node else None, self.options_class(name), f"{section}.{name}",
                              problems, owner=f"{self.kind} {name!r}")
            if options is not None:
                out.append((name, options))
        return tuple(out)
