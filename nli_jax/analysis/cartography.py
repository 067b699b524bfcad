"""Dataset cartography (Swayamdipta et al., EMNLP 2020) of a run trained with
`--config.hooks.dynamics.enabled=True`:

    python -m nli_jax.analysis cartography --workdir=RUN [--output=DIR] [--fraction=0.33]

Per training example, over the passes recorded (epochs, or every-N-steps evaluations):
confidence = the mean probability of the gold label, variability = its standard deviation
(population, as the paper's code), correctness = the fraction of passes predicted right. Writes
to --output (default RUN/cartography):

- `cartography.jsonl`: every example's id, label and the three statistics;
- `data_map.png`: confidence against variability, coloured by correctness (the paper's figure);
- `easy_to_learn.jsonl`, `ambiguous.jsonl`, `hard_to_learn.jsonl`: the paper's subsets, each
  `--fraction` of the examples (highest confidence; highest variability; lowest confidence),
  one line per example with its id, the task's own fields (label by name) and its statistics.
  `--config.data.train_subset=FILE` trains on one of them (the paper's use: the ambiguous third);
- `summary.json` and `summary.md`: counts per label in each subset, thresholds, passes.

The run's data is read again through its task (its config.json), so the subsets hold the
examples the run trained on; records of another run or task are refused, naming the file.
"""
from __future__ import annotations

import io
import json
import os
import sys

import numpy as np
from absl import app, flags

from nli_jax import cli, storage
from nli_jax import workdir as workdir_lib
from nli_jax.hooks import dynamics
from nli_jax.planner import build_plan, saved_config
from nli_jax.tasks import create_task
from nli_jax.train.setup import training_examples as select

REGIONS = ("easy_to_learn", "ambiguous", "hard_to_learn")


def training_examples(workdir: str):
    """(plan, task, the examples the run trained on) from the run's config.json and data."""
    config = saved_config(workdir)
    if config is None:
        raise FileNotFoundError(f"{workdir} has no {workdir_lib.CONFIG_FILE}: not an nli-jax run directory")
    plan = build_plan(config, training=False)
    task = create_task(plan)
    splits = task.load(workdir)
    source = select(plan, task, splits)
    return plan, task, [source[i] for i in range(len(source))]


def statistics(records: dict[str, np.ndarray]) -> dict[int, dict]:
    """{example idx: confidence, variability, correctness, passes} from the records."""
    order = np.argsort(records["idx"], kind="stable")
    idx, prob, correct = (records[k][order] for k in ("idx", "gold_probability", "correct"))
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    out = {}
    for begin, end in zip(starts, np.r_[starts[1:], len(idx)]):
        p = prob[begin:end].astype(np.float64)
        out[int(idx[begin])] = {"confidence": float(p.mean()), "variability": float(p.std()),
                                "correctness": float(np.mean(correct[begin:end])), "passes": int(end - begin)}
    return out


def _label_name(task, example):
    label = example.get("label")
    labels = getattr(task, "labels", ())
    if isinstance(label, (int, np.integer)) and 0 <= int(label) < len(labels):
        return labels[int(label)]
    return label


def _row(task, example, stats) -> dict:
    """The example's own fields (label by name), its id and its statistics."""
    row = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in example.items()
           if k not in ("line",)}
    row["label"] = _label_name(task, example)
    row["id"] = str(example.get("id", example["idx"]))
    row.update({k: round(v, 6) if isinstance(v, float) else v for k, v in stats.items()})
    return row


def cartography(workdir: str, output: str | None = None, fraction: float = 1 / 3) -> dict:
    if not 0 < fraction <= 1:
        raise ValueError(f"--fraction={fraction}: must be in (0, 1]")
    output = output or os.path.join(workdir, "cartography")
    workdir_lib.check_tool_output(output, "--output", reads=[workdir], read_flag="--workdir", directory=True)
    plan, task, examples = training_examples(workdir)
    meta = dynamics.read_meta(workdir)
    if meta is None:
        raise FileNotFoundError(f"{os.path.join(workdir, dynamics.DIRECTORY, dynamics.META)} not found: train the run "
                                "with --config.hooks.dynamics.enabled=True")
    dynamics.check_meta(workdir, dynamics.identity(plan.task, workdir_lib.read_config(workdir), len(examples)))
    stats = statistics(dynamics.read_records(workdir))
    by_idx = {int(e["idx"]): e for e in examples}
    unknown = sorted(set(stats) - set(by_idx))
    if unknown:
        raise dynamics.DynamicsError(f"{os.path.join(workdir, dynamics.DIRECTORY)} records examples {unknown[:5]} "
                                     f"that the run's training split ({len(examples)} examples) does not have")
    ids = sorted(stats)
    confidence = np.array([stats[i]["confidence"] for i in ids])
    variability = np.array([stats[i]["variability"] for i in ids])
    n = max(1, int(round(fraction * len(ids))))
    chosen = {"easy_to_learn": np.argsort(-confidence, kind="stable")[:n],
              "ambiguous": np.argsort(-variability, kind="stable")[:n],
              "hard_to_learn": np.argsort(confidence, kind="stable")[:n]}
    rows = {i: _row(task, by_idx[i], stats[i]) for i in ids}
    storage.write_text(storage.under(output, "cartography.jsonl"), "".join(
        json.dumps({k: rows[i][k] for k in ("id", "idx", "label", "confidence", "variability", "correctness",
                                             "passes")}, ensure_ascii=False) + "\n" for i in ids))
    summary = {"workdir": workdir, "task": plan.task, "examples": len(ids), "mode": meta.get("mode"),
               "passes": {"min": min(s["passes"] for s in stats.values()),
                          "max": max(s["passes"] for s in stats.values())},
               "fraction": fraction, "not_recorded": len(examples) - len(ids), "regions": {}}
    for region, positions in chosen.items():
        members = [ids[p] for p in positions]
        storage.write_text(storage.under(output, f"{region}.jsonl"), "".join(
            json.dumps(rows[i], ensure_ascii=False) + "\n" for i in members))
        labels = [str(rows[i]["label"]) for i in members]
        summary["regions"][region] = {
            "count": len(members), "file": os.path.join(output, f"{region}.jsonl"),
            "per_label": {label: labels.count(label) for label in sorted(set(labels))},
            "confidence": [float(confidence[positions].min()), float(confidence[positions].max())],
            "variability": [float(variability[positions].min()), float(variability[positions].max())]}
    every = [str(rows[i]["label"]) for i in ids]
    summary["per_label"] = {label: every.count(label) for label in sorted(set(every))}
    summary["data_map"] = _data_map(storage.under(output, "data_map.png"), confidence, variability,
                                    np.array([stats[i]["correctness"] for i in ids]),
                                    f"{plan.task}: {len(ids)} training examples, {summary['passes']['max']} passes")
    storage.write_text(storage.under(output, "summary.json"), json.dumps(summary, indent=2, ensure_ascii=False))
    storage.write_text(storage.under(output, "summary.md"), markdown(summary))
    return summary


def markdown(summary: dict) -> str:
    lines = [f"# Data map of {summary['workdir']}", "",
             f"Task `{summary['task']}`, {summary['examples']} training examples, {summary['passes']['max']} passes "
             f"({summary['mode']}); each subset is {summary['fraction']:.0%} of the examples.", "",
             "| subset | examples | confidence | variability | " + " | ".join(summary["per_label"]) + " |",
             "|---" * (4 + len(summary["per_label"])) + "|"]
    for region, r in summary["regions"].items():
        lines.append(f"| {region} | {r['count']} | {r['confidence'][0]:.3f}-{r['confidence'][1]:.3f} | "
                     f"{r['variability'][0]:.3f}-{r['variability'][1]:.3f} | "
                     + " | ".join(str(r["per_label"].get(label, 0)) for label in summary["per_label"]) + " |")
    lines.append(f"| all | {summary['examples']} | | | " + " | ".join(str(v) for v in summary["per_label"].values())
                 + " |")
    lines += ["", "![data map](data_map.png)", ""]
    return "\n".join(lines)


def _data_map(path: str, confidence, variability, correctness, title: str) -> str:
    import matplotlib  # late: plots only; a command that draws none does not pay for matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # late: after matplotlib.use("Agg")
    fig, ax = plt.subplots(figsize=(6, 5), dpi=120)
    points = ax.scatter(variability, confidence, c=correctness, cmap="coolwarm_r", s=6, alpha=0.7, vmin=0, vmax=1)
    fig.colorbar(points, ax=ax, label="correctness")
    ax.set_xlabel("variability")
    ax.set_ylabel("confidence")
    ax.set_ylim(0, 1)
    ax.set_xlim(0, max(0.5, float(np.max(variability)) * 1.05 if len(variability) else 0.5))
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    storage.write_bytes(path, buffer.getvalue())
    return path


def define_flags() -> None:
    flags.DEFINE_string("workdir", None, "A run trained with --config.hooks.dynamics.enabled=True.")
    flags.DEFINE_string("output", None, "Where the files go (default: <workdir>/cartography).")
    flags.DEFINE_float("fraction", 1 / 3, "Share of the examples in each subset (the paper's third).")
    flags.mark_flags_as_required(["workdir"])


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    FLAGS = flags.FLAGS
    try:
        summary = cartography(FLAGS.workdir, FLAGS.output, FLAGS.fraction)
    except cli.user_errors() + (ValueError,) as e:
        sys.exit(f"nli_jax.analysis cartography: error: {' '.join(str(e).split())}")
    print(markdown(summary))
