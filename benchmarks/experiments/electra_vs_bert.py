"""ELECTRA-small against the BERT of configs/pretrain/*:cpu_learn at the same wall time (issue 27, item 4).

    python -m benchmarks.experiments.pretrain_vs_transformers --workdir=/tmp/recipe_search   # the BERT run (item 1)
    python -m benchmarks.experiments.electra_vs_bert --workdir=/tmp/recipe_search
    python -m benchmarks.experiments.downstream_gain --names=bert,electra --max_seq_length=32 --epochs=smsa=1,emot=3 \\
        --export=/tmp/recipe_search/runs/vs_nli-jax_10000/export,/tmp/recipe_search/runs/electra_cpu_learn/export \\
        --workdir=/tmp/electra_downstream

ELECTRA: `electra_small.get_config("cpu_learn")` through train_and_evaluate (the loop pretrain.main
runs): ELECTRA-small's discriminator (12 x 256, 128-wide embeddings shared with a generator a quarter
as wide), replaced-token loss weighted 50, on the BERT run's own data (the same 2,000-piece vocabulary
and 32-token examples of ../shared/data/id_corpus_sample under --workdir), batch 64, AdamW 5e-4
warmed up over the first tenth of its steps (as the BERT run: 1,000 of 10,000). Its step count fills the BERT run's wall time (first to last line of
its train.log, or --seconds): a short calibration run measures seconds per step first.

Prints both held-out curves against wall time (BERT's MLM accuracy and accuracy at [MASK] inputs;
ELECTRA's generator MLM accuracy and discriminator replaced-token accuracy / F1) and the CPU; writes
--json (default <workdir>/electra_vs_bert.json; ratios: ELECTRA's final generator MLM accuracy over
BERT's, and its wall time over BERT's) and a PNG (--png). Fine-tuning both on SmSA and EmoT is
benchmarks.experiments.downstream_gain (command above).
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import sys
import time

from benchmarks import harness
from benchmarks.experiments import pretrain_recipe_search, pretrain_vs_transformers

LOG_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d) ")
EVAL_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) eval step (\d+):")


def _seconds(match) -> int:
    h, m, s = (int(match.group(i)) for i in (1, 2, 3))
    return 3600 * h + 60 * m + s


def eval_times(train_log: str) -> tuple[float, dict[int, float]]:
    """(wall seconds from the log's first line to its last, {evaluated step: seconds since the
    first line}); log times are HH:MM:SS, so a run may cross midnight once."""
    with open(train_log, encoding="utf-8") as f:
        lines = [line for line in f if LOG_TIME.match(line)]
    if not lines:
        sys.exit(f"{train_log}: no timestamped lines")
    start, previous, offset, times, last = _seconds(LOG_TIME.match(lines[0])), None, 0, {}, 0.0
    for line in lines:
        t = _seconds(LOG_TIME.match(line))
        if previous is not None and t < previous:
            offset += 86400
        previous = t
        last = t + offset - start
        m = EVAL_LINE.match(line)
        if m:
            times[int(m.group(4))] = last
    return last, times


def electra_config(vocab_dir: str, examples_dir: str, steps: int, eval_every: int, layers: int = 0):
    """ELECTRA-small's cpu_learn config; `layers` > 0: that many layers instead of its 12 (smoke runs)."""
    c = pretrain_vs_transformers.cpu_learn_config(vocab_dir, examples_dir, steps, eval_every, model="electra_small",
                                                  checkpoint_every=eval_every, log_every=max(1, min(100, eval_every)))
    if layers:
        c.model.overrides.num_hidden_layers = layers
    return c


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True, help="pretrain_vs_transformers' workdir")
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--bert_run", default="", help="default: <workdir>/runs/vs_nli-jax_10000")
    parser.add_argument("--seconds", type=float, default=0, help="wall-time budget (default: the BERT run's)")
    parser.add_argument("--evaluations", type=int, default=10)
    parser.add_argument("--calibration_steps", type=int, default=60)
    parser.add_argument("--seconds_per_step", type=float, default=0, help="skip the calibration run: this rate")
    parser.add_argument("--png", default="", help="default: <workdir>/electra_vs_bert.png")
    parser.add_argument("--layers", type=int, default=0, help="ELECTRA-small's width at this depth (default: its 12; "
                        "smoke runs)")
    args = parser.parse_args()
    print(harness.line(), flush=True)
    harness.quiet_absl()
    from nli_jax.train.loop import train_and_evaluate

    bert_run = args.bert_run or os.path.join(args.workdir, "runs", "vs_nli-jax_10000")
    try:
        with open(os.path.join(bert_run, "results.json"), encoding="utf-8") as f:
            bert = json.load(f)
    except FileNotFoundError:
        sys.exit(f"no BERT run at {bert_run}: run benchmarks.experiments.pretrain_vs_transformers first (or pass "
                 "--bert_run)")
    bert_seconds, bert_times = eval_times(os.path.join(bert_run, "train.log"))
    budget = args.seconds or bert_seconds
    args.vocab, args.length = 2000, 32  # the cpu_learn data (pretrain_recipe_search.prepared)
    vocab_dir, examples_dir = pretrain_recipe_search.prepared(args)

    # Seconds per step of the ELECTRA step alone (after compilation): the rate of the calibration's last log.
    seconds_per_step = args.seconds_per_step
    if not seconds_per_step:
        calibration = os.path.join(args.workdir, "runs", "electra_calibration")
        shutil.rmtree(calibration, ignore_errors=True)
        c = electra_config(vocab_dir, examples_dir, args.calibration_steps, args.calibration_steps, args.layers)
        c.train.log_every_steps = max(1, args.calibration_steps // 3)
        c.export_final = False
        train_and_evaluate(c, calibration)
        with open(os.path.join(calibration, "metrics.jsonl"), encoding="utf-8") as f:
            rate = [json.loads(line) for line in f][-1]["train/examples_per_s"]
        seconds_per_step = c.train.batch_size / rate
    # Evaluations cost time too: leave them their share of the budget (about 2% each at this size).
    steps = int(budget / seconds_per_step / (1 + 0.02 * args.evaluations))
    eval_every = max(1, steps // args.evaluations)
    steps = eval_every * args.evaluations
    print(f"budget {budget:.0f} s (BERT run {bert_seconds:.0f} s); ELECTRA {seconds_per_step:.3f} s/step -> {steps} steps",
          flush=True)

    electra_dir = os.path.join(args.workdir, "runs", "electra_cpu_learn")
    shutil.rmtree(electra_dir, ignore_errors=True)  # a leftover run would resume
    c = electra_config(vocab_dir, examples_dir, steps, eval_every, args.layers)
    # The BERT run warms up over its first tenth (1,000 of 10,000 steps); so does this shorter run.
    c.optimizer.warmup_steps = max(1, steps // 10)
    started = time.time()
    electra = train_and_evaluate(c, electra_dir)
    electra_seconds = time.time() - started
    _, electra_times = eval_times(os.path.join(electra_dir, "train.log"))

    bert_curve = [{"step": h["step"], "seconds": bert_times.get(h["step"]), **h["heldout"]} for h in bert["history"]]
    electra_curve = [{"step": h["step"], "seconds": electra_times.get(h["step"]), **h["heldout"]}
                     for h in electra["history"]]
    lines = [f"{harness.line()}; {datetime.date.today()}. BERT ({bert_run}): {bert['steps']} steps in {bert_seconds:.0f} s; "
             f"ELECTRA-small: {electra['steps']} steps in {electra_seconds:.0f} s ({seconds_per_step:.3f} s/step alone).", "",
             "| model | step | wall s | held-out MLM acc | [MASK]-input acc | replaced-token acc | replaced F1 |",
             "|---|---|---|---|---|---|---|"]
    for name, curve in (("BERT 2x128", bert_curve), ("ELECTRA-small", electra_curve)):
        for r in curve:
            lines.append(f"| {name} | {r['step']} | {r['seconds'] or 0:.0f} | {r['mlm_accuracy']:.3f} | "
                         f"{r.get('mask_input_accuracy', float('nan')):.3f} | {r.get('rtd_accuracy', float('nan')):.3f} | "
                         f"{r.get('replaced_f1', float('nan')):.3f} |")
    text = "\n".join(lines)
    print(text, flush=True)
    ratios = {"electra_over_bert_seconds": electra_seconds / bert_seconds}
    if bert_curve[-1]["mlm_accuracy"]:
        ratios["electra_over_bert_final_mlm_accuracy"] = electra_curve[-1]["mlm_accuracy"] / bert_curve[-1]["mlm_accuracy"]
    harness.write_result(
        args.json or os.path.join(args.workdir, "electra_vs_bert.json"),
        {"budget_s": budget, "bert_seconds": bert_seconds, "electra_seconds": electra_seconds,
         "electra_seconds_per_step": seconds_per_step, "bert": bert_curve, "electra": electra_curve,
         "exports": {"bert": os.path.join(bert_run, "export"), "electra": os.path.join(electra_dir, "export")}},
        ratios=ratios)
    plot(args.png or os.path.join(args.workdir, "electra_vs_bert.png"), bert_curve, electra_curve)


def plot(path: str, bert_curve: list[dict], electra_curve: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    minutes = lambda curve: [(r["seconds"] or 0) / 60 for r in curve]  # noqa: E731
    left.plot(minutes(bert_curve), [r["mlm_accuracy"] for r in bert_curve], "o-", label="BERT 2x128: MLM accuracy")
    left.plot(minutes(bert_curve), [r["mask_input_accuracy"] for r in bert_curve], "s--", label="BERT: [MASK]-input accuracy")
    left.plot(minutes(electra_curve), [r["mlm_accuracy"] for r in electra_curve], "^-",
              label="ELECTRA-small generator: MLM accuracy")
    left.set_xlabel("wall time (minutes)")
    left.set_ylabel("held-out accuracy")
    left.legend(fontsize=8)
    right.plot(minutes(electra_curve), [r["replaced_f1"] for r in electra_curve], "^-", label="replaced-token F1")
    right.plot(minutes(electra_curve), [r["rtd_accuracy"] for r in electra_curve], "v--", label="replaced-token accuracy")
    if all("replaced_share" in r for r in electra_curve):  # in the final report, not the history's tracked metrics
        right.plot(minutes(electra_curve), [1 - r["replaced_share"] for r in electra_curve], ":", color="grey",
                   label="constant 'original' accuracy")
    right.set_xlabel("wall time (minutes)")
    right.set_title("ELECTRA-small discriminator (held out)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
