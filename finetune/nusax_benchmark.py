"""NusaX-Senti in its languages for one model, in the NusaX paper's layout (a column per language
and their average; macro-F1 x 100, mean (sd) over seeds).

    python -m finetune.nusax_benchmark --model=base --languages=all --seeds=1,2,3 --workdir=runs/nusax \\
        [--source=/data/nusax/sentiment] [--override=train.num_epochs=3 ...]
    python -m finetune.nusax_benchmark --model=base --languages=indonesian --transfer --seeds=1,2,3 \\
        --workdir=runs/nusax_zero_shot

Each language runs configs/nusax.py:lang=L,model=M in <workdir>/<language>/seed_<s> (without
--seeds: <workdir>/<language>). Writes <workdir>/table.md and table.csv: one row per evaluated
split (validation, and test when the source has it), each language's macro-F1 and the average
over the languages (each seed's average, then mean (sd) over seeds).

--transfer: each language of --languages is a source; its runs (configs/nusax.py:lang=S,transfer)
also score every language's validation (and test) split, and <workdir>/transfer.md, transfer.csv
and transfer.png (a heatmap) give the source x target macro-F1 matrix (mean over seeds; the
diagonal is in-language). table.md then holds the sources' in-language scores.

--multi_source: each language of --languages is a target; its runs (configs/nusax.py:target=T)
train on the other 11 languages joined, in <workdir>/multi_source/<target>/seed_<s>, and
<workdir>/multi_source.md / .csv give each target's macro-F1 on its own validation (and test)
split.

Rerunning skips finished runs (results.json present, same config) and resumes unfinished ones;
every config (with the overrides) is built before any training, so a bad --override fails at
once; a run that fails is reported under the table and in the exit status, and the others still
run (finetune.sweep.run_cell).
"""
from __future__ import annotations

import io
import os

from absl import app, flags

from configs import nusax as nusax_config
from finetune.sweep import run_seeds
from nli_jax import storage, tables
from nli_jax.tasks.nusax import LANGUAGES
from nli_jax import cli


def define_flags():
    """The command line (defined when run as a command, so that the module imports beside the
    other commands' modules, whose flags have the same names)."""
    flags.DEFINE_string("model", "base", "a name of configs/indonlu.py's MODELS, or a checkpoint directory or hub id")
    flags.DEFINE_string("workdir", None, "output directory")
    flags.DEFINE_string("source", "", "NusaX sentiment folder (one folder per language); empty = download")
    flags.DEFINE_list("languages", ["all"], f"languages to run ('all': {', '.join(LANGUAGES)})")
    flags.DEFINE_bool("transfer", False, "score every language in each run: the source x target matrix")
    flags.DEFINE_bool("multi_source", False, "each language is a target: trained on the other 11, scored on it")
    flags.DEFINE_bool("cpu_test", False, "tiny from-scratch model (configs/nusax.py's cpu_test variant)")
    flags.DEFINE_multi_string("override", [], "config overrides key=value, e.g. train.num_epochs=3")
    flags.DEFINE_list("seeds", [], "random restarts, e.g. 1,2,3: one run per seed, mean (sd) in the table")
    flags.mark_flags_as_required(["workdir"])


FLAGS = flags.FLAGS

SPLITS = ("validation", "test")


def languages_of(names) -> list[str]:
    names = list(LANGUAGES) if list(names) == ["all"] else list(names)
    unknown = [n for n in names if n not in LANGUAGES]
    if unknown:
        raise app.UsageError(f"--languages: unknown language(s) {unknown}; NusaX has {', '.join(LANGUAGES)} (or all)")
    return names


def language_configs(model: str, source: str, languages, overrides=(), cpu_test=False, transfer=False,
                     multi_source=False) -> dict:
    """Every language's config, built before any training so that a bad override fails at once
    (`multi_source`: the language is the target, trained on the other 11)."""
    configs = {}
    for language in languages:
        variant = (f"target={language}" if multi_source else f"lang={language}") + f",model={model}" \
            + (",transfer" if transfer else "") + (",cpu_test" if cpu_test else "")
        config = nusax_config.get_config(variant)
        config.data.source = source
        cli.apply_overrides(config, overrides)
        configs[language] = config
    return configs


def described_model(model: str, configs: dict) -> str:
    """--model as the tables name it, with what the runs build when that is not its checkpoint
    (--cpu_test or a model.init / model.preset override)."""
    built = sorted({c.model.init or f"preset {c.model.preset} from scratch" for c in configs.values()})
    named = nusax_config.indonlu.MODELS.get(model, (model,))[0]
    return f"`{model}`" + ("" if built == [named] else f" (run: {'; '.join(built)})")


def _score(runs, language, seed, split):
    report = runs.get(language, {}).get(seed, {}).get("splits", {}).get(split)
    return None if report is None else report["f1"]


def _seeds(runs) -> list:
    return sorted({seed for per_seed in runs.values() for seed in per_seed}, key=str)


def table(runs: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """runs[language][seed] = that run's results.json (seed None without --seeds); one row per split."""
    languages = [l for l in LANGUAGES if l in runs]
    seeds = _seeds(runs)
    finished = {s for per_seed in runs.values() for r in per_seed.values() for s in r["splits"]}
    rows = []
    for split in [s for s in SPLITS if s in finished]:
        per_seed = [[_score(runs, l, seed, split) for l in languages] for seed in seeds]
        rows.append([split] + [tables.format_mean_std([v for v in (_score(runs, l, s, split) for s in seeds)
                                                      if v is not None]) for l in languages]
                    + [tables.format_mean_std([sum(v) / len(v) for v in per_seed if v and None not in v])])
    return ["split"] + languages + ["average"], rows


def transfer_matrix(runs: dict[str, dict], split: str) -> dict[str, dict[str, float]]:
    """{source: {target: mean over seeds of macro-F1 on <split>_<target>}} of the finished runs."""
    seeds = _seeds(runs)
    out = {}
    for source in [l for l in LANGUAGES if l in runs]:
        row = {}
        for target in LANGUAGES:
            values = [v for v in (_score(runs, source, seed, f"{split}_{target}") for seed in seeds) if v is not None]
            if values:
                row[target] = sum(values) / len(values)
        if row:
            out[source] = row
    return out


def write_transfer(workdir: str, runs: dict[str, dict], model: str, seeds=()) -> str | None:
    """transfer.md / transfer.csv (source x target macro-F1 x 100, mean over seeds; one block per
    split) and transfer.png (the validation matrix); None when no run has finished."""
    blocks, header = [], ["source \\ target"] + list(LANGUAGES) + ["average"]
    matrices = {split: transfer_matrix(runs, split) for split in SPLITS}
    matrices = {split: m for split, m in matrices.items() if m}
    if not matrices:
        return None
    csv_rows = []
    for split, matrix in matrices.items():
        rows = []
        for source, row in matrix.items():
            cells = [f"{100 * row[t]:.2f}" if t in row else "" for t in LANGUAGES]
            average = f"{100 * sum(row.values()) / len(row):.2f}" if len(row) == len(LANGUAGES) else ""
            rows.append([source] + cells + [average])
            csv_rows.append([split] + rows[-1])
        blocks.append(f"### {split}\n\n" + tables.markdown(header, rows))
    tables.write_csv(storage.under(workdir, "transfer.csv"), ["split"] + header, csv_rows)
    spread = f", mean over seeds {', '.join(map(str, seeds))}" if seeds else ""
    text = (f"# NusaX-Senti transfer, model {model}\n\nmacro-F1 x 100 of a model trained on the source (row) and "
            f"scored on the target (column){spread}; the diagonal is in-language.\n\n" + "\n\n".join(blocks) + "\n")
    storage.write_text(storage.under(workdir, "transfer.md"), text)
    split = "validation" if "validation" in matrices else next(iter(matrices))
    plot_matrix(matrices[split], storage.under(workdir, "transfer.png"),
                f"NusaX-Senti {split} macro-F1, {model.replace('`', '')}")
    return text


def plot_matrix(matrix: dict[str, dict[str, float]], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    sources = list(matrix)
    values = np.array([[100 * matrix[s].get(t, np.nan) for t in LANGUAGES] for s in sources])
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(LANGUAGES), 1.4 + 0.5 * len(sources)))
    image = ax.imshow(values, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(LANGUAGES)), LANGUAGES, rotation=45, ha="right")
    ax.set_yticks(range(len(sources)), sources)
    ax.set_xlabel("target")
    ax.set_ylabel("source")
    for i in range(len(sources)):
        for j in range(len(LANGUAGES)):
            if not np.isnan(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.0f}", ha="center", va="center",
                        color="white" if values[i, j] < 60 else "black", fontsize=8)
    fig.colorbar(image, ax=ax, label="macro-F1 x 100")
    ax.set_title(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    storage.write_bytes(path, buffer.getvalue())


def write_tables(workdir: str, runs: dict[str, dict], model: str, seconds: dict[str, float],
                 failures=(), seeds=()) -> str:
    header, rows = table(runs)
    tables.write_csv(storage.under(workdir, "table.csv"), header, rows)
    spread = f", mean (sd) over seeds {', '.join(map(str, seeds))}" if seeds else ""
    notes = [f"failed: {f}" for f in failures]
    notes += ["wall time per language (s): " + ", ".join(f"{l} {s:.0f}" for l, s in seconds.items()),
              f"total: {sum(seconds.values()):.0f} s"]
    return tables.write_markdown(storage.under(workdir, "table.md"), header, rows,
                                 title=f"NusaX-Senti, model {model} (macro-F1 x 100{spread}; trained and scored in "
                                       "each language)", notes=notes)


def as_target_scores(runs: dict[str, dict]) -> dict[str, dict]:
    """Multi-source runs (runs[target][seed]) with each target's own splits (validation_<target>,
    test_<target>) as validation / test, for `table`."""
    return {target: {seed: dict(r, splits={split: r["splits"][f"{split}_{target}"] for split in SPLITS
                                           if f"{split}_{target}" in r["splits"]})
                     for seed, r in per_seed.items()} for target, per_seed in runs.items()}


def write_multi_source(workdir: str, runs: dict[str, dict], model: str, seeds=()) -> str:
    """multi_source.md / .csv: each target's macro-F1 x 100 when trained on the other 11 languages."""
    header, rows = table(as_target_scores(runs))
    tables.write_csv(storage.under(workdir, "multi_source.csv"), header, rows)
    spread = f", mean (sd) over seeds {', '.join(map(str, seeds))}" if seeds else ""
    return tables.write_markdown(storage.under(workdir, "multi_source.md"), header, rows,
                                 title=f"NusaX-Senti multi-source, model {model} (macro-F1 x 100{spread}; each column's "
                                       "language trained on the other 11 and scored on its own splits)")


def run_benchmark(model: str, workdir: str, source: str, languages, overrides=(), cpu_test=False, seeds=(),
                  transfer=False, multi_source=False) -> tuple[str, list[str]]:
    """Runs (or reads, when finished) every language x seed; returns table.md's text (and
    transfer.md's with `transfer`; multi_source.md's alone with `multi_source`) and the failures."""
    from nli_jax.workdir import check_tool_output
    if transfer and multi_source:
        raise app.UsageError("--transfer and --multi_source: choose one (a multi-source run scores only its target)")
    check_tool_output(workdir, "--workdir", directory=True)
    configs = language_configs(model, source, languages, overrides, cpu_test, transfer, multi_source)
    base = os.path.join(workdir, "transfer" if transfer else "multi_source") if transfer or multi_source else workdir
    model = described_model(model, configs)
    runs, seconds, failures = {}, {}, []
    for language, config in configs.items():
        runs[language], seconds[language], failed = run_seeds(config, os.path.join(base, language), seeds, language)
        failures += failed
        if multi_source:
            write_multi_source(workdir, runs, model, seeds)
            continue
        write_tables(workdir, runs, model, seconds, failures, seeds)  # readable while the benchmark runs
        if transfer:
            write_transfer(workdir, runs, model, seeds)
    if multi_source:
        return write_multi_source(workdir, runs, model, seeds) + "".join(f"\nfailed: {f}" for f in failures), failures
    text = write_tables(workdir, runs, model, seconds, failures, seeds)
    if transfer:
        text += "\n" + (write_transfer(workdir, runs, model, seeds) or "no transfer run finished\n")
    return text, failures


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    seeds = [int(s) for s in FLAGS.seeds]
    text, failures = run_benchmark(FLAGS.model, FLAGS.workdir, FLAGS.source, languages_of(FLAGS.languages),
                                   FLAGS.override, FLAGS.cpu_test, seeds, FLAGS.transfer, FLAGS.multi_source)
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    define_flags()
    cli.run_tool(main)
