"""The crammed recipe (configs/pretrain/crammed.py:cpu_learn) side by side with transformers'
ModernBertForMaskedLM (issue 41, item 4).

    python -m benchmarks.experiments.crammed_vs_transformers --workdir=/tmp/recipe_search --steps=1000
    python -m benchmarks.experiments.crammed_vs_transformers --workdir=/tmp/recipe_search --steps=100 \
        --same_init --ramp_fraction=0.05     # both from nli-jax's initial parameters: the update rules alone
    python -m benchmarks.experiments.crammed_vs_transformers --workdir=/tmp/s --steps=20   # smoke run
    python -m benchmarks.experiments.crammed_vs_transformers --workdir=/tmp/s --seed=3 \
        --init_from=transformers --sides=nli-jax   # nli-jax's trainer from transformers' draw of seed 3

Data: as benchmarks.experiments.pretrain_vs_transformers (id_corpus_sample, a 2,000-piece
WordPiece vocabulary, 32-token examples, built once under --workdir).

nli-jax: the run's own set-up (loop.checked_setup), its own training batches (compiled_step.train_batches:
shuffling and 30% masking) and its own compiled train step (compiled_step.initial_state_and_step) with the
recipe's optimizer over --steps: AdamW 1e-3 (b2 0.98, eps 1e-12, decay 0.01 on kernels and
embeddings), the one-cycle triangle, the batch ramp (an update every k steps on the mean gradient,
k from 1 to 4 at 60% of the run), clipping at 0.5.

transformers: `ModernBertForMaskedLM` of the same config.json (nli-jax's export of the shape:
modernbert.to_hf) with its own initialisation (--same_init: nli-jax's initial parameters, exported
and loaded by from_pretrained; --init_from=transformers: both sides from transformers' own draw of
--seed, loaded into nli-jax's model, to tell the draw's distribution from the trainer), trained by a PyTorch loop on the very same batches
with the same optimizer: torch AdamW with decay on the Linear and embedding weights only, the same
triangle, the same ramp (gradients summed over k steps, divided by k, clipped at 0.5, one step),
loss = mean cross-entropy over the batch's masked positions (the logits computed there only,
through the model's head and tied decoder).

Prints both training-loss curves (each step's loss, and means over windows of --window steps) and
the largest gap between them, per step and between window means; writes --json (default
<workdir>/crammed_vs_transformers.json) and a PNG of both curves (--png).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks import harness
from benchmarks.experiments import pretrain_recipe_search


def crammed_config(vocab_dir: str, examples_dir: str, steps: int):
    """configs/pretrain/crammed.py:cpu_learn on prepared data, over `steps` steps (no budget: both
    sides run the same steps)."""
    from configs.pretrain import crammed
    c = crammed.get_config("cpu_learn")
    c.model.tokenizer = vocab_dir
    c.pretrain.examples_dir = examples_dir
    c.data.workers = 0
    c.train.update(max_steps=steps, budget_minutes=0.0, eval_every_steps=steps, checkpoint_every_steps=steps,
                   log_every_steps=steps)
    return c


def set_up(config, workdir: str):
    from nli_jax.train import loop
    from nli_jax import planner
    plan = planner.build_plan(config)
    run, _, steps, train_source, _ = loop.checked_setup(plan, workdir)
    return plan, run, steps, train_source


def torch_side(run, plan, same_init: str = "", seed: int = 0):
    """(model, optimizer) of transformers' ModernBertForMaskedLM of the run's shape: its own
    initialisation, or (`same_init`: an export of nli-jax's initial parameters) nli-jax's."""
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM
    from nli_jax.models import modernbert
    hf_config = {k: v for k, v in modernbert.to_hf(run.model.config).items() if k != "dtype"}
    torch.manual_seed(seed)
    model = (ModernBertForMaskedLM.from_pretrained(same_init, attn_implementation="eager") if same_init else
             ModernBertForMaskedLM(ModernBertConfig(**hf_config, attn_implementation="eager")))
    o = plan.optimizer
    # nli_jax.train.optimizers.decay_mask: kernels and embeddings decay; norms (and biases) do not.
    named = dict(model.named_parameters())
    decay = [p for n, p in named.items() if n.endswith(".weight") and "norm" not in n]
    rest = [p for n, p in named.items() if not (n.endswith(".weight") and "norm" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=o.lr, betas=(o.b1, o.b2), eps=o.eps)
    return model, optimizer


def torch_loss(model, batch):
    import torch
    ids = torch.from_numpy(np.asarray(batch["input_ids"], np.int64))
    mask = torch.from_numpy(np.asarray(batch["attention_mask"], np.int64))
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    positions = torch.from_numpy(np.asarray(batch["masked_positions"], np.int64))
    picked = torch.gather(hidden, 1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
    logits = model.decoder(model.head(picked))
    targets = torch.from_numpy(np.asarray(batch["masked_ids"], np.int64))
    weights = torch.from_numpy(np.asarray(batch["masked_weights"], np.float32)
                               * np.asarray(batch["weight"], np.float32)[:, None])
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                               reduction="none").reshape(targets.shape)
    return (losses * weights).sum() / weights.sum().clamp(min=1.0)


def transformers_draw(run, params, model):
    """`params` (the run's placed parameters) replaced by transformers' `model`'s initial tensors."""
    import jax
    from flax import nnx
    from nli_jax.models.pretrained import load_weights
    load_weights(run.model, {k: v.detach().float().numpy() for k, v in model.state_dict().items()},
                 source="transformers' initialisation")
    drawn = nnx.to_pure_dict(nnx.state(run.model, nnx.Param))
    return jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), drawn, params)


def side_by_side(plan, run, steps, train_source, same_init_dir: str = "", seed: int = 0,
                 init_from: str = "own", sides: str = "both") -> dict:
    """Both sides (or `sides` alone) step by step on each of the run's batches: {"nli-jax": [loss],
    "transformers": [loss], "lr": [...], "update": [bool], "seconds": {...}}. `init_from`:
    "transformers" starts both from transformers' draw of `seed`."""
    import jax
    import torch
    from nli_jax.data import pipeline
    from nli_jax.train import compiled_step
    from nli_jax.train.batch_ramp import ramp_schedule
    from nli_jax.train.optimizers import make_optimizer
    torch.set_num_threads(os.cpu_count())
    total = steps.total_steps
    tx, schedule = make_optimizer(plan.optimizer, plan.schedule, plan.batch_ramp, total_steps=total,
                                  steps_per_epoch=steps.steps_per_epoch, warmup_steps=steps.warmup_steps, unit_peak=True)
    params = run.params
    if init_from == "transformers":  # transformers' draw (torch.manual_seed(seed)) for both sides
        model, optimizer = torch_side(run, plan, "", seed)
        params = transformers_draw(run, params, model)
    state, train_step = compiled_step.initial_state_and_step(run.steps, params, tx, schedule)
    if same_init_dir:  # nli-jax's initial parameters as a transformers directory, for both sides
        from nli_jax.tools import export
        export(run, state["params"], same_init_dir)
    if init_from != "transformers":
        model, optimizer = torch_side(run, plan, same_init_dir, seed)
    model.train()
    k = ramp_schedule(plan.batch_ramp, total)
    batches = iter(compiled_step.train_batches(run, train_source, total).iterator(0))
    out = {"nli-jax": [], "transformers": [], "lr": [], "update": [], "seconds": {"nli-jax": 0.0, "transformers": 0.0}}
    accumulated = 0
    for step in range(total):
        batch = next(batches)
        lr = float(schedule(step)) * plan.optimizer.lr
        out["lr"].append(lr)
        if sides == "transformers":
            out["nli-jax"].append(float("nan"))
        else:
            start = time.perf_counter()
            state, metrics = train_step(state, pipeline.to_global(batch, run.batch_sharding))
            metrics = jax.device_get(metrics)
            out["seconds"]["nli-jax"] += time.perf_counter() - start
            out["nli-jax"].append(float(metrics["loss_sum"] / metrics["weight"]))
        if sides == "nli-jax":
            out["transformers"].append(float("nan"))
            out["update"].append(False)
            continue
        start = time.perf_counter()
        loss = torch_loss(model, batch)
        loss.backward()
        accumulated += 1
        due = accumulated >= int(k(np.int32(step))) or step + 1 == total
        if due:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad /= accumulated
            torch.nn.utils.clip_grad_norm_(model.parameters(), plan.optimizer.grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad()
            accumulated = 0
        out["seconds"]["transformers"] += time.perf_counter() - start
        out["transformers"].append(float(loss.detach()))
        out["update"].append(bool(due))
        if (step + 1) % 100 == 0 or step + 1 == total:
            print(f"  step {step + 1}: nli-jax {out['nli-jax'][-1]:.4f} transformers {out['transformers'][-1]:.4f} "
                  f"lr {lr:.2e}", flush=True)
    return out


def windows(losses: list[float], size: int) -> list[float]:
    return [float(np.mean(losses[i:i + size])) for i in range(0, len(losses), size)]


def plot(curves: dict, window: int, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    for side in ("nli-jax", "transformers"):
        ax.plot(np.arange(1, len(curves[side]) + 1), curves[side], alpha=0.3, linewidth=0.6)
        means = windows(curves[side], window)
        ax.plot([(i + 1) * window for i in range(len(means))], means, marker="o", label=f"{side} ({window}-step mean)")
    ax.set(xlabel="step", ylabel="training MLM loss", title="crammed :cpu_learn, the loop's batches")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--window", type=int, default=50, help="steps per mean of the loss curves")
    parser.add_argument("--png", default="", help="default <workdir>/crammed_vs_transformers.png")
    parser.add_argument("--seed", type=int, default=0, help="another pair of initialisations (nli-jax's "
                        "train.seed + seed, torch's seed); the batches stay the same")
    parser.add_argument("--same_init", action="store_true",
                        help="transformers starts from nli-jax's initial parameters (isolates the update rule)")
    parser.add_argument("--init_from", choices=("own", "transformers"), default="own",
                        help="transformers: both sides start from transformers' draw of --seed (nli-jax's "
                             "trainer from the other library's initialisation)")
    parser.add_argument("--sides", choices=("both", "nli-jax", "transformers"), default="both",
                        help="train one side only (the other's curve is NaN): with --init_from, a draw's "
                             "effect at one trainer's cost")
    parser.add_argument("--ramp_fraction", type=float, default=0.0,
                        help="batch_ramp.fraction (default: the recipe's 0.6)")
    args = parser.parse_args()
    if args.same_init and args.init_from != "own":
        parser.error("--same_init (nli-jax's draw for both) and --init_from=transformers exclude each other")
    print(harness.line(), flush=True)
    harness.quiet_absl()
    prep = argparse.Namespace(workdir=args.workdir, data=args.data, vocab=2000, length=32)
    vocab_dir, examples_dir = pretrain_recipe_search.prepared(prep)
    config = crammed_config(vocab_dir, examples_dir, args.steps)
    if args.ramp_fraction:
        config.batch_ramp.fraction = args.ramp_fraction
    config.train.seed += args.seed
    name = (f"crammed_vs_hf_{args.steps}" + ("_same_init" if args.same_init else "")
            + (f"_from_{args.init_from}" if args.init_from != "own" else "") + (f"_seed{args.seed}" if args.seed else ""))
    plan, run, steps, train_source = set_up(config, os.path.join(args.workdir, "runs", name))
    curves = side_by_side(plan, run, steps, train_source,
                          os.path.join(args.workdir, "runs", name, "initial") if args.same_init else "", args.seed,
                          args.init_from, args.sides)
    a, b = np.asarray(curves["nli-jax"]), np.asarray(curves["transformers"])
    gap = np.abs(a - b)
    wa, wb = windows(curves["nli-jax"], args.window), windows(curves["transformers"], args.window)
    window_gap = np.abs(np.asarray(wa) - np.asarray(wb))
    summary = {"steps": len(a), "window": args.window, "same_init": args.same_init, "init_from": args.init_from,
               "sides": args.sides, "seed": args.seed,
               "ramp_fraction": plan.batch_ramp.fraction, "curves": curves,
               "max_gap": {"per_step": float(gap.max()), "step": int(gap.argmax()) + 1,
                           "window_means": float(window_gap.max()),
                           "window_end_step": int((window_gap.argmax() + 1) * args.window)},
               "first_loss": {"nli-jax": float(a[0]), "transformers": float(b[0])},
               "final_window_loss": {"nli-jax": wa[-1], "transformers": wb[-1]},
               "updates": int(sum(curves["update"]))}
    print(f"\ncrammed :cpu_learn (ModernBERT 2 x 128, 2,000-piece vocabulary, 32 tokens, batch 64, ramp to 4), "
          f"{len(a)} steps, {summary['updates']} updates; {harness.line()}")
    print(f"| steps | nli-jax mean loss | transformers mean loss | gap |\n|---|---|---|---|")
    for i, (x, y) in enumerate(zip(wa, wb)):
        print(f"| {i * args.window + 1}-{min((i + 1) * args.window, len(a))} | {x:.4f} | {y:.4f} | {abs(x - y):.4f} |")
    print(f"largest gap: per step {gap.max():.4f} (step {gap.argmax() + 1}); between {args.window}-step means "
          f"{window_gap.max():.4f} (ending at step {summary['max_gap']['window_end_step']})")
    print(f"seconds: nli-jax {curves['seconds']['nli-jax']:.1f}, transformers {curves['seconds']['transformers']:.1f}")
    ratios = ({"nli_jax_over_transformers_final_window_loss": wa[-1] / wb[-1],
               "nli_jax_over_transformers_seconds": curves["seconds"]["nli-jax"] / curves["seconds"]["transformers"]}
              if args.sides == "both" else {})  # one side alone: nothing to divide
    harness.write_result(args.json or os.path.join(args.workdir, "crammed_vs_transformers.json"), summary,
                         ratios=ratios)
    png = args.png or os.path.join(args.workdir, "crammed_vs_transformers.png")
    init = "same" if args.same_init else {"own": "own", "transformers": "transformers'"}[args.init_from]
    plot(curves, args.window, png, f"nli-jax vs transformers ModernBertForMaskedLM ({init} initialisation, same "
                                   f"batches, AdamW, triangle, ramp, clip 0.5); {harness.line()}")
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
