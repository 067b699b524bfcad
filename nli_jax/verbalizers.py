"""Label verbalisers: how a classification task's labels become NLI hypotheses, for zero-shot
classification with an NLI model (nli_jax.zero_shot) and for recasting a labelled task as NLI
pairs (nli_jax.tasks.universal).

A verbaliser is data, not code per task: a template with `{}` where a label's phrase goes (and
`{aspect}` where an aspect's phrase goes, for multi-aspect tasks) and the phrase of each label.
Any classification task whose label set is a row of DEFAULTS gets that row's Indonesian
template and phrases (SmSA and NusaX-Senti share positive / neutral / negative); any other task
takes a template and phrases from the user (`--template`, `--labels`).

A sentence-pair task (WReTE) is scored as NLI itself: its first text is the premise, its second
(through the template) the hypothesis, and its labels name the NLI outcome each stands for
(`entailment` or `not_entailment`).
"""
from __future__ import annotations

import dataclasses
import re
import string
from typing import Mapping

from nli_jax.errors import RunError

# The kinds of classification a verbaliser serves.
SINGLE, ASPECTS, PAIR = "single", "aspects", "pair"
# What a pair task's labels may stand for.
PAIR_OUTCOMES = ("entailment", "not_entailment")


@dataclasses.dataclass(frozen=True)
class Verbalizer:
    """`template.format(phrase, aspect=aspect phrase)` is a label's hypothesis; for a pair task
    `template.format(second text)` is the one hypothesis and `phrases` maps each label to its
    outcome (PAIR_OUTCOMES)."""
    template: str
    phrases: Mapping[str, str]
    kind: str = SINGLE
    aspects: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def hypothesis(self, label: str, aspect: str | None = None) -> str:
        if aspect is None:
            return self.template.format(self.phrases[label])
        return self.template.format(self.phrases[label], aspect=self.aspects.get(aspect, aspect.replace("_", " ")))


SENTIMENT = {"negative": "negatif", "neutral": "netral", "positive": "positif"}

# Aspect phrases of CASA (car reviews) and HoASA (hotel reviews).
ASPECT_PHRASES = {
    "fuel": "bahan bakar", "machine": "mesin", "others": "hal lain", "part": "suku cadang", "price": "harga",
    "service": "layanan", "ac": "AC", "air_panas": "air panas", "bau": "bau", "general": "keseluruhan",
    "kebersihan": "kebersihan", "linen": "linen", "sunrise_meal": "sarapan", "tv": "TV", "wifi": "wifi",
}

# (kind, label set) -> the Indonesian default. A task plugs in by its labels, whatever its name.
DEFAULTS: dict[tuple[str, frozenset], Verbalizer] = {
    (v.kind, frozenset(v.phrases)): v for v in (
        # SmSA, NusaX-Senti (every language: the hypothesis stays Indonesian unless given)
        Verbalizer("Sentimen teks ini {}.", SENTIMENT),
        # EmoT
        Verbalizer("Teks ini mengungkapkan rasa {}.", {"anger": "marah", "fear": "takut", "happy": "senang",
                                                      "love": "cinta", "sadness": "sedih"}),
        # CASA
        Verbalizer("Ulasan ini bernada {} tentang {aspect}.", SENTIMENT, ASPECTS, ASPECT_PHRASES),
        # HoASA ("neut": the aspect is not judged)
        Verbalizer("Ulasan ini bernada {} tentang {aspect}.",
                   {"neg": "negatif", "neg_pos": "negatif dan positif", "neut": "netral", "pos": "positif"},
                   ASPECTS, ASPECT_PHRASES),
        # WReTE: sentence A entails (or paraphrases) sentence B, or not
        Verbalizer("{}", {"Entail_or_Paraphrase": "entailment", "NotEntail": "not_entailment"}, PAIR),
    )}


def check_template(template: str, kind: str) -> None:
    """A template must have one `{}` (the label's phrase, or a pair task's second text) and no
    other field than `{aspect}` (multi-aspect tasks)."""
    allowed = {"aspect"} if kind == ASPECTS else set()
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise RunError(f"--template={template!r}: not a template ({e})") from None
    if fields.count("") != 1 or any(f not in allowed and f != "" for f in fields):
        what = "`{}` for the label's phrase" + (" and optionally `{aspect}`" if kind == ASPECTS else "")
        if kind == PAIR:
            what = "`{}` for the pair's second text"
        raise RunError(f"--template={template!r}: a template needs exactly one {what}, and no other field "
                       f"(found {['{' + f + '}' for f in fields] or 'no field'})")


def parse_labels(text: str) -> dict[str, str]:
    """'negative=negatif,neutral=netral' -> {label: phrase}; a phrase may hold spaces."""
    pairs = [part for part in re.split(r",(?=[^,=]+=)", text.strip()) if part.strip()] if text.strip() else []
    if not pairs:
        raise RunError(f"--labels={text!r}: an empty label list; give label=phrase pairs, e.g. "
                       "--labels=negative=negatif,neutral=netral,positive=positif")
    out = {}
    for part in pairs:
        label, sep, phrase = part.partition("=")
        label, phrase = label.strip(), phrase.strip()
        if not sep or not label or not phrase:
            raise RunError(f"--labels={text!r}: {part!r} is not label=phrase")
        if label in out:
            raise RunError(f"--labels={text!r}: label {label!r} given twice")
        out[label] = phrase
    return out


def verbalizer_for(task_name: str, labels, kind: str, *, template: str | None = None,
                   phrases: Mapping[str, str] | None = None) -> Verbalizer:
    """The verbaliser of a task with `labels` (its label names) of `kind`: the user's template and
    phrases where given, else DEFAULTS' row for its label set. Refused in one line: a template
    without `{}`, an empty label list, phrases for labels the task lacks or missing for labels it
    has, a pair label that is no NLI outcome, a task without a default and none given."""
    labels = tuple(labels)
    if phrases is not None and not phrases:
        raise RunError(f"task {task_name!r}: an empty label list; every label needs a phrase ({list(labels)})")
    default = DEFAULTS.get((kind, frozenset(labels)))
    if default is None and (template is None or phrases is None):
        raise RunError(f"task {task_name!r} ({kind}, labels {list(labels)}) has no default verbaliser: give "
                       "--template (with `{}`) and --labels=label=phrase,...")
    template = default.template if template is None else template
    check_template(template, kind)
    phrases = dict(default.phrases if phrases is None else phrases)
    unknown = [label for label in phrases if label not in labels]
    missing = [label for label in labels if label not in phrases]
    if unknown or missing:
        raise RunError(f"task {task_name!r}: --labels " + "; ".join(
            ([f"names {unknown}, not its labels"] if unknown else []) +
            ([f"lacks {missing}"] if missing else [])) + f" (its labels: {list(labels)})")
    if kind == PAIR:
        wrong = {label: p for label, p in phrases.items() if p not in PAIR_OUTCOMES}
        if wrong or sorted(phrases.values()).count("entailment") != 1:
            raise RunError(f"task {task_name!r}: a pair task's labels map to NLI outcomes {PAIR_OUTCOMES}, exactly one "
                           f"to entailment; got {phrases}")
    return Verbalizer(template, phrases, kind, default.aspects if default else ASPECT_PHRASES)
