"""Teaching an Indonesian encoder new languages in the decay of a warmup-stable-decay run (issue 52,
item 4): a small crammed model pretrained on id_corpus_sample with WSD, then three decays of equal
steps from its pre-decay parameters, scored on NusaX's ten local languages.

    python -m benchmarks.experiments.new_languages_decay --workdir=/tmp/new_languages   # full size (not yet run)
    python -m benchmarks.experiments.new_languages_decay --workdir=/tmp/nl --pretrain_minutes=0.05 \\
        --calibration_steps=2 --eval_every=10 --decay_steps=4 --evaluations=2 --languages=javanese,sundanese \\
        --heldout_examples=32 --new_pieces=50 --seeds=1 --finetune_epochs=1 --finetune_limit=32 \\
        --finetune_max_seq_length=32 --batch=8 --vocab_size=1000                 # a smoke run: ~1.5 minutes

Stages (each skipped when report.json has it, so an interrupted run continues; other sizes in the
same --workdir are refused):

1. id_corpus_sample -> corpus, a --vocab_size WordPiece vocabulary and --max_seq_length examples
   (benchmarks.experiments.pretrain_recipe_search.prepared, as crammed_vs_bert uses them).
2. configs/pretrain/crammed_wsd.py:cpu_learn for train.budget_minutes = --pretrain_minutes (or
   --pretrain_steps without a budget): it exports its pre-decay parameters to <run>/pre_decay.
   Beside it, configs/pretrain/crammed.py:cpu_learn (the one-cycle triangle) for the same minutes
   on the same examples: WSD against one-cycle at equal minutes on Indonesian (final held-out MLM
   accuracy, both on the same 15% held-out masks). Not run with --pretrain_steps.
3. NusaX's MT text (<data>/nusax/mt/{train,valid}.csv, one column per language) written one file
   per language and split, 5-sentence documents (the logic of docs/pretraining.md's MiniLM
   section), under --workdir; the pre-decay tokenizer extended with --new_pieces pieces trained on
   the local languages' training text (nli_jax.pretraining.vocab_extension, what
   `python -m pretrain.extend_vocab` runs): vocab_extension.json's fertility per language (on the
   training text), and the fertility on the validation text with the same function.
4. Three decays, configs/pretrain/crammed_wsd.py:cpu_learn,anneal from the pre-decay export, each
   --decay_steps steps (default: a tenth of the pretraining's), evaluated --evaluations times:
   (a) Indonesian only; (b) Indonesian and the local languages' training text, p ∝ n^--alpha;
   (c) as (b) with the extended tokenizer, new rows the mean of their old pieces (the default
   task_options.new_token_init="mean").
5. Held-out MLM accuracy at step 0 and at every evaluation of each decay: each decay keeps the
   checkpoint of every evaluation, whose parameters are scored (the run's own evaluation step,
   nli_jax.train.setup.prepare) on (i) each language's NusaX MT *validation* text, built into
   examples with the run's tokenizer and nothing held out (none of it is trained on), and (ii) the
   Indonesian held-out pairs of the run (id_corpus_sample documents held out by hash), the
   run's own held-out split. The runs' own held-out splits cannot be NusaX's validation text: a
   corpus's held-out documents are chosen by hash (pretrain.heldout_permille), and no option gives
   a corpus held-out files of its own; so the local languages lose ~1% of their training documents
   to held-out pairs that are not used here.
6. NusaX-Senti from each decay's export in each local language (finetune.nusax_benchmark's
   runs, configs/nusax.py:lang=L,model=<export>), --seeds seeds of --finetune_epochs epochs:
   validation macro-F1 mean (sd) per language, and the mean over the local languages (each seed's
   mean, then mean (sd) over seeds). Trained and scored on NusaX only.

Targets (issue 52): (c) ahead of (a) on the mean local-language validation accuracy at every
evaluation of the decay (step 0, the shared start, is reported, not counted), and on the mean
local-language F1 by more than the larger of the two sds. Each is a boolean with its numbers in
the result; report.md says where a target does not hold.

Writes <workdir>/report.json (its state; copied to --json), report.md and decay_curves.png.
Ratios: c_over_a and b_over_a local-language validation accuracy at the final evaluation,
c_over_a and b_over_a Indonesian held-out accuracy at the final evaluation (what the new languages
cost Indonesian), c_over_a local-language F1, and WSD over one-cycle final held-out accuracy.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import shutil
import sys
import time

from benchmarks import harness
from benchmarks.experiments import pretrain_recipe_search
from benchmarks.experiments.electra_vs_bert import eval_times

LOCAL_LANGUAGES = ("acehnese", "balinese", "banjarese", "buginese", "javanese", "madurese", "minangkabau", "ngaju",
                   "sundanese", "toba_batak")
ARMS = ("a", "b", "c")
ARM_NAMES = {"a": "(a) Indonesian only", "b": "(b) + local languages", "c": "(c) + local languages, extended vocabulary"}
INDONESIAN = "indonesian"  # the corpus name of id_corpus_sample in the decays' mixtures
NUSAX_INDONESIAN = "nusax_indonesian"  # NusaX's Indonesian column, validation text beside the local languages
HELDOUT_MASK_PROB = 0.15  # every run and evaluation scored on BERT's rate (the anneal trains at 5%, crammed at 30%)
SENTENCES_PER_DOCUMENT = 5
SETTINGS = ("languages", "vocab_size", "max_seq_length", "batch", "pretrain_minutes", "pretrain_steps", "eval_every",
            "calibration_steps", "decay_steps", "evaluations", "alpha", "new_pieces", "heldout_examples", "seeds",
            "finetune_epochs", "finetune_limit", "finetune_max_seq_length", "finetune_lr")


# ----------------------------------------------------------------------------- data

def write_language_files(csv_path: str, output_dir: str, columns) -> dict[str, str]:
    """{column: <output_dir>/<column>.txt}: the CSV's column, one sentence per line, a blank line
    after every 5 (documents for the examples' segment pairs), as docs/pretraining.md writes them."""
    with open(csv_path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in columns if not rows or c not in rows[0]]
    if missing:
        sys.exit(f"{csv_path}: no column {missing[0]!r} (columns: {', '.join(rows[0]) if rows else 'none'})")
    os.makedirs(output_dir, exist_ok=True)
    files = {}
    for column in columns:
        files[column] = os.path.join(output_dir, f"{column}.txt")
        with open(files[column], "w", encoding="utf-8") as f:
            ends = ("\n\n" if i % SENTENCES_PER_DOCUMENT == SENTENCES_PER_DOCUMENT - 1 else "\n" for i in range(len(rows)))
            f.write("".join(" ".join(r[column].split()) + end for r, end in zip(rows, ends)))
    return files


def validation_fertility(tokenizer_dirs: dict[str, str], files: dict[str, str]) -> dict:
    """{language: {"words", "lines", <tokenizer name>: pieces per word}} on the validation text,
    with vocab_extension's own measure."""
    from nli_jax.pretraining.vocab_extension import fertility, load_hf_tokenizer, read_lines
    tokenizers = {name: load_hf_tokenizer(d) for name, d in tokenizer_dirs.items()}
    out = {}
    for language, path in files.items():
        lines = read_lines([path], 10**9)
        out[language] = {"words": sum(len(line.split()) for line in lines), "lines": len(lines),
                         **{name: fertility(t, lines) for name, t in tokenizers.items()}}
    return out


# ----------------------------------------------------------------------------- configs

def pretrain_config(module: str, args, vocab_dir: str, examples_dir: str):
    """configs/pretrain/<module>.py:cpu_learn on the prepared examples: a budget of
    --pretrain_minutes (or --pretrain_steps steps), held-out masks at 15%."""
    import importlib
    c = importlib.import_module(f"configs.pretrain.{module}").get_config("cpu_learn")
    c.model.tokenizer = vocab_dir
    c.pretrain.examples_dir = examples_dir
    c.pretrain.heldout_examples = args.heldout_examples
    shape(c, args)
    budget = 0.0 if args.pretrain_steps else float(args.pretrain_minutes)
    c.train.update(budget_minutes=budget, budget_calibration_steps=args.calibration_steps,
                   max_steps=args.pretrain_steps or 1_000_000, eval_every_steps=args.eval_every,
                   checkpoint_every_steps=args.eval_every, log_every_steps=max(1, min(100, args.eval_every)))
    return c


def shape(c, args) -> None:
    """What every run of the experiment shares: length, batch, masks, float32, in-process data."""
    c.data.max_seq_length = args.max_seq_length
    c.task_options.max_predictions = math.ceil(0.3 * args.max_seq_length)  # crammed's 30%, all of it predicted
    c.task_options.heldout_mask_prob = HELDOUT_MASK_PROB
    c.train.batch_size = args.batch
    c.model.dtype = "float32"
    c.data.workers = 0


def decay_config(args, steps: int, pre_decay: str, tokenizer: str, corpus: dict[str, str]):
    """The anneal variant from the pre-decay export on `corpus` ({name: glob}) for `steps` steps,
    a checkpoint kept at every evaluation."""
    from configs.pretrain import crammed_wsd
    c = crammed_wsd.get_config("cpu_learn,anneal")
    shape(c, args)
    c.model.init = pre_decay
    c.model.tokenizer = tokenizer
    c.pretrain.examples_dir = ""
    c.pretrain.corpus = tuple(f"{name}={pattern}" for name, pattern in corpus.items())
    c.pretrain.corpus_alpha = args.alpha if len(corpus) > 1 else 0.0
    c.pretrain.heldout_examples = args.heldout_examples
    c.pretrain.workers = 1
    every = steps // args.evaluations
    c.train.update(budget_minutes=0.0, max_steps=steps, eval_every_steps=every,
                   checkpoint_every_steps=every, keep_checkpoints=args.evaluations + 1,
                   log_every_steps=max(1, min(100, every)), async_checkpointing=False)
    return c


# ----------------------------------------------------------------------------- evaluation

def checkpoint_params(workdir: str, step: int, like):
    """The parameters of `workdir`'s checkpoint of `step` (checkpoints/<step>/state), placed as
    `like` (the run set-up's own parameters: same tree, shapes and shardings)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    path = os.path.join(os.path.abspath(workdir), "checkpoints", str(step), "state")
    if not os.path.isdir(path):
        sys.exit(f"{path} not found: the decay keeps a checkpoint at every evaluation (train.keep_checkpoints)")
    saved = ocp.StandardCheckpointer().restore(path)["params"]

    def lookup(keys, target):
        tree = saved
        for key in keys:
            name = getattr(key, "key", getattr(key, "idx", None))
            tree = tree[name] if name in tree else tree[str(name)]  # orbax keeps dict keys as strings
        if tuple(tree.shape) != tuple(target.shape):
            sys.exit(f"{path}: {jax.tree_util.keystr(keys)} has shape {tree.shape}, the run's {target.shape}")
        return jax.device_put(np.asarray(tree, dtype=target.dtype), target.sharding)

    return jax.tree_util.tree_map_with_path(lookup, like)


def evaluate_decay(config, run_dir: str, steps: list[int], heldout_dir: str, validation: dict[str, str],
                   texts: dict[str, str], eval_dir: str) -> list[dict]:
    """[{"step", "indonesian", "indonesian_loss", "languages": {language: accuracy}, "masked_tokens"}] at step 0
    (the parameters the decay starts from, grown for an extended tokenizer) and at `steps`: the
    run's evaluation step on its Indonesian held-out pairs and on each language's validation
    examples ({language: examples dir}, every pair of both of create_examples' splits, built from
    `texts`, {language: text file})."""
    from nli_jax.data.pipeline import Subset
    from nli_jax.planner import build_plan
    from nli_jax.pretraining.examples import ExampleSource
    from nli_jax.pretraining.mixture import TaggedConcatenation
    from nli_jax.train.setup import prepare

    def examples(directory):
        parts = [s for s in ("train", "heldout") if glob.glob(os.path.join(directory, f"{s}-*.array_record"))]
        sources = {s: ExampleSource(directory, s) for s in parts}
        return TaggedConcatenation(sources) if len(sources) > 1 else next(iter(sources.values()))

    # Per-corpus accuracies are reported by a corpus's position in pretrain.corpus: the validation
    # languages first, then Indonesian, in both evaluated sources.
    c = config.copy_and_resolve_references()
    c.pretrain.corpus = tuple(f"{name}={texts[name]}" for name in validation) \
        + tuple(p for p in config.pretrain.corpus if p.startswith(f"{INDONESIAN}="))
    c.pretrain.corpus_alpha = 0.0
    empty = {name: Subset(ExampleSource(heldout_dir, "heldout"), []) for name in validation}
    heldout = ExampleSource(heldout_dir, "heldout")
    indonesian = TaggedConcatenation({**empty, INDONESIAN: Subset(heldout, range(min(len(heldout),
                                                                                       c.pretrain.heldout_examples)))})
    texts = TaggedConcatenation({name: examples(d) for name, d in validation.items()})
    os.makedirs(eval_dir, exist_ok=True)
    run = prepare(build_plan(c), eval_dir, splits={"heldout": indonesian})
    curve = []
    for step in [0, *steps]:
        params = run.params if step == 0 else checkpoint_params(run_dir, step, run.params)
        own = run.evaluator.evaluate(params, "heldout", indonesian).report
        text = run.evaluator.evaluate(params, "validation", texts).report
        curve.append({"step": step, "indonesian": own[f"mlm_accuracy_{INDONESIAN}"], "indonesian_loss": own["loss"],
                      "languages": {n: text[f"mlm_accuracy_{n}"] for n in validation},
                      "masked_tokens": {**{n: text[f"masked_tokens_{n}"] for n in validation},
                                        INDONESIAN: own[f"masked_tokens_{INDONESIAN}"]}})
        print(f"  step {step}: Indonesian held-out {curve[-1]['indonesian']:.4f}; validation "
              + ", ".join(f"{n} {a:.4f}" for n, a in curve[-1]["languages"].items()), flush=True)
    return curve


def local_mean(point: dict, languages) -> float:
    return sum(point["languages"][language] for language in languages) / len(languages)


# ----------------------------------------------------------------------------- fine-tuning

def finetune_f1(args, export: str, workdir: str, source: str, languages) -> dict:
    """NusaX-Senti in each language from `export` (finetune.nusax_benchmark's runs): {"languages":
    {language: mean_std of validation macro-F1}, "local_mean": mean_std of each seed's mean over
    the languages, "failures"}."""
    from finetune import nusax_benchmark
    from nli_jax.tables import mean_std
    seeds = [int(s) for s in args.seeds.split(",")]
    overrides = [f"train.num_epochs={args.finetune_epochs}", f"data.max_seq_length={args.finetune_max_seq_length}",
                 f"optimizer.lr={args.finetune_lr}", "model.dtype=float32", "data.workers=0"]
    if args.finetune_limit:
        overrides.append(f"data.max_train_examples={args.finetune_limit}")
    _, failures = nusax_benchmark.run_benchmark(export, workdir, source, list(languages), overrides, seeds=seeds)
    scores = {}
    for language in languages:
        for seed in seeds:
            path = os.path.join(workdir, language, f"seed_{seed}", "results.json")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    scores.setdefault(language, {})[seed] = json.load(f)["splits"]["validation"]["f1"]
    complete = [s for s in seeds if all(s in scores.get(language, {}) for language in languages)]
    return {"languages": {language: mean_std(list(per_seed.values())) for language, per_seed in scores.items()},
            "per_seed": {language: {str(s): v for s, v in per_seed.items()} for language, per_seed in scores.items()},
            "local_mean": mean_std([sum(scores[language][s] for language in languages) / len(languages)
                                    for s in complete]),
            "failures": failures}


# ----------------------------------------------------------------------------- main

def parse_args():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data", default=harness.shared_data(), help="the shared data root (id_corpus_sample, nusax)")
    parser.add_argument("--languages", default=",".join(LOCAL_LANGUAGES), help="NusaX local languages")
    parser.add_argument("--vocab_size", type=int, default=2000, help="the Indonesian WordPiece vocabulary")
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--pretrain_minutes", type=float, default=25.0, help="WSD's and one-cycle's budget")
    parser.add_argument("--pretrain_steps", type=int, default=0, help="> 0: WSD for these steps, no budget, no one-cycle")
    parser.add_argument("--eval_every", type=int, default=1000, help="pretraining's evaluations")
    parser.add_argument("--calibration_steps", type=int, default=20, help="train.budget_calibration_steps")
    parser.add_argument("--decay_steps", type=int, default=0, help="each decay's steps (0: a tenth of pretraining's)")
    parser.add_argument("--evaluations", type=int, default=5, help="evaluations of each decay")
    parser.add_argument("--alpha", type=float, default=0.3, help="the mixture's temperature (p ∝ n^alpha)")
    parser.add_argument("--new_pieces", type=int, default=1000, help="pieces added for (c)")
    parser.add_argument("--heldout_examples", type=int, default=1000, help="Indonesian held-out pairs")
    parser.add_argument("--seeds", default="1,2,3", help="NusaX-Senti seeds")
    parser.add_argument("--finetune_epochs", type=int, default=5, help="NusaX-Senti epochs (0: no fine-tuning)")
    parser.add_argument("--finetune_limit", type=int, default=0, help="fine-tune on the first N examples (smoke runs)")
    parser.add_argument("--finetune_max_seq_length", type=int, default=128)
    parser.add_argument("--finetune_lr", type=float, default=1e-4)
    args = parser.parse_args()
    languages = [language for language in args.languages.split(",") if language]
    unknown = [language for language in languages if language not in LOCAL_LANGUAGES]
    if unknown or not languages:
        parser.error(f"--languages: {unknown or 'none'} not among NusaX's local languages {', '.join(LOCAL_LANGUAGES)}")
    args.languages = ",".join(languages)
    if args.evaluations < 1 or (args.decay_steps and args.decay_steps % args.evaluations):
        parser.error(f"--decay_steps={args.decay_steps} is not a multiple of --evaluations={args.evaluations}")
    return args


def main():
    args = parse_args()
    print(harness.line(), flush=True)  # figures differ between CPUs
    harness.quiet_absl()
    from nli_jax.pretraining.examples import create_examples
    from nli_jax.pretraining.vocab_extension import EXTENSION_FILE, extend_vocabulary
    from nli_jax.train.loop import train_and_evaluate

    languages = args.languages.split(",")
    mt = os.path.join(args.data, "nusax", "mt")
    for split in ("train", "valid"):
        if not os.path.isfile(os.path.join(mt, f"{split}.csv")):
            sys.exit(f"no NusaX MT text at {mt}/{split}.csv (../shared/data/README.md)")
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    state_path = os.path.join(work, "report.json")
    settings = {k: getattr(args, k) for k in SETTINGS}
    state = {"settings": settings, "timings": {}}
    if os.path.exists(state_path):
        with open(state_path, encoding="utf-8") as f:
            state = {k: v for k, v in json.load(f).items() if k not in ("command", "date", "machine", "ratios")}
        if state.get("settings") != settings:
            changed = sorted(k for k in settings if state.get("settings", {}).get(k) != settings[k])
            sys.exit(f"{work} holds a run with other settings ({', '.join(changed)}): use a new --workdir")

    def save():
        harness.write_result(state_path, state, ratios=ratios_of(state, languages))

    # 1. Indonesian data, as crammed_vs_bert prepares it.
    vocab_dir, examples_dir = pretrain_recipe_search.prepared(argparse.Namespace(
        workdir=work, data=args.data, vocab=args.vocab_size, length=args.max_seq_length))
    corpus_glob = os.path.join(work, "corpus", "corpus-*.txt")

    # 2. WSD (its pre-decay export) and, at equal minutes, the one-cycle triangle.
    arms = {"wsd": "crammed_wsd"} if args.pretrain_steps else {"wsd": "crammed_wsd", "one_cycle": "crammed"}
    for arm, module in arms.items():
        if arm in state:
            continue
        run_dir = os.path.join(work, "pretrain", arm)
        shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished budgeted run would resume with its old budget
        start = time.time()
        result = train_and_evaluate(pretrain_config(module, args, vocab_dir, examples_dir), run_dir)
        state["timings"][f"{arm}_s"] = time.time() - start
        _, times = eval_times(os.path.join(run_dir, "train.log"))
        state[arm] = {"config": f"configs/pretrain/{module}.py:cpu_learn", "steps": result["steps"],
                      "curve": [{"step": h["step"], "seconds": times.get(h["step"]),
                                 "mlm_accuracy": h["heldout"]["mlm_accuracy"]} for h in result["history"]],
                      "export": result.get("export"), "milestones": result.get("milestones", {})}
        print(f"{arm}: {result['steps']} steps, final held-out MLM accuracy "
              f"{state[arm]['curve'][-1]['mlm_accuracy']:.4f}", flush=True)
        save()
    if "one_cycle" in state:  # at equal minutes of training steps, on the same held-out pairs and masks
        wsd, one_cycle = (state[arm]["curve"][-1]["mlm_accuracy"] for arm in ("wsd", "one_cycle"))
        state["wsd_vs_one_cycle"] = {"minutes": args.pretrain_minutes, "wsd": wsd, "one_cycle": one_cycle,
                                     "wsd_ahead": wsd > one_cycle}
    pre_decay = state["wsd"]["milestones"].get("pre_decay", {}).get("export")
    if not pre_decay or not os.path.isfile(os.path.join(pre_decay, "config.json")):
        sys.exit(f"the WSD run exported no pre-decay parameters ({state['wsd']['milestones']})")
    decay_steps = args.decay_steps or max(args.evaluations,
                                          state["wsd"]["steps"] // 10 // args.evaluations * args.evaluations)
    state["decay_steps"] = decay_steps

    # 3. NusaX MT text per language and split; the tokenizer extended on the local languages.
    text = {split: write_language_files(os.path.join(mt, f"{split}.csv"), os.path.join(work, "nusax_text", split),
                                        languages + ([INDONESIAN] if split == "valid" else []))
            for split in ("train", "valid")}
    validation_files = {(NUSAX_INDONESIAN if lang == INDONESIAN else lang): path for lang, path in text["valid"].items()}
    extended_dir = os.path.join(work, "vocab_extended")
    if "extension" not in state:
        start = time.time()
        extend_vocabulary(pre_decay, {lang: [text["train"][lang]] for lang in languages}, args.new_pieces,
                          extended_dir)
        with open(os.path.join(extended_dir, EXTENSION_FILE), encoding="utf-8") as f:
            extension = json.load(f)
        state["extension"] = {"vocab_size": extension["vocab_size"], "new_pieces": len(extension["new_pieces"]),
                              "fertility_train": extension["fertility"],
                              "fertility_validation": validation_fertility(
                                  {"before": pre_decay, "after": extended_dir}, validation_files)}
        state["timings"]["extension_s"] = time.time() - start
        save()

    # 4-5. The three decays, and their held-out accuracy at every evaluation.
    local = {lang: text["train"][lang] for lang in languages}
    plans = {"a": (pre_decay, {INDONESIAN: corpus_glob}),
             "b": (pre_decay, {INDONESIAN: corpus_glob, **local}),
             "c": (extended_dir, {INDONESIAN: corpus_glob, **local})}
    state.setdefault("decays", {})
    for arm, (tokenizer, corpus) in plans.items():
        if arm in state["decays"]:
            continue
        run_dir = os.path.join(work, "decay", arm)
        config = decay_config(args, decay_steps, pre_decay, tokenizer, corpus)
        start = time.time()
        result = train_and_evaluate(config, run_dir)
        state["timings"][f"decay_{arm}_s"] = time.time() - start
        start = time.time()
        validation = {}
        for name, path in validation_files.items():  # the validation text in the run's tokenization, all of it
            validation[name] = os.path.join(work, "validation_examples", arm, name)
            if not os.path.isfile(os.path.join(validation[name], "examples.json")):
                create_examples([path], tokenizer, validation[name], max_seq_length=args.max_seq_length,
                                sentence_task="none", heldout_permille=0, workers=1, progress=False)
        print(f"decay {ARM_NAMES[arm]}: {result['steps']} steps; held-out MLM accuracy from its checkpoints:", flush=True)
        curve = evaluate_decay(config, run_dir, [h["step"] for h in result["history"]],
                               os.path.join(run_dir, "examples", INDONESIAN), validation, validation_files,
                               os.path.join(work, "decay_eval", arm))
        state["timings"][f"decay_{arm}_evaluations_s"] = time.time() - start
        state["decays"][arm] = {
            "name": ARM_NAMES[arm], "tokenizer": tokenizer, "corpus": list(config.pretrain.corpus),
            "steps": result["steps"], "export": result.get("export"), "curve": curve,
            "run_heldout": [{"step": h["step"], **{k: v for k, v in h["heldout"].items()
                                                   if k.startswith("mlm_accuracy") or k == "loss"}}
                            for h in result["history"]]}
        save()

    # 6. NusaX-Senti from each export.
    source = os.path.join(args.data, "nusax", "sentiment")
    state.setdefault("finetune", {})
    if args.finetune_epochs:
        if not os.path.isdir(source):
            sys.exit(f"no NusaX-Senti at {source}")
        for arm in ARMS:
            if arm not in state["finetune"]:
                start = time.time()
                state["finetune"][arm] = finetune_f1(args, state["decays"][arm]["export"],
                                                     os.path.join(work, "finetune", arm), source, languages)
                state["timings"][f"finetune_{arm}_s"] = time.time() - start
                save()

    state["targets"] = targets(state, languages)
    save()
    write_report(args, state, languages, work)
    plot(state, languages, os.path.join(work, "decay_curves.png"))
    if args.json:
        shutil.copyfile(state_path, args.json)


# ----------------------------------------------------------------------------- reading

def targets(state: dict, languages) -> dict:
    """Issue 52's two targets, each {"holds": bool or None (not measured), the numbers}."""
    a, c = state["decays"]["a"]["curve"], state["decays"]["c"]["curve"]
    points = [(pa["step"], local_mean(pc, languages) - local_mean(pa, languages)) for pa, pc in zip(a[1:], c[1:])]
    accuracy = {"holds": all(m > 0 for _, m in points), "steps": [s for s, _ in points],
                "margins": [m for _, m in points], "behind_at": [s for s, m in points if m <= 0],
                "languages_behind_at_final": [lang for lang in languages
                                              if c[-1]["languages"][lang] <= a[-1]["languages"][lang]]}
    fa, fc = state.get("finetune", {}).get("a"), state.get("finetune", {}).get("c")
    f1 = {"holds": None, "reason": "not fine-tuned (--finetune_epochs=0)" if not (fa and fc) else
          "no seed finished in every language for both runs (see the failures)"}
    if fa and fc and fa["local_mean"]["n"] and fc["local_mean"]["n"]:
        margin = fc["local_mean"]["mean"] - fa["local_mean"]["mean"]
        larger_sd = max(fa["local_mean"]["std"], fc["local_mean"]["std"])
        f1 = {"holds": margin > larger_sd, "margin": margin, "larger_sd": larger_sd,
              "a": fa["local_mean"]["mean"], "c": fc["local_mean"]["mean"], "seeds": fc["local_mean"]["n"],
              "languages_behind": [lang for lang in languages if lang in fa["languages"] and lang in fc["languages"]
                                   and fc["languages"][lang]["mean"] <= fa["languages"][lang]["mean"]]}
    return {"c_ahead_of_a_local_accuracy_at_every_evaluation": accuracy,
            "c_ahead_of_a_local_f1_by_more_than_larger_sd": f1}


def ratios_of(state: dict, languages) -> dict:
    """Quotients of the runs' own figures (left out where the denominator is 0)."""
    out = {}

    def add(name, numerator, denominator):
        if denominator:
            out[name] = numerator / denominator

    decays = state.get("decays", {})
    if "a" in decays:
        final_a = decays["a"]["curve"][-1]
        for arm in ("b", "c"):
            if arm in decays:
                final = decays[arm]["curve"][-1]
                add(f"{arm}_over_a_local_accuracy_final", local_mean(final, languages), local_mean(final_a, languages))
                add(f"{arm}_over_a_indonesian_accuracy_final", final["indonesian"], final_a["indonesian"])
    finetune = state.get("finetune", {})
    if finetune.get("a", {}).get("local_mean", {}).get("n") and finetune.get("c", {}).get("local_mean", {}).get("n"):
        add("c_over_a_local_f1", finetune["c"]["local_mean"]["mean"], finetune["a"]["local_mean"]["mean"])
    if "wsd" in state and "one_cycle" in state:
        add("wsd_over_one_cycle_final_mlm_accuracy", state["wsd"]["curve"][-1]["mlm_accuracy"],
            state["one_cycle"]["curve"][-1]["mlm_accuracy"])
    return out


def write_report(args, state: dict, languages, work: str) -> None:
    s = state["settings"]
    lines = ["# Teaching an Indonesian encoder new languages in the decay (issue 52, item 4)", "",
             f"Command: `{harness.command()}`", "", harness.line(), "",
             f"Crammed 2 x 128 ModernBERT, {s['vocab_size']:,}-piece WordPiece vocabulary, {s['max_seq_length']}-token "
             f"pairs, batch {s['batch']}; held-out masks at {HELDOUT_MASK_PROB:.0%} everywhere.", "",
             "## WSD against the one-cycle triangle on Indonesian", "",
             "| run | steps | final held-out MLM accuracy | wall s at the last evaluation |", "|---|---|---|---|"]
    for arm in ("wsd", "one_cycle"):
        if arm in state:
            last = state[arm]["curve"][-1]
            lines.append(f"| {arm} ({state[arm]['config']}) | {state[arm]['steps']} | {last['mlm_accuracy']:.4f} | "
                         f"{last['seconds'] or 0:.0f} |")
    if "one_cycle" not in state:
        lines += ["", "One-cycle not run: --pretrain_steps fixes steps, not minutes."]
    else:
        verdict = state["wsd_vs_one_cycle"]
        lines += ["", f"Both for train.budget_minutes = {s['pretrain_minutes']:g} (training steps only), the same held-out "
                  f"pairs and masks: WSD {'ahead of' if verdict['wsd_ahead'] else 'not ahead of'} one-cycle "
                  f"({verdict['wsd']:.4f} against {verdict['one_cycle']:.4f})."]
    lines += ["", f"## Held-out MLM accuracy during the decays ({state['decay_steps']} steps each)", "",
              "Local languages: NusaX MT validation text; Indonesian: id_corpus_sample's held-out pairs (the (c) run's "
              "in its own tokenization); step 0: the pre-decay parameters (for (c), grown).", "",
              "| run | step | " + " | ".join(languages) + " | local mean | NusaX Indonesian | id held-out |",
              "|---|---|" + "---|" * (len(languages) + 3)]
    for arm, decay in state["decays"].items():
        for point in decay["curve"]:
            cells = " | ".join(f"{point['languages'][lang]:.4f}" for lang in languages)
            lines.append(f"| {arm} | {point['step']} | {cells}"
                         + f" | {local_mean(point, languages):.4f} | {point['languages'][NUSAX_INDONESIAN]:.4f} | "
                         f"{point['indonesian']:.4f} |")
    ext = state["extension"]
    lines += ["", f"## Fertility (pieces per whitespace word): {ext['new_pieces']} new pieces, vocabulary "
              f"{ext['vocab_size']:,}", "", "| language | train words | train before | train after | "
              "validation words | validation before | validation after |", "|---|---|---|---|---|---|---|"]
    for lang in [*languages, NUSAX_INDONESIAN]:
        t = ext["fertility_train"].get(lang)  # the extension's languages: the local ones
        v = ext["fertility_validation"][lang]
        trained = f"{t['words']} | {t['before']:.3f} | {t['after']:.3f}" if t else " | | "
        lines.append(f"| {lang} | {trained} | {v['words']} | {v['before']:.3f} | {v['after']:.3f} |")
    if state.get("finetune"):
        lines += ["", f"## NusaX-Senti validation macro-F1 x 100, mean (sd) over seeds {s['seeds']}; "
                  f"{s['finetune_epochs']} epoch(s), length {s['finetune_max_seq_length']}, Adam {s['finetune_lr']:g}", "",
                  "| run | " + " | ".join(languages) + " | local mean |", "|---|" + "---|" * (len(languages) + 1)]
        for arm, f in state["finetune"].items():
            cells = [_mean_sd(f["languages"].get(lang)) for lang in languages]
            lines.append(f"| {arm} | " + " | ".join(cells) + f" | {_mean_sd(f['local_mean'])} |")
            lines += [f"failed: {x}" for x in f["failures"]]
    accuracy = state["targets"]["c_ahead_of_a_local_accuracy_at_every_evaluation"]
    f1 = state["targets"]["c_ahead_of_a_local_f1_by_more_than_larger_sd"]
    lines += ["", "## Targets", "",
              f"- (c) ahead of (a) on the mean local-language validation accuracy at every evaluation: "
              f"**{'holds' if accuracy['holds'] else 'does not hold'}** (margins "
              + ", ".join(f"step {st} {m:+.4f}" for st, m in zip(accuracy["steps"], accuracy["margins"])) + ")"
              + (f"; not ahead at steps {accuracy['behind_at']}" if accuracy["behind_at"] else "")
              + (f"; at the final evaluation not ahead in {', '.join(accuracy['languages_behind_at_final'])}"
                 if accuracy["languages_behind_at_final"] else "")]
    if f1["holds"] is None:
        lines.append(f"- (c) ahead of (a) on the mean local-language F1: not measured ({f1['reason']})")
    else:
        lines.append(f"- (c) ahead of (a) on the mean local-language F1 by more than the larger sd: "
                     f"**{'holds' if f1['holds'] else 'does not hold'}** ((c) {100 * f1['c']:.2f} - (a) "
                     f"{100 * f1['a']:.2f} = {100 * f1['margin']:+.2f}, larger sd {100 * f1['larger_sd']:.2f}, "
                     f"{f1['seeds']} seeds)" + (f"; (c) not ahead in {', '.join(f1['languages_behind'])}"
                                                if f1["languages_behind"] else ""))
    lines += ["", "Wall time (s): " + ", ".join(f"{k[:-2]} {v:.0f}" for k, v in state["timings"].items())]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(work, "report.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, flush=True)


def _mean_sd(summary) -> str:
    if not summary or not summary["n"]:
        return ""
    return f"{100 * summary['mean']:.2f}" + (f" ({100 * summary['std']:.2f})" if summary["n"] > 1 else "")


def plot(state: dict, languages, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, decay in state["decays"].items():
        steps = [p["step"] for p in decay["curve"]]
        line, = ax.plot(steps, [local_mean(p, languages) for p in decay["curve"]], "o-", label=f"{ARM_NAMES[arm]}: local")
        ax.plot(steps, [p["indonesian"] for p in decay["curve"]], "s--", color=line.get_color(),
                label=f"{arm}: Indonesian held-out")
    ax.set(xlabel="decay step", ylabel=f"held-out MLM accuracy ({HELDOUT_MASK_PROB:.0%} masks)",
           title=f"Decays from the pre-decay checkpoint; local: mean of {len(languages)} NusaX languages' validation text")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
