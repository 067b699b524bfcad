"""The plan's builder: an ml_collections config becomes a frozen, typed `nli_jax.plan.RunPlan`,
here and nowhere else, and every check of a run lives here, in the order a run meets them:

1. `build_plan` (nothing read): each field's type and range (declared on the plan's
   dataclasses, and on the task's options class for `task_options`), then the relations that need no file: task and splits, model preset, seeds,
   batch against processes, accumulation and data-parallel devices, mesh shape, pretraining
   masking; then the derived `BatchPlan`. `seed_plans` builds one plan per entry of `seeds`.
2. `check_paths`: every gs:// path reachable (seconds, before anything is read or written).
3. `check_model_fit` (tokenizer and model shape known): data.max_seq_length against what an
   example needs and what the model can embed; the tokenizer against the model's vocabulary.
4. `check_unknown_rate` (data read): the tokenizer against the training text.
5. `step_plan` (training split sized): one batch at least; warmup shorter than the run.

Every refusal is a `ConfigValueError` naming the key as the command line gives it
(`--config.optimizer.lr=-0.001: optimizer.lr must be > 0`); all problems of a stage are
reported at once, on one line. The command line's side (mistyped keys) is `nli_jax.cli`,
using `config_keys` and `close_keys` from here.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
from typing import Sequence

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from nli_jax import migrations
from nli_jax import options as options_lib
from nli_jax import plan as P
from nli_jax import storage
from nli_jax import workdir as workdir_lib
from nli_jax.data.records import read_many
from nli_jax.errors import ConfigValueError, RunError  # noqa: F401  (re-exported)
from nli_jax.hooks import HOOKS
from nli_jax.models.presets import PRESETS
from nli_jax.options import flag  # noqa: F401  (re-exported: the refusals' spelling of a key)
from nli_jax.schedules import SCHEDULES
from nli_jax.pretraining.mixture import corpus_globs
from nli_jax.tasks import TASK_OPTIONS, TASKS, create_task, options_class
from nli_jax.train import mesh as mesh_lib
from nli_jax.train.batch_ramp import BatchRampOptions

log = logging.getLogger("nli_jax")

# Config keys that name files or directories: each may be a local path or gs://bucket/path (and
# the task's options declared with option(..., path=True)).
PATH_KEYS = ("data.source", "data.tfds_dir", "data.train_subset", "model.init", "model.tokenizer", "pretrain.corpus",
             "pretrain.examples_dir")
_SECTIONS = {"data": P.DataPlan, "model": P.ModelPlan, "optimizer": P.OptimizerPlan, "train": P.TrainPlan,
             "pretrain": P.PretrainPlan}
_TOP = ("task", "eval_splits", "seeds", "export_best", "export_final")


# --- the config as keys ---------------------------------------------------------------------

def config_dict(config) -> dict:
    """The config as plain JSON values (tuples as lists), as config.json stores it."""
    return json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict") else config))


def config_keys(config) -> list[str]:
    """Every leaf key of a config, dotted (mesh.shape's axes included, as --config.mesh.shape.data)."""
    return sorted(traverse_util.flatten_dict(config_dict(config), sep=".", keep_empty_nodes=True))


def has_key(config, key: str):
    """True when the dotted key names a field (or section) of the config, else how many of its
    leading parts do."""
    node = config
    for depth, part in enumerate(key.split(".")):
        if not (hasattr(node, "keys") and part in node):
            return depth
        node = node[part]
    return True


def saved_config(workdir: str):
    """A run's config.json as a ConfigDict (its lists as tuples), an older nli-jax's keys where
    they are now (nli_jax.migrations.upgrade_config_json), the plan's defaults for keys it did not
    write; None when the workdir has none."""
    saved = workdir_lib.read_config(workdir)
    if saved is None:
        return None
    saved = migrations.upgrade_config_json(saved, options_class(saved.get("task", "")))

    def merged(defaults: dict, values: dict) -> dict:
        out = dict(defaults)
        for key, value in values.items():
            both_dicts = isinstance(value, dict) and isinstance(defaults.get(key), dict) and key != "shape"
            out[key] = merged(defaults[key], value) if both_dicts else value
        return out

    def tuples(node):
        if isinstance(node, dict):
            return {k: tuples(v) for k, v in node.items()}
        return tuple(tuples(v) for v in node) if isinstance(node, list) else node
    task = saved.get("task", migrations.TASK_OF_CONFIGS_WITHOUT_ONE)
    defaults = P.default_config(task, P.section_defaults(options_class(task)), pretrain="pretrain" in saved)
    return ml_collections.ConfigDict(tuples(merged(config_dict(defaults), saved)))


def close_keys(key: str, keys: Sequence[str], n: int = 3) -> list[str]:
    """The valid keys closest to a mistyped one: by whole key, then by its last part."""
    found = difflib.get_close_matches(key, keys, n=n, cutoff=0.6)
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
    for match in difflib.get_close_matches(leaf, list(by_leaf), n=n, cutoff=0.6):
        if by_leaf[match] not in found:
            found.append(by_leaf[match])
    return found[:n]


def refuse(problems: list[str]) -> None:
    if problems:
        raise ConfigValueError("; ".join(problems))


def _tuples(value):
    """config.json's lists as the config files' tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


# --- 1. the plan ----------------------------------------------------------------------------

def _section(config, name: str, cls, problems: list[str]):
    """A section dataclass from config.<name>, every field type- and range-checked."""
    node = config[name]
    values = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for key in sorted(set(node.keys()) - names):
        problems.append(unknown_key(f"{name}.{key}", [f"{name}.{n}" for n in sorted(names)]))
    for field in dataclasses.fields(cls):
        key = f"{name}.{field.name}"
        if field.name == "overrides":
            values["overrides"] = _overrides(node["overrides"], problems)
            continue
        if field.name not in node:
            problems.append(f"the config has no {key} (start from configs/finetune_common.base_config(), which "
                            "has every key)")
            continue
        value = _tuples(node[field.name])
        value = P.LEGACY_VALUES.get(key, lambda v: v)(value)
        bad = P.check_of(field).problem(value)
        if bad:
            problems.append(f"{flag(key, value)}: {key} {bad}")
        values[field.name] = value
    return values


def unknown_key(key: str, known: Sequence[str], owner: str = "nli-jax") -> str:
    """Why `key` is refused: a key an older nli-jax had that a task's options hold now, or one
    close to a known key."""
    moved = migrations.moved_key(key)
    if moved:
        return f"{key}: now {moved} (its component's own option): --config.{moved}=..."
    close = difflib.get_close_matches(key, list(known), n=2)
    return (f"{key}: not a config key of {owner}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))


def task_options(config, task: str, problems: list[str]):
    """The task's options (its registered class) from config.task_options: keys the config lacks
    take the class's defaults, each value is checked, and a key the task does not declare is
    refused, unless it is another task's option at that task's default (what a config made for
    another task leaves when --config.task changes the task)."""
    if task not in TASKS:
        return P.NoOptions()  # the unknown task is refused by name
    cls = options_class(task)

    def owners(key):
        return sorted(name for name, other in TASK_OPTIONS.items() if key in P.section_defaults(other))

    def tolerated(key, value):
        found = owners(key)
        return bool(found) and all(P.section_defaults(TASK_OPTIONS[o])[key] == value for o in found)
    node = config["task_options"] if "task_options" in config else {}
    return options_lib.resolve(node, cls, "task_options", problems, owner=f"task {task!r}", tolerated=tolerated,
                               elsewhere=lambda key: f"{key} is an option of {', '.join(owners(key))}"
                               if owners(key) else "")


def _components(config, schedule: str, problems: list[str]):
    """The chosen schedule's options (every registered schedule's checked), the batch ramp's and
    every run hook's, from config.schedules / batch_ramp / hooks (nli_jax.options.resolve)."""
    def node(name):
        return config[name] if name in config else None
    schedules = dict(SCHEDULES.resolve_all(node("schedules"), "schedules", problems))
    if schedule not in SCHEDULES:
        close = difflib.get_close_matches(str(schedule), SCHEDULES.names(), n=2)
        problems.append(f"{flag('optimizer.schedule', schedule)}: optimizer.schedule must be one of "
                        f"{SCHEDULES.names()}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    ramp = options_lib.resolve(node("batch_ramp"), BatchRampOptions, "batch_ramp", problems, owner="the batch ramp")
    hooks = HOOKS.resolve_all(node("hooks"), "hooks", problems)
    return schedules.get(schedule), ramp, hooks


def _overrides(node, problems: list[str]) -> tuple:
    out = []
    for name in sorted(node.keys()):
        value = node[name]
        check = P.OVERRIDE_CHECKS.get(name)
        bad = check.problem(value) if check else None
        if bad:
            problems.append(f"{flag('model.overrides.' + name, value)}: model.overrides.{name} {bad}")
        if value is not None:
            out.append((name, value))
    return tuple(out)


def build_plan(config, *, training: bool = True, devices: int | None = None, processes: int | None = None,
               process_index: int | None = None) -> P.RunPlan:
    """The run's plan, every check that needs no file passed (one ConfigValueError listing them
    all otherwise). `training=False` (evaluate, predict, export): the model may come from the
    checkpoint given on the command line, and nothing is trained. `devices` / `processes`: as
    JAX sees them unless given (tests check a config against other machines)."""
    processes = jax.process_count() if processes is None else processes
    devices = jax.device_count() if devices is None else devices
    process_index = jax.process_index() if process_index is None else min(jax.process_index(), processes - 1)
    problems: list[str] = []
    top = {}
    for name in _TOP:
        field = next(f for f in dataclasses.fields(P.RunPlan) if f.name == name)
        if name not in config:
            problems.append(f"the config has no {name} (the config files define every key)")
            continue
        value = _tuples(config[name])
        bad = P.check_of(field).problem(value)
        if bad:
            problems.append(f"{flag(name, value)}: {name} {bad}")
        top[name] = value
    sections = {name: _section(config, name, cls, problems) for name, cls in _SECTIONS.items()
                if name != "pretrain" or ("pretrain" in config and hasattr(config["pretrain"], "keys"))}
    mesh_shape = config["mesh"]["shape"] if "mesh" in config else {"data": -1}
    mesh_shape = dict(mesh_shape) if hasattr(mesh_shape, "keys") else mesh_shape
    rules = tuple(tuple(r) for r in _tuples(config["mesh"]["rules"]))
    refuse(problems)  # the relations below assume well-typed values
    options = task_options(config, top["task"], problems)
    schedule, batch_ramp, hooks = _components(config, sections["optimizer"]["schedule"], problems)
    refuse(problems)

    data = P.DataPlan(**dict(sections["data"], tfds_dir=os.path.expanduser(sections["data"]["tfds_dir"]
                                                                           or "~/tensorflow_datasets/nli_jax")))
    model, optimizer, train = (P.ModelPlan(**sections["model"]), P.OptimizerPlan(**sections["optimizer"]),
                               P.TrainPlan(**sections["train"]))
    pretrain = P.PretrainPlan(**sections["pretrain"]) if "pretrain" in sections else None
    try:
        sizes = mesh_lib.resolve_shape(mesh_shape, devices)
    except ValueError as e:
        problems.append(f"{flag('mesh.shape', mesh_shape)}: {e}")
        sizes = None
    mesh = P.MeshPlan(shape=tuple(sizes.items()) if sizes else (), rules=rules,
                      data_parallel=mesh_lib.data_parallel_size(sizes, rules) if sizes else 1)

    # config.json records the task's options resolved (defaults included): the run's identity.
    config_json = dict(config_dict(config), task_options=dataclasses.asdict(options))
    plan = P.RunPlan(task=top["task"], eval_splits=top["eval_splits"], seeds=top["seeds"],
                     export_best=top["export_best"], export_final=top["export_final"], task_options=options,
                     data=data, model=model, optimizer=optimizer, schedule=schedule, batch_ramp=batch_ramp, hooks=hooks,
                     train=train, mesh=mesh, pretrain=pretrain, batch=None, config_json=config_json)
    task = _task(plan, problems)
    refuse(problems)
    plan = dataclasses.replace(plan, batch=_batch_plan(data, train, mesh, task, processes, process_index, training,
                                                       problems))
    _check_relations(plan, task, training, problems)
    refuse(problems)
    return plan


def _task(plan: P.RunPlan, problems: list[str]):
    """The plan's task (constructed from the plan's sections; no data read)."""
    if plan.task in TASKS:
        return create_task(plan)
    suggestions = difflib.get_close_matches(str(plan.task), sorted(TASKS), n=3)
    problems.append(f"{flag('task', plan.task)}: unknown task"
                    f"{'; did you mean ' + ' or '.join(suggestions) if suggestions else ''} "
                    f"(tasks: {', '.join(sorted(TASKS))})")
    return None


# Tokens (rows x data.max_seq_length) of an evaluation batch per data-parallel device, at most:
# the shipped recipes' eval batches are below it (IndoNLI 64 x 512 on one device: 32,768).
EVAL_TOKENS_PER_DEVICE = 65536


def _batch_plan(data: P.DataPlan, train: P.TrainPlan, mesh: P.MeshPlan, task, processes: int,
                process_index: int, training: bool, problems: list[str]) -> P.BatchPlan:
    batch, accumulation, parallel = train.batch_size, train.accumulation_steps, mesh.data_parallel
    if training and batch % (processes * accumulation):
        problems.append(f"{flag('train.batch_size', batch)}: must divide by processes x accumulation_steps "
                        f"({processes} x {accumulation} = {processes * accumulation})")
    micro = batch // accumulation
    if mesh.shape and training and batch % accumulation == 0 and micro % parallel:
        problems.append(f"{flag('train.batch_size', batch)}: the micro-batch of {micro} examples (batch_size / "
                        f"accumulation_steps) must divide by the {parallel} data-parallel devices")
    eval_batch = train.eval_batch_size
    if mesh.shape and (eval_batch < processes or (eval_batch // processes * processes) % parallel):
        problems.append(f"{flag('train.eval_batch_size', eval_batch)}: must divide by the {parallel} "
                        f"data-parallel devices ({processes} process(es))")
    max_len = data.max_seq_length
    buckets = (max_len,) if data.pad_to_max_length else tuple(sorted({b for b in data.buckets if b <= max_len}
                                                                     | {max_len}))
    # Packing groups: one per data-parallel shard and micro-batch, each process packing its own.
    groups = accumulation * parallel
    packs = data.packing and task.packs_examples and groups % processes == 0 and batch % groups == 0
    # Evaluation batches are bounded by tokens whatever train.eval_batch_size says (a huge one was
    # killed at the first evaluation): at most EVAL_TOKENS_PER_DEVICE rows x max_seq_length tokens
    # per data-parallel device. The loop logs the bound.
    asked_eval = eval_batch
    eval_batch = min(eval_batch, max(1, EVAL_TOKENS_PER_DEVICE // max_len) * parallel)
    # Evaluation packs one group per data-parallel device, each its share of the eval batch's rows.
    local_eval = max(1, eval_batch // processes)
    eval_packs = data.packing and task.packs_examples and parallel % processes == 0 and \
        local_eval % (parallel // processes) == 0
    return P.BatchPlan(processes=processes, process_index=process_index, global_batch=batch,
                       local_batch=max(1, batch // processes), accumulation=accumulation, data_parallel=parallel,
                       global_eval_batch=eval_batch, local_eval_batch=local_eval,
                       eval_batch_asked=asked_eval if asked_eval != eval_batch else 0,
                       buckets=buckets, packing_groups=groups // processes if packs else 0,
                       eval_packing_groups=parallel // processes if eval_packs else 0)


def _check_relations(plan: P.RunPlan, task, training: bool, problems: list[str]) -> None:
    possible = task.possible_splits()
    eval_splits = list(plan.eval_splits)
    if possible is not None:
        unknown = [s for s in eval_splits if s not in possible]
        if unknown:
            problems.append(f"{flag('eval_splits', tuple(eval_splits))}: {unknown} "
                            f"{'is not a split' if len(unknown) == 1 else 'are not splits'} of task "
                            f"{plan.task!r} (its splits: {', '.join(sorted(possible))})")
    if len(set(eval_splits)) != len(eval_splits):
        problems.append(f"{flag('eval_splits', tuple(eval_splits))}: a split is listed twice")
    seeds = list(plan.seeds)
    if len(set(seeds)) != len(seeds):
        problems.append(f"{flag('seeds', tuple(seeds))}: a seed is listed twice (the runs would be identical)")
    model = plan.model
    if training and not model.init:
        if model.preset not in PRESETS:
            close = difflib.get_close_matches(str(model.preset), sorted(PRESETS), n=3)
            problems.append(f"{flag('model.preset', model.preset)}: unknown preset (with model.init empty the model "
                            f"is built from a preset{'; did you mean ' + ' or '.join(close) if close else ''}; "
                            f"presets: {', '.join(sorted(PRESETS))})")
        if not model.tokenizer:
            problems.append("--config.model.tokenizer='' and --config.model.init='': a from-scratch model needs "
                            "model.tokenizer (a directory with vocab.txt or tokenizer.json)")
    problems.extend(task.plan_problems(plan))
    for key, component in plan.component_options():  # each component's relations with the run
        problems.extend(component.plan_problems(plan, task, key))
    if plan.data.train_subset and plan.data.max_train_examples:
        problems.append(f"{flag('data.train_subset', plan.data.train_subset)} and "
                        f"{flag('data.max_train_examples', plan.data.max_train_examples)}: two ways of choosing the "
                        "training examples; give one")
    p = plan.pretrain
    if training and p is not None:
        if not p.examples_dir and not any(p.corpus):
            problems.append(f"{flag('pretrain.corpus', tuple(p.corpus))}: no corpus files and no "
                            "pretrain.examples_dir: nothing to pretrain on")
        if p.continued and not model.init:
            problems.append("--config.model.init='': continued pretraining (the config's :continue variant) "
                            "starts from a checkpoint: pass --config.model.init=DIR (a Hugging Face BERT or "
                            "ALBERT directory)")


def for_seed(config, seed: int):
    """A copy of the config for one run of its `seeds`: train.seed set, no seeds loop of its own."""
    one = config.copy_and_resolve_references()
    with one.unlocked():
        one.seeds = ()
        one.train.seed = int(seed)
    return one


def seed_plans(config, plan: P.RunPlan, **kwargs) -> dict[int, P.RunPlan]:
    """{seed: that run's plan} for every entry of `seeds`, all checked before any runs."""
    return {int(seed): build_plan(for_seed(config, seed), **kwargs) for seed in plan.seeds}


# --- 2. paths -------------------------------------------------------------------------------

def check_paths(plan: P.RunPlan, workdir: str | None = None) -> None:
    """Every path of the run (workdir and PATH_KEYS) has a usable scheme, and a gs:// one a bucket
    that exists behind an endpoint that answers (seconds, not gcsfs's minutes of retries): one
    error naming the key and path, before anything is read, written or computed."""
    values = {"data.source": plan.data.source, "data.tfds_dir": plan.data.tfds_dir,
              "data.train_subset": plan.data.train_subset, "model.init": plan.model.init,
              "model.tokenizer": plan.model.tokenizer}
    if plan.pretrain is not None:
        values.update({"pretrain.corpus": corpus_globs(plan.pretrain.corpus),  # a mixture's "name=glob" as its glob
                       "pretrain.examples_dir": plan.pretrain.examples_dir})
    for name in type(plan.task_options).path_fields():
        values[f"task_options.{name}"] = getattr(plan.task_options, name)
    named = [("--workdir", workdir)] if workdir else []
    for key in (*PATH_KEYS, *(k for k in values if k.startswith("task_options."))):
        value = values.get(key, "")
        for item in ([value] if isinstance(value, str) else list(value or ())):
            if item and (":" in item.split("/")[0]):  # a URL; hub ids and local paths have no scheme
                named.append((f"--config.{key}", item))
    seen = set()
    for name, value in named:
        try:
            storage.check(value)
            bucket = storage.scheme(value) and value.split("://", 1)[1].split("/")[0]
            if bucket and bucket not in seen:
                seen.add(bucket)
                storage.check_reachable(value.split("*")[0].rsplit("/", 1)[0] if "*" in value else value)
        except storage.StorageError as e:
            raise storage.StorageError(f"{name}: {e}") from None


# --- 3. tokenizer and model -----------------------------------------------------------------

def usable_positions(encoder_config) -> int:
    """Token positions the model can embed (RoBERTa numbers them from pad_token_id + 1)."""
    return int(encoder_config.max_position_embeddings) - int(encoder_config.position_offset)


def check_model_fit(plan: P.RunPlan, task, tokenizer, tokenizer_path: str, encoder_config, model_source: str) -> None:
    """data.max_seq_length against what one example needs and what the model can embed; the
    tokenizer's ids against the model's vocabulary."""
    problems = []
    max_len = plan.data.max_seq_length
    need, shape = task.min_seq_length(tokenizer)
    if max_len < need:
        problems.append(f"{flag('data.max_seq_length', max_len)}: too short for task {task.name!r}: {shape} needs at "
                        f"least {need} tokens with this tokenizer")
    positions = usable_positions(encoder_config)
    if max_len > positions:
        problems.append(f"{flag('data.max_seq_length', max_len)}: longer than the {positions} positions the model "
                        f"({model_source}, max_position_embeddings {encoder_config.max_position_embeddings}) can embed")
    vocab = tokenizer.get_vocab()
    largest = max(vocab.values()) if vocab else -1
    if len(tokenizer) > encoder_config.vocab_size or largest >= encoder_config.vocab_size:
        problems.append(f"tokenizer {tokenizer_path} has {len(tokenizer)} entries (ids up to {largest}) but the model "
                        f"({model_source}) embeds only vocab_size {encoder_config.vocab_size}: the tokenizer does not "
                        f"fit the model (--config.model.tokenizer / --config.model.init)")
    refuse(problems)


# --- 4. tokenizer against the text ----------------------------------------------------------

# Above this share of [UNK] among the (non-special) tokens of a sample of training text, the
# tokenizer does not fit the text: most words would be invisible to the model.
MAX_UNKNOWN_RATE = 0.5
WARN_UNKNOWN_RATE = 0.05  # above it, a warning: many words would be invisible to the model
UNKNOWN_SAMPLE = 256


def check_unknown_rate(tokenizer, tokenizer_path: str, source, encode, split: str,
                       sample: int = UNKNOWN_SAMPLE, limit: float = MAX_UNKNOWN_RATE) -> float:
    """Share of [UNK] among the non-special tokens of the first `sample` examples of `source`;
    above `limit` the run stops, naming the tokenizer and the rate."""
    unk = tokenizer.unk_token_id
    if unk is None or source is None or len(source) == 0:
        return 0.0
    special = np.asarray(sorted(set(tokenizer.all_special_ids) - {unk}), np.int64)
    n = min(sample, len(source))
    examples = read_many(source, range(n))
    unknown = total = 0
    for example in examples:
        features = encode(example)
        ids = features.get("input_ids")
        if ids is None:  # pretraining records: the two segments' token ids
            ids = np.concatenate([np.asarray(features.get(k, []), np.int64) for k in ("a", "b")])
        ids = np.asarray(ids, np.int64)
        ids = ids[~np.isin(ids, special)]
        unknown += int((ids == unk).sum())
        total += int(ids.size)
    rate = unknown / max(total, 1)
    if WARN_UNKNOWN_RATE < rate <= limit:
        hint = ""
        lowercase_vocab = sum(t.islower() for t in tokenizer.get_vocab()) > 0.9 * sum(
            t.isalpha() for t in tokenizer.get_vocab())
        if lowercase_vocab and not getattr(tokenizer, "do_lower_case", True):
            hint = ": its vocabulary is lowercase but it does not lowercase the text (do_lower_case false)"
        log.warning("tokenizer %s maps %.0f%% of the tokens of the first %d %s examples to %s%s", tokenizer_path,
                    100 * rate, n, split, tokenizer.unk_token, hint)
    if rate > limit:
        raise ConfigValueError(
            f"tokenizer {tokenizer_path} maps {rate:.0%} of the tokens of the first {n} {split} examples to "
            f"{tokenizer.unk_token} (limit {limit:.0%}): it does not fit this text (--config.model.tokenizer)")
    return rate


def check_label_variety(plan: P.RunPlan, task, source) -> None:
    """A training split whose examples all carry one label teaches nothing but that label (a
    wrong file, a filter gone wrong): refused unless data.allow_one_label."""
    if plan.data.allow_one_label or len(source) == 0 or task.gold_labels(source[0]) is None:
        return
    labels = set()
    for i in range(len(source)):
        labels.update(task.gold_labels(source[i]) or ())
        if len(labels) > 1:
            return
    raise ConfigValueError(f"task {plan.task!r}: every one of the {len(source)} training examples has the label "
                           f"{sorted(labels)[0]!r} if any: the model would learn that label alone (a wrong file or "
                           f"subset?); check data.source / data.train_subset, or pass "
                           f"--config.data.allow_one_label=True")


# --- 5. the run's length --------------------------------------------------------------------

def step_plan(plan: P.RunPlan, train_examples: int) -> P.StepPlan:
    """Steps per epoch, total and warmup steps and the intervals, from the training split's size:
    it must hold one global batch, and the warmup must end before the run does."""
    train, batch = plan.train, plan.batch.global_batch
    steps_per_epoch = train_examples // batch
    if steps_per_epoch == 0:
        raise ConfigValueError(f"{flag('train.batch_size', batch)}: the training split has {train_examples} examples, "
                               "fewer than one batch")
    epoch_steps = steps_per_epoch * train.num_epochs
    total_steps = min(epoch_steps, train.max_steps) if train.max_steps > 0 else epoch_steps
    opt = plan.optimizer
    if opt.warmup_steps >= epoch_steps and opt.warmup_steps > 0:
        raise ConfigValueError(
            f"{flag('optimizer.warmup_steps', opt.warmup_steps)}: not shorter than the whole run ({epoch_steps} steps: "
            f"{train.num_epochs} epochs of {steps_per_epoch}); the learning rate would never reach optimizer.lr")
    if opt.warmup_steps >= total_steps > 0 and opt.warmup_steps > 0:
        log.warning("train.max_steps=%d stops the run inside the %d warmup steps: the learning rate reaches only "
                    "%.2g of optimizer.lr", total_steps, opt.warmup_steps, total_steps / opt.warmup_steps)
    warmup = opt.warmup_steps or round(opt.warmup_ratio * total_steps)
    eval_every = train.eval_every_steps or steps_per_epoch
    return P.StepPlan(train_examples=train_examples, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                      warmup_steps=int(warmup), eval_every=eval_every,
                      checkpoint_every=train.checkpoint_every_steps or eval_every,
                      log_every=max(1, train.log_every_steps))

