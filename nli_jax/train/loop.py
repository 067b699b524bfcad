"""train_and_evaluate(config, workdir): the one loop behind fine-tuning and pretraining.

Order of work, so that bad input fails before compute and nothing that would block the corrected
command is written before every check has passed: config values and relations (validation) ->
workdir config check -> tokenizer and model shape (max_seq_length, vocabulary) -> fingerprint of
the tokenizer, model.init and task files -> dataset files (validated, written as array_record)
-> [UNK] rate of the training text -> model -> mesh -> batch and step plan -> fingerprint of the
data -> config.json and inputs.json written -> steps (resuming from the newest intact checkpoint).
Each step: train; evaluate on validation every `eval_every_steps` (early stopping, best
parameters); checkpoint every `checkpoint_every_steps` and on SIGTERM. At the end the best
parameters are evaluated on every split and written to results.json / predictions.jsonl.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import signal
from typing import Any, Callable

import jax
import numpy as np
import optax
from flax import nnx

from nli_jax import storage
from nli_jax.checkpoints import load_tokenizer
from nli_jax.checkpoints.hf import read_config, resolve_directory
from nli_jax.data import pipeline
from nli_jax.data.readers import recording_reads
from nli_jax.models import make_rngs, preset
from nli_jax.models.config import EncoderConfig
from nli_jax.tasks import get_task
from nli_jax.train import inputs as inputs_lib
from nli_jax.train import mesh as mesh_lib
from nli_jax.train import sharding as sharding_lib
from nli_jax.train import validation
from nli_jax.data.records import InMemorySource
from nli_jax.train.checkpointing import (CONFIG_FILE, Checkpointer, abstract_like, check_workdir_config,
                                         has_trained_state, read_workdir_config, write_workdir_config)
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.reporting import Reporter, log, setup_logging, write_json, write_jsonl
from nli_jax.train.steps import check_dropout_streams, make_eval_step, make_train_step
from nli_jax.train.validation import ConfigValueError


def train_and_evaluate(config, workdir: str) -> dict:
    """Runs the config (once, or once per entry of `config.seeds`) and returns results.json."""
    validation.check_paths(config, workdir)
    validation.validate_config(config)
    seeds = list(config.get("seeds") or ())
    if not seeds:
        return _run(config, workdir)
    per_seed = {}
    for seed in seeds:
        seed_config = config.copy_and_resolve_references()
        with seed_config.unlocked():
            seed_config.seeds = ()
            seed_config.train.seed = int(seed)
        per_seed[int(seed)] = _run(seed_config, os.path.join(workdir, f"seed_{seed}"))
    summary = aggregate_seeds(per_seed)
    write_json(os.path.join(workdir, "results.json"), summary)
    return summary


def aggregate_seeds(per_seed: dict[int, dict]) -> dict:
    """mean ± std (sample std, ddof=1, as over the papers' random restarts) of every split's
    primary metric."""
    splits = sorted({s for r in per_seed.values() for s in r["splits"]})
    out = {"seeds": sorted(per_seed), "splits": {}}
    for split in splits:
        metric = next(iter(per_seed.values()))["primary_metric"]
        values = [r["splits"][split][metric] for r in per_seed.values() if split in r["splits"]]
        out["splits"][split] = {metric: {"mean": float(np.mean(values)),
                                         "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                                         "values": values}}
    out["per_seed"] = {str(s): r for s, r in per_seed.items()}
    return out


def _overrides(config) -> dict:
    return {k: v for k, v in dict(config.model.get("overrides") or {}).items() if v is not None}


def encoder_config_for(config, tokenizer, init: str | None = None) -> tuple[EncoderConfig, str | None]:
    """(the model's EncoderConfig, its resolved checkpoint directory or None) without building
    the model: a checkpoint's config.json, or the preset with the tokenizer's vocabulary."""
    m = config.model
    init = init or m.get("init")
    if init:
        directory = resolve_directory(init)
        return EncoderConfig.from_hf_dict(read_config(directory), dtype=m.get("dtype", "float32"),
                                          remat=bool(m.get("remat", False)), **_overrides(config)), directory
    return preset(m.preset, vocab_size=len(tokenizer), dtype=m.get("dtype", "float32"), remat=bool(m.get("remat", False)),
                  pad_token_id=tokenizer.pad_token_id, **_overrides(config)), None


def build_model(config, task, tokenizer, init: str | None = None):
    cls, head_kwargs = task.model_class_and_kwargs(config)
    m = config.model
    init = init or m.get("init")
    if init:
        return cls.from_pretrained(init, dtype=m.get("dtype", "float32"), remat=bool(m.get("remat", False)),
                                   seed=int(config.train.seed), config_overrides=_overrides(config), **head_kwargs)
    encoder_config, _ = encoder_config_for(config, tokenizer)
    return cls(encoder_config, rngs=make_rngs(int(config.train.seed)), **head_kwargs)


def build_placed_model(config, task, tokenizer, mesh, rules, init: str | None = None):
    """(model, its parameters as global arrays in their shardings, those shardings). From scratch
    on a mesh that shards parameters (fsdp or tensor), they are created on the devices in their
    shardings (no host holds them whole). A checkpoint (model.init) is read on the host and each
    process puts its shards in place; so are replicated parameters (pure data parallelism), which
    every device holds whole anyway."""
    if init or config.model.get("init") or not any(mesh.shape.get(a, 1) > 1 for a in ("fsdp", "tensor")):
        model = build_model(config, task, tokenizer, init=init)
        shardings = mesh_lib.param_shardings(model, mesh, rules)
        params = mesh_lib.put_global(nnx.to_pure_dict(nnx.state(model, nnx.Param)), shardings)
        return model, params, shardings
    return sharding_lib.create_sharded(lambda: build_model(config, task, tokenizer), mesh, rules)


@dataclasses.dataclass
class ModelInputs:
    """The task, tokenizer and model shape of a run, checked against each other (no data, no
    parameters yet)."""
    task: Any
    tokenizer: Any
    tokenizer_dir: str
    encoder_config: EncoderConfig
    model_dir: str | None  # model.init's directory (None: built from a preset)


def model_inputs(config, model_init: str | None = None) -> ModelInputs:
    """Task, tokenizer and model shape, with data.max_seq_length and the vocabulary checked
    against them before any data is read or parameter loaded."""
    task = get_task(config.task)
    tokenizer_path = config.model.get("tokenizer") or model_init or config.model.init
    if not tokenizer_path:
        raise ConfigValueError("--config.model.tokenizer='': no tokenizer (and no model.init to take one from)")
    tokenizer_dir = resolve_directory(tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_dir)
    encoder_config, model_dir = encoder_config_for(config, tokenizer, model_init)
    source = model_init or config.model.get("init") or f"preset {config.model.preset}"
    validation.check_model_fit(config, task, tokenizer, tokenizer_path, encoder_config, source)
    # Both are local by now (resolve_directory downloads a gs:// directory once per process).
    if model_dir and storage.resolve(model_dir) != storage.resolve(tokenizer_dir):
        _check_same_vocabulary(tokenizer, tokenizer_path, model_dir)
    return ModelInputs(task, tokenizer, tokenizer_dir, encoder_config, model_dir)


def _check_same_vocabulary(tokenizer, tokenizer_path: str, model_dir: str) -> None:
    """A tokenizer other than the checkpoint's own must have the same vocabulary: its ids
    index the checkpoint's embedding rows."""
    if not set(os.listdir(model_dir)) & set(inputs_lib.TOKENIZER_FILES) - {"tokenizer_config.json",
                                                                            "special_tokens_map.json"}:
        return  # the checkpoint ships no tokenizer to compare with
    try:
        own = load_tokenizer(model_dir).get_vocab()
    except Exception as e:  # an unloadable tokenizer of the checkpoint's is not this run's concern
        log.warning("could not load %s's own tokenizer to compare it with %s (%s)", model_dir, tokenizer_path, e)
        return
    given = tokenizer.get_vocab()
    if own != given:
        differing = sorted(t for t in set(own) | set(given) if own.get(t) != given.get(t))
        raise ConfigValueError(
            f"--config.model.tokenizer={tokenizer_path!r}: its vocabulary differs from the one model.init "
            f"({model_dir}) was trained with ({len(differing)} of {max(len(own), len(given))} tokens differ, e.g. "
            f"{differing[:5]}): its token ids would select the wrong embeddings; use the checkpoint's tokenizer")


class _Preemption:
    """SIGTERM (TPU maintenance, preemption) asks the loop to checkpoint and exit, at the same
    step on every process, without a per-step exchange between hosts:

    - several processes with JAX's preemption service (started by jax.distributed.initialize,
      which catches SIGTERM itself): `reached_preemption_sync_point(step)` is a local check each
      step; when a host gets the notice the service agrees on a step in the background;
    - several processes without it: the processes exchange their flags every `check_every`
      steps only (the log steps, where the loop waits for the devices anyway);
    - one process: the flag set by our SIGTERM handler, checked every step.
    """

    def __init__(self, check_every: int = 1):
        self.requested = False
        self._previous = None
        self.check_every = max(1, check_every)
        self.service = False

    def __enter__(self):
        if jax.process_count() > 1:
            from jax._src import distributed
            self.service = distributed.global_state.preemption_sync_manager is not None
        if self.service:
            return self  # the service's own SIGTERM handler must stay in place
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def reached(self, step: int) -> bool:
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils
        if self.service:
            return multihost_utils.reached_preemption_sync_point(step)
        if step % self.check_every:
            return False
        return bool(np.any(multihost_utils.process_allgather(np.array(self.requested))))


class Preempted(SystemExit):
    pass


@dataclasses.dataclass
class RunSetup:
    """Everything a run needs before its first step: task, data, tokenizer, model, mesh,
    shardings and the jitted evaluation step. Training, final evaluation, evaluate and predict
    all start from one of these."""
    config: Any
    workdir: str
    task: Any
    splits: dict
    tokenizer: Any
    model: Any
    encode: Callable
    collate: Callable
    mesh: Any
    rules: tuple
    batch_sharding: Any
    graphdef: Any
    rest: Any
    params: dict  # placed by the logical-axis rules
    param_shardings: Any
    eval_step: Callable
    tokenizer_dir: str | None = None
    model_dir: str | None = None
    _eval_data: dict = dataclasses.field(default_factory=dict)
    _predict_step: Callable | None = None

    @property
    def label_names(self) -> list[str] | None:
        labels = getattr(self.task, "labels", None)
        return list(labels) if labels else None

    def evaluate(self, params, split: str):
        """(report, prediction records) of one split; each split is read and encoded once per run."""
        if split not in self._eval_data:
            self._eval_data[split] = _EvalSplit(self.splits[split], self.encode)
        return _evaluate(self.task, self.eval_step, params, self._eval_data[split], self.collate, self.batch_sharding,
                         int(self.config.train.get("eval_batch_size", 64)), jax.process_count(), jax.process_index(),
                         split)

    def predict(self, params, examples: list[dict], split: str) -> list[dict]:
        """Prediction records (label names) for examples that may have no gold labels."""
        if self._predict_step is None:
            graphdef, rest, task = self.graphdef, nnx.to_pure_dict(self.rest), self.task

            def predict_step(params, batch):
                return {**task.predict(nnx.merge(graphdef, params, rest), batch), "idx": batch["idx"]}
            self._predict_step = jax.jit(predict_step, in_shardings=(self.param_shardings, self.batch_sharding),
                                         out_shardings=mesh_lib.replicated(self.mesh))
        data = _EvalSplit(InMemorySource(examples), self.encode)
        return _predict(self.task, self._predict_step, params, data, self.collate, self.batch_sharding,
                        int(self.config.train.get("eval_batch_size", 64)), jax.process_count(), jax.process_index(),
                        split)


def setup(config, workdir: str, *, splits: dict | None = None, labels: list[str] | None = None,
          model_init: str | None = None, checked: ModelInputs | None = None) -> RunSetup:
    """Data, tokenizer, model, mesh and shardings, in an order that makes bad input fail
    before compute. `splits` replaces the task's own data (evaluate/predict on given files);
    `labels` then gives the label names (from the checkpoint); `model_init` overrides
    config.model.init (a Hugging Face checkpoint to evaluate as it is); `checked`: the
    result of `model_inputs` when the caller has it already."""
    checked = checked or model_inputs(config, model_init)
    task, tokenizer = checked.task, checked.tokenizer
    if splits is None:
        splits = task.load(config, workdir)
    if labels is not None:
        fixed = type(task).__dict__.get("labels") or getattr(type(task), "labels", ())
        if fixed and tuple(fixed) != tuple(labels):
            raise validation.RunError(f"the checkpoint's labels {list(labels)} are not task {task.name!r}'s {list(fixed)}")
        task.labels = tuple(labels)

    encode = task.encoder(config, tokenizer)
    sample_split = next((s for s in (task.train_split, task.validation_split, *splits) if s in splits), None)
    if sample_split is not None:
        validation.check_unknown_rate(tokenizer, config.model.get("tokenizer") or model_init or config.model.init,
                                      splits[sample_split], encode, sample_split)
    mesh = mesh_lib.make_mesh(dict(config.mesh.shape))
    rules = tuple(tuple(r) for r in config.mesh.rules)
    model, params, param_shardings = build_placed_model(config, task, tokenizer, mesh, rules, init=model_init)
    check_dropout_streams(model)
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"tokenizer has {len(tokenizer)} entries but the model's vocab_size is {model.config.vocab_size}")
    max_len = int(config.data.max_seq_length)
    buckets = sorted({int(b) for b in (config.data.get("buckets") or ()) if int(b) <= max_len} | {max_len})
    if config.data.get("pad_to_max_length", False):
        buckets = [max_len]
    collate = task.collate(config, tokenizer) or functools.partial(
        pipeline.pad_batch, buckets=buckets, pad_values=task.pad_values(tokenizer))

    batch_sharding = mesh_lib.batch_sharding(mesh, rules)
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    eval_step = jax.jit(make_eval_step(graphdef, rest, task), in_shardings=(param_shardings, batch_sharding),
                        out_shardings=mesh_lib.replicated(mesh))
    return RunSetup(config=config, workdir=workdir, task=task, splits=splits, tokenizer=tokenizer, model=model,
                    encode=encode, collate=collate, mesh=mesh, rules=rules, batch_sharding=batch_sharding,
                    graphdef=graphdef, rest=rest, params=params, param_shardings=param_shardings, eval_step=eval_step,
                    tokenizer_dir=checked.tokenizer_dir, model_dir=checked.model_dir)


@dataclasses.dataclass
class Plan:
    """The training run's size, from the config and the data: checked before config.json is written."""
    train_source: Any
    global_batch: int
    accumulation: int
    steps_per_epoch: int
    total_steps: int
    data_parallel: int = 1


def plan_training(run: RunSetup) -> Plan:
    """Batch against processes, accumulation and data-parallel devices; the training split against
    one batch; the warmup against the run's steps."""
    config, task = run.config, run.task
    pc = jax.process_count()
    global_batch = int(config.train.batch_size)
    accumulation = int(config.train.get("accumulation_steps", 1))
    if global_batch % (pc * accumulation):
        raise ConfigValueError(f"--config.train.batch_size={global_batch}: must divide by processes x "
                               f"accumulation_steps ({pc} x {accumulation})")
    spec = run.batch_sharding.spec
    data_parallel = int(np.prod([run.mesh.shape[a] for a in spec[0] or ()])) if spec else 1
    if (global_batch // accumulation) % data_parallel:
        raise ConfigValueError(f"--config.train.batch_size={global_batch}: the micro-batch "
                               f"{global_batch // accumulation} must divide by the {data_parallel} data-parallel devices")
    if task.train_split not in run.splits:
        raise FileNotFoundError(f"task {task.name}: split {task.train_split!r} not found in the data")
    train_source = run.splits[task.train_split]
    limit = int(config.data.get("max_train_examples", 0))
    if limit > 0:  # the first N examples in file order: quick experiments and overfitting checks
        train_source = pipeline.Subset(train_source, [i for i in range(len(train_source))
                                                      if train_source[i]["idx"] < limit])
    steps_per_epoch = pipeline.steps_per_epoch(len(train_source), global_batch)
    if steps_per_epoch == 0:
        raise ConfigValueError(f"--config.train.batch_size={global_batch}: the training split has "
                               f"{len(train_source)} examples, fewer than one batch")
    epoch_steps = steps_per_epoch * int(config.train.num_epochs)
    total_steps = epoch_steps
    max_steps = int(config.train.get("max_steps", 0))
    if max_steps > 0:
        total_steps = min(total_steps, max_steps)
    warmup = int(config.optimizer.get("warmup_steps", 0))
    if warmup >= epoch_steps and warmup > 0:
        raise ConfigValueError(
            f"--config.optimizer.warmup_steps={warmup}: not shorter than the whole run ({epoch_steps} steps: "
            f"{config.train.num_epochs} epochs of {steps_per_epoch}); the learning rate would never reach "
            f"optimizer.lr")
    if warmup >= total_steps > 0 and warmup > 0:
        log.warning("train.max_steps=%d stops the run inside the %d warmup steps: the learning rate reaches only "
                    "%.2g of optimizer.lr", total_steps, warmup, total_steps / warmup)
    return Plan(train_source=train_source, global_batch=global_batch, accumulation=accumulation,
                steps_per_epoch=steps_per_epoch, total_steps=total_steps, data_parallel=data_parallel)


def train_collate(run: RunSetup, plan: Plan) -> Callable:
    """The training batches' collate: with data.packing, for tasks that predict once per example
    from its first token, several examples per row (pipeline.pack_batch), packed in one group
    per data-parallel shard and micro-batch so that each example stays on its row's device;
    otherwise the evaluation's padding to length buckets."""
    collate = run.collate
    if not (run.config.data.get("packing", False) and run.task.packs_examples
            and isinstance(collate, functools.partial) and collate.func is pipeline.pad_batch):
        return collate
    pc = jax.process_count()
    groups = plan.accumulation * plan.data_parallel
    if groups % pc or plan.global_batch % groups:
        return collate  # shards that do not line up with processes or examples: plain padding
    return functools.partial(pipeline.pack_batch, buckets=collate.keywords["buckets"],
                             pad_values=collate.keywords["pad_values"], groups=groups // pc)


def _run(config, workdir: str) -> dict:
    setup_logging(workdir)
    # Nothing that would refuse the corrected command (config.json, inputs.json) is written
    # before every check below has passed.
    check_workdir_config(workdir, config.to_dict(), write=False)
    trained = has_trained_state(workdir)
    if trained and read_workdir_config(workdir) is None:
        raise validation.RunError(f"workdir {workdir} holds checkpoints or results but no {CONFIG_FILE}: its config "
                                  "is unknown. Use a new --workdir, or delete the old one to start over.")
    checked = model_inputs(config)
    task = checked.task
    known = inputs_lib.fingerprint(files=task.input_files(config, workdir), tokenizer_dir=checked.tokenizer_dir,
                                   model_dir=checked.model_dir)
    inputs_lib.check_inputs(workdir, known, trained=trained)  # before any data is (re)built in the workdir
    with recording_reads() as data_files:
        run = setup(config, workdir, checked=checked)
    missing = [s for s in config.eval_splits if s not in run.splits]
    if missing:
        log.info("splits not in the data (held-out files absent), skipped: %s", missing)
    for needed in (task.train_split, task.validation_split):
        if needed not in run.splits:
            raise FileNotFoundError(f"task {task.name}: split {needed!r} not found in the data")
    plan = plan_training(run)
    current = dict(known, data=dict(sorted(data_files.items())))
    inputs_lib.check_inputs(workdir, current, trained=trained, parts=("data",))
    if trained and inputs_lib.read_inputs(workdir) is None:
        log.info("%s has no %s (written by an older nli-jax): recording this run's inputs from now on", workdir,
                 inputs_lib.INPUTS_FILE)
    write_workdir_config(workdir, config.to_dict())
    inputs_lib.write_inputs(workdir, current)
    state, loop, reused = train(run, plan)
    ckpt = Checkpointer(workdir, keep=int(config.train.get("keep_checkpoints", 2)), async_save=False)
    try:
        best_params, _ = ckpt.restore_best(abstract_like(state["params"]), step=loop["best_step"],
                                           abstract_state=abstract_like(state))
        ckpt.prune_best(loop["best_step"])
    finally:
        ckpt.close()
    params = best_params if best_params is not None else state["params"]
    eval_splits = [s for s in config.eval_splits if s in run.splits]
    results, records = final_evaluation(run, params, eval_splits, reused=reused)
    results.update(steps=loop["steps"], best_step=loop["best_step"], stopped_early=loop["stopped_early"],
                   history=loop["history"], train_tokens=loop["train_tokens"])
    if config.get("export_final", False):
        # The final parameters: pretraining's export (fine-tunes with model.init).
        results["export"] = export(run, state["params"], os.path.join(workdir, "export"))
    if config.get("export_best", False):
        # The best parameters with real label names: loads in transformers' *For...Classification.
        results["export_best"] = export(run, params, os.path.join(workdir, "export_best"))
    write_json(os.path.join(workdir, "results.json"), results)
    write_jsonl(os.path.join(workdir, "predictions.jsonl"), records)
    return results


def host_params(params):
    """Whole parameters as numpy arrays on this host. Arrays sharded across processes (fsdp or
    tensor axes spanning hosts) are gathered with multihost_utils: device_get cannot read the
    shards of another process."""
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree.leaves(params)):
        from jax.experimental import multihost_utils
        return multihost_utils.process_allgather(params, tiled=True)
    return jax.device_get(params)


def export(run: RunSetup, params, directory: str) -> str:
    """`params` as a Hugging Face directory (config with id2label names, weights, tokenizer).
    Every process calls it (the gather is collective); process 0 writes."""
    nnx.update(run.model, nnx.State(host_params(params)))
    if jax.process_index() == 0:
        run.model.save_pretrained(directory, tokenizer=run.tokenizer, label_names=run.label_names)
    return directory


def train(run: RunSetup, plan: Plan | None = None):
    """The training loop: returns (final state, loop bookkeeping, the evaluation made at the best
    step in this process, if any, so the final evaluation need not repeat it)."""
    config, workdir, task, mesh = run.config, run.workdir, run.task, run.mesh
    pc, pi = jax.process_count(), jax.process_index()
    plan = plan or plan_training(run)
    global_batch, accumulation = plan.global_batch, plan.accumulation
    batch_sharding = run.batch_sharding
    train_source = plan.train_source
    collate = train_collate(run, plan)
    if task.train_split == "train":
        run.splits = dict(run.splits, train=train_source)
    steps_per_epoch, total_steps = plan.steps_per_epoch, plan.total_steps
    tx, schedule = make_optimizer(config.optimizer, total_steps, steps_per_epoch)

    params, param_shardings = run.params, run.param_shardings
    replicated = mesh_lib.replicated(mesh)
    # Moments follow their parameter's sharding; counts and other scalars are replicated.
    opt_shardings = optax.tree_map_params(
        tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, params), param_shardings,
        transform_non_params=lambda _: replicated, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
    state = {"params": params, "opt_state": opt_state, "step": mesh_lib.put_global(np.int32(0), replicated)}
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    train_step = jax.jit(make_train_step(run.graphdef, run.rest, task, tx, schedule, seed=int(config.train.seed),
                                         accumulation_steps=accumulation),
                         in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, replicated),
                         donate_argnums=(0,))

    # Several processes: each pads (or packs) its rows to the shape the whole global batch needs,
    # known from every example's length (gathered once here), so shapes agree with no per-step exchange.
    lengths = (pipeline.encoded_lengths(train_source, run.encode, pi, pc)
               if pc > 1 and (pipeline.is_bucketing(collate) or pipeline.is_packing(collate)) else None)
    train_iter = iter(pipeline.train_dataset(
        train_source, run.encode, local_batch_size=global_batch // pc, seed=int(config.train.seed),
        num_epochs=int(config.train.num_epochs), collate=collate, process_index=pi, process_count=pc,
        workers=int(config.data.get("workers", 0)), lengths=lengths))

    ckpt = Checkpointer(workdir, keep=int(config.train.get("keep_checkpoints", 2)),
                        async_save=bool(config.train.get("async_checkpointing", True)))
    loop = {"best_metric": None, "best_step": None, "evals_without_improvement": 0, "stopped_early": False,
            "history": []}
    try:
        restored = ckpt.restore_latest(abstract_like(state), train_iter)
    except BaseException:
        ckpt.close()
        raise
    if restored is not None:
        latest, state, loop = restored
        log.info("resumed from %s at step %d", ckpt.directory, latest)
    step = int(jax.device_get(state["step"]))

    eval_every = int(config.train.get("eval_every_steps", 0)) or steps_per_epoch
    ckpt_every = int(config.train.get("checkpoint_every_steps", 0)) or eval_every
    log_every = max(1, int(config.train.get("log_every_steps", 50)))
    patience = int(config.train.get("early_stopping_patience", 0))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    peak = float(config.train.get("peak_tflops_per_device", 0.0)) * 1e12 * jax.device_count()
    # Training FLOPs per token: 6 x (parameters outside the embedding tables) + attention.
    model = run.model
    embedding_params = sum(x.size for p, x in nnx.to_flat_state(nnx.state(model.encoder.embeddings, nnx.Param)))
    c = model.config
    max_len = int(config.data.max_seq_length)
    flops_per_token = 6 * (n_params - embedding_params) + 12 * c.num_hidden_layers * c.hidden_size * max_len
    reporter = Reporter(workdir, total_steps, step, flops_per_token=flops_per_token, peak_flops=peak)
    log.info("task %s | %s %s, %.1fM parameters | mesh %s | %d train examples, %d steps/epoch, %d steps | "
             "batch %d (accumulation %d)", task.name, type(model).__name__, model.config.model_type, n_params / 1e6,
             dict(mesh.shape), len(train_source), steps_per_epoch, total_steps, global_batch, accumulation)
    if pipeline.is_packing(collate):
        log.info("training batches packed (data.packing): several examples per row, each attending to itself, "
                 "in %d group(s) per process", collate.keywords["groups"])

    best_evaluation = None  # (step, report, records) of the best evaluation made in this process
    pending = []
    padding = {"lengths": hashlib.sha1(), "per_length": {}, "real": 0, "padded": 0}
    with _Preemption(check_every=log_every) as preemption:
        while step < total_steps and not loop["stopped_early"]:
            local = next(train_iter)
            real_tokens = int(local["attention_mask"].sum())
            reporter.count(int(local["weight"].sum()) * pc, real_tokens * pc)
            _count_padding(padding, local["attention_mask"].shape, real_tokens)
            state, metrics = train_step(state, pipeline.to_global(local, batch_sharding))
            step += 1
            pending.append(metrics)
            if step % log_every == 0 or step == total_steps:
                sums = jax.device_get(pending)
                total = {k: float(np.sum([m[k] for m in sums])) for k in sums[0] if k not in ("lr", "grad_norm")}
                total.update(lr=float(sums[-1]["lr"]), grad_norm=float(sums[-1]["grad_norm"]))
                reporter.train(step, total, step / steps_per_epoch)
                pending = []
            if step % eval_every == 0 or step == total_steps:
                result, records = run.evaluate(state["params"], task.validation_split)
                metric = result[task.primary_metric]
                reporter.scalars(step, {f"{task.validation_split}/{task.primary_metric}": metric,
                                        f"{task.validation_split}/loss": result["loss"]})
                loop["history"].append({"step": step, "epoch": round(step / steps_per_epoch, 3),
                                        task.validation_split: {task.primary_metric: metric, "loss": result["loss"]}})
                if loop["best_metric"] is None or metric > loop["best_metric"]:
                    loop.update(best_metric=metric, best_step=step, evals_without_improvement=0)
                    ckpt.save_best(step, state["params"], {"step": step, task.primary_metric: metric,
                                                           "labels": run.label_names})
                    best_evaluation = (step, result, records)
                else:
                    loop["evals_without_improvement"] += 1
                    if patience and loop["evals_without_improvement"] >= patience:
                        loop["stopped_early"] = True
                log.info("eval step %d: %s %s %.4f (best %.4f at step %d)%s", step, task.validation_split,
                         task.primary_metric, metric, loop["best_metric"], loop["best_step"],
                         " -> early stop" if loop["stopped_early"] else "")
            if step % ckpt_every == 0 or step == total_steps or loop["stopped_early"]:
                ckpt.save(step, state, train_iter, loop)
            if preemption.reached(step):
                ckpt.save(step, state, train_iter, loop, force=True)
                ckpt.close()
                log.info("SIGTERM: checkpoint saved at step %d; exiting (rerun the same command to resume)", step)
                raise Preempted(143)
        ckpt.wait()
    ckpt.close()
    reporter.close()
    if padding["real"]:
        # Per process: processes that agree on every step's shape print the same digest.
        log.info("process %d: padded length per step sha1 %s (%s steps at each length); %.3f padded tokens per "
                 "real token", pi, padding["lengths"].hexdigest()[:12],
                 ", ".join(f"{n}: {c}" for n, c in sorted(padding["per_length"].items())),
                 (padding["padded"] - padding["real"]) / padding["real"])
    # Tokens the steps computed on (rows x length, padding included) and real ones, for this
    # process's steps of this invocation (a resumed run counts from its resume).
    loop = dict(loop, steps=step, train_tokens={"computed": padding["padded"], "real": padding["real"]})
    reused = None
    if best_evaluation is not None and best_evaluation[0] == loop["best_step"]:
        reused = {task.validation_split: best_evaluation[1:]}
    return state, loop, reused


def _count_padding(padding: dict, shape, real_tokens: int) -> None:
    rows, length = (int(n) for n in shape)
    padding["lengths"].update(length.to_bytes(4, "little"))
    padding["per_length"][length] = padding["per_length"].get(length, 0) + 1
    padding["real"] += real_tokens
    padding["padded"] += rows * length


def final_evaluation(run: RunSetup, params, splits: list[str], *, reused: dict | None = None):
    """results.json's task fields and every split's report, and the prediction records, for
    `params`. `reused`: {split: (report, records)} already computed with these parameters."""
    task, config = run.task, run.config
    results = {"task": task.name, "primary_metric": task.primary_metric,
               "hypothesis_only": bool(config.data.get("hypothesis_only", False)), "splits": {}}
    records = []
    for split in splits:
        report, split_records = (reused or {}).get(split) or run.evaluate(params, split)
        results["splits"][split] = report
        records.extend(split_records)
        log.info("final %s: %s %.4f (%d examples)", split, task.primary_metric, report[task.primary_metric],
                 report["count"])
    return results, records


def resolve_checkpoint(path: str) -> dict:
    """A run's workdir (its best parameters, under best/) or a Hugging Face directory."""
    if not path:
        raise validation.RunError("no checkpoint given: a fine-tuning run's workdir or a Hugging Face model directory")
    storage.check_reachable(storage.check(path), what="checkpoint")
    if storage.isdir(os.path.join(path, "best")):
        config = read_workdir_config(path)
        if config is None:
            raise FileNotFoundError(f"{path} has best/ but no {CONFIG_FILE}: not a complete nli-jax run")
        return {"kind": "run", "path": path, "config": config}
    if storage.isfile(os.path.join(path, "config.json")):
        return {"kind": "hf", "path": path}
    raise FileNotFoundError(f"checkpoint {path}: neither a run directory (with best/ and {CONFIG_FILE}) nor a "
                            "Hugging Face model directory (with config.json)")


# What must match between the run that trained a checkpoint and the config that evaluates it.
_MODEL_KEYS = ("task", "model.", "data.max_seq_length", "data.hypothesis_only", "data.word_alignment")


def _checkpoint_setup(config, workdir, checkpoint: str, splits=None, need_labels=False):
    """RunSetup and parameters for a checkpoint, refusing a config whose model differs."""
    found = resolve_checkpoint(checkpoint)
    if found["kind"] == "run":
        from nli_jax.train.checkpointing import _flatten
        ours, theirs = _flatten(config.to_dict()), _flatten(found["config"])
        differing = sorted(k for k in set(ours) | set(theirs) if k.startswith(_MODEL_KEYS) and ours.get(k) != theirs.get(k))
        if differing:
            raise validation.RunError(f"{checkpoint} was trained with a different model or task config: " + "; ".join(
                f"{k}: {theirs.get(k)!r} (run) vs {ours.get(k)!r} (given)" for k in differing[:10]))
        info = Checkpointer.read_best_info(checkpoint)
        if info is None:
            raise FileNotFoundError(f"{checkpoint}/best holds no saved parameters")
        labels = info.get("labels")
        checked = model_inputs(config)
        recorded = inputs_lib.read_inputs(checkpoint)
        if recorded is not None:
            changed = inputs_lib.differences(recorded, inputs_lib.fingerprint(tokenizer_dir=checked.tokenizer_dir),
                                             parts=("tokenizer",))
            if changed:
                raise inputs_lib.InputsChangedError(
                    f"{checkpoint} was trained with another tokenizer than this config's ({'; '.join(changed[:5])}): "
                    "its parameters would read the wrong token ids; restore the run's tokenizer files")
        run = setup(config, workdir, splits=splits, labels=labels if splits is not None else None, checked=checked)
        if labels and run.label_names and list(labels) != run.label_names:
            raise validation.RunError(f"{checkpoint} was trained with labels {labels} but the data gives {run.label_names}")
        ckpt = Checkpointer(checkpoint, async_save=False, create=False)
        try:
            params, _ = ckpt.restore_best(abstract_like(run.params))
        finally:
            ckpt.close()
        return run, params
    labels = _hf_label_names(checkpoint)
    run = setup(config, workdir, splits=splits, labels=labels if splits is not None else None, model_init=checkpoint)
    if labels and run.label_names and labels != run.label_names:
        raise validation.RunError(f"{checkpoint}: id2label {labels} differs from task {run.task.name!r}'s labels {run.label_names}")
    if need_labels and not run.label_names:
        raise validation.RunError(f"{checkpoint}: its config.json has no label names (id2label) for task {run.task.name!r}")
    return run, run.params


def _hf_label_names(directory: str) -> list[str] | None:
    id2label = read_config(directory).get("id2label") or {}
    names = [id2label[k] for k in sorted(id2label, key=int)]
    return None if not names or all(n == f"LABEL_{i}" for i, n in enumerate(names)) else names


def evaluate_checkpoint(config, workdir: str, checkpoint: str, files: dict[str, str] | None = None) -> dict:
    """Evaluates a run's best parameters (or a Hugging Face checkpoint) on the config's
    eval_splits and on `files` ({split name: path}, in the task's format, labelled), writing
    results.json and predictions.jsonl to `workdir` with the same breakdowns as training."""
    validation.validate_config(config, training=False)
    task = get_task(config.task)
    files = dict(files or {})
    extra = {}
    for name, path in files.items():  # every file read and validated before any compute
        extra[name] = InMemorySource(task.read_file(config, path, labelled=True))
    splits = None
    if config.data.get("source") or not files:
        splits = task.load(config, workdir)
    splits = {**(splits or {}), **extra}
    eval_splits = [s for s in config.eval_splits if s in splits and s not in extra] + list(extra)
    if not eval_splits:
        raise validation.RunError(f"nothing to evaluate: none of eval_splits {list(config.eval_splits)} is in the data "
                         "and no files were given")
    setup_logging(workdir)
    run, params = _checkpoint_setup(config, workdir, checkpoint, splits=splits if extra else None)
    if extra:
        run.splits = splits
    results, records = final_evaluation(run, params, eval_splits)
    results["checkpoint"] = checkpoint
    results["files"] = files
    write_json(os.path.join(workdir, "results.json"), results)
    write_jsonl(os.path.join(workdir, "predictions.jsonl"), records)
    return results


def export_checkpoint(config, checkpoint: str, output: str) -> str:
    """A run's best parameters as a Hugging Face directory with label names and tokenizer."""
    validation.validate_config(config, training=False)
    if resolve_checkpoint(checkpoint)["kind"] != "run":
        raise validation.RunError(f"{checkpoint} is not a fine-tuning run directory (with best/ and {CONFIG_FILE})")
    run, params = _checkpoint_setup(config, output, checkpoint, splits={}, need_labels=True)
    return export(run, params, output)


def predict_files(config, output_dir: str, checkpoint: str, files: dict[str, str]) -> list[dict]:
    """Predictions with label names for unlabelled input ({name: path}, the task's file format;
    gold fields may be absent), written to <output_dir>/predictions.jsonl (split = name)."""
    validation.validate_config(config, training=False)
    if not files:
        raise validation.RunError("no input files to predict")
    task = get_task(config.task)
    inputs = {name: task.read_file(config, path, labelled=False) for name, path in files.items()}
    setup_logging(output_dir)
    run, params = _checkpoint_setup(config, output_dir, checkpoint, splits={}, need_labels=True)
    records = []
    for name, examples in inputs.items():
        records.extend(run.predict(params, examples, name))
        log.info("predicted %s: %d examples from %s", name, len(examples), files[name])
    write_jsonl(os.path.join(output_dir, "predictions.jsonl"), records)
    return records


class _EvalSplit:
    """A split read once and each example encoded once (lazily: a process encodes only the
    rows it evaluates), reused by every evaluation of the run."""

    def __init__(self, source, encode):
        self.examples = [source[i] for i in range(len(source))]
        self.by_idx = {e["idx"]: e for e in self.examples}
        self._encode, self._encoded = encode, {}
        self._lengths = None

    def lengths(self, process_index: int, process_count: int):
        """Every example's encoded length, gathered across processes once per run."""
        if self._lengths is None:
            self._lengths = pipeline.encoded_lengths(self.examples, self.encode, process_index, process_count)
        return self._lengths

    def encode(self, example):
        key = example["idx"]
        if key not in self._encoded:
            self._encoded[key] = self._encode(example)
        return self._encoded[key]


def _run_batches(step_fn, params, data: _EvalSplit, collate, batch_sharding, local_batch, pc, pi, split):
    """Runs `step_fn` over a split in eval batches: (summed metrics or None, per-example outputs
    merged in file order, the examples in that order)."""
    if getattr(collate, "needs_rng", False):  # a fixed generator per evaluation batch
        random_collate = collate
        collate = lambda rows: random_collate(rows, np.random.default_rng((7919, int(rows[0]["idx"]), pi)))
    examples, by_idx = data.examples, data.by_idx
    dummy = dict(data.encode(examples[0]), idx=np.int32(-1))
    sums, outputs = None, []
    lengths = data.lengths(pi, pc) if pc > 1 and pipeline.is_bucketing(collate) else None
    for local in pipeline.eval_batches(examples, data.encode, local_batch_size=local_batch, collate=collate,
                                       dummy=dummy, process_index=pi, process_count=pc, lengths=lengths):
        out = step_fn(params, pipeline.to_global(local, batch_sharding))
        metrics, predictions = out if isinstance(out, tuple) else (None, out)
        # Replicated outputs: every process sees every row; idx maps rows back to examples.
        outputs.append(dict(jax.device_get(predictions)))
        if metrics is not None:
            metrics = jax.device_get(metrics)
            sums = metrics if sums is None else {k: sums[k] + metrics[k] for k in sums}
    # Per-example rows (tag sequences differ in width between batches), in file order.
    rows = [{k: v[i] for k, v in batch.items()} for batch in outputs for i in range(len(batch["idx"]))]
    rows = sorted((r for r in rows if r["idx"] >= 0), key=lambda r: int(r["idx"]))
    merged = {k: [r[k] for r in rows] for k in outputs[0]}
    ordered = [by_idx[int(r["idx"])] for r in rows]
    if len(ordered) != len(examples):
        raise RuntimeError(f"{split}: evaluated {len(ordered)} of {len(examples)} examples")
    return sums, merged, ordered


def _local_batch(global_batch: int, pc: int) -> int:
    """train.eval_batch_size is global, like train.batch_size: each process takes its share."""
    return max(1, global_batch // pc)


def _evaluate(task, eval_step, params, data: _EvalSplit, collate, batch_sharding, eval_batch, pc, pi, split):
    sums, merged, ordered = _run_batches(eval_step, params, data, collate, batch_sharding, _local_batch(eval_batch, pc),
                                         pc, pi, split)
    report = task.report(split, ordered, merged)
    report["loss"] = float(sums["loss_sum"]) / max(float(sums["weight"]), 1.0)
    return report, task.prediction_records(split, ordered, merged)


def _predict(task, predict_step, params, data: _EvalSplit, collate, batch_sharding, eval_batch, pc, pi, split):
    _, merged, ordered = _run_batches(predict_step, params, data, collate, batch_sharding,
                                      _local_batch(eval_batch, pc), pc, pi, split)
    return task.prediction_records(split, ordered, merged)
