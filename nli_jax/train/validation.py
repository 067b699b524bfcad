"""One validation layer for run configs, applied before anything is written to the workdir or
computed: every field's type and range (`FIELDS`), and the relations between fields and with
the devices (`validate_config`), with the tokenizer and the model (`check_model_fit`), with the
training text (`check_unknown_rate`) and with the data size (the loop's `plan_training`).

Every refusal is a `ConfigValueError` naming the key as it is given on the command line
(`--config.optimizer.lr=-0.001: must be > 0`); all problems of a config are reported at once,
on one line. The command-line side (mistyped keys, with the closest valid ones) is in
`nli_jax.train.cli`.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Sequence

from nli_jax.errors import ConfigValueError, RunError  # noqa: F401  (re-exported)


@dataclasses.dataclass(frozen=True)
class Field:
    kind: str  # int, float, bool, str, ints, strs, choice, optional_float
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low < value instead of low <= value
    high_open: bool = False
    choices: tuple = ()

    def problem(self, value) -> str | None:
        """Why `value` is not acceptable, or None."""
        kind = self.kind
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
            inner = Field("int" if kind == "ints" else "str", self.low, self.high, self.low_open, self.high_open)
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


def _int(low=None, high=None):
    return Field("int", low, high)


def _float(low=None, high=None, low_open=False, high_open=False):
    return Field("float", low, high, low_open, high_open)


BOOL, STR = Field("bool"), Field("str")
PROBABILITY = Field("optional_float", 0.0, 1.0, high_open=True)

# Every field a fine-tuning or pretraining config may have, with its type and range. Fields a
# config lacks are skipped (pretrain.* only exists in pretraining configs).
FIELDS: dict[str, Field] = {
    "eval_splits": Field("strs"),
    "seeds": Field("ints"),
    "export_best": BOOL,
    "export_final": BOOL,
    "data.source": STR,
    "data.tfds_dir": STR,
    "data.max_seq_length": _int(1),
    "data.buckets": Field("ints", 1),
    "data.pad_to_max_length": BOOL,
    "data.packing": BOOL,
    "data.hypothesis_only": BOOL,
    "data.word_alignment": Field("choice", choices=("average", "first")),
    "data.train_size": Field("choice", choices=("", "50k", "30k", "10k", "3k")),
    "data.holdout_topic": STR,
    "data.validation_fraction": _float(0.0, 1.0, low_open=True, high_open=True),
    "data.validation_seed": _int(0),
    "data.translate_train_source": STR,
    "data.mix_indonli_train": BOOL,
    "data.max_train_examples": _int(0),
    "data.workers": _int(0),
    "model.init": STR,
    "model.preset": STR,
    "model.tokenizer": STR,
    "model.dtype": Field("choice", choices=("float32", "bfloat16", "float16")),
    "model.remat": BOOL,
    "model.overrides.hidden_dropout_prob": PROBABILITY,
    "model.overrides.attention_probs_dropout_prob": PROBABILITY,
    "model.overrides.classifier_dropout": PROBABILITY,
    "optimizer.name": Field("choice", choices=("adam", "adamw", "lamb")),
    "optimizer.lr": _float(0.0, 1.0, low_open=True),
    "optimizer.schedule": Field("choice", choices=("constant", "linear", "polynomial", "exponential_per_epoch")),
    "optimizer.warmup_steps": _int(0),
    "optimizer.warmup_ratio": _float(0.0, 1.0, high_open=True),
    "optimizer.decay_rate": _float(0.0, 1.0, low_open=True),
    "optimizer.end_lr": _float(0.0),
    "optimizer.power": _float(0.0, low_open=True),
    "optimizer.b1": _float(0.0, 1.0, high_open=True),
    "optimizer.b2": _float(0.0, 1.0, high_open=True),
    "optimizer.eps": _float(0.0, low_open=True),
    "optimizer.weight_decay": _float(0.0),
    "optimizer.grad_clip": _float(0.0),
    "train.seed": _int(0),
    "train.batch_size": _int(1),
    "train.eval_batch_size": _int(1),
    "train.accumulation_steps": _int(1),
    "train.num_epochs": _int(1),
    "train.max_steps": _int(0),
    "train.log_every_steps": _int(1),
    "train.eval_every_steps": _int(0),
    "train.checkpoint_every_steps": _int(0),
    "train.keep_checkpoints": _int(1),
    "train.async_checkpointing": BOOL,
    "train.early_stopping_patience": _int(0),
    "train.peak_tflops_per_device": _float(0.0),
    "pretrain.phase": Field("choice", choices=(1, 2)),
    "pretrain.corpus": Field("strs"),
    "pretrain.examples_dir": STR,
    "pretrain.sentence_task": Field("choice", choices=("nsp", "sop", "none")),
    "pretrain.whole_word": BOOL,
    "pretrain.max_ngram": _int(1),
    "pretrain.mask_prob": _float(0.0, 1.0, low_open=True, high_open=True),
    "pretrain.max_predictions": _int(1),
    "pretrain.short_seq_prob": _float(0.0, 1.0),
    "pretrain.dupe_factor": _int(1),
    "pretrain.data_seed": _int(0),
    "pretrain.workers": _int(1),
    "pretrain.heldout_examples": _int(1),
    "pretrain.heldout_permille": _int(1, 999),
    "pretrain.random_token_low": _int(0),
    "pretrain.continued": BOOL,
}


def _get(config, key: str, default=KeyError):
    node = config
    for part in key.split("."):
        try:
            if part not in node:
                if default is KeyError:
                    raise KeyError(key)
                return default
            node = node[part]
        except TypeError:  # a parent is not a ConfigDict
            if default is KeyError:
                raise KeyError(key) from None
            return default
    return node


_MISSING = object()


def flat_keys(config, prefix: str = "") -> list[str]:
    """Every leaf key of a (ConfigDict or dict) config, dotted."""
    out = []
    for key in config.keys():
        value = config[key]
        if hasattr(value, "keys") and not isinstance(value, (str, bytes)):
            inner = flat_keys(value, f"{prefix}{key}.")
            out.extend(inner or [f"{prefix}{key}"])
        else:
            out.append(f"{prefix}{key}")
    return out


def close_keys(key: str, keys: Sequence[str], n: int = 3) -> list[str]:
    """The valid keys closest to a mistyped one: by whole key, then by its last part."""
    found = difflib.get_close_matches(key, keys, n=n, cutoff=0.6)
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
    for match in difflib.get_close_matches(leaf, list(by_leaf), n=n, cutoff=0.6):
        if by_leaf[match] not in found:
            found.append(by_leaf[match])
    return found[:n]


def _flag(key: str, value) -> str:
    return f"--config.{key}={value!r}" if isinstance(value, str) else f"--config.{key}={value}"


def refuse(problems: list[str]) -> None:
    if problems:
        raise ConfigValueError("; ".join(problems))


# Config keys that name files or directories: each may be a local path or gs://bucket/path.
PATH_KEYS = ("data.source", "data.tfds_dir", "data.translate_train_source", "model.init", "model.tokenizer",
             "pretrain.corpus", "pretrain.examples_dir")


def check_paths(config, workdir: str | None = None) -> None:
    """Every path of the run (workdir and PATH_KEYS) has a usable scheme, and a gs:// one a bucket
    that exists behind an endpoint that answers (seconds, not gcsfs's minutes of retries): one
    error naming the key and path, before anything is read, written or computed."""
    from nli_jax import storage
    named = [("--workdir", workdir)] if workdir else []
    for key in PATH_KEYS:
        value = _get(config, key, "")
        for item in ([value] if isinstance(value, str) else list(value or ())):
            if item and (":" in item.split("/")[0]):  # a URL; hub ids and local paths have no scheme
                named.append((f"--config.{key}", item))
    seen = set()
    for flag, value in named:
        try:
            storage.check(value)
            bucket = storage.scheme(value) and value.split("://", 1)[1].split("/")[0]
            if bucket and bucket not in seen:
                seen.add(bucket)
                storage.check_reachable(value.split("*")[0].rsplit("/", 1)[0] if "*" in value else value)
        except storage.StorageError as e:
            raise storage.StorageError(f"{flag}: {e}") from None


def validate_config(config, *, devices: int | None = None, processes: int | None = None,
                    training: bool = True) -> None:
    """Types and ranges of every field, and the relations that need no data, tokenizer or model:
    task and splits, model preset, epochs/steps, batch vs accumulation, processes and devices,
    warmup ratio, mesh shape, pretraining masking. Raises one ConfigValueError listing them all.
    `training=False` (evaluate, predict, export): the model may come from the checkpoint given
    on the command line, and nothing is trained."""
    problems = []
    for key, field in FIELDS.items():
        value = _get(config, key, _MISSING)
        if value is _MISSING:
            continue
        bad = field.problem(value)
        if bad:
            problems.append(f"{_flag(key, value)}: {key} {bad}")
    refuse(problems)  # relations below assume well-typed values

    from nli_jax.tasks import get_task
    task_name = _get(config, "task", None)
    try:
        task = get_task(task_name)
    except KeyError:
        from nli_jax.tasks.base import TASKS
        suggestions = difflib.get_close_matches(str(task_name), sorted(TASKS), n=3)
        problems.append(f"{_flag('task', task_name)}: unknown task"
                        f"{'; did you mean ' + ' or '.join(suggestions) if suggestions else ''} "
                        f"(tasks: {', '.join(sorted(TASKS))})")
        refuse(problems)
    possible = task.possible_splits(config)
    eval_splits = list(_get(config, "eval_splits", ()))
    if possible is not None:
        unknown = [s for s in eval_splits if s not in possible]
        if unknown:
            problems.append(f"{_flag('eval_splits', tuple(eval_splits))}: {unknown} "
                            f"{'is not a split' if len(unknown) == 1 else 'are not splits'} of task "
                            f"{task.name!r} (its splits: {', '.join(sorted(possible))})")
    if len(set(eval_splits)) != len(eval_splits):
        problems.append(f"{_flag('eval_splits', tuple(eval_splits))}: a split is listed twice")
    seeds = list(_get(config, "seeds", ()) or ())
    if len(set(seeds)) != len(seeds):
        problems.append(f"{_flag('seeds', tuple(seeds))}: a seed is listed twice (the runs would be identical)")

    if training and not _get(config, "model.init", ""):
        from nli_jax.models.presets import PRESETS
        name = _get(config, "model.preset", None)
        if name not in PRESETS:
            close = difflib.get_close_matches(str(name), sorted(PRESETS), n=3)
            problems.append(f"{_flag('model.preset', name)}: unknown preset (with model.init empty the model is "
                            f"built from a preset{'; did you mean ' + ' or '.join(close) if close else ''}; "
                            f"presets: {', '.join(sorted(PRESETS))})")
    if training and not _get(config, "model.tokenizer", "") and not _get(config, "model.init", ""):
        problems.append("--config.model.tokenizer='' and --config.model.init='': a from-scratch model needs "
                        "model.tokenizer (a directory with vocab.txt or tokenizer.json)")

    batch = _get(config, "train.batch_size", 1)
    accumulation = _get(config, "train.accumulation_steps", 1)
    if processes is None or devices is None:
        import jax
        processes = jax.process_count() if processes is None else processes
        devices = jax.device_count() if devices is None else devices
    if training and batch % (processes * accumulation):
        problems.append(f"{_flag('train.batch_size', batch)}: must divide by processes x accumulation_steps "
                        f"({processes} x {accumulation} = {processes * accumulation})")
    mesh_sizes, mesh_problem = _mesh_sizes(_get(config, "mesh.shape", {"data": -1}), devices)
    if mesh_problem:
        problems.append(mesh_problem)
    else:
        parallel = data_parallel_size(mesh_sizes, _get(config, "mesh.rules", None))
        micro = batch // accumulation
        if training and batch % accumulation == 0 and micro % parallel:
            problems.append(f"{_flag('train.batch_size', batch)}: the micro-batch of {micro} examples (batch_size / "
                            f"accumulation_steps) must divide by the {parallel} data-parallel devices")
        eval_batch = _get(config, "train.eval_batch_size", 64)
        if eval_batch < processes or (eval_batch // processes * processes) % parallel:
            problems.append(f"{_flag('train.eval_batch_size', eval_batch)}: must divide by the {parallel} "
                            f"data-parallel devices ({processes} process(es))")
    p = _get(config, "pretrain", None)
    if training and p is not None and hasattr(p, "keys"):
        max_len = _get(config, "data.max_seq_length", 0)
        if _get(config, "pretrain.max_predictions", 0) > max_len:
            problems.append(f"{_flag('pretrain.max_predictions', p.max_predictions)}: more predictions than "
                            f"data.max_seq_length ({max_len}) tokens")
        if not _get(config, "pretrain.examples_dir", "") and not any(_get(config, "pretrain.corpus", ())):
            problems.append(f"{_flag('pretrain.corpus', tuple(p.corpus))}: no corpus files and no "
                            "pretrain.examples_dir: nothing to pretrain on")
        if _get(config, "pretrain.continued", False) and not _get(config, "model.init", ""):
            problems.append("--config.model.init='': continued pretraining (the config's :continue variant) "
                            "starts from a checkpoint: pass --config.model.init=DIR (a Hugging Face BERT or "
                            "ALBERT directory)")
    refuse(problems)


def _mesh_sizes(shape, devices: int) -> tuple[dict, str | None]:
    from nli_jax.train.mesh import MESH_AXES
    flag = _flag("mesh.shape", dict(shape) if hasattr(shape, "keys") else shape)
    if not hasattr(shape, "keys"):
        return {}, f"{flag}: must be a dict of mesh axis sizes"
    unknown = sorted(set(shape) - set(MESH_AXES))
    if unknown:
        return {}, f"{flag}: unknown mesh axes {unknown}; expected {list(MESH_AXES)}"
    sizes = {a: shape.get(a, 1) for a in MESH_AXES}
    if any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1) for v in sizes.values()):
        return {}, f"{flag}: sizes must be positive integers, or -1 for the rest of the devices"
    if list(sizes.values()).count(-1) > 1:
        return {}, f"{flag}: at most one axis may be -1"
    known = math.prod(v for v in sizes.values() if v != -1)
    for axis, v in sizes.items():
        if v == -1:
            if devices % known:
                return {}, f"{flag}: {devices} devices cannot fill the other axes' {known}"
            sizes[axis] = devices // known
    if math.prod(sizes.values()) != devices:
        return {}, f"{flag}: the mesh needs {math.prod(sizes.values())} devices, there are {devices}"
    return sizes, None


def data_parallel_size(mesh_sizes: dict, rules) -> int:
    """Devices a batch is split over: the mesh axes the 'batch' rule maps to (as mesh.batch_sharding)."""
    from nli_jax.train.mesh import DEFAULT_RULES
    table = dict(tuple(r) for r in (rules if rules is not None else DEFAULT_RULES))
    target = table.get("batch")
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    return math.prod(mesh_sizes.get(a, 1) for a in axes if a in mesh_sizes)


# --- tokenizer and model -------------------------------------------------------------------------

def usable_positions(encoder_config) -> int:
    """Token positions the model can embed (RoBERTa numbers them from pad_token_id + 1)."""
    return int(encoder_config.max_position_embeddings) - int(encoder_config.position_offset)


def check_model_fit(config, task, tokenizer, tokenizer_path: str, encoder_config, model_source: str) -> None:
    """data.max_seq_length against what one example needs and what the model can embed; the
    tokenizer's ids against the model's vocabulary."""
    problems = []
    max_len = int(config.data.max_seq_length)
    need, shape = task.min_seq_length(config, tokenizer)
    if max_len < need:
        problems.append(f"{_flag('data.max_seq_length', max_len)}: too short for task {task.name!r}: {shape} needs at "
                        f"least {need} tokens with this tokenizer")
    positions = usable_positions(encoder_config)
    if max_len > positions:
        problems.append(f"{_flag('data.max_seq_length', max_len)}: longer than the {positions} positions the model "
                        f"({model_source}, max_position_embeddings {encoder_config.max_position_embeddings}) can embed")
    vocab = tokenizer.get_vocab()
    largest = max(vocab.values()) if vocab else -1
    if len(tokenizer) > encoder_config.vocab_size or largest >= encoder_config.vocab_size:
        problems.append(f"tokenizer {tokenizer_path} has {len(tokenizer)} entries (ids up to {largest}) but the model "
                        f"({model_source}) embeds only vocab_size {encoder_config.vocab_size}: the tokenizer does not "
                        f"fit the model (--config.model.tokenizer / --config.model.init)")
    refuse(problems)


# Above this share of [UNK] among the (non-special) tokens of a sample of training text, the
# tokenizer does not fit the text: most words would be invisible to the model.
MAX_UNKNOWN_RATE = 0.5
UNKNOWN_SAMPLE = 256


def check_unknown_rate(tokenizer, tokenizer_path: str, source, encode, split: str,
                       sample: int = UNKNOWN_SAMPLE, limit: float = MAX_UNKNOWN_RATE) -> float:
    """Share of [UNK] among the non-special tokens of the first `sample` examples of `source`;
    above `limit` the run stops, naming the tokenizer and the rate."""
    unk = tokenizer.unk_token_id
    if unk is None or source is None or len(source) == 0:
        return 0.0
    import numpy as np
    special = np.asarray(sorted(set(tokenizer.all_special_ids) - {unk}), np.int64)
    n = min(sample, len(source))
    examples = source.get_many(list(range(n))) if hasattr(source, "get_many") else [source[i] for i in range(n)]
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
    if rate > limit:
        raise ConfigValueError(
            f"tokenizer {tokenizer_path} maps {rate:.0%} of the tokens of the first {n} {split} examples to "
            f"{tokenizer.unk_token} (limit {limit:.0%}): it does not fit this text (--config.model.tokenizer)")
    return rate

