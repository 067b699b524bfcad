"""Every shipped recipe and variant resolves to the config it resolved to at 5272312 (before
recipes were written as a parent and its overrides): tests/fixtures/resolved_recipes_5272312.json
holds each one's config as that commit's get_config(variant).to_dict() gave it. An older key is read
where it lives now (nli_jax.migrations); a key added since must hold its default."""
import importlib
import json

import pytest
from flax import traverse_util

from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "resolved_recipes_5272312.json"
RESOLVED = json.loads(FIXTURE.read_text().replace("{REPO}", str(REPO)))


def _flat(config: dict) -> dict:
    d = json.loads(json.dumps(config))
    shape = d.get("mesh", {}).pop("shape", None)
    flat = traverse_util.flatten_dict(d, sep=".", keep_empty_nodes=True)
    if shape is not None:
        flat["mesh.shape"] = shape
    return {k: v for k, v in flat.items() if not isinstance(v, traverse_util._EmptyNode)}


def differences(then: dict, now: dict) -> list[str]:
    from nli_jax import migrations
    from nli_jax.plan import LEGACY_VALUES, default_config, section_defaults
    from nli_jax.tasks import options_class
    options = options_class(now["task"])
    older = _flat(migrations.upgrade_config_json(then, options))
    current = _flat(now)
    defaults = _flat(default_config(now["task"], section_defaults(options), pretrain="pretrain" in now).to_dict())
    out = []
    for key in sorted(set(older) | set(current)):
        if key not in current:
            out.append(f"{key}: {older[key]!r} then, gone now")
        elif key not in older:
            if defaults.get(key, object()) != current[key]:
                out.append(f"{key}: new, {current[key]!r} is not its default {defaults.get(key)!r}")
        elif _meaning(LEGACY_VALUES, key, older[key]) != _meaning(LEGACY_VALUES, key, current[key]):
            out.append(f"{key}: {older[key]!r} -> {current[key]!r}")
    return out


def _meaning(legacy_values: dict, key: str, value):
    """A value as the workdir check compares it: through plan.LEGACY_VALUES where an older spelling
    means the same (mesh.rules without its (name, None) rules: a name without a rule is not sharded)."""
    normalise = legacy_values.get(key)
    value = [tuple(v) if isinstance(v, list) else v for v in value] if isinstance(value, list) else value
    return normalise(value) if normalise else value


# What changed on purpose since 5272312, by recipe: the overlap check (issue 49) lets the two corpora
# whose official evaluation splits repeat their training text run as published.
INTENDED = {"configs/inferes.py": {"data.allow_overlap": True}, "configs/indonlu.py:task=terma": {"data.allow_overlap": True}}


def _intended(recipe: str) -> dict:
    path, variant = recipe.split(":", 1)
    out = dict(INTENDED.get(path, {}))
    for key, changes in INTENDED.items():
        if ":" in key and recipe.startswith(key) and (recipe == key or recipe[len(key)] == ","):
            out.update(changes)
    return out


@pytest.mark.parametrize("recipe", sorted(RESOLVED))
def test_the_recipe_resolves_as_it_did(recipe):
    path, variant = recipe.split(":", 1)
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    now = module.get_config(variant or None).to_dict()
    intended = _intended(recipe)
    found = differences(RESOLVED[recipe], now)
    assert [d for d in found if d.split(":", 1)[0] not in intended] == []
    for key, value in intended.items():  # each intended change is there, with its value
        assert _flat(now)[key] == value, (recipe, key)


def test_a_recipe_is_its_parent_and_its_overrides():
    """configs/pretrain/crammed.py states its parent (indobert_base) and overrides; span_bert.py changes
    the parent's task, keeping the masking budget the parent set (80 at phase 2), the new task's
    defaults elsewhere."""
    from configs import recipes
    from configs.pretrain import crammed, indobert_base, span_bert
    parent, child = indobert_base.get_config("cpu_test"), crammed.get_config("cpu_test")
    assert (child.pretrain.corpus, child.data.max_seq_length) == (parent.pretrain.corpus, parent.data.max_seq_length)
    assert (child.optimizer.schedule, child.model.preset, child.task_options.max_predictions) == ("one_cycle",
                                                                                                 "tiny-crammed", 20)
    span = span_bert.get_config("phase=2")
    assert (span.task, span.task_options.max_predictions, span.task_options.whole_word) == ("span_bert", 80, True)
    with pytest.raises(recipes.UnknownVariantError, match="unknown variant.s. phase; this config file knows: "
                                                          "cpu_test, cpu_learn"):
        crammed.get_config("phase=2")


def test_an_override_naming_no_key_is_refused_naming_the_recipe():
    from configs import recipes
    from configs.pretrain import indobert_base
    mistyped = recipes.derive(indobert_base, {"optimizer.learning_rate": 1e-3}, name="configs/mine.py")
    with pytest.raises(KeyError, match=r"configs/mine.py: override 'optimizer.learning_rate' names no config key"):
        mistyped()
    with pytest.raises(KeyError, match=r"'optimiser.lr' names no config key \('optimiser' is not a section\)"):
        recipes.derive(indobert_base, {"optimiser.lr": 1e-3})()
