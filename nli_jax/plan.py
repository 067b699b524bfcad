"""The plan of a run: every value a run uses, typed and frozen, resolved once from its
ml_collections config by `nli_jax.planner` (which also runs every check, before anything
is written). Nothing else reads the config: tasks, the input pipeline and the optimizer receive
the sections they need.

Sections mirror the config's: `data`, `model`, `optimizer`, `train`, `mesh`, `pretrain`. Each
field declares its type and accepted range (`Check`, in the field's metadata) next to it; the
relations between fields are the planner's. Derived values that need no data are in `BatchPlan`
(batch sizes per process, micro-batches, data-parallel devices, length buckets, packing);
those that need the size of the training split in `StepPlan` (steps per epoch, total, warmup,
evaluation / checkpoint / logging intervals).

Every field's default is declared here, next to its type and range; `default_config()` turns
them into the ml_collections config that configs/finetune_common.py starts every recipe from.
What one task or pretraining objective alone reads is not here but in that task's own options
(`TaskOptions`, declared beside the task: `RunPlan.task_options`, `config.task_options`).

Frozen dataclasses rather than pydantic (MaxText's choice for its large YAML): the fields are
few and flat, most checks are relations between sections (which the planner states in one
place rather than as validators spread over models), frozen dataclasses are hashable (a jit
can take them as static arguments), and they add no dependency.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from nli_jax import options
from nli_jax.hooks import HOOKS
from nli_jax.options import Check, Options, check_of, flag, option  # noqa: F401  (the declarations' API)
from nli_jax.schedules import SCHEDULES


# Field declarations (each with its Check) are nli_jax.options'; the sections below use them.
_int, _float, _choice, _bool, _str = options._int, options._float, options._choice, options._bool, options._str
_field = options._field

# Upper bounds of the fields that size an allocation (a length, a batch, a vocabulary multiple, a
# process count): far beyond any recipe, below what aborts in XLA or the allocator.
MAX_LENGTH = 65536
MAX_BATCH = 100_000  # (LAMB's largest BERT batch: 65,536)
MAX_WORKERS = 256

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
    """mesh.rules less its (name, None) rules: a name with no rule maps to no mesh axis, as a rule
    to None does, so an older config without today's ("layers", None), ("qkv", None) or
    ("glu", None) means the same run and a workdir it wrote still resumes."""
    return type(rules)(r for r in rules if not (isinstance(r, (list, tuple)) and len(r) == 2 and r[1] is None)) \
        if isinstance(rules, (list, tuple)) else rules


# Config keys whose values from an older nli-jax mean one of today's: the workdir check compares a
# saved config.json with the current one through these, and the planner reads section fields so.
LEGACY_VALUES = {"model.remat": remat_policy_name, "mesh.rules": mesh_rules_without_layers}


# --- the config's sections ------------------------------------------------------------------

# Logical axis names of parameters and activations -> mesh axes (nli_jax.train.mesh), MaxText-style.
# A name without a rule is not sharded: a family's own axes (its module says which) need none.
MESH_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("hidden", None),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("position", None),
    ("token_type", None),
    ("labels", None),
    ("layers", None),  # the leading axis of scanned layers' parameters (model.scan_layers): never sharded
)
MESH_SHAPE = {"data": -1, "fsdp": 1, "tensor": 1}  # -1: the devices the other axes leave


@dataclasses.dataclass(frozen=True)
class DataPlan:
    """`config.data`: where the data is, how examples are encoded and batched."""
    source: str = _str()  # local directory or gs:// with the official files; empty = download them
    tfds_dir: str = _str("~/tensorflow_datasets/nli_jax")  # where the array_record copies are written (~ expanded)
    max_seq_length: int = _int(128, 1, MAX_LENGTH)
    buckets: tuple = _field("ints", 1, MAX_LENGTH, default=(32, 64, 128, 256, 512))  # pad each batch to the smallest that fits
    pad_to_max_length: bool = _bool(False)  # True on TPU: one compiled shape
    # Training batches of sequence-level tasks put several examples in one row, each attending
    # to itself only (no padding computed): same loss, a third fewer tokens on IndoNLI at 128.
    packing: bool = _bool(True)
    # Packed training steps take few shapes: a shape is compiled only when it saves more tokens
    # (rows x length, over the run) than this (pipeline.plan_packed_shapes). 8192: about what
    # one compilation of a 12-layer, 384-wide encoder's train step costs on a 2-core CPU, in
    # tokens of its training (7-10 s at 1.2 ms a token). 0: each batch its own shape.
    compile_cost_tokens: int = _int(8192, 0)
    max_train_examples: int = _int(0, 0)  # > 0: train on the first N examples ("train" in eval_splits evaluates them)
    # A file naming training examples by id (one per line, or JSON lines with "id": the subsets
    # `python -m nli_jax.analysis cartography` writes): train on those only.
    train_subset: str = _str()
    allow_one_label: bool = _bool(False)  # a training split whose examples all carry one label is refused unless True
    # An evaluation split sharing text with the training examples beyond nli_jax.hooks.overlap.MAX_SHARE
    # is refused unless True (then its overlapping examples are also scored apart: "clean").
    allow_overlap: bool = _bool(False)
    # grain worker processes reading and batching training data (fine-tuning and pretraining); each
    # holds the tokenizer, the data source's readers and its prefetched batches: about 0.3 GiB on
    # the cpu_test config (measured peak RSS 0.29 GiB per worker, 0.77 GiB the main process).
    workers: int = _int(0, 0, MAX_WORKERS)


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """`config.model`: a checkpoint to start from, or a preset shape built from scratch."""
    init: str = _str()  # Hugging Face directory or hub id; empty = from scratch with `preset`
    preset: str = _str("indobert-base")
    tokenizer: str = _str()  # default: the init directory
    dtype: str = _choice("float32", "float32", "bfloat16", "float16")
    # What each layer keeps for its backward pass (REMAT_POLICIES); older configs' True / False
    # (= "full" / "none") still assign and resume: LEGACY_VALUES.
    remat: str = _choice("none", *REMAT_POLICIES)
    # One scanned layer over stacked parameters (compiles in seconds at 24 layers on TPU); a family
    # whose layers are shared across depth keeps its loop. Parameters, checkpoints and optimizer state
    # then have a leading layers axis:
    # a run resumes with the setting it started with (Hugging Face exports are the same either way).
    scan_layers: bool = _bool(False)
    # The attention kernel (nli_jax.models.attention): "auto" (splash on a TPU target without
    # attention dropout, plain otherwise), "plain" or "splash".
    attention: str = _choice("auto", "auto", "plain", "splash")
    # A from-scratch model's vocabulary rounded up to a multiple of this (128: the TPU's lane width,
    # so the embedding and decoder matmuls tile exactly); the tokenizer's ids are unchanged.
    vocab_multiple: int = _int(1, 1, 4096)
    # The dtype of the parameters' copy the train step computes with (gradients included): bfloat16
    # halves the gradients' memory and their collectives; the optimizer keeps float32 master weights.
    step_param_dtype: str = _choice("float32", "float32", "bfloat16")
    # EncoderConfig fields to override, those set only (config.model.overrides without Nones; the
    # config's keys: OVERRIDE_CHECKS).
    overrides: tuple = _field("any", default=())

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
    """`config.optimizer`: the optimizer, its learning rate, warmup (the steps: StepPlan) and the
    schedule's name; the schedule's own options are `config.schedules.<name>` (nli_jax.schedules)."""
    name: str = _choice("adam", "adam", "adamw", "lamb")
    lr: float = _float(1e-5, 0.0, 1.0, low_open=True)
    schedule: str = _str("constant")  # a registered schedule (nli_jax.schedules), checked by the planner
    warmup_steps: int = _int(0, 0)
    warmup_ratio: float = _float(0.0, 0.0, 1.0, high_open=True)
    b1: float = _float(0.9, 0.0, 1.0, high_open=True)
    b2: float = _float(0.999, 0.0, 1.0, high_open=True)
    eps: float = _float(1e-8, 0.0, low_open=True)
    weight_decay: float = _float(0.0, 0.0)
    grad_clip: float = _float(1.0, 0.0)


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """`config.train`: the run's length, batch, seed and intervals as configured."""
    seed: int = _int(42, 0, 2**32 - 1)  # an input of the compiled train step (uint32)
    batch_size: int = _int(16, 1, MAX_BATCH)
    eval_batch_size: int = _int(64, 1, MAX_BATCH)  # global, like batch_size: each process evaluates its share
    accumulation_steps: int = _int(1, 1, MAX_BATCH)
    num_epochs: int = _int(10, 1)
    max_steps: int = _int(0, 0)  # > 0 caps the run
    log_every_steps: int = _int(50, 1)
    eval_every_steps: int = _int(0, 0)  # 0 = once per epoch
    checkpoint_every_steps: int = _int(0, 0)  # 0 = at every evaluation
    keep_checkpoints: int = _int(2, 1, 1000)
    async_checkpointing: bool = _bool(True)
    early_stopping_patience: int = _int(3, 0)  # evaluations without improvement; 0 = off
    # A wall-clock budget (Cramming's): > 0 fixes the run's steps from the time a step takes, measured
    # on budget_calibration_steps throw-away steps before training (nli_jax.train.budget); the
    # schedule and the batch ramp are laid over those steps, recorded in the checkpoints, and a resumed
    # run keeps them. train.max_steps / num_epochs stay the cap.
    budget_minutes: float = _float(0.0, 0.0)
    budget_calibration_steps: int = _int(20, 2)
    peak_tflops_per_device: float = _float(0.0, 0.0)  # e.g. 123 for TPU v3 bf16: enables MFU in the log


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """`config.mesh`, resolved: the size of every axis (data, fsdp, tensor) on these devices
    and the rules that map logical axis names to them (configured as MESH_SHAPE and MESH_RULES)."""
    shape: tuple  # ((axis, size), ...) in MESH_AXES order, -1 resolved
    rules: tuple  # ((logical name, mesh axis | (axes) | None), ...)
    data_parallel: int  # devices a batch is split over (the axes the "batch" rule names)

    @property
    def shape_dict(self) -> dict[str, int]:
        return dict(self.shape)


@dataclasses.dataclass(frozen=True)
class PretrainPlan:
    """`config.pretrain`: the corpus and the segment-pair examples every pretraining objective
    reads (nli_jax.pretraining.examples); how they are masked is the objective's own option
    (nli_jax.tasks.pretraining.MaskedLMOptions). Defaults: the BERT recipe's phase 1."""
    phase: int = _choice(1, 1, 2)
    corpus: tuple = _field("strs", default=("",))  # prepared corpus files (globs); examples built into <workdir>/examples
    # A mixture (nli_jax.pretraining.mixture): corpus entries "name=glob" name corpora, each built into
    # <workdir>/examples/<name> and sampled by weight ("name=weight" each) or p ∝ n^corpus_alpha (XLM-R: 0.3;
    # 0 and no weights: in proportion to size); held-out MLM accuracy reported per corpus.
    corpus_weights: tuple = _field("strs", default=())
    corpus_alpha: float = _float(0.0, 0.0)
    examples_dir: str = _str()  # or prebuilt examples (pretrain.create_examples)
    sentence_task: str = _choice("nsp", "nsp", "sop", "none")  # how the pairs' second segment is chosen
    short_seq_prob: float = _float(0.1, 0.0, 1.0)
    dupe_factor: int = _int(1, 1, 100)
    data_seed: int = _int(12345, 0)
    workers: int = _int(2, 1, MAX_WORKERS)
    heldout_examples: int = _int(2000, 1, 10**7)
    heldout_permille: int = _int(10, 1, 999)  # documents held out for evaluation (by hash), per thousand
    continued: bool = _bool(False)  # model.init is required: continued pretraining of a checkpoint


@dataclasses.dataclass(frozen=True)
class TaskOptions(Options):
    """The options one task (or pretraining objective) alone reads, declared beside it as a
    subclass with a default and accepted values per field (`option(...)`), registered with it
    (`register("name", options=...)`). The planner builds `RunPlan.task_options` from
    `config.task_options` (nli_jax.options.resolve): a key the config lacks takes the default here,
    one the task does not declare is refused. `problems()`: relations between the options."""


@dataclasses.dataclass(frozen=True)
class NoOptions(TaskOptions):
    """A task without options of its own."""


section_defaults = options.defaults  # {field: default} of a plan section or options class


def default_config(task: str, task_options: dict, *, pretrain: bool = False):
    """Every key a run's config has, with its default, as an ml_collections ConfigDict: the
    sections above, the task's options as given (nli_jax.tasks.options_config: its options
    class's defaults), every registered schedule's and run hook's options (`schedules.<name>`,
    `hooks.<name>`), the batch ramp's, and `pretrain` when asked for.
    configs/finetune_common.py starts every recipe from this."""
    from nli_jax.train.batch_ramp import BatchRampOptions  # late: JAX; nli_jax.workdir imports this module
    c = ml_collections.ConfigDict()
    c.task = task
    c.eval_splits = ("validation",)
    c.seeds = ()  # e.g. (1, 2, 3): one run per seed in <workdir>/seed_N, mean ± std in results.json
    # The best parameters as a Hugging Face directory (<workdir>/export_best, label names in
    # id2label); also later with `python -m finetune.export`.
    c.export_best = False
    c.export_final = False  # the final parameters as a Hugging Face directory (<workdir>/export): pretraining
    c.task_options = ml_collections.ConfigDict(dict(task_options))
    for name, cls in (("data", DataPlan), ("model", ModelPlan), ("optimizer", OptimizerPlan), ("train", TrainPlan)):
        c[name] = ml_collections.ConfigDict(section_defaults(cls))
    model = section_defaults(ModelPlan)
    # Any type: older configs' True / False (= "full" / "none") still assign and resume.
    model["remat"] = ml_collections.FieldReference(model["remat"], field_type=object)
    # EncoderConfig fields to override (None = the checkpoint's / preset's value).
    model["overrides"] = ml_collections.ConfigDict(
        {name: ml_collections.config_dict.placeholder(float) for name in OVERRIDE_CHECKS})
    c.model = ml_collections.ConfigDict(model)
    c.mesh = ml_collections.ConfigDict({"shape": dict(MESH_SHAPE), "rules": MESH_RULES})
    c.schedules = ml_collections.ConfigDict(SCHEDULES.default_options())
    c.batch_ramp = ml_collections.ConfigDict(section_defaults(BatchRampOptions))
    c.hooks = ml_collections.ConfigDict(HOOKS.default_options())
    if pretrain:
        c.pretrain = ml_collections.ConfigDict(section_defaults(PretrainPlan))
    return c


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
    # train.eval_batch_size when evaluation batches were bounded by tokens below it (else 0).
    eval_batch_asked: int = 0

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
    task: str = _field("str")
    eval_splits: tuple = _field("strs")
    seeds: tuple = _field("ints")
    export_best: bool = _field("bool")
    export_final: bool = _field("bool")
    task_options: TaskOptions = _field("section")  # the task's own (its options class, registered with it)
    data: DataPlan = _field("section")
    model: ModelPlan = _field("section")
    optimizer: OptimizerPlan = _field("section")
    schedule: Options = _field("section")  # optimizer.schedule's own options (config.schedules.<name>)
    batch_ramp: Options = _field("section")  # config.batch_ramp (nli_jax.train.batch_ramp.BatchRampOptions)
    hooks: tuple = _field("section")  # ((name, options), ...) of every registered run hook (config.hooks)
    train: TrainPlan = _field("section")
    mesh: MeshPlan = _field("section")
    pretrain: PretrainPlan | None = _field("section")
    batch: BatchPlan = _field("derived")
    config_json: dict = dataclasses.field(compare=False, hash=False, metadata={"check": Check("derived")})

    @property
    def seed(self) -> int:
        return self.train.seed

    def hook(self, name: str) -> Options:
        """The options of run hook `name`."""
        return dict(self.hooks)[name]

    def component_options(self) -> list[tuple[str, Options]]:
        """(config key, options) of every component the run has: its task, schedule, batch ramp
        and hooks."""
        return [("task_options", self.task_options), (f"schedules.{self.optimizer.schedule}", self.schedule),
                ("batch_ramp", self.batch_ramp), *((f"hooks.{name}", o) for name, o in self.hooks)]
