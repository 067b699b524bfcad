"""Does pretraining with nli-jax help downstream? (issue 27, item 2)

    python -m benchmarks.experiments.downstream_gain --export=/tmp/recipe_search/runs/vs_nli-jax_10000/export \\
        --workdir=/tmp/downstream
    python -m benchmarks.experiments.downstream_gain --export=DIR --workdir=/tmp/d --tasks=smsa --seeds=1 \\
        --epochs=smsa=1 --train_limit=200     # smoke run

Fine-tunes a pretrained export (e.g. the `:cpu_learn` run of benchmarks.experiments.pretrain_vs_transformers)
and the same architecture from random initialisation (its config.json's shape, its vocabulary) on
IndoNLU tasks, each arm with the same recipe and the same seeds, through train_and_evaluate (the loop
finetune.main runs). Reports validation macro-F1 (the IndoNLU metric) and accuracy of the best epoch,
mean and sample standard deviation over the seeds, and whether the pretrained arm wins by more than
one standard deviation (the difference of means larger than either arm's standard deviation).
Several exports (--export=A,B) are compared against one random arm (item 4: ELECTRA and BERT).

Writes --json (default <workdir>/downstream_gain.json; ratios: each export's mean F1 over the
baseline's, per task) and <workdir>/report.md; prints the CPU.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from benchmarks import harness

SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
              "max_position_embeddings", "type_vocab_size")


def export_shape(export: str) -> dict:
    with open(os.path.join(export, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    missing = [k for k in SHAPE_KEYS[:4] if k not in config]
    if missing:
        sys.exit(f"{export}/config.json lacks {missing}: not an encoder export")
    return {k: config[k] for k in SHAPE_KEYS if k in config}  # ModernBERT's has no type_vocab_size


def finetune_config(args, task: str, epochs: int, seed: int, init: str, shape: dict, tokenizer: str):
    from configs import indonlu as indonlu_config
    c = indonlu_config.get_config(f"task={task},model=scratch")
    c.data.source = os.path.join(args.data, "indonlu")
    c.data.tfds_dir = os.path.join(args.workdir, "tfds")
    c.data.max_seq_length = args.max_seq_length
    c.data.workers = 0
    c.data.max_train_examples = args.train_limit
    c.model.tokenizer = tokenizer
    c.model.init = init  # "" = the same shape from random initialisation
    if not init:  # a checkpoint brings its own shape (and model type: BERT or ELECTRA)
        c.model.preset = "scratch-2layer-small"
        c.model.overrides.update(shape)
    c.model.overrides.hidden_dropout_prob = args.dropout
    c.model.overrides.attention_probs_dropout_prob = args.dropout
    c.optimizer.lr = args.lr
    c.train.seed = seed
    c.train.batch_size = args.batch_size
    c.train.num_epochs = epochs
    c.train.early_stopping_patience = 0
    c.train.log_every_steps = 100
    c.train.async_checkpointing = False
    c.eval_splits = ("validation",)
    return c


def summary(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--export", required=True, help="pretrained export directory (comma-separated: several)")
    parser.add_argument("--names", default="", help="a name per export (default: pretrained, pretrained2, ...)")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--tasks", default="smsa,emot")
    parser.add_argument("--epochs", default="smsa=5,emot=10", help="epochs per task (best epoch by validation F1)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--lr", type=float, default=1e-4, help="the IndoNLU recipe's rate for models from scratch")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--no_random", action="store_true", help="compare the exports only (no random-init arm)")
    parser.add_argument("--train_limit", type=int, default=0, help="first N training examples (smoke runs)")
    args = parser.parse_args()
    print(harness.line(), flush=True)
    harness.quiet_absl()
    from nli_jax.train.loop import train_and_evaluate

    exports = [e for e in args.export.split(",") if e]
    names = [n for n in args.names.split(",") if n] or [
        "pretrained" + (str(i + 1) if i else "") for i in range(len(exports))]
    if len(names) != len(exports):
        sys.exit(f"--names gives {len(names)} names for {len(exports)} exports")
    shapes = [export_shape(e) for e in exports]
    for e in exports:
        if not os.path.isfile(os.path.join(e, "vocab.txt")):
            sys.exit(f"{e} has no vocab.txt: not a pretrained export")
    if not os.path.isdir(os.path.join(args.data, "indonlu")):
        sys.exit(f"no IndoNLU data at {args.data}/indonlu")
    epochs = dict(kv.split("=") for kv in args.epochs.split(",") if kv)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in epochs]
    if unknown:
        sys.exit(f"--epochs gives no epochs for {unknown}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    # The random arm takes the first export's shape and vocabulary (every export's, when they agree).
    arms = [(name, export, shape, export) for name, export, shape in zip(names, exports, shapes)]
    if not args.no_random:
        arms.append(("random", "", shapes[0], exports[0]))
    os.makedirs(args.workdir, exist_ok=True)
    runs = []
    for task in tasks:
        for name, init, shape, tokenizer in arms:
            for seed in seeds:
                c = finetune_config(args, task, int(epochs[task]), seed, init, shape, tokenizer)
                start = time.time()
                r = train_and_evaluate(c, os.path.join(args.workdir, f"{task}_{name}_seed{seed}"))
                v = r["splits"]["validation"]
                runs.append({"task": task, "arm": name, "seed": seed, "f1": 100 * v["f1"],
                             "accuracy": 100 * v["accuracy"], "seconds": time.time() - start})
                print(json.dumps(runs[-1]), flush=True)

    lines = ["| task | arm | validation F1 (mean ± sd) | accuracy (mean ± sd) | per seed F1 |", "|---|---|---|---|---|"]
    verdicts, ratios = {}, {}
    for task in tasks:
        stats = {}
        for name, *_ in arms:
            cell = [r for r in runs if r["task"] == task and r["arm"] == name]
            stats[name] = summary([r["f1"] for r in cell])
            acc = summary([r["accuracy"] for r in cell])
            lines.append(f"| {task} | {name} | {stats[name][0]:.2f} ± {stats[name][1]:.2f} | {acc[0]:.2f} ± {acc[1]:.2f} "
                         f"| {', '.join(format(r['f1'], '.2f') for r in cell)} |")
        baseline = names[0] if args.no_random else "random"
        for name in [n for n in names if n != baseline]:
            gain = stats[name][0] - stats[baseline][0]
            sd = max(stats[name][1], stats[baseline][1])
            verdicts[f"{task}/{name} vs {baseline}"] = {"gain_f1": gain, "sd": sd, "wins": gain > sd}
            ratios[f"{task}/{name}_over_{baseline}_f1"] = stats[name][0] / max(stats[baseline][0], 1e-9)
    lines.append("")
    for key, v in verdicts.items():
        lines.append(f"- {key}: {v['gain_f1']:+.2f} F1 (larger sd {v['sd']:.2f}): "
                     + ("wins by more than one sd" if v["wins"] else "does not win by more than one sd"))
    header = (f"{harness.line()}; {time.strftime('%Y-%m-%d')}. Command: `{harness.command()}`\n\n"
              f"Recipe for every arm: Adam {args.lr:g} (x0.9 per epoch), batch {args.batch_size}, length "
              f"{args.max_seq_length}, dropout {args.dropout:g}, epochs {args.epochs}; the best epoch's validation "
              "macro-F1.\n\n")
    text = header + "\n".join(lines) + "\n"
    with open(os.path.join(args.workdir, "report.md"), "w", encoding="utf-8") as f:
        f.write(text)
    harness.write_result(args.json or os.path.join(args.workdir, "downstream_gain.json"),
                         {"args": vars(args), "runs": runs, "verdicts": verdicts}, ratios=ratios)
    print(text)


if __name__ == "__main__":
    main()
