"""A run's own steps compiled ahead of time for a TPU topology, on any host (launch.compile).

The TPU compiler ships in `libtpu` and needs no TPU: `jax.experimental.topologies` describes a
slice's devices (all its hosts'), a mesh is laid over them, and the loop's own jitted train
step (nli_jax.train.compiled_step.jit_train_step) and evaluation step (setup.jit_eval_step) are lowered
with abstract inputs and compiled, as MaxText's train_compile.py and axlearn's
run_aot_compilation do before a pod is booked. No data, no weights and no hub access: the model's
shape comes from its preset, a local config.json or the published shape of a hub checkpoint
(nli_jax.models.presets.PUBLISHED_SHAPES), and the batches from the task's own batching of
examples at data.max_seq_length (`Task.example_of_length`), the largest step a run can take.

What the compiler reports is per device: HBM for arguments (parameters, optimizer state, batch),
temporaries and code; FLOPs; and its own estimate of the step's time (`optimal_seconds`), from
which an MFU and projected hours follow. These are the compiler's estimates, not measurements.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from nli_jax import planner, storage
from nli_jax.checkpoints import load_tokenizer
from nli_jax.checkpoints.hf import read_config
from nli_jax.data import fixture_path, pipeline
from nli_jax.errors import RunError
from nli_jax.models import make_rngs, preset
from nli_jax.models.config import EncoderConfig
from nli_jax.models.presets import PUBLISHED_SHAPES
from nli_jax.tasks import create_task
from nli_jax.train import mesh as mesh_lib
from nli_jax.train.compiled_step import jit_train_step, train_state_shardings
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.setup import StepSetup, jit_eval_step, preset_config

GIB = 1024 ** 3
STAND_IN_TAGS = 32  # labels of a task whose label set comes from its data files


@dataclasses.dataclass(frozen=True)
class Topology:
    """A Cloud TPU slice as `jax.experimental.topologies` names it, with its per-device
    datasheet figures (a device is a TensorCore on v2/v3, a chip elsewhere)."""
    accelerator: str  # Cloud TPU's name of the slice (--accelerator-type)
    name: str  # get_topology_desc's topology_name
    chip_config: str  # "megacore" (v4, v5p: one device per chip), else "default"
    chips_per_host: tuple[int, int, int]
    hbm_gib: float  # per device
    peak_bf16_tflops: float  # per device

    def devices(self):
        """The slice's devices, every host's (device.process_index tells the host)."""
        # Off Cloud TPU there is no metadata server, and libtpu prints its failure to find the
        # slice's type and hosts unless told; the topology itself is given explicitly below.
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", self.accelerator)
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        # No chip is claimed: several compilations may run side by side (libtpu's lockfile is
        # for processes that drive a TPU).
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        from jax.experimental import topologies  # late: libtpu reads the TPU_* variables set just above
        try:
            description = topologies.get_topology_desc(
                platform="tpu", topology_name=self.name, chip_config_name=self.chip_config,
                chips_per_host_bounds=self.chips_per_host, num_slices=1)
        except Exception as e:  # libtpu missing or too old: say which, not a traceback
            raise RunError(f"cannot describe TPU topology {self.name!r} ({' '.join(str(e).split())[:300]}); "
                           "install the TPU compiler with pip install -e '.[tpu]'") from None
        return list(description.devices)


# Public datasheets (../shared/reference/papers.md): v2 8 GiB per core, 45 TFLOP/s per 2-core
# chip; v3 16 GiB per core, 123 per chip; v4 32 GiB, 275; v5e 16 GiB, 197; v5p 95 GiB, 459;
# v6e 32 GiB, 918 (bf16, per chip).
TOPOLOGIES = {t.accelerator: t for t in (
    Topology("v2-8", "v2:2x2", "default", (2, 2, 1), 8, 22.5),
    Topology("v3-8", "v3:2x2", "default", (2, 2, 1), 16, 61.5),
    Topology("v4-8", "v4:2x2x1", "megacore", (2, 2, 1), 32, 275),
    Topology("v4-16", "v4:2x2x2", "megacore", (2, 2, 1), 32, 275),
    Topology("v4-32", "v4:2x2x4", "megacore", (2, 2, 1), 32, 275),
    Topology("v5e-4", "v5e:2x2", "default", (2, 2, 1), 16, 197),
    Topology("v5e-8", "v5e:2x4", "default", (2, 4, 1), 16, 197),
    Topology("v5e-256", "v5e:16x16", "default", (2, 2, 1), 16, 197),
    Topology("v5p-8", "v5p:2x2x1", "megacore", (2, 2, 1), 95, 459),
    Topology("v6e-8", "v6e:2x4", "default", (2, 4, 1), 32, 918),
)}


def topology(name: str) -> Topology:
    if name not in TOPOLOGIES:
        raise RunError(f"--topology={name!r}: unknown; expected one of {', '.join(TOPOLOGIES)}")
    return TOPOLOGIES[name]


# --- what the compiler says --------------------------------------------------------------------

_UNITS = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, None: 1, "": 1}


def _bytes(number: str, unit: str | None) -> float:
    return float(number) * _UNITS[unit or ""]


def usable_hbm(devices, mesh) -> float:
    """Bytes of HBM the TPU compiler lets one program use on a device (below the datasheet's
    figure: 15.48 GiB of a v3 core's 16), read from its refusal of a program that cannot fit."""
    replicated = NamedSharding(mesh, P())
    huge = 1 << 40  # 4 TiB of float32 outputs per device: more than any chip has
    try:
        jax.jit(lambda x: jnp.broadcast_to(x, (huge,)) * 2, out_shardings=replicated).lower(
            jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)).compile()
    except Exception as e:
        found = re.search(r"available HBM \(([\d.]+)([KMGT])?\)|of ([\d.]+)([KMGT])? hbm", str(e), re.I)
        if found:
            number, unit = (found.group(1), found.group(2)) if found.group(1) else (found.group(3), found.group(4))
            return _bytes(number, unit)
    return float("nan")


_COLLECTIVE = re.compile(r"=\s*(\(.*?\)|\S+)\s+(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                         r"(-start)?\(")
_ARRAY = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|bf16|f16|f32|f64)\[([\d,]*)\]")
_WIDTH = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8}


def collectives(hlo_text: str) -> dict:
    """{kind: {count, bytes}} of the compiled program's collectives (an async pair counted once, at
    its start). Bytes: the arrays each one produces (an all-gather's gathered array, a
    reduce-scatter's shard, an all-reduce's reduced arrays), per device."""
    out: dict[str, dict] = {}
    for line in hlo_text.splitlines():
        found = _COLLECTIVE.search(line)
        if not found:
            continue
        shape, kind, start = found.groups()
        arrays = [_WIDTH[t] * math.prod(int(d) for d in dims.split(",") if d) for t, dims in _ARRAY.findall(shape)]
        if start and kind in ("all-gather", "collective-permute", "all-to-all") and len(arrays) > 1:
            arrays = arrays[len(arrays) // 2:]  # (operands, results): the results
        entry = out.setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += int(sum(arrays))
    return out


# The TPU compiler's cost model prices some instructions it cannot estimate at exactly -1 s each:
# XLA's RngBitGenerator (the dropout masks' bits: nli_jax.models.make_rngs uses "rbg" keys) and the
# ConcatBitcast custom call that joins its outputs. A dropout step's raw estimate is then negative;
# each such instruction is counted as costing 0 instead (their real cost is a few elementwise
# passes, small beside the matmuls).
_UNPRICED = re.compile(r" rng-bit-generator\(|custom_call_target=\"ConcatBitcast\"")


# A Pallas kernel (the splash attention of nli_jax.models.attention) is a custom call whose inside
# the cost model cannot see: a program holding one has no usable time estimate.
_KERNEL = re.compile(r'custom_call_target="tpu_custom_call"')


def estimated_seconds(cost: dict, hlo_text: str) -> tuple[float | None, int]:
    """(the compiler's estimate of the program's time with its unpriced instructions at 0 s, or
    None when the program runs Pallas kernels the estimate cannot include; how many unpriced
    instructions there were)."""
    unpriced = len(_UNPRICED.findall(hlo_text))
    if _KERNEL.search(hlo_text):
        return None, unpriced
    return float(cost.get("optimal_seconds", float("nan"))) + unpriced, unpriced


def _shard_bytes(tree) -> int:
    """Bytes one device holds of abstract arrays with shardings (the largest shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * x.dtype.itemsize
    return total


# --- the run's model and batches, abstract --------------------------------------------------------

def model_shape(plan):
    """The EncoderConfig a run of `plan` trains, without hub access: model.init's config.json when
    it is a local directory, else the published shape of a hub id nli-jax's configs name, else
    the preset (with its own vocabulary: the shipped pretraining recipes' 30,522 / 30,000)."""
    model = plan.model
    if model.init:
        if storage.isdir(model.init):
            return EncoderConfig.from_hf_dict(read_config(model.init), **model.encoder_fields)
        if model.init in PUBLISHED_SHAPES:
            return EncoderConfig.from_hf_dict(PUBLISHED_SHAPES[model.init], **model.encoder_fields)
        raise RunError(f"--config.model.init={model.init!r}: not a local directory and not a hub id whose shape "
                       f"nli-jax knows ({', '.join(sorted(PUBLISHED_SHAPES))}); give a directory with its config.json")
    own = model.overrides_dict.get("vocab_size") or preset(model.preset).vocab_size
    return preset_config(model, own)


def _shape_tokenizer():
    """A tokenizer for the batching's special-token ids only (batch shapes do not depend on the
    vocabulary): the tiny WordPiece vocabulary shipped with the package."""
    return load_tokenizer(fixture_path("tiny_wordpiece"))


def _global_abstract(local: dict, processes: int, sharding) -> dict:
    """The global batch of `processes` hosts each holding a batch like `local` (numpy), abstract."""
    return {k: jax.ShapeDtypeStruct((np.shape(v)[0] * processes, *np.shape(v)[1:]), np.asarray(v).dtype,
                                    sharding=sharding) for k, v in local.items()}


def _evaluation_needs_lengths(batching, processes: int) -> bool:
    """As nli_jax.train.evaluation.Evaluator decides: packed evaluation, or buckets over hosts."""
    return bool(batching.eval_packing_groups) or (processes > 1 and batching.bucketed)


def abstract_batches(plan, task, batching, processes: int, sharding) -> tuple[dict, dict]:
    """(train batch, evaluation batch), global and abstract, as the run's batching makes them from
    examples of data.max_seq_length tokens: the largest shapes its steps take (packed rows hold
    one such example each)."""
    length, batch = plan.data.max_seq_length, plan.batch
    try:
        example = task.example_of_length(length)
    except NotImplementedError as e:  # a task of one's own that does not describe its examples: one line
        raise RunError(f"{e}: launch.compile needs it to shape the run's batches") from None
    rng = np.random.default_rng(0)
    train_rows = [dict(example, idx=np.int32(i)) for i in range(batch.local_batch)]
    local_train = batching.training(train_rows, global_lengths=np.full(batch.local_batch * processes, length), rng=rng)
    eval_examples = [dict(example, idx=np.int32(i)) for i in range(batch.local_eval_batch * processes)]
    local_eval = next(iter(pipeline.eval_batches(
        eval_examples, lambda e: e, batching, local_batch_size=batch.local_eval_batch,
        dummy=dict(example, idx=np.int32(-1)), process_index=0, process_count=processes,
        lengths=np.full(len(eval_examples), length) if _evaluation_needs_lengths(batching, processes) else None)))
    return _global_abstract(local_train, processes, sharding), _global_abstract(local_eval, processes, sharding)


def _with_stand_in_files(config):
    """The config with the package's tiny vocabulary and corpus standing in where a pretraining
    recipe leaves its files to the command line (model.tokenizer, pretrain.corpus): the plan's
    checks want them, while the compiled programs depend only on the shapes."""
    config = config.copy_and_resolve_references()
    if "pretrain" in config and hasattr(config.pretrain, "keys"):
        if not config.model.tokenizer and not config.model.init:
            config.model.tokenizer = fixture_path("tiny_wordpiece")
        if not any(config.pretrain.corpus) and not config.pretrain.examples_dir:
            config.pretrain.corpus = (fixture_path("corpus_tiny") + "/*.txt",)
    return config


@dataclasses.dataclass
class Compiled:
    """One compiled step: its analyses, or the compiler's refusal."""
    seconds: float
    memory: object = None
    cost: dict | None = None
    hlo: str = ""
    error: str = ""
    input_shardings: object = None


def _compile(jitted, *args) -> Compiled:
    start = time.perf_counter()
    lowered = jitted.lower(*args)  # a tracing error is nli-jax's, not the compiler's: raised
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:  # the compiler's refusal (RESOURCE_EXHAUSTED when it cannot fit)
        return Compiled(time.perf_counter() - start, error=" ".join(str(e).split()))
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return Compiled(time.perf_counter() - start, compiled.memory_analysis(), dict(cost or {}), compiled.as_text(),
                    input_shardings=compiled.input_shardings[0])


def parameter_specs(shardings, params) -> dict[str, list]:
    """{dotted parameter path: its PartitionSpec, one entry per dimension} of a compiled program's
    parameter shardings (`params`: the abstract parameters, for their ranks)."""
    out = {}
    flat_params = jax.tree.leaves(params)
    for (path, sharding), param in zip(jax.tree_util.tree_flatten_with_path(shardings)[0], flat_params):
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        spec = list(sharding.spec)
        out[name] = spec + [None] * (len(param.shape) - len(spec))
    return out


def abstract_model(plan, task, encoder_config, mesh):
    """(graphdef, the non-parameter state, the parameters as abstract arrays in their shardings,
    those shardings, the abstract model) of the task's model on `mesh`, nothing computed."""
    cls, head_kwargs = task.model_class_and_kwargs()

    def create():
        return cls(encoder_config, rngs=make_rngs(plan.seed), **head_kwargs)

    abstract = nnx.eval_shape(create)
    param_shardings = mesh_lib.param_shardings(abstract, mesh, plan.mesh.rules)
    graphdef, abstract_params, _ = nnx.split(abstract, nnx.Param, ...)
    # The non-parameter state (RNG keys and counts) is a constant of the steps: made on the host
    # (the parameters' initialisation is dead code there and never runs).
    rest = jax.jit(lambda: nnx.split(create(), nnx.Param, ...)[2])()
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nnx.to_pure_dict(abstract_params), param_shardings)
    return graphdef, rest, params, param_shardings, nnx.merge(graphdef, abstract_params, rest)


def abstract_train_state(plan, params, param_shardings, mesh):
    """(optimizer, schedule, the train state {params, opt_state, step} as abstract arrays in their
    shardings, those shardings, the step's run values) as the loop makes them."""
    # The schedule's length (here: a training split of 1,000 batches) only changes constants of
    # the program, not its shape or cost.
    steps = planner.step_plan(plan, plan.batch.global_batch * 1000)
    tx, schedule = make_optimizer(plan.optimizer, plan.schedule, plan.batch_ramp, total_steps=steps.total_steps,
                                  steps_per_epoch=steps.steps_per_epoch, warmup_steps=steps.warmup_steps,
                                  unit_peak=True)
    shardings = train_state_shardings(tx, params, param_shardings, mesh)
    replicated = mesh_lib.replicated(mesh)
    opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                             jax.eval_shape(tx.init, params), shardings["opt_state"])
    state = {"params": params, "opt_state": opt_state,
             "step": jax.ShapeDtypeStruct((), jax.numpy.int32, sharding=replicated)}
    run_values = {"seed": jax.ShapeDtypeStruct((), jax.numpy.uint32, sharding=replicated),
                  "lr": jax.ShapeDtypeStruct((), jax.numpy.float32, sharding=replicated)}
    return tx, schedule, state, shardings, run_values


# --- the check ------------------------------------------------------------------------------------

def compile_run(config, topology_name: str, *, eval_step: bool = True) -> dict:
    """Compiles the run `config` describes for `topology_name` (TOPOLOGIES): the loop's train step
    and evaluation step, with the plan, mesh, shardings and batch shapes such a run takes on that
    slice. Returns the report (see `report_lines`); a program that does not fit is reported with
    what would make it fit, not raised."""
    target = topology(topology_name)
    devices = target.devices()
    config = _with_stand_in_files(config)
    processes = len({d.process_index for d in devices})
    plan = planner.build_plan(config, devices=len(devices), processes=processes, process_index=0)
    task = create_task(plan)
    # A tagging task's tag set comes from its files, which are not read here: stand-ins give its
    # head a width (a [hidden, tags] matrix, which changes nothing of what fits).
    stand_in = tuple(f"TAG{i}" for i in range(STAND_IN_TAGS)) if hasattr(task, "labels") and not task.labels else None
    task = task.bind(_shape_tokenizer(), labels=stand_in)
    encoder_config = model_shape(plan)
    mesh = mesh_lib.make_mesh(plan.mesh.shape_dict, devices)
    graphdef, rest, params, param_shardings, model = abstract_model(plan, task, encoder_config, mesh)
    tx, schedule, state, shardings, run_values = abstract_train_state(plan, params, param_shardings, mesh)
    batch_sharding = mesh_lib.batch_sharding(mesh, plan.mesh.rules)
    batching = task.batching(_shape_tokenizer(), plan.batch)
    train_batch, eval_batch = abstract_batches(plan, task, batching, processes, batch_sharding)

    steps = StepSetup(plan, task, graphdef, rest, param_shardings, batch_sharding, mesh)
    train = _compile(jit_train_step(steps, tx, schedule, shardings), state, train_batch, run_values)
    evaluation = _compile(jit_eval_step(steps), params, eval_batch) if eval_step else None

    length = plan.data.max_seq_length
    tokens_per_step = plan.batch.global_batch * length
    formula_flops = model.training_flops_per_token(length) * tokens_per_step / len(devices)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    report = {
        "topology": topology_name, "devices": len(devices), "hosts": processes,
        "device_kind": devices[0].device_kind, "mesh": dict(mesh.shape),
        "model": {"model_type": encoder_config.model_type, "layers": encoder_config.num_hidden_layers,
                  "hidden": encoder_config.hidden_size, "vocab": encoder_config.vocab_size,
                  "parameters": n_params, "dtype": encoder_config.dtype, "remat": encoder_config.remat,
                  "scan_layers": encoder_config.scans_layers, "step_param_dtype": plan.model.step_param_dtype},
        "batch": {"global": plan.batch.global_batch, "per_device": plan.batch.global_batch // plan.batch.data_parallel,
                  "accumulation": plan.batch.accumulation, "length": length,
                  "train_shapes": {k: list(v.shape) for k, v in train_batch.items()},
                  "eval_shapes": {k: list(v.shape) for k, v in eval_batch.items()}},
        "hbm_per_device_gib": target.hbm_gib,
        "usable_hbm_per_device_gib": round(usable_hbm(devices, mesh) / GIB, 3),
        "peak_bf16_tflops_per_device": target.peak_bf16_tflops,
        "train_step": _step_report(train, state, train_batch, formula_flops, tokens_per_step, target, plan),
    }
    if evaluation is not None:
        report["eval_step"] = _step_report(evaluation, {"params": params}, eval_batch, None, None, target, plan)
    return report


def _step_report(compiled: Compiled, state, batch, formula_flops, tokens_per_step, target: Topology, plan) -> dict:
    params_bytes = _shard_bytes(state["params"])
    opt_bytes = _shard_bytes(state.get("opt_state", {}))
    batch_bytes = _shard_bytes(batch)
    out = {"compile_seconds": round(compiled.seconds, 1),
           "parameters_gib": round(params_bytes / GIB, 3), "optimizer_state_gib": round(opt_bytes / GIB, 3),
           "batch_gib": round(batch_bytes / GIB, 4)}
    if compiled.error:
        out.update(fits=False, error=compiled.error[:600], advice=_advice(compiled.error, params_bytes, opt_bytes,
                                                                           batch_bytes, plan))
        return out
    m = compiled.memory
    total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
             + m.generated_code_size_in_bytes)
    seconds, unpriced = estimated_seconds(compiled.cost, compiled.hlo)
    kernels = len(_KERNEL.findall(compiled.hlo))
    flops = float(compiled.cost.get("flops", float("nan")))
    out.update(fits=True, arguments_gib=round(m.argument_size_in_bytes / GIB, 3),
               temporaries_gib=round(m.temp_size_in_bytes / GIB, 3),
               outputs_not_aliased_gib=round((m.output_size_in_bytes - m.alias_size_in_bytes) / GIB, 3),
               code_gib=round(m.generated_code_size_in_bytes / GIB, 4), total_gib=round(total / GIB, 3),
               headroom_gib=round(target.hbm_gib - total / GIB, 3),
               compiler_tflops_per_device=round(flops / 1e12, 4),
               compiler_estimated_seconds=None if seconds is None else round(seconds, 5),
               unpriced_instructions=unpriced, pallas_kernels=kernels,
               collectives=collectives(compiled.hlo),
               parameter_specs=parameter_specs(compiled.input_shardings[0]["params"] if "opt_state" in state
                                               else compiled.input_shardings[0], state["params"]))
    # The cost model counts a while loop's body once, whatever its trip count (measured: a scan of
    # three matmuls costs one). Accumulation's micro-batches are such a loop around nearly the whole
    # step: its FLOPs and time are multiplied by the trip count. Scanned layers leave a loop of the
    # layers' share of the step, which the estimate cannot be scaled for: no time estimate then.
    if " while(" in compiled.hlo and formula_flops is not None and seconds is not None:
        if plan.model.scan_layers:
            seconds = out["compiler_estimated_seconds"] = None
            out["no_estimate"] = "scanned layers: the cost model counts one layer"
        elif plan.batch.accumulation > 1:
            out["loops_counted_once_scale"] = plan.batch.accumulation
            seconds *= plan.batch.accumulation
            flops *= plan.batch.accumulation
            out.update(compiler_estimated_seconds=round(seconds, 5),
                       compiler_tflops_per_device=round(flops / 1e12, 4))
    if formula_flops is not None and seconds is not None:
        out.update(formula_tflops_per_device=round(formula_flops / 1e12, 4),
                   compiler_over_formula=round(flops / formula_flops, 3) if formula_flops else None,
                   compiler_estimated_mfu=round(formula_flops / (seconds * target.peak_bf16_tflops * 1e12), 3),
                   tokens_per_second=round(tokens_per_step / seconds),
                   hours_per_million_steps=round(seconds * 1e6 / 3600, 1))
    return out


def _advice(error: str, params_bytes: int, opt_bytes: int, batch_bytes: int, plan) -> str:
    """What would make a program the compiler refused fit, from its own figures: temporaries
    shrink with the per-device batch (accumulation) and with remat (one layer's activations kept
    instead of every layer's); parameters and optimizer state with the FSDP size."""
    found = re.search(r"temporaries \(([\d.]+)([KMGT])?\) exceeds available HBM \(([\d.]+)([KMGT])?\)", error) or \
        re.search(r"Used ([\d.]+)([KMGT])? of ([\d.]+)([KMGT])? hbm", error, re.I)
    if not found:
        return "the compiler refused the program (see error)"
    needed, available = _bytes(found.group(1), found.group(2)), _bytes(found.group(3), found.group(4))
    fixed = params_bytes + opt_bytes + batch_bytes
    temporaries = needed if "temporaries" in found.group(0) else max(needed - fixed, 0.0)
    devices = math.prod(dict(plan.mesh.shape).values())
    fsdp = dict(plan.mesh.shape).get("fsdp", 1)
    options = []
    if fixed >= available:  # parameters and optimizer state alone: only sharding them helps
        if fsdp < devices:
            options.append(f"--config.mesh.shape=\"{{'data': 1, 'fsdp': -1}}\" (parameters and optimizer state "
                           f"{fixed / GIB:.1f} GiB -> {fixed / GIB * fsdp / devices:.1f} GiB per device)")
    else:
        if plan.model.remat == "none":
            options.append("--config.model.remat=full (activations recomputed in the backward pass)")
        room, per_device = available - fixed, plan.batch.global_batch // plan.batch.data_parallel // plan.batch.accumulation
        factor = 2 ** math.ceil(math.log2(max(temporaries / room, 1.0001)))
        if factor <= per_device:
            options.append(f"--config.train.accumulation_steps={plan.batch.accumulation * factor} (per-device batch "
                           f"{per_device} -> {per_device // factor}, same global batch)")
        if fsdp < devices and params_bytes + opt_bytes > 0.25 * available:
            options.append("--config.mesh.shape=\"{'data': 1, 'fsdp': -1}\" (parameters and optimizer state sharded)")
    return (f"needs {needed / GIB:.2f} GiB of {available / GIB:.2f} GiB usable per device; would fit with: "
            + ("; or ".join(options) if options else "a larger topology"))


def report_lines(report: dict) -> list[str]:
    """The report as a few human lines (the JSON holds everything)."""
    lines = [f"{report['topology']}: {report['devices']} {report['device_kind']} devices on {report['hosts']} host(s), "
             f"mesh {report['mesh']} | {report['model']['model_type']} {report['model']['layers']} x "
             f"{report['model']['hidden']}, {report['model']['parameters'] / 1e6:.1f}M parameters, "
             f"{report['model']['dtype']}, remat {report['model']['remat']}"
             f"{', scanned layers' if report['model']['scan_layers'] else ''} | batch {report['batch']['global']} x "
             f"{report['batch']['length']} ({report['batch']['per_device']} per device, accumulation "
             f"{report['batch']['accumulation']})"]
    for name in ("train_step", "eval_step"):
        step = report.get(name)
        if step is None:
            continue
        if not step["fits"]:
            lines.append(f"{name}: DOES NOT FIT: {step['advice']}")
            continue
        line = (f"{name}: fits, {step['total_gib']:.2f} of {report['hbm_per_device_gib']} GiB per device "
                f"(usable {report['usable_hbm_per_device_gib']}): parameters {step['parameters_gib']:.2f}, "
                f"optimizer {step['optimizer_state_gib']:.2f}, temporaries {step['temporaries_gib']:.2f}; "
                f"compiled in {step['compile_seconds']:.0f} s; compiler: {step['compiler_tflops_per_device']:.3f} "
                + (f"TFLOP per device, estimated {step['compiler_estimated_seconds']:.4f} s"
                   if step["compiler_estimated_seconds"] is not None else
                   (f"TFLOP per device, no time estimate ({step['no_estimate']})" if "no_estimate" in step else
                    f"TFLOP per device outside its {step['pallas_kernels']} Pallas kernel(s), no time estimate "
                    "(the cost model cannot see inside them)")))
        if "loops_counted_once_scale" in step:
            line += f" (x{step['loops_counted_once_scale']} micro-batches: the cost model counts the loop once)"
        if "formula_tflops_per_device" in step:
            line += (f" (formula {step['formula_tflops_per_device']:.3f} TFLOP, x{step['compiler_over_formula']}; "
                     f"estimated MFU {step['compiler_estimated_mfu']:.0%}, {step['tokens_per_second']:,} tokens/s, "
                     f"{step['hours_per_million_steps']:.1f} h per 1M steps)")
        coll = step["collectives"]
        if coll:
            line += "; collectives " + ", ".join(f"{k} {v['count']} ({v['bytes'] / 2**20:.1f} MiB)"
                                                 for k, v in sorted(coll.items()))
        lines.append(line)
    return lines
