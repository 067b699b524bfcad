"""Recipes as data: a recipe file states its parent and its overrides, as MaxText states a model as
a short file of overrides of a named parent.

    from configs import recipes
    from configs.pretrain import indobert_base

    get_config = recipes.derive(
        indobert_base,                                          # the parent config file
        {"task": "span_bert", "pretrain.sentence_task": "none"},  # its overrides, flat dotted keys
        variants={"cpu_test": {...}},                           # this file's own variants
        passes=("phase=1|2", "cpu_test"))                       # the parent's variants it accepts

`get_config("cpu_test,phase=2")` is the parent's config for the variants it knows, then the
overrides, then the file's own variants in their declared order (`default` when none of them is
given), then `derived`. A value may be a function of the config so far (a derived value: 30% of the
length). A key the config lacks is an error naming the recipe and the key, never a silently added
key. Overriding `task` gives the new task's options their defaults, keeping the values the recipe
set away from the old task's defaults (of options both tasks declare). `parse(arg, known)` reads every config file's `FILE:variant,key=value`.
"""
from __future__ import annotations

import difflib
from typing import Any, Callable, Mapping

import ml_collections

from nli_jax.tasks import options_config


class UnknownVariantError(ValueError):
    """A config variant (`--config=FILE:variant`) the config file does not have."""


def parse_arg(arg: str | None) -> dict:
    """'cpu_test' or 'lr=3e-5,model=base' -> {'cpu_test': True} / {'lr': '3e-5', 'model': 'base'}."""
    out = {}
    for part in (arg or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, _, value = part.partition("=")
        out[key] = value if value else True
    return out


def refuse_unknown_variants(options: dict, known) -> None:
    """One short error naming the variants of `options` left over (not popped by the config
    file) and the `known` ones ('cpu_test', 'task=...'), with the closest known as a suggestion.
    The command line prints it as `error: --config=FILE:variant: ...`."""
    if not options:
        return
    names = [k.split("=")[0] for k in known]
    unknown = sorted(options)
    close = sorted({m for u in unknown for m in difflib.get_close_matches(u, names, n=1, cutoff=0.6)})
    raise UnknownVariantError(f"unknown variant(s) {', '.join(unknown)}"
                              + (f" (did you mean {' or '.join(close)}?)" if close else "")
                              + f"; this config file knows: {', '.join(known)}")


def format_arg(options: Mapping[str, Any]) -> str | None:
    """parse_arg's inverse."""
    return ",".join(k if v is True else f"{k}={v}" for k, v in options.items()) or None


def apply(c: ml_collections.ConfigDict, overrides: Mapping[str, Any], recipe: str = "recipe"):
    """Sets each dotted key of `overrides` (a value, or a function of the config so far) in order;
    a key the config lacks is a KeyError naming `recipe` and the key."""
    for key, value in overrides.items():
        if callable(value):
            value = value(c)
        if key == "task":  # the recipe's own option values (those off the old task's defaults) carried over
            old_defaults, fresh = options_config(c.task), options_config(value)
            carried = {k: v for k, v in c.task_options.items() if k in fresh and old_defaults.get(k) != v}
            c.task = value
            c.task_options = options_config(value, **carried)
            continue
        *parents, leaf = key.split(".")
        node = c
        for part in parents:
            if part not in node:
                raise KeyError(f"{recipe}: override {key!r} names no config key ({part!r} is not a section)")
            node = node[part]
        if leaf not in node:
            close = difflib.get_close_matches(leaf, list(node.keys()), n=1)
            raise KeyError(f"{recipe}: override {key!r} names no config key"
                           + (f" (did you mean {'.'.join(parents + close)}?)" if close else ""))
        node[leaf] = value
    return c


def derive(parent, overrides: Mapping[str, Any], *, variants: Mapping[str, Mapping[str, Any]] | None = None,
           default: Mapping[str, Any] | None = None, derived: Mapping[str, Any] | None = None,
           passes: tuple[str, ...] | None = None, name: str = "recipe") -> Callable:
    """A config file's get_config: `parent` (a config module, or a get_config) for the variants it
    knows (`passes`: those this recipe accepts, None: all), then `overrides`, then each of
    `variants` given (`default` when none is), then `derived`."""
    get_parent = parent.get_config if hasattr(parent, "get_config") else parent
    own = dict(variants or {})

    passed = None if passes is None else {p.split("=")[0] for p in passes}

    def get_config(arg=None):
        options = parse_arg(arg)
        mine = [v for v in own if options.get(v)]
        if passed is not None:
            known = tuple(dict.fromkeys((*passes, *own)))
            refuse_unknown_variants({k: v for k, v in options.items() if k not in passed and k not in own}, known)
        # The parent gets the variants it knows (a variant of both, such as cpu_test, goes to both).
        c = get_parent(format_arg({k: v for k, v in options.items() if k not in own or (passed and k in passed)}))
        apply(c, overrides, name)
        for variant in mine:
            apply(c, own[variant], f"{name}:{variant}")
        if not mine and default:
            apply(c, default, name)
        return apply(c, derived or {}, name)
    return get_config
