"""One cell of the from-scratch recipe search (issue 27): a small BERT pretrained with MLM on
../shared/data/id_corpus_sample for a fixed number of steps, evaluated on held-out segments every
--eval_every steps. Prints, per evaluation, the accuracy at [MASK] inputs against the best constant
prediction there (the plateau's yardstick: a model that does not use context scores at most the
constant), the MLM accuracy over all predicted positions, the held-out loss and tokens/s; appends
the cell to <workdir>/search.jsonl (and writes it to --json, with the last evaluation's [MASK]
accuracy over the constant's as its ratio).

    python -m benchmarks.experiments.pretrain_recipe_search --workdir=/tmp/recipe_search --name=base
    python -m benchmarks.experiments.pretrain_recipe_search --workdir=/tmp/recipe_search --name=lr2e-4 --lr=2e-4

The corpus (4 shards), the WordPiece vocabulary (--vocab) and the examples (--length, no sentence
task) are built once under --workdir and reused by later cells. Through train_and_evaluate, the
loop pretrain.main runs; float32, dropout off unless --dropout.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time

from benchmarks import harness


def prepared(args) -> tuple[str, str]:
    """(vocabulary dir, examples dir) for --vocab and --length, built when absent."""
    from nli_jax.pretraining.corpus import prepare_corpus
    from nli_jax.pretraining.examples import create_examples
    from nli_jax.pretraining.vocab import train_vocabulary
    corpus_dir = os.path.join(args.workdir, "corpus")
    shards = sorted(glob.glob(os.path.join(corpus_dir, "corpus-*.txt")))
    if not shards:
        files = sorted(glob.glob(os.path.join(args.data, "id_corpus_sample", "*.txt")))
        if not files:
            sys.exit(f"no corpus at {args.data}/id_corpus_sample")
        shards = prepare_corpus(files, corpus_dir, shards=4, workers=2, lines_are_sentences=True,
                                progress=False)["shards"]
    vocab_dir = os.path.join(args.workdir, f"vocab{args.vocab}")
    if not os.path.isfile(os.path.join(vocab_dir, "vocab.txt")):
        train_vocabulary(shards, vocab_dir, vocab_size=args.vocab)
    examples_dir = os.path.join(args.workdir, f"ex_v{args.vocab}_L{args.length}")
    if not os.path.isfile(os.path.join(examples_dir, "examples.json")):
        create_examples(shards, vocab_dir, examples_dir, max_seq_length=args.length, sentence_task="none",
                        workers=2, progress=False)
    return vocab_dir, examples_dir


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--name", required=True, help="the cell's run directory under <workdir>/runs")
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--schedule", default="constant")
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--b2", type=float, default=0.999)
    parser.add_argument("--wd", type=float, default=0.01)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--init_range", type=float, default=0.02)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--prepare_only", action="store_true",
                        help="build the corpus shards, vocabulary and --length examples under --workdir, then stop")
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs
    harness.quiet_absl()

    from configs.pretrain import indobert_base
    from nli_jax.train.loop import train_and_evaluate
    vocab_dir, examples_dir = prepared(args)
    if args.prepare_only:
        print(f"vocabulary {vocab_dir}; examples {examples_dir}")
        return
    c = indobert_base.get_config("phase=1")
    c.model.preset = "scratch-2layer-small"
    c.model.dtype = "float32"
    c.model.tokenizer = vocab_dir
    c.model.overrides.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                             num_attention_heads=args.heads, num_hidden_layers=args.layers,
                             hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
                             initializer_range=args.init_range, max_position_embeddings=max(128, args.length))
    c.pretrain.sentence_task = "none"
    c.pretrain.examples_dir = examples_dir
    c.task_options.max_predictions = max(1, round(0.15 * args.length + 0.49))
    c.pretrain.heldout_examples = 1000
    c.data.max_seq_length = args.length
    c.data.workers = 0
    c.train.update(batch_size=args.batch, max_steps=args.steps, eval_every_steps=args.eval_every,
                   checkpoint_every_steps=args.steps, log_every_steps=args.eval_every, eval_batch_size=256)
    c.optimizer.update(lr=args.lr, warmup_steps=args.warmup, schedule=args.schedule, eps=args.eps, b2=args.b2,
                       weight_decay=args.wd, grad_clip=args.clip)
    workdir = os.path.join(args.workdir, "runs", args.name)
    start = time.time()
    results = train_and_evaluate(c, workdir)
    seconds = time.time() - start
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        logged = {r["step"]: r for r in map(json.loads, f)}
    print(f"cell {args.name}: " + " ".join(f"--{k}={v}" for k, v in vars(args).items()
                                           if k not in ("workdir", "data", "name", "json")))
    rows = []
    for h in results["history"]:
        held = h["heldout"]
        row = {"step": h["step"], "mask_input_accuracy": held["mask_input_accuracy"],
               "constant": held["mask_input_constant_baseline"], "mlm_accuracy": held["mlm_accuracy"],
               "loss": held["loss"], "tokens_per_s": logged.get(h["step"], {}).get("train/tokens_per_s", 0.0)}
        rows.append(row)
        print(f"step {row['step']:6d}  [MASK] acc {row['mask_input_accuracy']:.4f} (constant {row['constant']:.4f}, "
              f"{row['mask_input_accuracy'] / max(row['constant'], 1e-9):.2f}x)  MLM acc {row['mlm_accuracy']:.4f}  "
              f"loss {row['loss']:.3f}  {row['tokens_per_s']:.0f} tokens/s")
    print(f"{seconds:.0f} s")
    last = rows[-1]
    cell = harness.write_result(args.json, {"name": args.name, "args": vars(args), "seconds": seconds,
                                            "evaluations": rows},
                                ratios={"mask_input_accuracy_over_constant": last["mask_input_accuracy"]
                                        / max(last["constant"], 1e-9)})
    with open(os.path.join(args.workdir, "search.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(cell) + "\n")


if __name__ == "__main__":
    main()
