"""The from-scratch recipe (configs/pretrain/*:cpu_learn) side by side with transformers (issue 27).

    python -m benchmarks.experiments.pretrain_vs_transformers --workdir=/tmp/recipe_search
    python -m benchmarks.experiments.pretrain_vs_transformers --workdir=/tmp/s --steps=200 --eval_every=100   # smoke run

nli-jax: `indobert_base.get_config("cpu_learn")` through train_and_evaluate, the loop that
pretrain.main runs (corpus, 2,000-piece WordPiece vocabulary and 32-token examples of
../shared/data/id_corpus_sample built once under --workdir, as benchmarks.experiments.pretrain_recipe_search
does).

transformers: `BertForMaskedLM(BertConfig(...))` of the same shape with its own initialisation,
trained by a plain PyTorch loop on the very batches nli-jax's loop trains on (the run's own
training iterator: same shuffling and MLM masking), with the same optimizer: torch AdamW, weight
decay 0.01 on matrices and embeddings only (not on biases and LayerNorm, as nli-jax's decay
mask), beta2 0.98, eps 1e-6, linear warmup over 1,000 steps then constant, global-norm clipping
at 1.0, loss = mean cross-entropy over the batch's predicted positions. Evaluated every
--eval_every steps on the run's own held-out batches (the same masks), scored by the task's own
report (accuracy at [MASK] inputs, the best constant prediction there, MLM accuracy).

Prints both curves, the largest gap between them and the CPU; writes --json (default
<workdir>/pretrain_vs_transformers.json; ratios: nli-jax's final held-out figures and time over
transformers') and a PNG of both curves (--png).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks import harness
from benchmarks.experiments import pretrain_recipe_search


def cpu_learn_config(vocab_dir: str, examples_dir: str, steps: int, eval_every: int, *, model: str = "indobert_base",
                     checkpoint_every: int = 0, log_every: int = 0):
    """configs/pretrain/<model>.py:cpu_learn on prepared data (pretrain_recipe_search.prepared);
    checkpoints at the end and logs at each evaluation unless told otherwise."""
    import importlib
    c = importlib.import_module(f"configs.pretrain.{model}").get_config("cpu_learn")
    c.model.tokenizer = vocab_dir
    c.pretrain.examples_dir = examples_dir
    c.data.workers = 0
    c.train.update(max_steps=steps, eval_every_steps=eval_every, checkpoint_every_steps=checkpoint_every or steps,
                   log_every_steps=log_every or eval_every)
    return c


def heldout_row(step: int, report: dict) -> dict:
    return {"step": step, "mask_input_accuracy": report["mask_input_accuracy"],
            "constant": report["mask_input_constant_baseline"], "mlm_accuracy": report["mlm_accuracy"],
            "loss": report["loss"]}


def run_nli_jax(config, workdir: str) -> tuple[list[dict], float]:
    from nli_jax.train.loop import train_and_evaluate
    start = time.time()
    results = train_and_evaluate(config, workdir)
    return [heldout_row(h["step"], h["heldout"]) for h in results["history"]], time.time() - start


def torch_model_and_optimizer(run, plan):
    import torch
    from transformers import BertConfig, BertForMaskedLM
    e = run.model.config
    model = BertForMaskedLM(BertConfig(
        vocab_size=e.vocab_size, hidden_size=e.hidden_size, num_hidden_layers=e.num_hidden_layers,
        num_attention_heads=e.num_attention_heads, intermediate_size=e.intermediate_size,
        hidden_dropout_prob=e.hidden_dropout_prob, attention_probs_dropout_prob=e.attention_probs_dropout_prob,
        max_position_embeddings=e.max_position_embeddings, type_vocab_size=e.type_vocab_size,
        pad_token_id=e.pad_token_id, layer_norm_eps=e.layer_norm_eps))
    o = plan.optimizer
    # nli_jax.train.optimizers.decay_mask: decay on kernels and embeddings, not biases or LayerNorm.
    decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith(".weight") and "LayerNorm" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=o.lr, betas=(o.b1, o.b2), eps=o.eps)
    warmup = o.warmup_steps
    if o.schedule != "constant":
        raise ValueError("this benchmark reproduces the constant schedule after warmup (cpu_learn's)")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(t / warmup, 1.0) if warmup else 1.0)
    return model, optimizer, scheduler


def torch_mlm_logits(model, batch):
    """Logits at the predicted positions [batch, predictions, vocab], as nli-jax's MLM head computes them."""
    import torch
    out = model.bert(input_ids=torch.from_numpy(np.asarray(batch["input_ids"], np.int64)),
                     attention_mask=torch.from_numpy(np.asarray(batch["attention_mask"], np.int64)),
                     token_type_ids=torch.from_numpy(np.asarray(batch["token_type_ids"], np.int64)))
    positions = torch.from_numpy(np.asarray(batch["masked_positions"], np.int64))
    hidden = torch.gather(out.last_hidden_state, 1, positions[:, :, None].expand(-1, -1, out.last_hidden_state.shape[-1]))
    return model.cls(hidden)


def torch_loss(model, batch):
    import torch
    logits = torch_mlm_logits(model, batch)
    targets = torch.from_numpy(np.asarray(batch["masked_ids"], np.int64))
    weights = torch.from_numpy(np.asarray(batch["masked_weights"], np.float32) *
                               np.asarray(batch["weight"], np.float32)[:, None])
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                               reduction="none").reshape(targets.shape)
    return (losses * weights).sum() / weights.sum().clamp(min=1.0), logits, losses, weights


def torch_heldout(model, run, source) -> dict:
    """The held-out split through the run's own evaluation batches (the same masks as nli-jax's
    evaluation), scored by the task's report."""
    import torch
    from nli_jax.data import pipeline
    from nli_jax.train.evaluation import EvalSplit
    data = EvalSplit(source, run.encode)
    dummy = dict(data.encode(data.examples[0]), idx=np.int32(-1))
    mask_id = run.task.mask_id
    merged, loss_sum, weight_sum = {}, 0.0, 0.0
    model.eval()
    with torch.no_grad():
        for batch in pipeline.eval_batches(data.examples, data.encode, run.batching,
                                           local_batch_size=run.plan.batch.local_eval_batch, dummy=dummy):
            _, logits, losses, weights = torch_loss(model, batch)
            loss_sum += float((losses * weights).sum())
            weight_sum += float(weights.sum())
            hit = (logits.argmax(-1).numpy() == batch["masked_ids"]) * batch["masked_weights"]
            at_mask = (np.take_along_axis(batch["input_ids"], batch["masked_positions"], 1) == mask_id) & \
                (batch["masked_weights"] > 0)
            keep = batch["idx"] >= 0
            fields = {"mlm_correct": hit.sum(-1), "mlm_count": batch["masked_weights"].sum(-1),
                      "mask_correct": (hit * at_mask).sum(-1), "mask_count": at_mask.sum(-1).astype(np.float32),
                      "mask_targets": np.where(at_mask, batch["masked_ids"], -1)}
            for k, v in fields.items():
                merged.setdefault(k, []).extend(list(np.asarray(v)[keep]))
    model.train()
    report = run.task.report("heldout", data.examples, merged)
    report["loss"] = loss_sum / max(weight_sum, 1.0)
    return report


def run_transformers(config, workdir: str, eval_every: int) -> tuple[list[dict], float]:
    import torch
    from nli_jax.train import compiled_step, loop
    from nli_jax import planner
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    plan = planner.build_plan(config)
    run, _, steps, train_source, _ = loop.checked_setup(plan, workdir)
    model, optimizer, scheduler = torch_model_and_optimizer(run, plan)
    model.train()
    batches = iter(compiled_step.train_batches(run, train_source).iterator(plan.data.workers))
    rows, start = [], time.time()
    for step in range(1, steps.total_steps + 1):
        batch = next(batches)
        loss, *_ = torch_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.optimizer.grad_clip)
        optimizer.step()
        scheduler.step()
        if step % eval_every == 0 or step == steps.total_steps:
            rows.append(heldout_row(step, torch_heldout(model, run, run.splits["heldout"])))
            print(f"  transformers step {step}: {rows[-1]}", flush=True)
    return rows, time.time() - start


def plot(curves: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for side, rows in curves.items():
        steps = [r["step"] for r in rows]
        left.plot(steps, [r["mask_input_accuracy"] / max(r["constant"], 1e-9) for r in rows], marker="o", label=side)
        right.plot(steps, [r["mlm_accuracy"] for r in rows], marker="o", label=side)
    left.axhline(1.0, color="grey", linestyle=":", label="best constant")
    left.axhline(3.0, color="grey", linestyle="--", linewidth=0.8, label="3x the constant")
    left.set(xlabel="step", ylabel="[MASK]-input accuracy / best constant", title="held-out, at [MASK] inputs")
    right.set(xlabel="step", ylabel="MLM accuracy", title="held-out, all predicted positions")
    for ax in (left, right):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--eval_every", type=int, default=1000)
    parser.add_argument("--sides", default="nli-jax,transformers")
    parser.add_argument("--png", default="", help="where to draw both curves (default <workdir>/pretrain_vs_transformers.png)")
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs
    harness.quiet_absl()

    prep = argparse.Namespace(workdir=args.workdir, data=args.data, vocab=2000, length=32)
    vocab_dir, examples_dir = pretrain_recipe_search.prepared(prep)
    config = cpu_learn_config(vocab_dir, examples_dir, args.steps, args.eval_every)
    curves, seconds = {}, {}
    for side in args.sides.split(","):
        workdir = os.path.join(args.workdir, "runs", f"vs_{side}_{args.steps}")
        if side == "nli-jax":
            curves[side], seconds[side] = run_nli_jax(config, workdir)
        elif side == "transformers":
            curves[side], seconds[side] = run_transformers(config, workdir, args.eval_every)
        else:
            sys.exit(f"unknown side {side!r}")
        print(f"{side}: {seconds[side]:.0f} s", flush=True)

    print(f"\ncpu_learn, {args.steps} steps; held-out 1,000 segments; {harness.line()}")
    print("| step | " + " | ".join(f"{s} [MASK] acc (x const) | {s} MLM acc | {s} loss" for s in curves) + " |")
    print("|---|" + "---|---|---|" * len(curves))
    for i, row in enumerate(next(iter(curves.values()))):
        cells = []
        for side in curves:
            r = curves[side][i]
            cells += [f"{r['mask_input_accuracy']:.4f} ({r['mask_input_accuracy'] / max(r['constant'], 1e-9):.2f}x)",
                      f"{r['mlm_accuracy']:.4f}", f"{r['loss']:.3f}"]
        print(f"| {row['step']} | " + " | ".join(cells) + " |")
    summary, ratios = {"steps": args.steps, "seconds": seconds, "curves": curves}, {}
    if set(curves) == {"nli-jax", "transformers"}:
        a, b = curves["nli-jax"], curves["transformers"]
        gaps = {k: max(abs(x[k] - y[k]) for x, y in zip(a, b)) for k in ("mask_input_accuracy", "mlm_accuracy", "loss")}
        at = {k: max(zip(a, b), key=lambda xy: abs(xy[0][k] - xy[1][k]))[0]["step"] for k in gaps}
        summary["largest_gap"] = {k: {"value": gaps[k], "step": at[k]} for k in gaps}
        print("largest gap: " + ", ".join(f"{k} {gaps[k]:.4f} (step {at[k]})" for k in gaps))
        ratios = {f"nli_jax_over_transformers_final_{k}": a[-1][k] / b[-1][k] for k in ("mlm_accuracy", "loss")
                  if b[-1][k]}  # the last evaluation's
        ratios["nli_jax_over_transformers_seconds"] = seconds["nli-jax"] / seconds["transformers"]
    harness.write_result(args.json or os.path.join(args.workdir, "pretrain_vs_transformers.json"), summary,
                         ratios=ratios)
    png = args.png or os.path.join(args.workdir, "pretrain_vs_transformers.png")
    plot(curves, png, f"cpu_learn from scratch on id_corpus_sample: nli-jax vs transformers BertForMaskedLM "
                      f"(same batches, same AdamW); {harness.line()}")
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
