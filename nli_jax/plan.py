"""The plan of a run: every value a run uses, typed and frozen, resolved once from its
ml_collections config by `nli_jax.train.planner` (which also runs every check, before anything
is written). Nothing else reads the config: tasks, the input pipeline and the optimizer receive
the sections they need.

Sections mirror the config's: `data`, `model`, `optimizer`, `train`, `mesh`, `pretrain`. Each
field declares its type and accepted range (`Check`, in the field's metadata) next to it; the
relations between fields are the planner's. Derived values that need no data are in `BatchPlan`
(batch sizes per process, micro-batches, data-parallel devices, length buckets, packing);
those that need the size of the training split in `StepPlan` (steps per epoch, total, warmup,
evaluation / checkpoint / logging intervals).

Defaults live in the config files only (configs/finetune_common.py): the dataclasses have
none, and a config must give every field.

Frozen dataclasses rather than pydantic (MaxText's choice for its large YAML): the fields are
few and flat, most checks are relations between sections (which the planner states in one
place rather than as validators spread over models), frozen dataclasses are hashable (a jit
can take them as static arguments), and they add no dependency.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any


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


def _field(kind: str, low=None, high=None, *, low_open=False, high_open=False, choices=()):
    return dataclasses.field(metadata={"check": Check(kind, low, high, low_open, high_open, tuple(choices))})


def _int(low=None, high=None):
    return _field("int", low, high)


def _float(low=None, high=None, *, low_open=False, high_open=False):
    return _field("float", low, high, low_open=low_open, high_open=high_open)


def _choice(*choices):
    return _field("choice", choices=choices)


def _bool():
    return _field("bool")


def _str():
    return _field("str")


def check_of(field: dataclasses.Field) -> Check:
    return field.metadata.get("check", Check("any"))


# --- values of older configs ----------------------------------------------------------------

# model.remat: what each transformer layer keeps for its backward pass, the rest recomputed
# (nli_jax.models.encoder.layer_runner): nothing ("full", recompute the whole layer), every
# matmul output ("dots_saveable"), or those without batch dimensions, i.e. the weight matmuls
# but not attention's scores and context ("dots_with_no_batch_dims_saveable", MaxText's
# "minimal"). "none": no rematerialisation.
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")


def remat_policy_name(value):
    """model.remat as a policy name: older configs (and their workdirs' config.json) said
    True / False, which meant "full" / "none". Other values pass through to be checked."""
    if isinstance(value, bool):
        return "full" if value else "none"
    return value


def mesh_rules_without_layers(rules):
    """mesh.rules less a ("layers", None) rule: an older config without it meant the same (a name
    with no rule maps to no mesh axis), so a workdir it wrote still resumes."""
    return type(rules)(r for r in rules if list(r) != ["layers", None]) if isinstance(rules, (list, tuple)) else rules


# Config keys whose values from an older nli-jax mean one of today's: the workdir check compares a
# saved config.json with the current one through these, and the planner reads section fields so.
LEGACY_VALUES = {"model.remat": remat_policy_name, "mesh.rules": mesh_rules_without_layers}


# --- the config's sections ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DataPlan:
    """`config.data`: where the data is, how examples are encoded and batched."""
    source: str = _str()  # local directory or gs:// with the official files; empty = download
    tfds_dir: str = _str()  # where the array_record copies are written (~ expanded)
    max_seq_length: int = _int(1)
    buckets: tuple = _field("ints", 1)  # as configured; BatchPlan.buckets is what batches use
    pad_to_max_length: bool = _bool()
    packing: bool = _bool()
    compile_cost_tokens: int = _int(0)  # packed step shapes: pipeline.plan_packed_shapes
    hypothesis_only: bool = _bool()
    word_alignment: str = _choice("average", "first")
    train_size: str = _choice("", "50k", "30k", "10k", "3k")
    holdout_topic: str = _str()
    validation_fraction: float = _float(0.0, 1.0, low_open=True, high_open=True)
    validation_seed: int = _int(0)
    translate_train_source: str = _str()
    mix_indonli_train: bool = _bool()
    max_train_examples: int = _int(0)
    train_subset: str = _str()  # a file of training example ids (cartography subsets)
    allow_one_label: bool = _bool()  # train on a split whose examples all carry one label
    workers: int = _int(0)


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """`config.model`: a checkpoint to start from, or a preset shape built from scratch."""
    init: str = _str()
    preset: str = _str()
    tokenizer: str = _str()
    dtype: str = _choice("float32", "bfloat16", "float16")
    remat: str = _choice(*REMAT_POLICIES)  # True / False of older configs: LEGACY_VALUES
    scan_layers: bool = _bool()
    # The attention kernel (nli_jax.models.attention): "auto" (splash on a TPU target without
    # attention dropout, plain otherwise), "plain" or "splash".
    attention: str = _choice("auto", "plain", "splash")
    # A from-scratch model's vocabulary rounded up to a multiple of this (128: the TPU's lane width,
    # so the embedding and decoder matmuls tile exactly); the tokenizer's ids are unchanged.
    vocab_multiple: int = _int(1)
    # The dtype of the parameters' copy the train step computes with (gradients included): bfloat16
    # halves the gradients' memory and their collectives; the optimizer keeps float32 master weights.
    step_param_dtype: str = _choice("float32", "bfloat16")
    # EncoderConfig fields to override, those set only (config.model.overrides without Nones).
    overrides: tuple = _field("any")

    @property
    def tokenizer_path(self) -> str:
        """model.tokenizer, else the checkpoint's own (model.init); empty when neither is set."""
        return self.tokenizer or self.init

    @property
    def overrides_dict(self) -> dict[str, Any]:
        """EncoderConfig fields the run sets over the checkpoint's or preset's: config.model.overrides
        (those set) and model.attention."""
        return {**dict(self.overrides), "attention": self.attention}

    @property
    def encoder_fields(self) -> dict[str, Any]:
        """Every EncoderConfig field the run sets over the checkpoint's or preset's: how it computes
        (dtype, remat, scan_layers) and the overrides."""
        return {"dtype": self.dtype, "remat": self.remat, "scan_layers": self.scan_layers, **self.overrides_dict}


# Checks of config.model.overrides.<name> (the keys the config files define).
OVERRIDE_CHECKS = {
    "hidden_dropout_prob": Check("optional_float", 0.0, 1.0, high_open=True),
    "attention_probs_dropout_prob": Check("optional_float", 0.0, 1.0, high_open=True),
    "classifier_dropout": Check("optional_float", 0.0, 1.0, high_open=True),
}


@dataclasses.dataclass(frozen=True)
class OptimizerPlan:
    """`config.optimizer`: the optimizer and its learning-rate schedule (warmup: StepPlan)."""
    name: str = _choice("adam", "adamw", "lamb")
    lr: float = _float(0.0, 1.0, low_open=True)
    schedule: str = _choice("constant", "linear", "polynomial", "exponential_per_epoch")
    warmup_steps: int = _int(0)
    warmup_ratio: float = _float(0.0, 1.0, high_open=True)
    decay_rate: float = _float(0.0, 1.0, low_open=True)
    end_lr: float = _float(0.0)
    power: float = _float(0.0, low_open=True)
    b1: float = _float(0.0, 1.0, high_open=True)
    b2: float = _float(0.0, 1.0, high_open=True)
    eps: float = _float(0.0, low_open=True)
    weight_decay: float = _float(0.0)
    grad_clip: float = _float(0.0)


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """`config.train`: the run's length, batch, seed and intervals as configured."""
    seed: int = _int(0, 2**32 - 1)  # an input of the compiled train step (uint32)
    batch_size: int = _int(1)
    eval_batch_size: int = _int(1)
    accumulation_steps: int = _int(1)
    num_epochs: int = _int(1)
    max_steps: int = _int(0)
    log_every_steps: int = _int(1)
    eval_every_steps: int = _int(0)
    checkpoint_every_steps: int = _int(0)
    keep_checkpoints: int = _int(1)
    async_checkpointing: bool = _bool()
    early_stopping_patience: int = _int(0)
    peak_tflops_per_device: float = _float(0.0)
    record_dynamics: bool = _bool()  # training dynamics per example (nli_jax.train.dynamics)
    dynamics_every_steps: int = _int(0)  # > 0: an evaluation of the training split every N steps
    calibration: bool = _bool()  # calibration metrics and temperature scaling (nli_jax.train.calibrate)


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """`config.mesh`, resolved: the size of every axis (data, fsdp, tensor) on these devices
    and the rules that map logical axis names to them."""
    shape: tuple  # ((axis, size), ...) in MESH_AXES order, -1 resolved
    rules: tuple  # ((logical name, mesh axis | (axes) | None), ...)
    data_parallel: int  # devices a batch is split over (the axes the "batch" rule names)

    @property
    def shape_dict(self) -> dict[str, int]:
        return dict(self.shape)


@dataclasses.dataclass(frozen=True)
class PretrainPlan:
    """`config.pretrain`: the corpus, its examples and the masking of MLM pretraining."""
    phase: int = _choice(1, 2)
    corpus: tuple = _field("strs")
    examples_dir: str = _str()
    sentence_task: str = _choice("nsp", "sop", "none")
    whole_word: bool = _bool()
    max_ngram: int = _int(1)
    mask_prob: float = _float(0.0, 1.0, low_open=True, high_open=True)
    max_predictions: int = _int(1)
    short_seq_prob: float = _float(0.0, 1.0)
    dupe_factor: int = _int(1)
    data_seed: int = _int(0)
    workers: int = _int(1)
    heldout_examples: int = _int(1)
    heldout_permille: int = _int(1, 999)
    random_token_low: int = _int(0)
    continued: bool = _bool()
    # ELECTRA (task "electra"): the generator's width as a fraction of the discriminator's (at
    # most the discriminator's own), and the weight of the discriminator's loss (the paper's 50).
    generator_fraction: float = _float(0.0, 1.0, low_open=True)
    discriminator_weight: float = _float(0.0, low_open=True)


# --- derived --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Batch sizes, per process and device, and how rows become batches; no data needed."""
    processes: int
    process_index: int
    global_batch: int  # train.batch_size: examples per optimizer step, over all processes
    local_batch: int  # this process's rows of each global batch
    accumulation: int  # micro-batches per step
    data_parallel: int  # devices a (micro-)batch is split over
    global_eval_batch: int
    local_eval_batch: int
    buckets: tuple[int, ...]  # padded lengths a batch may have (one: pad_to_max_length)
    # Training batches put several examples per row (data.packing, for tasks that predict once
    # per example from its first token), in this many groups per process: one group per
    # data-parallel shard and micro-batch, so an example and its row share a device. 0: padded.
    packing_groups: int
    # Evaluation batches packed likewise (data.packing), one group per data-parallel device,
    # each of local_eval_batch / groups rows (pipeline.packed_eval_batches). 0: padded.
    eval_packing_groups: int = 0

    @property
    def accumulation_shards(self) -> int:
        """Data-parallel devices a training batch's micro-batches are laid out over, shard by shard
        (pipeline.shard_major, steps.make_train_step): all of them when each process holds whole
        shards, else 1 (micro-batch by micro-batch)."""
        return self.data_parallel if self.data_parallel % self.processes == 0 else 1


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The run's length and intervals, from the size of its training split."""
    train_examples: int
    steps_per_epoch: int
    total_steps: int  # num_epochs of steps_per_epoch, capped by train.max_steps
    warmup_steps: int  # optimizer.warmup_steps, or warmup_ratio x total_steps
    eval_every: int  # steps between validations (default: an epoch)
    checkpoint_every: int  # steps between checkpoints (default: every validation)
    log_every: int


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything a run is, before any file is read: its task, splits, seeds, sections and the
    batch plan. `config_json` is the config as config.json records it (keys as the command line
    names them), the one place the original survives: a workdir's identity."""
    task: str = _str()
    eval_splits: tuple = _field("strs")
    seeds: tuple = _field("ints")
    export_best: bool = _bool()
    export_final: bool = _bool()
    data: DataPlan = _field("section")
    model: ModelPlan = _field("section")
    optimizer: OptimizerPlan = _field("section")
    train: TrainPlan = _field("section")
    mesh: MeshPlan = _field("section")
    pretrain: PretrainPlan | None = _field("section")
    batch: BatchPlan = _field("derived")
    config_json: dict = dataclasses.field(compare=False, hash=False, metadata={"check": Check("derived")})

    @property
    def seed(self) -> int:
        return self.train.seed
