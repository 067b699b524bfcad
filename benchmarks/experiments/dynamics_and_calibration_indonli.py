"""Training dynamics and calibration on real IndoNLI pairs, through finetune.main and
`python -m nli_jax.analysis cartography`, with the MiniLM-L6 checkpoint on CPU:

1. Cartography with label noise: fine-tune on --train_pairs IndoNLI training pairs of which a
   seeded random --noise share has its label flipped (to one of the other two, uniformly), with
   --config.hooks.dynamics.enabled=True; then the data map. Reports the flipped pairs' share of
   each subset (easy-to-learn, ambiguous, hard-to-learn) against their share overall, and how
   many of them the hard-to-learn third holds (Swayamdipta et al. find mislabelled examples
   concentrated there).
2. Calibration: the same fine-tuning on clean labels (no dynamics recorded); ECE (15 bins), MCE,
   Brier and NLL before and after the temperature fitted on validation, on validation and on a
   held-out in-domain test split. ../shared/data has no IndoNLI test files, so `test_lay` is,
   unless --indonli_test_dir gives the real test_lay.jsonl / test_expert.jsonl, --test_pairs
   training pairs that neither run trains on (lay-annotated, like test_lay).
3. The cost of recording dynamics: training examples/s of the two runs (same shapes and
   steps; the first logging interval, compilation, left out).

    python -m benchmarks.experiments.dynamics_and_calibration_indonli --workdir=/tmp/dc
    python -m benchmarks.experiments.dynamics_and_calibration_indonli --workdir=/tmp/dc --train_pairs=1000 --epochs=3

Writes --json (default <workdir>/result.json; ratios: the hard-to-learn third's share of flipped
pairs over the overall share, and the training rate with dynamics over without). The cost of
recording (3.) compares two whole runs; `python -m benchmarks.dynamics_cost` times the loop's own
jitted step with and without the per-example outputs, alternating on the same batches.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks import harness

LABELS = ("e", "n", "c")


def make_sources(args) -> tuple[str, str, list[str]]:
    """(clean source dir, noisy source dir, ids of the flipped pairs)."""
    rows = [json.loads(line) for line in open(os.path.join(args.data, "indonli", "train.jsonl"), encoding="utf-8")]
    random.Random(args.seed).shuffle(rows)
    train, test = rows[:args.train_pairs], rows[args.train_pairs:args.train_pairs + args.test_pairs]
    rng = random.Random(args.seed + 1)
    flipped = set(rng.sample(range(len(train)), round(args.noise * len(train))))
    noisy = [dict(r, label=rng.choice([x for x in LABELS if x != r["label"]])) if i in flipped else r
             for i, r in enumerate(train)]
    sources = []
    for name, train_rows in (("clean", train), ("noisy", noisy)):
        d = os.path.join(args.workdir, "data", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "train.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in train_rows)
        val = open(os.path.join(args.data, "indonli", "val.jsonl"), encoding="utf-8").readlines()
        with open(os.path.join(d, "val.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(val[:args.val_pairs] if args.val_pairs else val)
        if args.indonli_test_dir:
            for split in ("test_lay.jsonl", "test_expert.jsonl"):
                if os.path.isfile(os.path.join(args.indonli_test_dir, split)):
                    shutil.copy(os.path.join(args.indonli_test_dir, split), os.path.join(d, split))
        elif args.test_pairs:
            with open(os.path.join(d, "test_lay.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in test)
        sources.append(d)
    return sources[0], sources[1], sorted(str(train[i]["pair_id"]) for i in flipped)


def finetune(args, workdir: str, source: str, *extra) -> float:
    """Runs finetune.main (the IndoNLI recipe with MiniLM at this length and batch); its seconds."""
    if os.path.isfile(os.path.join(workdir, "results.json")):
        return float("nan")  # finished earlier: reused
    splits = ("('validation','test_lay','test_expert')" if args.indonli_test_dir
              else "('validation','test_lay')" if args.test_pairs else "('validation',)")
    command = [sys.executable, "-m", "finetune.main", "--config=configs/indonli_base.py", f"--workdir={workdir}",
               f"--config.model.init={args.model}", f"--config.data.source={source}",
               f"--config.data.tfds_dir={os.path.join(args.workdir, 'tfds')}",
               f"--config.data.max_seq_length={args.max_seq_length}", f"--config.train.batch_size={args.batch}",
               f"--config.train.num_epochs={args.epochs}", f"--config.optimizer.lr={args.lr}",
               "--config.train.early_stopping_patience=0", "--config.train.log_every_steps=10",
               f"--config.train.seed={args.seed}", f"--config.eval_splits={splits}", *extra]
    start = time.time()
    subprocess.run(command, cwd=harness.REPO, check=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    return time.time() - start


def train_rate(workdir: str) -> float:
    """Median training examples/s over the logging intervals after the first (compilation)."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8")]
    return statistics.median(r["train/examples_per_s"] for r in rows[1:])


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--model", default="", help="Hugging Face BERT directory (default: the installed MiniLM-L6)")
    parser.add_argument("--train_pairs", type=int, default=3000)
    parser.add_argument("--test_pairs", type=int, default=2000, help="held-out training pairs standing in for test_lay")
    parser.add_argument("--val_pairs", type=int, default=0, help="the first N validation pairs only (0: all 2,197)")
    parser.add_argument("--indonli_test_dir", default="", help="a folder with the real test_lay / test_expert files")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_calibration_run", action="store_true", help="the label-noise run (1.) only")
    args = parser.parse_args()
    print(harness.line(), flush=True)
    args.model = args.model or harness.require_minilm()
    os.makedirs(args.workdir, exist_ok=True)
    clean, noisy, flipped = make_sources(args)

    noisy_run = os.path.join(args.workdir, "noisy_dynamics")
    seconds_noisy = finetune(args, noisy_run, noisy, "--config.hooks.dynamics.enabled=True")
    subprocess.run([sys.executable, "-m", "nli_jax.analysis", "cartography", f"--workdir={noisy_run}"], cwd=harness.REPO,
                   check=True, stdout=subprocess.DEVNULL)
    summary = json.load(open(os.path.join(noisy_run, "cartography", "summary.json"), encoding="utf-8"))
    flipped_ids, regions = set(flipped), {}
    for region in ("easy_to_learn", "ambiguous", "hard_to_learn"):
        ids = [json.loads(line)["id"] for line in open(os.path.join(noisy_run, "cartography", f"{region}.jsonl"),
                                                       encoding="utf-8")]
        share = sum(i in flipped_ids for i in ids) / len(ids)
        regions[region] = {"examples": len(ids), "flipped": sum(i in flipped_ids for i in ids), "flipped_share": share,
                           "enrichment": share / (len(flipped) / args.train_pairs)}
    # The lowest-confidence examples, as many as were flipped: how many of them were flipped.
    rows = [json.loads(line) for line in open(os.path.join(noisy_run, "cartography", "cartography.jsonl"),
                                              encoding="utf-8")]
    lowest = sorted(rows, key=lambda r: r["confidence"])[:len(flipped)]
    regions["lowest_confidence_n_flipped"] = {
        "examples": len(lowest), "flipped": sum(r["id"] in flipped_ids for r in lowest),
        "flipped_share": sum(r["id"] in flipped_ids for r in lowest) / len(lowest),
        "enrichment": sum(r["id"] in flipped_ids for r in lowest) / len(lowest) / (len(flipped) / args.train_pairs)}

    out = {"model": args.model, "train_pairs": args.train_pairs,
           "epochs": args.epochs, "noise": args.noise, "flipped": len(flipped), "seed": args.seed,
           "cartography": regions, "passes": summary["passes"],
           "seconds": {"noisy_with_dynamics": seconds_noisy}}
    print(f"MiniLM-L6, {args.train_pairs} IndoNLI training pairs x "
          f"{args.epochs} epochs, length {args.max_seq_length}, batch {args.batch}")
    print(f"label noise: {len(flipped)} of {args.train_pairs} flipped ({args.noise:.0%})")
    for region, r in regions.items():
        print(f"  {region}: {r['flipped']} flipped of {r['examples']} = {r['flipped_share']:.1%} "
              f"({r['enrichment']:.1f}x the overall share)")
    if not args.no_calibration_run:
        out.update(calibration_run(args, clean, noisy_run))
    ratios = {"hard_to_learn_over_overall_flipped_share": regions["hard_to_learn"]["enrichment"]}
    if "dynamics_cost" in out:
        ratios["with_over_without_dynamics_examples_per_s"] = out["dynamics_cost"]
    harness.write_result(args.json or os.path.join(args.workdir, "result.json"), out, ratios=ratios)


def calibration_run(args, clean: str, noisy_run: str) -> dict:
    """2. and 3.: the clean run's calibration, and the two runs' training rates."""
    clean_run = os.path.join(args.workdir, "clean_calibration")
    seconds_clean = finetune(args, clean_run, clean)
    results = json.load(open(os.path.join(clean_run, "results.json"), encoding="utf-8"))
    calibration = {split: {kind: r["calibration"][kind] for kind in ("raw", "temperature_scaled")}
                   for split, r in results["splits"].items()}
    out = {"accuracy": {split: r["accuracy"] for split, r in results["splits"].items()},
           "temperature": results["calibration"]["temperature"], "calibration": calibration,
           "test_lay": "real" if args.indonli_test_dir else f"{args.test_pairs} held-out training pairs",
           "train_examples_per_s": {"with_dynamics": train_rate(noisy_run), "without": train_rate(clean_run)},
           "seconds_clean": seconds_clean}
    out["dynamics_cost"] = out["train_examples_per_s"]["with_dynamics"] / out["train_examples_per_s"]["without"]
    print(f"calibration (clean labels), temperature {out['temperature']:.3f} fitted on validation:")
    for split, c in calibration.items():
        print(f"  {split}: ECE {c['raw']['ece']:.4f} -> {c['temperature_scaled']['ece']:.4f}, NLL {c['raw']['nll']:.4f} "
              f"-> {c['temperature_scaled']['nll']:.4f}, Brier {c['raw']['brier']:.4f} -> "
              f"{c['temperature_scaled']['brier']:.4f}, MCE {c['raw']['mce']:.4f} -> {c['temperature_scaled']['mce']:.4f}")
    rates = out["train_examples_per_s"]
    print(f"training examples/s: {rates['with_dynamics']:.1f} with dynamics, {rates['without']:.1f} without "
          f"({out['dynamics_cost']:.3f}x)")
    return out


if __name__ == "__main__":
    main()
