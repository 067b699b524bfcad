"""Sequential fine-tuning as one command: each link of the chain starts from the previous link's
best parameters (`model.init=<its workdir>`, nli_jax/train/run_init.py: the classification head
kept when the labels agree, new otherwise), the first from --model.

    python -m finetune.chain --links=indonesian,javanese,madurese --model=base --workdir=runs/chain_mad \\
        --source=nusax=/data/nusax/sentiment --seeds=1,2,3 --direct
    python -m finetune.chain --links=indonli,wrete --model=base --workdir=runs/indonli_wrete \\
        --source=indonli=/data/indonli --source=indonlu=/data/indonlu

A link is a NusaX language (configs/nusax.py:lang=L,model=M), an IndoNLU task
(configs/indonlu.py:task=T,model=M) or `indonli` (configs/indonli_base.py, model.init from
--model). Link k runs in <workdir>/<k>_<link> (with --seeds: <workdir>/seed_<s>/<k>_<link>, each
seed its own chain). --direct also fine-tunes the last link from --model alone
(<workdir>/[seed_<s>/]direct_<link>) and writes <workdir>/table.md / table.csv: the chain's and
the direct run's primary metric x 100 on every split, mean (sd) over seeds.

Rerunning skips finished links (results.json present, same config) and resumes an interrupted
one from its checkpoint (finetune.sweep.run_cell); every link's config (with the overrides) is
built before any training, so a bad --override or link fails at once; a link that fails stops
its chain (the later links are reported as not run) and the exit status is 1.
"""
from __future__ import annotations

import os

from absl import app, flags

from configs import indonli_base
from configs import indonlu as indonlu_config
from configs import nusax as nusax_config
from finetune.sweep import run_cell, with_lr_and_seed
from nli_jax import cli, storage, tables
from nli_jax.tasks.nusax import LANGUAGES


def define_flags():
    """The command line (defined when run as a command, so that the module imports beside the
    other commands' modules, whose flags have the same names)."""
    flags.DEFINE_list("links", None, "the chain, in order: NusaX languages, IndoNLU tasks or indonli")
    flags.DEFINE_string("model", "base", "the first link's model: a name of configs/indonlu.py's MODELS, or a "
                                         "checkpoint directory or hub id")
    flags.DEFINE_string("workdir", None, "output directory (one sub-directory per link)")
    flags.DEFINE_multi_string("source", [], "data of a family of links: nusax=DIR, indonlu=DIR, indonli=DIR "
                                            "(empty: download)")
    flags.DEFINE_bool("direct", False, "also fine-tune the last link from --model alone, and compare in table.md")
    flags.DEFINE_bool("cpu_test", False, "tiny from-scratch model (the configs' cpu_test variants)")
    flags.DEFINE_multi_string("override", [], "config overrides key=value for every link, e.g. train.num_epochs=3")
    flags.DEFINE_list("seeds", [], "random restarts, e.g. 1,2,3: one chain per seed, mean (sd) in the table")
    flags.mark_flags_as_required(["links", "workdir"])


FLAGS = flags.FLAGS

FAMILIES = ("nusax", "indonlu", "indonli")


def family_of(link: str) -> str:
    if link in LANGUAGES:
        return "nusax"
    if link in indonlu_config.TASKS:
        return "indonlu"
    if link == "indonli":
        return "indonli"
    raise app.UsageError(f"--links: unknown link {link!r}; a link is a NusaX language ({', '.join(LANGUAGES)}), "
                         f"an IndoNLU task ({', '.join(indonlu_config.TASKS)}) or indonli")


def link_config(link: str, model: str, sources: dict, overrides=(), cpu_test=False):
    """One link's config, started from --model (the chain then points model.init at the previous link)."""
    family = family_of(link)
    named = model in indonlu_config.MODELS
    variant = ",cpu_test" if cpu_test else ""
    if family == "nusax":
        config = nusax_config.get_config(f"lang={link},model={model}{variant}")
    elif family == "indonlu":  # its recipe by model name; a checkpoint takes the base model's
        config = indonlu_config.get_config(f"task={link},model={model if named else 'base'}{variant}")
        if not named and not cpu_test:
            config.model.init = model
    else:
        config = indonli_base.get_config("cpu_test" if cpu_test else None)
        if not cpu_test:
            config.model.init = indonlu_config.MODELS[model][0] if named else model
    if sources.get(family):
        config.data.source = sources[family]
    cli.apply_overrides(config, overrides)
    return config


def parse_sources(assignments) -> dict:
    sources = {}
    for assignment in assignments:
        family, sep, path = assignment.partition("=")
        if not sep or family not in FAMILIES:
            raise app.UsageError(f"--source={assignment!r}: expected FAMILY=DIR with FAMILY one of {', '.join(FAMILIES)}")
        sources[family] = path
    return sources


def chain_of(links, model, sources, overrides=(), cpu_test=False) -> list[tuple[str, object]]:
    """(link, its config) of every link, built before any training so a bad link or override fails at once."""
    if len(links) < 2:
        raise app.UsageError(f"--links={','.join(links)}: a chain needs at least two links")
    return [(link, link_config(link, model, sources, overrides, cpu_test)) for link in links]


def link_workdir(base: str, index: int, link: str) -> str:
    return os.path.join(base, f"{index}_{link}")


def run_chain(chain, base: str, seed=None) -> tuple[dict | None, list[str]]:
    """Runs (or reads, when finished) the links in order under `base`; returns the last link's
    results (None when a link failed) and the failures."""
    previous = None
    for index, (link, config) in enumerate(chain, start=1):
        config = with_lr_and_seed(config, seed=seed)
        if previous is not None:
            config.model.init = storage.resolve(previous)  # the same absolute path on every rerun
        workdir = link_workdir(base, index, link)
        outcome = run_cell(config, workdir)
        if "results" not in outcome:
            later = [l for l, _ in chain[index:]]
            return None, [f"{workdir}: {outcome['error'][:300]}" + (f" (not run: {', '.join(later)})" if later else "")]
        previous = workdir
        results = outcome["results"]
    return results, []


def write_table(workdir: str, links, chained: dict, direct: dict, failures=()) -> str:
    """table.md / table.csv: the chain's and the direct run's primary metric x 100 per split."""
    finished = list(chained.values()) + list(direct.values())
    metric = finished[0]["primary_metric"] if finished else "f1"
    splits = sorted({s for r in finished for s in r["splits"]}, key=lambda s: (s != "validation", s))
    rows = []
    for name, runs in ((" -> ".join(links), chained), (f"{links[-1]} directly", direct)):
        if runs:
            rows.append([name] + [tables.format_mean_std([r["splits"][s][metric] for r in runs.values()
                                                          if s in r["splits"]]) for s in splits])
    header = ["fine-tuning"] + splits
    tables.write_csv(storage.under(workdir, "table.csv"), header, rows)
    seeds = [s for s in chained if s is not None]
    spread = f", mean (sd) over seeds {', '.join(map(str, seeds))}" if seeds else ""
    return tables.write_markdown(storage.under(workdir, "table.md"), header, rows,
                                 title=f"{links[-1]}: sequential fine-tuning against direct ({metric} x 100{spread})",
                                 notes=[f"failed: {f}" for f in failures])


def run(links, model, workdir, sources, overrides=(), cpu_test=False, seeds=(), direct=False) -> tuple[str, list]:
    from nli_jax.workdir import check_tool_output
    check_tool_output(workdir, "--workdir", directory=True)
    chain = chain_of(links, model, sources, overrides, cpu_test)
    last_link, last_config = chain[-1]
    chained, alone, failures = {}, {}, []
    for seed in seeds or [None]:
        base = workdir if seed is None else os.path.join(workdir, f"seed_{seed}")
        results, failed = run_chain(chain, base, seed)
        failures += failed
        if results is not None:
            chained[seed] = results
        if direct:
            outcome = run_cell(with_lr_and_seed(last_config, seed=seed), os.path.join(base, f"direct_{last_link}"))
            if "results" in outcome:
                alone[seed] = outcome["results"]
            else:
                failures.append(f"{os.path.join(base, f'direct_{last_link}')}: {outcome['error'][:300]}")
    text = write_table(workdir, list(links), chained, alone, failures) if direct else "\n".join(
        f"{link_workdir(workdir if seed is None else os.path.join(workdir, f'seed_{seed}'), len(links), last_link)}: "
        + ", ".join(f"{split} {r['primary_metric']} {100 * report[r['primary_metric']]:.2f}"
                    for split, report in r["splits"].items()) for seed, r in chained.items())
    return text, failures


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    text, failures = run(FLAGS.links, FLAGS.model, FLAGS.workdir, parse_sources(FLAGS.source), FLAGS.override,
                         FLAGS.cpu_test, [int(s) for s in FLAGS.seeds], FLAGS.direct)
    print(text)
    for failure in failures:
        print(f"failed: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    define_flags()
    cli.run_tool(main)
