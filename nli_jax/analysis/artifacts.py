"""Annotation-artifact statistics for NLI corpora (Gururangan et al., 2018; the IndoNLI and
OCNLI papers' dataset analyses): label-word PMI on hypotheses, premise-hypothesis overlap and
hypothesis length per gold label, and the accuracy of a hypothesis-only run broken down by
label, category and diagnostic tag. Entry point: `analyse`; CLI: `python -m nli_jax.analysis
artifacts` (the default analysis: `python -m nli_jax.analysis --task=...` runs it too).

Examples are read with the corpus spec's own reader and `parse` (nli_jax.data.nli), so a bad
row fails with the same DataError naming file and line as training does, and no tfds
directory is needed.

Tokenisation (the statistics are about surface words, not model sub-words):
  - Indonesian and Spanish: lowercased regex words, `\\w+` runs joined by inner hyphens, so
    Indonesian reduplication ("anak-anak") stays one word; punctuation is dropped.
  - Chinese (OCNLI): one token per CJK character (no segmenter dependency; the negation
    characters 不 and 没 are then tokens of their own), runs of other word characters
    (digits, Latin) as one token.
PMI: natural log, add-k smoothing of every (word, label) count over the split's hypothesis
vocabulary (k=100 by default, as in Gururangan et al.), words rarer than `min_count`
occurrences in all hypotheses are not ranked.
"""
from __future__ import annotations

import collections
import io
import json
import math
import os
import re
import statistics
import sys
from typing import Callable, Iterable, Sequence

from absl import app, flags

import nli_jax.tasks  # noqa: F401  (the task registry imports every corpus module: each registers its corpus)
from nli_jax import storage
from nli_jax.data import nli as nli_data
from nli_jax.data.readers import DataError, read_validated
from nli_jax.metrics import accuracy, accuracy_by, accuracy_by_tag
from nli_jax.tasks.nli import TASK_CORPORA
from nli_jax.workdir import check_tool_output

OVERLAP_MEASURES = ("jaccard", "lcs_ratio", "new_token_rate")
LENGTH_BINS = ((1, 5), (6, 10), (11, 15), (16, 20), (21, 25), (26, 30), (31, None))  # inclusive, None = open

# --- tokenisation -----------------------------------------------------------------------------

_WORD = re.compile(r"\w+(?:-\w+)*")
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CHINESE = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+")


def tokenize_words(text: str) -> list[str]:
    """Lowercased words; hyphenated words (Indonesian reduplication) stay whole."""
    return _WORD.findall(text.lower())


def tokenize_chinese(text: str) -> list[str]:
    """One token per CJK character, other word-character runs whole (lowercased)."""
    return _CHINESE.findall(text.lower())


TOKENIZERS: dict[str, Callable[[str], list[str]]] = {"words": tokenize_words, "chinese_characters": tokenize_chinese}


def tokenization_for(corpus_name: str) -> str:
    """How the analysis splits corpus `corpus_name`'s text (its spec's analysis_tokenization)."""
    return nli_data.get_corpus(corpus_name).analysis_tokenization


# --- the statistics ---------------------------------------------------------------------------

def jaccard(premise: Sequence[str], hypothesis: Sequence[str]) -> float:
    """|P ∩ H| / |P ∪ H| over token types."""
    p, h = set(premise), set(hypothesis)
    union = p | h
    return len(p & h) / len(union) if union else 0.0


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common (not necessarily contiguous) subsequence of two token
    sequences. Bit-parallel (Allison & Dix 1986, Hyyrö 2004): one big-int update per token of
    `b` instead of a |a| x |b| table, so whole corpora with paragraph premises take seconds."""
    if not a or not b:
        return 0
    match = collections.defaultdict(int)
    for position, token in enumerate(a):
        match[token] |= 1 << position
    full = (1 << len(a)) - 1
    v = full
    for token in b:
        u = v & match.get(token, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def lcs_ratio(premise: Sequence[str], hypothesis: Sequence[str]) -> float:
    """LCS length over hypothesis length: how much of the hypothesis is the premise, in order."""
    return lcs_length(hypothesis, premise) / len(hypothesis) if hypothesis else 0.0


def new_token_rate(premise: Sequence[str], hypothesis: Sequence[str]) -> float:
    """Share of hypothesis tokens (occurrences) that do not occur in the premise."""
    if not hypothesis:
        return 0.0
    seen = set(premise)
    return sum(token not in seen for token in hypothesis) / len(hypothesis)


def label_word_pmi(hypotheses: Sequence[Sequence[str]], labels: Sequence[int], *,
                   num_labels: int = len(nli_data.NLI_LABELS),
                   smoothing: float = 100.0, min_count: int = 5, top_k: int = 10) -> list[list[dict]]:
    """Per label, the `top_k` hypothesis words by PMI(word, label) = log p(w, l) / (p(w) p(l)),
    from token counts with `smoothing` added to every (word, label) cell of the vocabulary
    (so that rare words cannot reach the top by chance). Each entry: word, pmi, count (in the
    label's hypotheses), total_count and hypothesis_share (the share of the label's hypotheses
    that contain the word). A label with no hypotheses gets no words: there is nothing to rank."""
    counts = collections.defaultdict(lambda: [0] * num_labels)
    containing = collections.defaultdict(lambda: [0] * num_labels)
    hypotheses_per_label = [0] * num_labels
    for tokens, label in zip(hypotheses, labels, strict=True):
        hypotheses_per_label[label] += 1
        for token in tokens:
            counts[token][label] += 1
        for token in set(tokens):
            containing[token][label] += 1
    if not counts:
        return [[] for _ in range(num_labels)]
    label_totals = [sum(c[label] for c in counts.values()) + smoothing * len(counts) for label in range(num_labels)]
    grand_total = sum(label_totals)
    ranked = [[] for _ in range(num_labels)]
    for word, by_label in counts.items():
        total = sum(by_label)
        if total < min_count:
            continue
        word_total = total + smoothing * num_labels
        for label in range(num_labels):
            if not hypotheses_per_label[label]:  # smoothing alone would rank words for it
                continue
            joint = by_label[label] + smoothing
            if joint <= 0:  # k = 0 and the word never occurs with this label: PMI is -inf
                continue
            pmi = math.log(joint * grand_total / (word_total * label_totals[label]))
            share = containing[word][label] / hypotheses_per_label[label] if hypotheses_per_label[label] else 0.0
            ranked[label].append({"word": word, "pmi": pmi, "count": by_label[label], "total_count": total,
                                  "hypothesis_share": share})
    return [sorted(entries, key=lambda e: (-e["pmi"], -e["count"], e["word"]))[:top_k] for entries in ranked]


def summary(values: Sequence[float]) -> dict:
    """Mean and median (None for no values, so an empty label shows as missing, not as 0)."""
    if not values:
        return {"mean": None, "median": None}
    return {"mean": float(statistics.fmean(values)), "median": float(statistics.median(values))}


def overlap_by_label(pairs: Sequence[tuple[list[str], list[str]]], labels: Sequence[int],
                     names: Sequence[str] = nli_data.NLI_LABELS) -> dict:
    """{label name | "overall": {"n", jaccard/lcs_ratio/new_token_rate: {"mean", "median"}}};
    pairs whose hypothesis has no token are left out (n counts the pairs used)."""
    values = {group: {m: [] for m in OVERLAP_MEASURES} for group in (*names, "overall")}
    for (premise, hypothesis), label in zip(pairs, labels, strict=True):
        if not hypothesis:
            continue
        measured = {"jaccard": jaccard(premise, hypothesis), "lcs_ratio": lcs_ratio(premise, hypothesis),
                    "new_token_rate": new_token_rate(premise, hypothesis)}
        for group in (names[label], "overall"):
            for measure, value in measured.items():
                values[group][measure].append(value)
    return {group: {"n": len(v["jaccard"]), **{m: summary(v[m]) for m in OVERLAP_MEASURES}, "values": v}
            for group, v in values.items()}


def length_by_label(lengths: Sequence[int], labels: Sequence[int], names: Sequence[str] = nli_data.NLI_LABELS) -> dict:
    """{label name | "overall": mean, median, min, max, histogram {length: count}, binned counts}."""
    groups = {group: [] for group in (*names, "overall")}
    for length, label in zip(lengths, labels, strict=True):
        groups[names[label]].append(length)
        groups["overall"].append(length)
    out = {}
    for group, values in groups.items():
        histogram = collections.Counter(values)
        binned = {_bin_name(lo, hi): sum(c for n, c in histogram.items() if n >= lo and (hi is None or n <= hi))
                  for lo, hi in LENGTH_BINS}
        binned = {"0": histogram.get(0, 0), **binned} if histogram.get(0) else binned
        out[group] = {"count": len(values), **summary(values), "min": min(values, default=None),
                      "max": max(values, default=None), "histogram": {str(n): histogram[n] for n in sorted(histogram)},
                      "binned": binned, "values": values}
    return out


def _bin_name(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else f"{lo}-{hi}"


def label_counts(labels: Sequence[int], names: Sequence[str]) -> dict:
    counter = collections.Counter(labels)
    total = len(labels)
    out = {name: {"count": counter[i], "share": counter[i] / total if total else 0.0} for i, name in enumerate(names)}
    out["overall"] = {"count": total, "share": 1.0 if total else 0.0}
    return out


def category_counts(examples: Sequence[dict], names: Sequence[str]) -> dict:
    """{category: {value: {label name: count}}}: whether a category is skewed towards a label."""
    out = collections.defaultdict(lambda: collections.defaultdict(lambda: dict.fromkeys(names, 0)))
    for example in examples:
        for name, value in example["categories"].items():
            out[name][value][names[example["label"]]] += 1
    return {name: {value: dict(v) for value, v in sorted(values.items())} for name, values in sorted(out.items())}


# --- data --------------------------------------------------------------------------------------

def nli_task_corpora() -> dict[str, str]:
    """{registered NLI task name: the corpus its data comes from}. The translate-train task is
    analysed on its machine-translated training corpus (its IndoNLI splits are `indonli`'s)."""
    return {task: corpus.name for task, corpus in sorted(TASK_CORPORA.items())}


def corpus_for_task(task_name: str) -> nli_data.NLICorpus:
    if task_name not in TASK_CORPORA:
        raise ValueError(f"unknown NLI task {task_name!r}; registered NLI tasks: {sorted(TASK_CORPORA)}")
    return TASK_CORPORA[task_name]


def resolve_split(corpus: nli_data.NLICorpus, source: str, split: str) -> tuple[str, str]:
    """(split name, file). "train" on a corpus without a plain train split (OCNLI) means its
    largest training file present, as OCNLITask chooses."""
    files = nli_data.split_files(corpus, source)
    if split in files:
        return split, files[split]
    if split == "train":
        for name in corpus.splits:  # the spec lists OCNLI's training files largest first
            if name.startswith("train_") and name in files:
                return name, files[name]
    known = sorted(corpus.splits)
    raise FileNotFoundError(f"{corpus.name}: split {split!r} not found in {source} "
                            f"(splits of this corpus: {known}; present: {sorted(files)})")


def load_split(corpus: nli_data.NLICorpus, split: str, path: str) -> list[dict]:
    """The split's examples, validated by the corpus spec (errors name file and line), with
    `idx` = position in the file's examples, as the training loop numbers them."""
    examples = read_validated(path, corpus.splits[split].reader, corpus.parse, dropped=corpus.dropped_rows,
                              id_field=corpus.id_field)
    for index, example in enumerate(examples):
        example["idx"] = index
    return examples


# --- hypothesis-only predictions ---------------------------------------------------------------

def read_predictions(path: str, names: Sequence[str] = nli_data.NLI_LABELS) -> list[tuple[int, dict]]:
    """(line number, row) of a run's predictions.jsonl, each row checked for the fields that
    ClassificationTask.prediction_records writes (labels among the corpus's `names`)."""
    if not storage.isfile(path):
        raise FileNotFoundError(f"predictions file {path} not found")
    rows = []
    with storage.open(path, "r", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{number}: malformed JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in ("split", "id", "prediction") if k not in row]
            if missing:
                raise DataError(f"{path}:{number}: missing field(s) {missing} "
                                "(is this an NLI run's predictions.jsonl?)")
            if row.get("label") is None:
                raise DataError(f"{path}:{number}: no gold label; predictions of unlabelled input (finetune.predict) "
                                "cannot be scored")
            for field in ("label", "prediction"):
                if row[field] not in names:
                    raise DataError(f"{path}:{number}: {field} {row[field]!r} is not one of {list(names)}")
            rows.append((number, row))
    if not rows:
        raise DataError(f"{path}: no predictions")
    return rows


def join_predictions(path: str, rows: Sequence[tuple[int, dict]], corpus: nli_data.NLICorpus, source: str
                     ) -> dict[str, list[tuple[dict, int]]]:
    """{split: [(example, predicted label)]}, each row matched to its example by split + id.

    A split the task builds itself rather than reads from one file (InferES' validation and
    topic_ood, carved from train and test) is matched by id over all the corpus' files. A
    duplicated id is told apart by `idx`. A row without exactly one matching example, whose gold
    label differs from the file's, or that repeats an example already predicted, is an error
    naming the predictions file and line."""
    files = nli_data.split_files(corpus, source)
    loaded: dict[str, list[dict]] = {}

    def examples_of(split):
        if split not in loaded:
            loaded[split] = load_split(corpus, split, files[split])
        return loaded[split]

    index: dict[str, dict[str, list[dict]]] = {}
    out = collections.defaultdict(list)
    matched: dict[tuple[str, int], int] = {}  # (split, example) -> line of its prediction
    for number, row in rows:
        split, example_id = str(row["split"]), str(row["id"])
        if split not in index:
            if split in corpus.splits and split not in files:
                raise DataError(f"{path}:{number}: split {split!r} but {corpus.splits[split].filename} is not in "
                                f"{source}")
            searched = [split] if split in files else list(files)
            index[split] = collections.defaultdict(list)
            for name in searched:
                for example in examples_of(name):
                    index[split][example["id"]].append(example)
        candidates = index[split].get(example_id, [])
        if len(candidates) > 1:
            candidates = [e for e in candidates if e["idx"] == row.get("idx")] or candidates
        where = f"split {split!r} of {corpus.name} in {source}"
        if not candidates:
            note = "" if split in files else f" (not a file of the corpus: searched {sorted(files)})"
            raise DataError(f"{path}:{number}: no example with id {example_id!r} in {where}{note}; "
                            "are the predictions from a run on this corpus and source?")
        if len(candidates) > 1:
            raise DataError(f"{path}:{number}: id {example_id!r} matches {len(candidates)} examples in {where} "
                            "and idx does not tell them apart")
        example = candidates[0]
        if row["label"] != corpus.labels[example["label"]]:
            raise DataError(f"{path}:{number}: gold label {row['label']!r} for id {example_id!r} but the data file "
                            f"says {corpus.labels[example['label']]!r}; the predictions do not belong to {where}")
        if (split, id(example)) in matched:
            raise DataError(f"{path}:{number}: a second prediction for id {example_id!r} in split {split!r} "
                            f"(first on line {matched[split, id(example)]})")
        matched[split, id(example)] = number
        out[split].append((example, corpus.labels.index(row["prediction"])))
    return dict(out)


def hypothesis_only_report(joined: dict[str, list[tuple[dict, int]]], names: Sequence[str]) -> dict:
    """Per split: accuracy overall, by gold label, by every category and by tag (as NLITask.report)."""
    out = {}
    for split, pairs in joined.items():
        examples = [e for e, _ in pairs]
        gold = [e["label"] for e in examples]
        predicted = [p for _, p in pairs]
        by_label = accuracy_by(gold, predicted, [names[g] for g in gold])
        report = {"count": len(gold), "accuracy": accuracy(gold, predicted),
                  "by_label": {name: by_label[name] for name in names if name in by_label}}
        for name in sorted({k for e in examples for k in e["categories"]}):
            groups = [e["categories"].get(name, "unknown") for e in examples]
            report[f"by_{name}"] = accuracy_by(gold, predicted, groups)
        if any(e["tags"] for e in examples):
            report["by_tag"] = accuracy_by_tag(gold, predicted, [e["tags"] for e in examples])
        out[split] = report
    return out


def run_settings(predictions_path: str) -> dict | None:
    """The run's results.json next to its predictions, if any: says whether it was hypothesis-only."""
    path = os.path.join(os.path.dirname(storage.resolve(predictions_path)), "results.json")
    if not storage.isfile(path):
        return None
    results = json.loads(storage.read_text(path))
    return {"task": results.get("task"), "hypothesis_only": results.get("hypothesis_only")}


# --- the whole analysis ------------------------------------------------------------------------

def analyse(task: str, source: str, workdir: str, *, split: str = "train", predictions: str | None = None,
            top_k: int = 10, smoothing: float = 100.0, min_count: int = 5, plots: bool = True) -> dict:
    """Computes every statistic for one split of a task's corpus and writes analysis.json,
    analysis.md and the PNG plots into `workdir`; returns the report (analysis.json's content).
    Predictions are checked before anything is written, so a bad file leaves no partial output."""
    check_tool_output(workdir, "--workdir", read_flag="--predictions", directory=True,
                      reads=[storage.resolve(predictions), os.path.dirname(storage.resolve(predictions))]
                      if predictions else [])
    corpus = corpus_for_task(task)
    split, path = resolve_split(corpus, source, split)
    examples = load_split(corpus, split, path)
    hypothesis_only = None
    if predictions:
        joined = join_predictions(predictions, read_predictions(predictions, corpus.labels), corpus, source)
        hypothesis_only = {"file": storage.resolve(predictions), "run": run_settings(predictions),
                           "splits": hypothesis_only_report(joined, corpus.labels)}

    names = corpus.labels
    tokenization = corpus.analysis_tokenization
    tokenize = TOKENIZERS[tokenization]
    pairs = [(tokenize(e["premise"]), tokenize(e["hypothesis"])) for e in examples]
    labels = [e["label"] for e in examples]
    pmi = label_word_pmi([h for _, h in pairs], labels, num_labels=len(names), smoothing=smoothing,
                         min_count=min_count, top_k=top_k)
    overlap = overlap_by_label(pairs, labels, names)
    lengths = length_by_label([len(h) for _, h in pairs], labels, names)

    report = {
        "task": task, "corpus": corpus.name, "split": split, "file": storage.resolve(path), "labels": list(names),
        "settings": {"tokenization": tokenization, "pmi_smoothing": smoothing, "pmi_min_count": min_count,
                     "pmi_log": "natural", "top_k": top_k},
        "counts": label_counts(labels, names),
        "category_counts": category_counts(examples, names),
        "pmi": {names[i]: entries for i, entries in enumerate(pmi)},
        "overlap": {g: {k: v for k, v in stats.items() if k != "values"} for g, stats in overlap.items()},
        "hypothesis_length": {g: {k: v for k, v in stats.items() if k != "values"} for g, stats in lengths.items()},
    }
    if hypothesis_only is not None:
        report["hypothesis_only"] = hypothesis_only
    if plots:
        report["plots"] = write_plots(workdir, report, overlap, lengths)
    storage.write_text(storage.under(workdir, "analysis.json"), json.dumps(report, indent=2, ensure_ascii=False))
    storage.write_text(storage.under(workdir, "analysis.md"), markdown(report))
    return report


# --- output ------------------------------------------------------------------------------------

def _number(value, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def markdown(report: dict) -> str:
    """analysis.md: every table of analysis.json (4 decimals for rates and PMI, 2 for lengths)."""
    s = report["settings"]
    names = report["labels"]
    groups = (*names, "overall")
    lines = [f"# Artifact analysis: {report['task']} ({report['corpus']}), split `{report['split']}`", "",
             f"Data: `{report['file']}`. Tokenisation: {s['tokenization']} (lowercased). "
             f"PMI: natural log, add-{s['pmi_smoothing']:g} smoothing, words with at least "
             f"{s['pmi_min_count']} occurrences in all hypotheses. Numbers: `analysis.json`.", ""]

    lines += ["## Label counts", ""]
    lines += _table(["label", "count", "share"],
                    [(g, report["counts"][g]["count"], _number(report["counts"][g]["share"])) for g in groups])
    for name, values in report["category_counts"].items():
        lines += [f"Labels by `{name}`:", ""]
        lines += _table([name, *names, "total"],
                        [(value, *(c[l] for l in names), sum(c.values())) for value, c in values.items()])

    lines += ["## Label–word PMI (hypotheses)", "",
              "Top words per gold label; `count`: occurrences in that label's hypotheses, `total`: in all "
              "hypotheses, `share`: fraction of that label's hypotheses containing the word.", ""]
    for label in names:
        lines += [f"### {label}", ""]
        lines += _table(["rank", "word", "PMI", "count", "total", "share"],
                        [(rank, e["word"], _number(e["pmi"]), e["count"], e["total_count"],
                          _number(e["hypothesis_share"])) for rank, e in enumerate(report["pmi"][label], start=1)])

    lines += ["## Premise–hypothesis overlap", "",
              "Token Jaccard of the type sets; LCS ratio: longest common subsequence (tokens) over hypothesis "
              "length; new-token rate: share of hypothesis tokens absent from the premise.", ""]
    columns = [(m, stat) for m in OVERLAP_MEASURES for stat in ("mean", "median")]
    lines += _table(["label", "n", *(f"{m} {stat}" for m, stat in columns)],
                    [(g, report["overlap"][g]["n"], *(_number(report["overlap"][g][m][stat]) for m, stat in columns))
                     for g in groups])

    lines += ["## Hypothesis length (tokens)", ""]
    lengths = report["hypothesis_length"]
    bins = list(lengths["overall"]["binned"])
    lines += _table(["label", "count", "mean", "median", "min", "max", *bins],
                    [(g, lengths[g]["count"], _number(lengths[g]["mean"], 2), _number(lengths[g]["median"], 2),
                      lengths[g]["min"], lengths[g]["max"], *(lengths[g]["binned"].get(b, 0) for b in bins))
                     for g in groups])

    if "hypothesis_only" in report:
        h = report["hypothesis_only"]
        lines += ["## Hypothesis-only predictions", "", f"Predictions: `{h['file']}`."]
        run = h.get("run")
        if run is not None:
            note = ("" if run.get("hypothesis_only")
                    else " **(not a hypothesis-only run: read these as a full model's)**")
            lines += [f"The run's results.json: task `{run.get('task')}`, hypothesis_only = "
                      f"{run.get('hypothesis_only')}{note}."]
        lines += [""]
        for split, r in h["splits"].items():
            lines += [f"### {split}: accuracy {_number(r['accuracy'])} ({r['count']} examples)", ""]
            for key, breakdown in r.items():
                if key.startswith("by_"):
                    lines += _table([key[3:], "accuracy", "count"],
                                    [(g, _number(v["accuracy"]), v["count"]) for g, v in breakdown.items()])

    if "plots" in report:
        lines += ["## Plots", ""]
        lines += [f"![{name}]({file})" + "\n" for name, file in report["plots"].items()]
    return "\n".join(lines).rstrip() + "\n"


_CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei",
              "Source Han Sans SC", "SimHei", "Microsoft YaHei", "PingFang SC", "AR PL UMing CN")


def _plot_word(word: str, cjk_font: bool) -> str:
    """The word as a bar label; CJK characters as code points when no installed font has them."""
    if cjk_font or not re.search(f"[{_CJK}]", word):
        return word
    return " ".join(f"U+{ord(c):04X}" if re.match(f"[{_CJK}]", c) else c for c in word)


def write_plots(workdir: str, report: dict, overlap: dict, lengths: dict) -> dict[str, str]:
    """overlap.png, hypothesis_length.png and pmi.png (Agg backend: no display needed);
    returns {title: file name} for the markdown."""
    import matplotlib  # late: plots only; a command that draws none does not pay for matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # late: after matplotlib.use("Agg")
    from matplotlib import font_manager  # late: as matplotlib above

    installed = {f.name for f in font_manager.fontManager.ttflist}
    cjk = [name for name in _CJK_FONTS if name in installed]
    names = report["labels"]
    colours = dict(zip(names, ("tab:green", "tab:gray", "tab:red", "tab:blue", "tab:orange")))
    title = f"{report['corpus']} {report['split']}"
    files = {}
    with plt.rc_context({"font.sans-serif": [*cjk, "DejaVu Sans"]}):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for ax, measure in zip(axes, OVERLAP_MEASURES):
            for label in names:
                values = overlap[label]["values"][measure]
                if values:
                    ax.hist(values, bins=20, range=(0, 1), density=True, histtype="step", linewidth=1.8,
                            color=colours[label], label=f"{label} (mean {statistics.fmean(values):.3f})")
            ax.set_title(measure.replace("_", " "))
            ax.set_xlabel(measure)
            ax.set_ylabel("density")
            ax.legend(fontsize=8)
        fig.suptitle(f"{title}: premise–hypothesis overlap per gold label")
        fig.tight_layout()
        files["premise-hypothesis overlap per label"] = _save(fig, workdir, "overlap.png")

        all_lengths = lengths["overall"]["values"]
        top = max(1, int(sorted(all_lengths)[int(0.995 * (len(all_lengths) - 1))])) if all_lengths else 1
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for label in names:
            values = [min(v, top) for v in lengths[label]["values"]]
            if values:
                ax.hist(values, bins=[b - 0.5 for b in range(0, top + 2)], histtype="step", linewidth=1.8,
                        color=colours[label], label=f"{label} (mean {statistics.fmean(lengths[label]['values']):.2f})")
        ax.set_xlabel(f"hypothesis length in tokens (last bin: {top} or more)")
        ax.set_ylabel("hypotheses")
        ax.set_title(f"{title}: hypothesis length per gold label")
        ax.legend()
        fig.tight_layout()
        files["hypothesis length per label"] = _save(fig, workdir, "hypothesis_length.png")

        fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), max(3.0, 0.35 * report["settings"]["top_k"] + 1.5)))
        for ax, label in zip(axes, names):
            entries = report["pmi"][label][::-1]
            ax.barh([_plot_word(e["word"], bool(cjk)) for e in entries], [e["pmi"] for e in entries],
                    color=colours[label])
            ax.set_title(label)
            ax.set_xlabel("PMI(word, label)")
        fig.suptitle(f"{title}: top hypothesis words by PMI per gold label")
        fig.tight_layout()
        files["label-word PMI"] = _save(fig, workdir, "pmi.png")
    return files


def _save(fig, workdir: str, name: str) -> str:
    import matplotlib.pyplot as plt  # late: plots only (write_plots chose the Agg backend)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    storage.write_bytes(storage.under(workdir, name), png.getvalue())  # local or gs://
    return name


# --- command line ------------------------------------------------------------------------------

def define_flags() -> None:
    flags.DEFINE_string("task", None, "Registered NLI task: indonli, ocnli, inferes, indonli_translate_train.")
    flags.DEFINE_string("source", None, "Folder with the corpus' official files (e.g. ../shared/data/indonli).")
    flags.DEFINE_string("workdir", None, "Output folder for analysis.md, analysis.json and the plots.")
    flags.DEFINE_string("split", "train", "Split to analyse; 'train' on OCNLI means its largest training file.")
    flags.DEFINE_string("predictions", None, "A hypothesis-only run's predictions.jsonl: accuracy by label/category/tag.")
    flags.DEFINE_integer("top_k", 10, "PMI words listed per label.", lower_bound=1)
    flags.DEFINE_float("pmi_smoothing", 100.0, "k of the add-k smoothing of (word, label) counts.", lower_bound=0.0)
    flags.DEFINE_integer("pmi_min_count", 5, "Words with fewer occurrences in all hypotheses are not ranked.",
                         lower_bound=1)
    flags.mark_flags_as_required(["task", "source", "workdir"])


def main(argv) -> None:
    """python -m nli_jax.analysis artifacts --task=indonli --source=DIR --workdir=OUT [--split=train]
    [--predictions=RUN/predictions.jsonl] [--top_k=10]."""
    FLAGS = flags.FLAGS
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        report = analyse(FLAGS.task, FLAGS.source, FLAGS.workdir, split=FLAGS.split, predictions=FLAGS.predictions,
                         top_k=FLAGS.top_k, smoothing=FLAGS.pmi_smoothing, min_count=FLAGS.pmi_min_count)
    except (DataError, FileNotFoundError, ValueError) as e:
        sys.exit(f"nli_jax.analysis: error: {e}")
    print(f"{report['corpus']} {report['split']}: {report['counts']['overall']['count']} examples; "
          f"wrote {os.path.join(FLAGS.workdir, 'analysis.md')}")
