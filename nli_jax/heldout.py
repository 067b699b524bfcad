"""The held-out-dataset protocol of a universal classifier (Laurer et al., 2023), its pieces that
are not the command line (finetune.universal_heldout): which tasks a held-out task's runs recast,
which held-out tasks share a run, per-task overrides, and the table.
"""
from __future__ import annotations

import numpy as np

from nli_jax.data.provenance import share_texts
from nli_jax.tasks import TASKS


def recast_for(heldout: str, tasks) -> list[str]:
    """The tasks recast for `heldout`'s run: every other one but those sharing its texts."""
    return [t for t in tasks if t != heldout and not share_texts(t, heldout)]


def run_owner(heldout: str, named, tasks) -> str:
    """The first held-out task (in `named`'s order) whose runs train on what `heldout`'s do: one
    run serves both (SmSA's and NusaX-Senti's runs, when NusaX is only held out)."""
    return next(t for t in named if recast_for(t, tasks) == recast_for(heldout, tasks))


def overrides_for(task: str, overrides) -> list[str]:
    """The `key=value` items for every task and the `task:key=value` items for `task`."""
    out = []
    for item in overrides:
        prefix, _, rest = item.partition(":")
        if rest and prefix in TASKS:
            if prefix == task:
                out.append(rest)
        else:
            out.append(item)
    return out


def table(rows: dict) -> str:
    """Markdown: task (and split), metric, zero-shot and majority baseline (x 100, mean (std)
    over seeds); a row's `not_recast` (tasks left out of its runs for sharing its texts) below."""
    def cell(values, seeds=None):
        if not values:
            return "-"
        values = [100 * v for v in values]
        if len(values) == 1:  # no spread to show
            return f"{values[0]:.2f}" + (f" (seed {seeds[0]})" if seeds else "")
        return f"{np.mean(values):.2f} ({np.std(values, ddof=1):.2f})"
    ceiling = any(row.get("ceiling") for row in rows.values())
    lines = ["| held-out task | metric | seeds | zero-shot | majority baseline |" + (" fine-tuned (ceiling) |" if ceiling else ""),
             "|---|---|---|---|---|" + ("---|" if ceiling else "")]
    for task, row in rows.items():
        lines.append(f"| {task} | {row['metric']} | {','.join(map(str, row['seeds']))} | {cell(row['zero_shot'])} | "
                     f"{cell(row['majority'])} |" + (f" {cell(row['ceiling'], row.get('ceiling_seeds'))} |" if ceiling else ""))
    notes = sorted({(task.split()[0], ", ".join(row["not_recast"])) for task, row in rows.items() if row.get("not_recast")})
    lines += [""] + [f"{task}: its runs trained without {names} (texts shared: nli_jax.data.provenance)"
                     for task, names in notes] if notes else []
    return "\n".join(lines) + "\n"
