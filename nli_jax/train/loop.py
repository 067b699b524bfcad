"""train_and_evaluate(config, workdir): the one loop behind fine-tuning and pretraining.

Order of work, so that bad input fails before compute: config keys -> workdir config check ->
dataset files (validated, written as array_record) -> tokenizer -> model -> mesh -> steps.
Each step: train; evaluate on validation every `eval_every_steps` (early stopping, best
parameters); checkpoint every `checkpoint_every_steps` and on SIGTERM. At the end the best
parameters are evaluated on every split and written to results.json / predictions.jsonl.
"""
from __future__ import annotations

import functools
import os
import signal

import jax
import numpy as np
import optax
from flax import nnx

from nli_jax.checkpoints import load_tokenizer
from nli_jax.data import pipeline
from nli_jax.models import make_rngs, preset
from nli_jax.tasks import get_task
from nli_jax.train import mesh as mesh_lib
from nli_jax.train.checkpointing import Checkpointer, abstract_like, check_workdir_config
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.reporting import Reporter, log, setup_logging, write_json, write_jsonl
from nli_jax.train.steps import make_eval_step, make_train_step


def train_and_evaluate(config, workdir: str) -> dict:
    """Runs the config (once, or once per entry of `config.seeds`) and returns results.json."""
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


def build_model(config, task, tokenizer):
    cls, head_kwargs = task.model_class_and_kwargs(config)
    m = config.model
    overrides = {k: v for k, v in dict(m.get("overrides") or {}).items() if v is not None}
    if m.get("init"):
        return cls.from_pretrained(m.init, dtype=m.get("dtype", "float32"), remat=bool(m.get("remat", False)),
                                   seed=int(config.train.seed), config_overrides=overrides, **head_kwargs)
    encoder_config = preset(m.preset, vocab_size=len(tokenizer), dtype=m.get("dtype", "float32"),
                            remat=bool(m.get("remat", False)), pad_token_id=tokenizer.pad_token_id, **overrides)
    return cls(encoder_config, rngs=make_rngs(int(config.train.seed)), **head_kwargs)


class _Preemption:
    """SIGTERM (TPU maintenance, preemption) asks the loop to checkpoint and exit."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
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
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            flag = multihost_utils.process_allgather(np.array(self.requested))
            return bool(np.any(flag))
        return self.requested


class Preempted(SystemExit):
    pass


def _run(config, workdir: str) -> dict:
    setup_logging(workdir)
    task = get_task(config.task)
    check_workdir_config(workdir, config.to_dict())

    # 1. Data: every file parsed and validated before any compute.
    task.workdir = workdir
    splits = task.load(config)
    missing = [s for s in config.eval_splits if s not in splits]
    if missing:
        log.info("splits not in the data (held-out files absent), skipped: %s", missing)
    for needed in (task.train_split, task.validation_split):
        if needed not in splits:
            raise FileNotFoundError(f"task {task.name}: split {needed!r} not found in the data")

    # 2. Tokenizer and model.
    tokenizer = load_tokenizer(config.model.get("tokenizer") or config.model.init)
    model = build_model(config, task, tokenizer)
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"tokenizer has {len(tokenizer)} entries but the model's vocab_size is {model.config.vocab_size}")
    encode = task.encoder(config, tokenizer)
    max_len = int(config.data.max_seq_length)
    buckets = sorted({int(b) for b in (config.data.get("buckets") or ()) if int(b) <= max_len} | {max_len})
    if config.data.get("pad_to_max_length", False) or jax.process_count() > 1:
        buckets = [max_len]  # equal shapes on every process
    collate = task.collate(config, tokenizer) or functools.partial(
        pipeline.pad_batch, buckets=buckets, pad_values=task.pad_values(tokenizer))

    # 3. Mesh, shardings, state.
    mesh = mesh_lib.make_mesh(dict(config.mesh.shape))
    rules = tuple(tuple(r) for r in config.mesh.rules)
    pc, pi = jax.process_count(), jax.process_index()
    global_batch = int(config.train.batch_size)
    accumulation = int(config.train.get("accumulation_steps", 1))
    if global_batch % (pc * accumulation):
        raise ValueError(f"train.batch_size {global_batch} must divide by processes x accumulation_steps "
                         f"({pc} x {accumulation})")
    batch_sharding = mesh_lib.batch_sharding(mesh, rules)
    data_parallel = int(np.prod([mesh.shape[a] for a in batch_sharding.spec[0] or ()])) if batch_sharding.spec else 1
    if (global_batch // accumulation) % data_parallel:
        raise ValueError(f"micro-batch {global_batch // accumulation} must divide by the {data_parallel} data-parallel devices")

    train_source = splits[task.train_split]
    limit = int(config.data.get("max_train_examples", 0))
    if limit > 0:  # the first N examples in file order: quick experiments and overfitting checks
        train_source = pipeline.Subset(train_source, [i for i in range(len(train_source))
                                                      if train_source[i]["idx"] < limit])
    splits = dict(splits, train=train_source) if task.train_split == "train" else splits
    eval_splits = [s for s in config.eval_splits if s in splits]
    steps_per_epoch = pipeline.steps_per_epoch(len(train_source), global_batch)
    if steps_per_epoch == 0:
        raise ValueError(f"training split has {len(train_source)} examples, fewer than one batch of {global_batch}")
    total_steps = steps_per_epoch * int(config.train.num_epochs)
    if int(config.train.get("max_steps", 0)) > 0:
        total_steps = min(total_steps, int(config.train.max_steps))
    tx, schedule = make_optimizer(config.optimizer, total_steps, steps_per_epoch)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    param_shardings = mesh_lib.param_shardings(model, mesh, rules)
    params = mesh_lib.put_global(nnx.to_pure_dict(params), param_shardings)
    replicated = mesh_lib.replicated(mesh)
    # Moments follow their parameter's sharding; counts and other scalars are replicated.
    opt_shardings = optax.tree_map_params(
        tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, params), param_shardings,
        transform_non_params=lambda _: replicated, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
    state = {"params": params, "opt_state": opt_state,
             "step": mesh_lib.put_global(np.int32(0), mesh_lib.replicated(mesh))}
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    train_step = jax.jit(make_train_step(graphdef, rest, task, tx, schedule, seed=int(config.train.seed),
                                         accumulation_steps=accumulation),
                         in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, replicated),
                         donate_argnums=(0,))
    eval_step = jax.jit(make_eval_step(graphdef, rest, task), in_shardings=(param_shardings, batch_sharding),
                        out_shardings=replicated)

    train_iter = iter(pipeline.train_dataset(
        train_source, encode, local_batch_size=global_batch // pc, seed=int(config.train.seed),
        num_epochs=int(config.train.num_epochs), collate=collate, process_index=pi, process_count=pc,
        workers=int(config.data.get("workers", 0))))

    ckpt = Checkpointer(workdir, keep=int(config.train.get("keep_checkpoints", 2)),
                        async_save=bool(config.train.get("async_checkpointing", True)))
    loop = {"best_metric": None, "best_step": None, "evals_without_improvement": 0, "stopped_early": False,
            "history": []}
    latest = ckpt.latest_step()
    if latest is not None:
        state, loop = ckpt.restore(latest, abstract_like(state), train_iter)
        log.info("resumed from %s at step %d", ckpt.directory, latest)
    step = int(jax.device_get(state["step"]))

    eval_every = int(config.train.get("eval_every_steps", 0)) or steps_per_epoch
    ckpt_every = int(config.train.get("checkpoint_every_steps", 0)) or eval_every
    log_every = max(1, int(config.train.get("log_every_steps", 50)))
    patience = int(config.train.get("early_stopping_patience", 0))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    peak = float(config.train.get("peak_tflops_per_device", 0.0)) * 1e12 * jax.device_count()
    # Training FLOPs per token: 6 x (parameters outside the embedding tables) + attention.
    embedding_params = sum(x.size for p, x in nnx.to_flat_state(nnx.state(model.encoder.embeddings, nnx.Param)))
    c = model.config
    flops_per_token = 6 * (n_params - embedding_params) + 12 * c.num_hidden_layers * c.hidden_size * max_len
    reporter = Reporter(workdir, total_steps, step, flops_per_token=flops_per_token, peak_flops=peak)
    log.info("task %s | %s %s, %.1fM parameters | mesh %s | %d train examples, %d steps/epoch, %d steps | "
             "batch %d (accumulation %d)", task.name, type(model).__name__, model.config.model_type, n_params / 1e6,
             dict(mesh.shape), len(train_source), steps_per_epoch, total_steps, global_batch, accumulation)

    eval_data: dict[str, _EvalSplit] = {}

    def evaluate(params, split):
        if split not in eval_data:
            eval_data[split] = _EvalSplit(splits[split], encode)
        return _evaluate(task, eval_step, params, eval_data[split], collate, batch_sharding,
                         int(config.train.get("eval_batch_size", 64)), pc, pi, split)

    pending = []
    with _Preemption() as preemption:
        while step < total_steps and not loop["stopped_early"]:
            local = next(train_iter)
            reporter.count(int(local["weight"].sum()) * pc, int(local["attention_mask"].sum()) * pc)
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
                result, _ = evaluate(state["params"], task.validation_split)
                metric = result[task.primary_metric]
                reporter.scalars(step, {f"{task.validation_split}/{task.primary_metric}": metric,
                                        f"{task.validation_split}/loss": result["loss"]})
                loop["history"].append({"step": step, "epoch": round(step / steps_per_epoch, 3),
                                        task.validation_split: {task.primary_metric: metric, "loss": result["loss"]}})
                if loop["best_metric"] is None or metric > loop["best_metric"]:
                    loop.update(best_metric=metric, best_step=step, evals_without_improvement=0)
                    ckpt.save_best(step, state["params"], {"step": step, task.primary_metric: metric})
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

        # Final evaluation with the best parameters on every split.
        best_params, best_info = ckpt.restore_best(abstract_like(state["params"]))
        params = best_params if best_params is not None else state["params"]
        results = {"task": task.name, "primary_metric": task.primary_metric, "steps": step,
                   "best_step": loop["best_step"], "stopped_early": loop["stopped_early"],
                   "hypothesis_only": bool(config.data.get("hypothesis_only", False)),
                   "history": loop["history"], "splits": {}}
        records = []
        for split in eval_splits:
            report, split_records = evaluate(params, split)
            results["splits"][split] = report
            records.extend(split_records)
            log.info("final %s: %s %.4f (%d examples)", split, task.primary_metric, report[task.primary_metric],
                     report["count"])
    if config.get("export_final", False):
        # The final parameters as a Hugging Face directory (with the tokenizer): fine-tunes with
        # finetune.main (model.init) and loads in transformers' PyTorch classes.
        nnx.update(model, nnx.State(jax.device_get(state["params"])))
        if jax.process_index() == 0:
            model.save_pretrained(os.path.join(workdir, "export"), tokenizer=tokenizer)
        results["export"] = os.path.join(workdir, "export")
    write_json(os.path.join(workdir, "results.json"), results)
    write_jsonl(os.path.join(workdir, "predictions.jsonl"), records)
    reporter.close()
    ckpt.close()
    return results


class _EvalSplit:
    """A split read once and each example encoded once (lazily: a process encodes only the
    rows it evaluates), reused by every evaluation of the run."""

    def __init__(self, source, encode):
        self.examples = [source[i] for i in range(len(source))]
        self.by_idx = {e["idx"]: e for e in self.examples}
        self._encode, self._encoded = encode, {}

    def encode(self, example):
        key = example["idx"]
        if key not in self._encoded:
            self._encoded[key] = self._encode(example)
        return self._encoded[key]


def _evaluate(task, eval_step, params, data: _EvalSplit, collate, batch_sharding, local_batch, pc, pi, split):
    if getattr(collate, "needs_rng", False):  # a fixed generator per evaluation batch
        random_collate = collate
        collate = lambda rows: random_collate(rows, np.random.default_rng((7919, int(rows[0]["idx"]), pi)))
    examples, by_idx = data.examples, data.by_idx
    dummy = dict(data.encode(examples[0]), idx=np.int32(-1))
    sums, outputs = None, []
    for local in pipeline.eval_batches(examples, data.encode, local_batch_size=local_batch, collate=collate,
                                       dummy=dummy, process_index=pi, process_count=pc):
        metrics, predictions = eval_step(params, pipeline.to_global(local, batch_sharding))
        # Replicated outputs: every process sees every row; idx maps rows back to examples.
        outputs.append(dict(jax.device_get(predictions)))
        metrics = jax.device_get(metrics)
        sums = metrics if sums is None else {k: sums[k] + metrics[k] for k in sums}
    # Per-example rows (tag sequences differ in width between batches), in file order.
    rows = [{k: v[i] for k, v in batch.items()} for batch in outputs for i in range(len(batch["idx"]))]
    rows = sorted((r for r in rows if r["idx"] >= 0), key=lambda r: int(r["idx"]))
    merged = {k: [r[k] for r in rows] for k in outputs[0]}
    ordered = [by_idx[int(r["idx"])] for r in rows]
    if len(ordered) != len(examples):
        raise RuntimeError(f"{split}: evaluated {len(ordered)} of {len(examples)} examples")
    report = task.report(split, ordered, merged)
    report["loss"] = float(sums["loss_sum"]) / max(float(sums["weight"]), 1.0)
    return report, task.prediction_records(split, ordered, merged)

