"""Run setup: from a checked plan to everything a run needs before its first step, in an order
that makes bad input fail before compute: the task, tokenizer and model shape (checked against
each other: `model_inputs`), then the data (validated as it is read), the [UNK] rate of the
training text, the mesh, the model placed in its shardings, the batching and the jitted
evaluation step (`prepare`). Training, the final evaluation and the offline tools (evaluate,
predict, export) all start from a `RunSetup`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Callable

import jax
from flax import nnx

from nli_jax import storage
from nli_jax import workdir as workdir_lib
from nli_jax.checkpoints import load_tokenizer
from nli_jax.checkpoints.hf import read_config, resolve_directory
from nli_jax.data import pipeline
from nli_jax.errors import ConfigValueError, RunError
from nli_jax.models import make_rngs, preset
from nli_jax.models.config import EncoderConfig
from nli_jax.plan import ModelPlan, RunPlan
from nli_jax.pretraining.vocab_extension import ExtensionNotGrown, VocabularyGrowth, grow_model, vocabulary_growth
from nli_jax.tasks import Task, create_task
from nli_jax.train import compilation, evaluation
from nli_jax import planner
from nli_jax.train import inputs as inputs_lib
from nli_jax.train import mesh as mesh_lib
from nli_jax.train import run_init as run_init_lib
from nli_jax.train import sharding as sharding_lib
from nli_jax.train.reporting import log
from nli_jax.train.steps import check_dropout_streams, make_eval_step

if TYPE_CHECKING:  # an annotation only: transformers is imported where a tokenizer is loaded
    from transformers import PreTrainedTokenizerBase


# --- the model's shape and weights ---------------------------------------------------------

def encoder_config_for(model: ModelPlan, tokenizer, init: str | None = None) -> tuple[EncoderConfig, str | None]:
    """(the model's EncoderConfig, its resolved checkpoint directory or None) without building
    the model: a checkpoint's config.json, or the preset with the tokenizer's vocabulary."""
    init = init or model.init
    if init:
        directory = resolve_directory(init)
        return EncoderConfig.from_hf_dict(read_config(directory), **model.encoder_fields), directory
    return preset_config(model, len(tokenizer), pad_token_id=tokenizer.pad_token_id), None


def preset_config(model: ModelPlan, vocab_size: int, **fields) -> EncoderConfig:
    """The preset's shape with a vocabulary of `vocab_size` rounded up to model.vocab_multiple and
    the run's encoder fields."""
    padded = -(-vocab_size // model.vocab_multiple) * model.vocab_multiple
    return preset(model.preset, **{**model.encoder_fields, **fields, "vocab_size": padded})


def build_model(model: ModelPlan, task, tokenizer, seed: int, init: str | None = None,
                growth: VocabularyGrowth | None = None, heads: bool = True):
    """The task's model: from `init` (or model.init) when set, else from the preset at random;
    `growth`: the checkpoint's vocabulary grown for a tokenizer that extends its own; `heads=False`:
    every weight outside the base model new (a source run's head for other labels)."""
    cls, head_kwargs = task.model_class_and_kwargs()
    init = init or model.init
    if init:
        loaded = cls.from_pretrained(init, dtype=model.dtype, remat=model.remat, scan_layers=model.scan_layers,
                                     seed=seed, config_overrides=model.overrides_dict, heads=heads, **head_kwargs)
        return grow_model(loaded, growth, seed) if growth else loaded
    encoder_config, _ = encoder_config_for(model, tokenizer)
    return cls(encoder_config, rngs=make_rngs(seed), **head_kwargs)


def build_placed_model(plan: RunPlan, task, tokenizer, mesh, init: str | None = None,
                       growth: VocabularyGrowth | None = None, heads: bool = True):
    """(model, its parameters as global arrays in their shardings, those shardings). From scratch
    on a mesh that shards parameters (fsdp or tensor), they are created on the devices in their
    shardings (no host holds them whole). A checkpoint (model.init) is read on the host and each
    process puts its shards in place; so are replicated parameters (pure data parallelism), which
    every device holds whole anyway."""
    rules = plan.mesh.rules
    if init or plan.model.init or not any(mesh.shape.get(a, 1) > 1 for a in ("fsdp", "tensor")):
        model = build_model(plan.model, task, tokenizer, plan.seed, init=init, growth=growth, heads=heads)
        shardings = mesh_lib.param_shardings(model, mesh, rules)
        params = mesh_lib.put_global(nnx.to_pure_dict(nnx.state(model, nnx.Param)), shardings)
        return model, params, shardings
    return sharding_lib.create_sharded(lambda: build_model(plan.model, task, tokenizer, plan.seed), mesh, rules)


@dataclasses.dataclass
class ModelInputs:
    """The task, tokenizer and model shape of a run, checked against each other (no data, no
    parameters yet)."""
    task: Task
    tokenizer: PreTrainedTokenizerBase
    tokenizer_dir: str
    encoder_config: EncoderConfig
    model_dir: str | None  # model.init's directory (None: built from a preset)
    # model.init's vocabulary grown for a tokenizer that extends it (continued pretraining), else None
    growth: VocabularyGrowth | None = None
    # model.init naming a finished fine-tuning run (sequential fine-tuning), else None
    run_init: run_init_lib.RunInit | None = None


def model_inputs(plan: RunPlan, model_init: str | None = None) -> ModelInputs:
    """Task, tokenizer and model shape, with data.max_seq_length and the vocabulary checked
    against them before any data is read or parameter loaded."""
    task = create_task(plan)
    source_run = None
    for key, path in (("model.init", plan.model.init), ("model.tokenizer", plan.model.tokenizer)):
        if not run_init_lib.is_run_directory(path) or (key == "model.init" and model_init):
            continue
        if key == "model.init" and plan.pretrain is None:  # sequential fine-tuning: a finished run's best/
            source_run = load_source_run(path)
            continue
        raise ConfigValueError(
            f"--config.{key}={path!r}: {storage.resolve(path)} is a training run's directory (its config.json is "
            "nli-jax's, its parameters in best/), not a model directory: start from its export "
            f"(python -m finetune.export --checkpoint={path} --output=DIR, then --config.{key}=DIR)")
    if source_run is not None:
        model_init = source_run.directory
    tokenizer_path = plan.model.tokenizer or (source_run.tokenizer_dir if source_run else None) or model_init \
        or plan.model.init
    if not tokenizer_path:
        raise ConfigValueError("--config.model.tokenizer='': no tokenizer (and no model.init to take one from)")
    tokenizer_dir = resolve_directory(tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_dir)
    encoder_config, model_dir = encoder_config_for(plan.model, tokenizer, model_init)
    growth = None
    source = (f"the run {plan.model.init}" if source_run else model_init) or plan.model.init \
        or f"preset {plan.model.preset}"
    # Both are local by now (resolve_directory downloads a gs:// directory once per process).
    if model_dir and storage.resolve(model_dir) != storage.resolve(tokenizer_dir):
        try:
            growth = _vocabulary_growth(task, tokenizer, tokenizer_path, model_dir, encoder_config.vocab_size)
        except ConfigValueError as e:  # a tokenizer larger than the model is named as such first
            if not isinstance(e.__cause__, ExtensionNotGrown):
                planner.check_model_fit(plan, task, tokenizer, tokenizer_path, encoder_config, source)
            raise
    if growth:
        encoder_config = dataclasses.replace(encoder_config, vocab_size=growth.vocab_size)
    planner.check_model_fit(plan, task, tokenizer, tokenizer_path, encoder_config, source)
    return ModelInputs(task, tokenizer, tokenizer_dir, encoder_config, model_dir, growth, source_run)


_SOURCE_RUNS: dict[str, run_init_lib.RunInit] = {}  # export directory -> the source run it holds


def load_source_run(path: str) -> run_init_lib.RunInit:
    """model.init naming a finished fine-tuning run: its best parameters (verified) exported once
    per process as a Hugging Face directory, with its labels and tokenizer (nli_jax.train.run_init)."""
    resolved, source_plan, info = run_init_lib.check_source(path)
    directory = run_init_lib.export_directory(resolved, info)
    if directory not in _SOURCE_RUNS:
        checked = model_inputs(source_plan)  # the source's own model.init may be a run too
        labels = list(info.get("labels") or ()) or None
        task = checked.task.bind(checked.tokenizer, {}, labels)
        # The source's structure (every parameter is then its best/'s, heads included).
        model = build_model(source_plan.model, task, checked.tokenizer, source_plan.seed,
                            init=checked.model_dir, growth=checked.growth, heads=False)
        params = run_init_lib.restore_best(path, resolved, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
        nnx.update(model, nnx.State(jax.device_get(params)))
        model.save_pretrained(storage.makedirs(directory), tokenizer=checked.tokenizer, label_names=labels)
        _SOURCE_RUNS[directory] = run_init_lib.source(resolved, source_plan, info, directory, checked.tokenizer_dir)
    return _SOURCE_RUNS[directory]


def _vocabulary_growth(task, tokenizer, tokenizer_path: str, model_dir: str, vocab_size: int) -> VocabularyGrowth | None:
    """A tokenizer other than the checkpoint's own must have the same vocabulary (its ids index
    the checkpoint's embedding rows), or extend it (every old token at its id) in a run that
    grows the vocabulary (continued pretraining: Task.new_token_init()); then the growth."""
    if not set(os.listdir(model_dir)) & set(inputs_lib.TOKENIZER_FILES) - {"tokenizer_config.json",
                                                                            "special_tokens_map.json"}:
        return None  # the checkpoint ships no tokenizer to compare with
    try:
        own = load_tokenizer(model_dir)
    except Exception as e:  # an unloadable tokenizer of the checkpoint's is not this run's concern
        log.warning("could not load %s's own tokenizer to compare it with %s (%s)", model_dir, tokenizer_path, e)
        return None
    try:
        return vocabulary_growth(tokenizer, tokenizer_path, own, model_dir, vocab_size, task.new_token_init())
    except RunError as e:
        raise ConfigValueError(str(e)) from e


# --- the run --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepSetup:
    """What a run's compiled steps are built from: its plan (accumulation, step dtype), the bound
    task (loss, predictions), the model's structure without its parameters, and the shardings of
    parameters and batches on the mesh. launch.compile builds one from abstract shapes alone."""
    plan: RunPlan
    task: Task
    graphdef: nnx.GraphDef
    rest: nnx.State  # the model's state that is not a parameter (RNG counters, ...)
    param_shardings: dict  # the parameters' pytree of jax.sharding.NamedSharding
    batch_sharding: jax.sharding.NamedSharding
    mesh: jax.sharding.Mesh


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """Everything a run needs before its first step, fixed from then on: plan, bound task, data,
    tokenizer, model and its placed parameters, batching, the steps' set-up and the evaluator
    (with its jitted step)."""
    plan: RunPlan
    workdir: str
    task: Task  # bound (Task.bind): labels and tokenizer values fixed
    splits: dict
    tokenizer: PreTrainedTokenizerBase
    model: nnx.Module
    params: dict  # placed by the logical-axis rules
    encode: Callable
    batching: pipeline.BatchingProtocol
    steps: StepSetup
    evaluator: evaluation.Evaluator
    tokenizer_dir: str | None = None
    model_dir: str | None = None
    # A training run's examples (prepare(training=True): training_examples; "train" in `splits` is
    # them too, so that evaluating "train" evaluates what was trained on); None for the tools.
    train_examples: object = None
    # model.init naming a finished run: where the encoder came from, the head kept or new and why
    init_from: dict | None = None

    @property
    def mesh(self):
        return self.steps.mesh

    @property
    def batch_sharding(self):
        return self.steps.batch_sharding

    @property
    def param_shardings(self):
        return self.steps.param_shardings

    @property
    def label_names(self) -> list[str] | None:
        labels = getattr(self.task, "labels", None)
        return list(labels) if labels else None

    def evaluate(self, params, split: str) -> evaluation.SplitEvaluation:
        """One split of the run's data evaluated: report, prediction records, outputs."""
        return self.evaluator.evaluate(params, split, self.splits[split])

    def predict(self, params, examples: list[dict], name: str) -> tuple[list[dict], dict]:
        """(prediction records with label names, per-example outputs) for examples that may have
        no gold labels."""
        return self.evaluator.predict(params, examples, name)


def prepare(plan: RunPlan, workdir: str, *, splits: dict | None = None, labels: list[str] | None = None,
            model_init: str | None = None, checked: ModelInputs | None = None, training: bool = False) -> RunSetup:
    """Data, tokenizer, model, mesh and shardings, in an order that makes bad input fail
    before compute. `splits` replaces the task's own data (evaluate/predict on given files);
    `labels` then gives the label names (from the checkpoint); `model_init` overrides
    model.init (a Hugging Face checkpoint to evaluate as it is); `checked`: the result of
    `model_inputs` when the caller has it already; `training`: the run's training examples chosen
    (`training_examples`, RunSetup.train_examples)."""
    checked = checked or model_inputs(plan, model_init)
    tokenizer = checked.tokenizer
    if splits is None:
        splits = checked.task.load(workdir)
    task = checked.task.bind(tokenizer, splits, labels)

    encode = task.encoder(tokenizer)
    sample_split = next((s for s in (task.train_split, task.validation_split, *splits) if s in splits), None)
    if sample_split is not None:
        planner.check_unknown_rate(tokenizer, plan.model.tokenizer or model_init or plan.model.init,
                                   splits[sample_split], encode, sample_split)
    train_examples = None
    if training:
        for needed in (task.train_split, task.validation_split):
            if needed not in splits:
                raise FileNotFoundError(f"task {task.name}: split {needed!r} not found in the data")
        train_examples = training_examples(plan, task, splits)
        if task.train_split == "train":  # a max_train_examples subset is what "train" evaluates
            splits = dict(splits, train=train_examples)
    mesh = mesh_lib.make_mesh(plan.mesh.shape_dict)
    init_from, heads = None, True
    if checked.run_init is not None:  # sequential fine-tuning: the source's head only for the same labels
        heads, reason = checked.run_init.head_decision(task.model_class_and_kwargs()[0].__name__, getattr(task, "labels", None))
        init_from = checked.run_init.record(heads, reason)
        log.info("model.init: the best parameters (step %d) of the run %s; classification head %s: %s",
                 checked.run_init.best_step, checked.run_init.workdir, init_from["head"], reason)
    init = checked.model_dir if checked.run_init else model_init
    model, params, param_shardings = build_placed_model(plan, task, tokenizer, mesh, init=init,
                                                        growth=checked.growth, heads=heads)
    check_dropout_streams(model)
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"tokenizer has {len(tokenizer)} entries but the model's vocab_size is {model.config.vocab_size}")
    batching = task.batching(tokenizer, plan.batch)
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    steps = StepSetup(plan, task, graphdef, rest, param_shardings, mesh_lib.batch_sharding(mesh, plan.mesh.rules), mesh)
    evaluator = evaluation.Evaluator(task, encode, batching, plan.batch, jit_eval_step(steps), steps.batch_sharding,
                                     predict_step=evaluation.predict_step(steps))
    return RunSetup(plan=plan, workdir=workdir, task=task, splits=splits, tokenizer=tokenizer, model=model,
                    params=params, encode=encode, batching=batching, steps=steps, evaluator=evaluator,
                    tokenizer_dir=checked.tokenizer_dir, model_dir=checked.model_dir, train_examples=train_examples,
                    init_from=init_from)


def jit_eval_step(steps: StepSetup):
    """The run's evaluation step under jit: (params, batch) -> (metric sums, predictions), both
    replicated. The one evaluation runs and launch.compile compiles for a TPU topology."""
    return jax.jit(make_eval_step(steps.graphdef, steps.rest, steps.task),
                   in_shardings=(steps.param_shardings, steps.batch_sharding),
                   out_shardings=mesh_lib.replicated(steps.mesh),
                   compiler_options=compilation.forward_compiler_options(mesh_lib.platform(steps.mesh)))


def training_examples(plan: RunPlan, task, splits: dict):
    """The examples a run trains on: the task's training split, its first
    data.max_train_examples in file order (quick experiments and overfitting checks), or the
    examples data.train_subset names by id (a cartography subset); unknown ids are refused."""
    if task.train_split not in splits:
        raise FileNotFoundError(f"task {task.name}: split {task.train_split!r} not found in the data")
    source = splits[task.train_split]
    limit = plan.data.max_train_examples
    if limit > 0:
        source = pipeline.Subset(source, [i for i in range(len(source)) if source[i]["idx"] < limit])
    if plan.data.train_subset:
        wanted = read_subset(plan.data.train_subset, task.name)
        positions, repeated = {}, set()
        for i in range(len(source)):
            key = str(source[i].get("id", source[i]["idx"]))
            if key in positions:
                repeated.add(key)
            positions[key] = i
        ambiguous = [i for i in wanted if i in repeated]
        if ambiguous:  # a dict by id kept one row of each: 150 of 300 rows trained, without a word
            raise RunError(f"--config.data.train_subset={plan.data.train_subset!r}: {len(ambiguous)} of its "
                           f"{len(wanted)} ids name more than one row of task {task.name!r}'s training split (the "
                           f"split repeats {len(repeated)} id(s), e.g. {sorted(ambiguous)[:5]}): a subset by id "
                           "cannot tell them apart; give the training rows unique ids")
        unknown = [i for i in wanted if i not in positions]
        if unknown:
            raise RunError(f"--config.data.train_subset={plan.data.train_subset!r}: {len(unknown)} of its {len(wanted)} "
                           f"ids are not in task {task.name!r}'s training split ({len(source)} examples), e.g. "
                           f"{unknown[:5]}: the file was written for other data")
        source = pipeline.Subset(source, sorted(positions[i] for i in wanted))
    return source


def read_subset(path: str, task_name: str) -> list[str]:
    """The ids of a subset file: JSON lines with "id" (nli_jax.analysis cartography's subsets,
    whose "task" must be this one) or one id per line."""
    if not storage.isfile(path):
        raise FileNotFoundError(f"--config.data.train_subset={path!r}: no such file")
    ids = []
    for number, line in enumerate(storage.read_text(path).splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except ValueError as e:
                raise RunError(f"{path}:{number}: malformed JSON ({e})") from None
            if "id" not in row:
                raise RunError(f"{path}:{number}: a JSON line without \"id\"")
            if row.get("task", task_name) != task_name:
                raise RunError(f"{path}:{number}: a subset of task {row['task']!r}, not {task_name!r}")
            ids.append(str(row["id"]))
        else:
            ids.append(line)
    if not ids:
        raise RunError(f"--config.data.train_subset={path!r}: the file names no examples")
    if len(set(ids)) != len(ids):
        raise RunError(f"--config.data.train_subset={path!r}: an id is listed twice")
    return ids
