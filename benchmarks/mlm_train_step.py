"""MLM training step (forward, backward, clipped AdamW update): nli-jax vs transformers' PyTorch eager.

    python -m benchmarks.mlm_train_step                 # BERT-base, batch 8 x seq 128, fp32
    python -m benchmarks.mlm_train_step --model tiny-bert --rounds 2 --steps 1   # smoke run

Each side's achieved FP32 GFLOP/s (the model's training FLOPs per token x tokens/s) is printed
beside the CPU's peak (benchmarks.harness.cpu_peak: cores x clock x FMA units x lanes x 2).

Sides (--sides):
  nli-jax              the pretraining loop's own step: nli_jax.train.compiled_step.initial_state_and_step
                       (the state {params, opt_state, step} in its shardings, the jitted
                       make_train_step with the state donated) with the "pretraining" task and
                       the optimizer of configs/pretrain/indobert_base.py's plan.
  nli-jax-handwritten  a minimal hand-written jitted step (same model, loss and optimizer, the
                       model's own dropout RNG state, no metrics): what the loop's step costs
                       on top of the bare computation.
  pytorch-eager        transformers' BertForMaskedLM called with labels as users do (logits at
                       every position, loss at the labelled ones), torch.optim.AdamW,
                       clip_grad_norm_; torch.set_num_threads(os.cpu_count()).
  pytorch-sparse       ModernBERT only, on request: transformers' ModernBertForMaskedLM with its
                       sparse_prediction option (the decoder at the labelled positions only, as
                       nli-jax's head): the peer at its fastest.

Every side: the same shapes, the same masked positions (15% of tokens, at most 20 per
sequence), dropout 0.1, and the optimizer of configs/pretrain (AdamW, decay 0.01 not on biases
and LayerNorm, eps 1e-6, gradient clipping at global norm 1.0) with a constant lr. nli-jax
computes MLM logits only at the masked positions (the BERT recipe). After compilation and a
warm-up step per side, --rounds rounds of --steps timed steps per side run in the same
process on the same cores, the side that goes first rotating from round to round so that
machine noise hits all; min / median / max step time per side and the ratio of medians.
"""
from __future__ import annotations

import dataclasses
import functools
import os

# As the command line does, before JAX runs anything or anything is printed (it may re-execute the
# interpreter; PyTorch shares the process and the allocator setting).
from nli_jax.cli import host_memory  # noqa: E402

HOST_MALLOC = host_memory.configure()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from configs.pretrain import indobert_base  # noqa: E402
from nli_jax.data import pipeline  # noqa: E402
from nli_jax.losses import weighted_cross_entropy  # noqa: E402
from nli_jax.models import ForMaskedLM, make_rngs, preset  # noqa: E402
from nli_jax.tasks import create_task  # noqa: E402
from nli_jax.train import mesh as mesh_lib  # noqa: E402
from nli_jax.train.compiled_step import initial_state_and_step  # noqa: E402
from nli_jax.train.optimizers import make_optimizer  # noqa: E402
from nli_jax.planner import build_plan  # noqa: E402
from nli_jax.train.setup import StepSetup  # noqa: E402
from nli_jax.train.steps import check_dropout_streams  # noqa: E402

from benchmarks import harness  # noqa: E402

SIDES = ("nli-jax", "nli-jax-handwritten", "pytorch-eager")
SPARSE_PEER = "pytorch-sparse"  # transformers' sparse_prediction: a ModernBERT option


def make_batch(vocab, batch, length, predictions, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(min(1000, vocab // 2), vocab, (batch, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 3, 4
    n = min(predictions, max(1, round(0.15 * length)))
    positions = np.stack([np.sort(rng.choice(np.arange(1, length - 1), n, replace=False)) for _ in range(batch)])
    positions = np.pad(positions, ((0, 0), (0, predictions - n))).astype(np.int32)
    weights = np.zeros((batch, predictions), np.float32)
    weights[:, :n] = 1
    labels = np.take_along_axis(ids, positions, axis=1)
    masked = ids.copy()
    np.put_along_axis(masked, positions[:, :n], 2, axis=1)  # [MASK]
    return dict(input_ids=masked, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids),
                masked_positions=positions, masked_ids=labels, masked_weights=weights,
                weight=np.ones((batch,), np.float32))


def pretraining_plan(lr: float):
    """configs/pretrain/indobert_base.py's plan (its BERT optimizer block: AdamW, eps 1e-6, decay
    0.01, clip 1.0) at a constant lr."""
    config = indobert_base.get_config("phase=1")
    config.optimizer.lr, config.optimizer.schedule, config.optimizer.warmup_steps = lr, "constant", 0
    config.model.tokenizer = "unused"  # the step needs no tokenizer; the plan needs one named
    config.pretrain.corpus = ("unused",)
    return build_plan(config)


def loop_state_and_step(model, plan, seed=0):
    """(state, step, batch_sharding): the state and step nli_jax.train.loop.train() runs, its own
    initial_state_and_step, placed as it places it (the plan's batch ramp, if any, included)."""
    task = create_task(plan)  # its loss on given batches: nothing of the tokenizer needed
    check_dropout_streams(model)
    mesh = mesh_lib.make_mesh(plan.mesh.shape_dict)
    batch_sharding = mesh_lib.batch_sharding(mesh, plan.mesh.rules)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    param_shardings = mesh_lib.param_shardings(model, mesh, plan.mesh.rules)
    params = mesh_lib.put_global(nnx.to_pure_dict(params), param_shardings)
    tx, schedule = make_optimizer(plan.optimizer, plan.schedule, plan.batch_ramp, total_steps=1_000_000,
                                  steps_per_epoch=1_000_000, warmup_steps=0)
    plan = dataclasses.replace(plan, train=dataclasses.replace(plan.train, seed=seed))
    steps = StepSetup(plan, task, graphdef, rest, param_shardings, batch_sharding, mesh)
    state, step = initial_state_and_step(steps, params, tx, schedule)
    return state, step, batch_sharding


def loop_step_fn(model, plan, seed=0):
    """The step nli_jax.train.loop.train() runs (loop_state_and_step) as a call on a converted batch."""
    state, step, batch_sharding = loop_state_and_step(model, plan, seed)
    holder = [state]

    def run(batch):
        holder[0], metrics = step(holder[0], batch)
        jax.block_until_ready((holder[0], metrics))
        return float(metrics["loss_sum"]) / max(float(metrics["weight"]), 1.0)
    return run, lambda batch: pipeline.to_global(batch, batch_sharding)


def handwritten_step_fn(model, plan):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx, _ = make_optimizer(plan.optimizer, total_steps=1_000_000, steps_per_epoch=1_000_000, warmup_steps=0)
    opt_state = tx.init(params)

    # Donated state is updated in place: no fresh 94 MB embedding-sized buffers per step.
    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(params, opt_state, rest, batch):
        model = nnx.merge(graphdef, params, rest)

        def loss_fn(m):
            out = m(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    masked_positions=batch["masked_positions"], deterministic=False)
            total, count = weighted_cross_entropy(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"])
            return total / count
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        params = nnx.state(model, nnx.Param)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, nnx.state(model, nnx.Not(nnx.Param)), loss

    state = [params, opt_state, rest]

    def run(batch):
        state[0], state[1], state[2], loss = step(*state, batch)
        return float(loss)  # blocks until the step is done
    return run, lambda batch: jax.tree.map(jnp.asarray, batch)


def torch_step_fn(config, opt_cfg, *, device: str = "cpu", bf16: bool = False, num_labels: int = 0,
                  sparse_prediction: bool = False):
    """(run, convert, torch): one step of transformers' model of `config` (AutoModelForMaskedLM, or
    AutoModelForSequenceClassification with `num_labels`) on `device`, float32 parameters, under
    torch.autocast(bfloat16) with `bf16`; `convert` makes a batch of make_batch (or of
    benchmarks.device_check.classification_batch) its inputs on that device. `sparse_prediction`:
    ModernBERT's option decoding the labelled positions only."""
    import torch
    import transformers
    torch.set_num_threads(os.cpu_count())
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in config.to_hf_dict().items() if k != "dtype"},
                                           **({"num_labels": num_labels} if num_labels else {}),
                                           **({"sparse_prediction": True} if sparse_prediction else {}))
    auto = transformers.AutoModelForSequenceClassification if num_labels else transformers.AutoModelForMaskedLM
    model = auto.from_config(hf).to(device).train()
    # nli_jax.train.optimizers.decay_mask: decay on matrices (kernels, embeddings) only.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opt_cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=opt_cfg.lr, betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps)
    device_type = torch.device(device).type

    def run(batch):
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            out = model(**batch)
        loss, run.decoded_rows = out.loss, int(np.prod(out.logits.shape[:-1]))  # positions the head decoded
        del out  # the logits are not held past the backward pass
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())  # waits for the step (on an accelerator too)

    # ModernBERT takes no token types.
    fields = ("input_ids", "attention_mask") + (("token_type_ids",) if "token_type_ids" in
                                                 model.forward.__code__.co_varnames else ())

    def convert(batch):
        if num_labels:
            labels = np.asarray(batch["label"], np.int64)
        else:
            labels = np.full(batch["input_ids"].shape, -100, np.int64)
            for b in range(labels.shape[0]):
                keep = batch["masked_weights"][b] > 0
                labels[b, batch["masked_positions"][b][keep]] = batch["masked_ids"][b][keep]
        inputs = {k: torch.tensor(batch[k], dtype=torch.long, device=device) for k in fields}
        return dict(inputs, labels=torch.tensor(labels, device=device))
    return run, convert, torch


def add_step_arguments(parser, *, model: str) -> None:
    """The step's model and batch (make_batch's shape) and learning rate: --model --batch --seq
    --predictions --lr, shared with benchmarks.step_profile."""
    parser.add_argument("--model", default=model, help="preset name (nli_jax.models.PRESETS)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20, help="max_predictions_per_seq")
    parser.add_argument("--lr", type=float, default=1e-4)


def main():
    parser = harness.parser(__doc__)
    add_step_arguments(parser, model="indobert-base")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"comma-separated, of {', '.join(SIDES)} (and {SPARSE_PEER} for ModernBERT)")
    args = parser.parse_args()
    print(f"{harness.line()}; host allocator: {HOST_MALLOC}", flush=True)  # ratios differ between CPUs
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or set(sides) - {*SIDES, SPARSE_PEER}:
        parser.error(f"--sides: expected some of {', '.join(SIDES)}, {SPARSE_PEER}, got {args.sides!r}")

    config = preset(args.model, max_position_embeddings=max(512, args.seq))
    if SPARSE_PEER in sides and config.model_type != "modernbert":
        parser.error(f"--sides: {SPARSE_PEER} is transformers' ModernBERT option; --model={args.model} is "
                     f"{config.model_type}")
    plan = pretraining_plan(args.lr)
    batch = make_batch(config.vocab_size, args.batch, args.seq, args.predictions)
    calls, runs, torch = {}, {}, None
    for name in sides:
        if name == "nli-jax":
            run, convert = loop_step_fn(ForMaskedLM(config, sentence_head=False, rngs=make_rngs(0)), plan)
        elif name == "nli-jax-handwritten":
            run, convert = handwritten_step_fn(ForMaskedLM(config, sentence_head=False, rngs=make_rngs(0)), plan)
        else:
            run, convert, torch = torch_step_fn(config, plan.optimizer, sparse_prediction=name == SPARSE_PEER)
        calls[name] = functools.partial(run, convert(batch))
        runs[name] = run
    # Warm-up: nli-jax's first step compiles; PyTorch's sets up its allocator and oneDNN primitives.
    timings = harness.time_sides(calls, rounds=args.rounds, calls=args.steps, warmup=2)

    tokens = args.batch * args.seq
    result = {"model": args.model, "batch": args.batch, "seq": args.seq, "max_predictions": args.predictions,
              "optimizer": dataclasses.asdict(plan.optimizer), "rounds": args.rounds, "steps_per_round": args.steps,
              "jax": jax.__version__, "torch": torch.__version__ if torch else None,
              "torch_threads": torch.get_num_threads() if torch else None, "host_allocator": HOST_MALLOC,
              "nli_jax_step": "nli_jax.train.compiled_step.initial_state_and_step (make_train_step), pretraining task, "
                              "donated state", "sides": {}}
    # Achieved FP32 FLOP/s against the CPU's peak: the model's training FLOPs per token (6 x the
    # parameters outside the embedding tables + attention; the same count as device_check's MFU)
    # x tokens/s. nli-jax decodes only the masked positions, PyTorch every one: both are credited
    # the same useful work, so the figure says how near each side's step is to the hardware.
    flops_per_token = ForMaskedLM(config, sentence_head=False, rngs=make_rngs(0)).training_flops_per_token(args.seq)
    peak = harness.cpu_peak()
    result.update(training_flops_per_token=flops_per_token, cpu_peak=peak)
    for name, timing in timings.items():
        achieved = tokens / timing.median * flops_per_token / 1e9
        decoded = {"decoded_rows": runs[name].decoded_rows} if hasattr(runs[name], "decoded_rows") else {}
        result["sides"][name] = dict(timing.summary(), **decoded, tokens_per_s=tokens / timing.median,
                                     step_times_s=timing.times, gflops=achieved,
                                     share_of_peak=achieved / peak["gflops"] if peak["gflops"] else None)
    print(f"MLM train step, {args.model}, batch {args.batch} x seq {args.seq}, fp32, clipped AdamW, {os.cpu_count()} "
          f"cores; {args.rounds} rounds x {args.steps} steps per side")
    print(f"  FP32 peak {peak['gflops']:.0f} GFLOP/s ({peak['formula']}); {flops_per_token / 1e6:.1f} MFLOP per token")
    print(f"  {'side':20s} {'tokens/s':>9s}   step s: {'min':>7s} {'median':>7s} {'max':>7s}   first (compile) s"
          f"   GFLOP/s  of peak")
    for name, r in result["sides"].items():
        share = f"{100 * r['share_of_peak']:6.1f}%" if r["share_of_peak"] is not None else "      ?"
        print(f"  {name:20s} {r['tokens_per_s']:9.1f}           {r['min_s']:7.3f} {r['median_s']:7.3f} "
              f"{r['max_s']:7.3f}   {r['first_call_s']:17.1f}   {r['gflops']:7.1f}  {share}")
    # tokens/s ratio = ratio of the median step times, the denominator's over the numerator's
    ratios = {f"{a}_over_{b}_tokens_per_s".replace("-", "_"): timings[b].median / timings[a].median
              for a, b in (("nli-jax", "pytorch-eager"), ("nli-jax-handwritten", "pytorch-eager"),
                           ("nli-jax", "nli-jax-handwritten"), ("nli-jax", SPARSE_PEER)) if a in sides and b in sides}
    for name, value in ratios.items():
        print(f"  ratio {name}: {value:.2f}x")
    harness.write_result(args.json, result, ratios=ratios)


if __name__ == "__main__":
    main()
