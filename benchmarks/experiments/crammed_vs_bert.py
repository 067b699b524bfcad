"""The crammed recipe against the BERT of configs/pretrain/indobert_base.py:cpu_learn at the same
wall-clock budget on 2 cores (issue 41, item 3).

    python -m benchmarks.experiments.crammed_vs_bert --workdir=/tmp/recipe_search --minutes=25
    python -m benchmarks.experiments.downstream_gain --names=bert,crammed --max_seq_length=128 \\
        --epochs=smsa=5,emot=10 --seeds=1,2,3 --workdir=/tmp/crammed_downstream \\
        --export=/tmp/recipe_search/runs/budget_bert_25/export,/tmp/recipe_search/runs/budget_crammed_25/export
    python -m benchmarks.experiments.crammed_vs_bert --workdir=/tmp/s --minutes=0.1 --eval_every=20   # smoke run

Both arms on the same data (pretrain_recipe_search.prepared: id_corpus_sample, a 2,000-piece
WordPiece vocabulary, 32-token examples and their held-out documents under --workdir), through
train_and_evaluate (the loop pretrain.main runs), each with train.budget_minutes = --minutes (the
budget fixes each run's steps from its own measured step time: nli_jax/train/budget.py) and a
held-out evaluation every --eval_every steps:

- bert: configs/pretrain/indobert_base.py:cpu_learn as shipped (BERT 2 x 128, 15% masking, AdamW
  1e-3 after 1,000 warmup steps, constant, clipping 1.0, batch 64);
- crammed: configs/pretrain/crammed.py:cpu_learn (ModernBERT 2 x 128, 30% masking, the triangle,
  the batch ramped to 4 x 64 at 60% of the budget, clipping 0.5).

Each arm's held-out figures are its own run's evaluation, both on the same held-out masks: the
held-out split is masked at --heldout_mask_prob (15%, BERT's rate; task_options.heldout_mask_prob)
whatever rate the arm trains at, so the crammed arm (trained at 30%) and BERT answer the same
questions. MLM accuracy and accuracy at [MASK] inputs. The wall time of each evaluation is read from
the run's train.log (set-up, the budget's calibration, evaluations and checkpoints included; the
budget counts training steps only). The verdict compares the arms at the same wall time: at each
crammed evaluation after the first fifth of the budget, BERT's curve linearly interpolated there.
Downstream (SmSA, EmoT at length 128, three seeds): the downstream_gain command above, on the two
exports.

Prints both curves against wall time and the CPU; writes --json (default
<workdir>/crammed_vs_bert.json; ratios: crammed's final held-out MLM accuracy over BERT's, and its
steps over BERT's) and a PNG of both curves (--png).
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil

from benchmarks import harness
from benchmarks.experiments import pretrain_recipe_search
from benchmarks.experiments.electra_vs_bert import eval_times

ARMS = {"bert": "indobert_base", "crammed": "crammed"}


def arm_config(arm: str, vocab_dir: str, examples_dir: str, minutes: float, eval_every: int,
               heldout_mask_prob: float = 0.15):
    import importlib
    c = importlib.import_module(f"configs.pretrain.{ARMS[arm]}").get_config("cpu_learn")
    c.task_options.heldout_mask_prob = heldout_mask_prob
    c.model.tokenizer = vocab_dir
    c.pretrain.examples_dir = examples_dir
    c.data.workers = 0
    c.train.update(budget_minutes=float(minutes), max_steps=1_000_000, eval_every_steps=eval_every,
                   checkpoint_every_steps=eval_every, log_every_steps=max(1, min(100, eval_every)))
    return c  # BERT keeps its 1,000 warmup steps (cut to the run's steps when a budget buys fewer)


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--minutes", type=float, default=25.0, help="each arm's train.budget_minutes")
    parser.add_argument("--eval_every", type=int, default=500)
    parser.add_argument("--arms", default="bert,crammed")
    parser.add_argument("--heldout_mask_prob", type=float, default=0.15, help="both arms' held-out masking rate")
    parser.add_argument("--png", default="", help="default <workdir>/crammed_vs_bert.png")
    args = parser.parse_args()
    print(harness.line(), flush=True)
    harness.quiet_absl()
    from nli_jax.train.loop import train_and_evaluate
    vocab_dir, examples_dir = pretrain_recipe_search.prepared(
        argparse.Namespace(workdir=args.workdir, data=args.data, vocab=2000, length=32))
    curves, results = {}, {}
    for arm in args.arms.split(","):
        workdir = os.path.join(args.workdir, "runs", f"budget_{arm}_{args.minutes:g}")
        shutil.rmtree(workdir, ignore_errors=True)  # a leftover run would resume
        results[arm] = train_and_evaluate(arm_config(arm, vocab_dir, examples_dir, args.minutes, args.eval_every,
                                                     args.heldout_mask_prob), workdir)
        _, times = eval_times(os.path.join(workdir, "train.log"))
        curves[arm] = [{"step": h["step"], "seconds": times.get(h["step"]), **h["heldout"]}
                       for h in results[arm]["history"]]
        print(f"{arm}: {results[arm]['steps']} steps", flush=True)
    lines = [f"{harness.line()}; {datetime.date.today()}; budget {args.minutes:g} minutes of training steps per arm; "
             f"held-out masking {args.heldout_mask_prob:g} for both", "",
             "| arm | step | wall s | held-out MLM acc | [MASK]-input acc | best constant |",
             "|---|---|---|---|---|---|"]
    for arm, curve in curves.items():
        for r in curve:
            lines.append(f"| {arm} | {r['step']} | {r['seconds'] or 0:.0f} | {r['mlm_accuracy']:.4f} | "
                         f"{r.get('mask_input_accuracy', float('nan')):.4f} | "
                         f"{r.get('mask_input_constant_baseline', float('nan')):.4f} |")
    masked = {arm: r["splits"]["heldout"]["masked_tokens"] for arm, r in results.items()}
    lines += ["", "held-out masked tokens: " + ", ".join(f"{arm} {n}" for arm, n in masked.items())]
    ratios, verdict = {}, {}
    if set(curves) == set(ARMS):
        ratios["crammed_over_bert_steps"] = results["crammed"]["steps"] / results["bert"]["steps"]
        if curves["bert"][-1]["mlm_accuracy"] > 0:  # a smoke run's BERT may predict nothing right
            ratios["crammed_over_bert_final_mlm_accuracy"] = (curves["crammed"][-1]["mlm_accuracy"]
                                                              / curves["bert"][-1]["mlm_accuracy"])
        verdict = at_the_same_wall_time(curves, args.minutes * 60 / 5)
        lines += ["", f"crammed ahead of BERT (interpolated at the same wall time) at {verdict['ahead']} of "
                  f"{verdict['points']} crammed evaluations after the first fifth of the budget; smallest margin "
                  f"{verdict['smallest_margin']:+.4f}, largest {verdict['largest_margin']:+.4f}"]
    print("\n".join(lines), flush=True)
    harness.write_result(args.json or os.path.join(args.workdir, "crammed_vs_bert.json"),
                         {"minutes": args.minutes, "heldout_mask_prob": args.heldout_mask_prob, "curves": curves,
                          "heldout_masked_tokens": masked,
                          "verdict": verdict, "steps": {arm: r["steps"] for arm, r in results.items()},
                          "exports": {arm: r.get("export") for arm, r in results.items()}}, ratios=ratios)
    plot(args.png or os.path.join(args.workdir, "crammed_vs_bert.png"), curves, args.minutes)


def at_the_same_wall_time(curves: dict, after_seconds: float) -> dict:
    """Crammed's held-out MLM accuracy at each of its evaluations after `after_seconds`, against
    BERT's curve linearly interpolated at that wall time (points past BERT's last are not compared)."""
    import numpy as np
    bert = [(r["seconds"], r["mlm_accuracy"]) for r in curves["bert"] if r["seconds"] is not None]
    xs, ys = zip(*bert)
    margins = [r["mlm_accuracy"] - float(np.interp(r["seconds"], xs, ys)) for r in curves["crammed"]
               if r["seconds"] is not None and after_seconds <= r["seconds"] <= xs[-1]]
    return {"after_seconds": after_seconds, "points": len(margins), "ahead": sum(m > 0 for m in margins),
            "smallest_margin": min(margins, default=float("nan")), "largest_margin": max(margins, default=float("nan")),
            "margins": margins}


def plot(path: str, curves: dict, minutes: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    for arm, curve in curves.items():
        m = [(r["seconds"] or 0) / 60 for r in curve]
        ax.plot(m, [r["mlm_accuracy"] for r in curve], "o-", label=f"{arm}: MLM accuracy")
        ax.plot(m, [r.get("mask_input_accuracy", float("nan")) for r in curve], "s--", label=f"{arm}: [MASK]-input")
    ax.axvline(minutes / 5, color="grey", lw=0.8, ls=":")  # the first fifth of the budget
    ax.set(xlabel="wall time (minutes)", ylabel="held-out accuracy (the same 15% masks for both)",
           title=f"id_corpus_sample, {minutes:g} minutes of training steps per arm, 2 x 128 models")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
