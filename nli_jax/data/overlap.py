"""Train / evaluation overlap (contamination): which evaluation examples share text with the
training examples. Texts are normalised (Unicode NFKC, case-folded, every run of characters
other than letters and digits a word break); an evaluation example overlaps when its normalised
text equals a training example's (exact) or when each of its text fields is found in the
training examples' same field: the same text, or a shared sequence of NGRAM (8) words (n-gram).
N-grams are hashed into a set of the training side's, so the cost is linear in the words of
both sides (IndoNLI's 10k training pairs against its validation split: 0.15 s).

The fields compared are an example's text fields (TEXT_FIELDS: the premise and hypothesis of
NLI, the text of sentence tasks, the words of tagging tasks, the question of QA).
"""
from __future__ import annotations

import dataclasses
import re
import unicodedata
from typing import Iterable

NGRAM = 8
# Text fields of the examples the readers give, in the order they are joined for exact matches.
TEXT_FIELDS = ("premise", "hypothesis", "text", "text_a", "text_b", "question", "tokens")
_WORD_BREAK = re.compile(r"[\W_]+")


def normalised_words(text) -> list[str]:
    """Lower-cased words of a text (a list of words is joined first), punctuation dropped."""
    if isinstance(text, (list, tuple)):
        text = " ".join(str(t) for t in text)
    return [w for w in _WORD_BREAK.split(unicodedata.normalize("NFKC", str(text)).casefold()) if w]


def example_fields(example: dict) -> dict[str, list[str]]:
    """{field: its normalised words} of each text field an example has."""
    return {f: normalised_words(example[f]) for f in TEXT_FIELDS if example.get(f) is not None}


def _ngrams(words: list[str], n: int) -> Iterable[int]:
    return (hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1))


def _whole(fields) -> int:
    return hash(tuple(" ".join(words) for words in fields))


class TrainingIndex:
    """The training side: hashes of whole normalised examples, and per text field the hashes of
    its whole texts and of their n-grams."""

    def __init__(self, examples: Iterable[dict], n: int = NGRAM):
        self.n, self.whole, self.count = n, set(), 0
        self.fields: dict[str, tuple[set, set]] = {}  # field -> (whole texts, n-grams)
        for example in examples:
            fields = example_fields(example)
            self.count += 1
            self.whole.add(_whole(fields.values()))
            for name, words in fields.items():
                texts, grams = self.fields.setdefault(name, (set(), set()))
                texts.add(hash(tuple(words)))
                grams.update(_ngrams(words, n))

    def _field_found(self, name: str, words: list[str]) -> bool:
        texts, grams = self.fields.get(name, (set(), set()))
        return hash(tuple(words)) in texts or any(g in grams for g in _ngrams(words, self.n))

    def match(self, example: dict) -> str | None:
        """"exact", "ngram" or None for one evaluation example: exact when its whole normalised
        text is a training example's; ngram when each of its text fields is a training field's
        text or shares an n-gram with one (a pair task's premise alone is not enough: IndoNLI's
        validation pairs reuse the training premises with new hypotheses)."""
        fields = example_fields(example)
        if not fields:
            return None
        if _whole(fields.values()) in self.whole:
            return "exact"
        if all(self._field_found(name, words) for name, words in fields.items()):
            return "ngram"
        return None


@dataclasses.dataclass(frozen=True)
class Overlap:
    """One evaluation split against the training examples."""
    count: int  # evaluation examples
    exact: int  # with the same normalised text as a training example
    ngram: int  # not exact, but sharing an n-gram with one
    positions: tuple[int, ...]  # positions (in the split's order) of the overlapping examples
    n: int = NGRAM

    @property
    def overlapping(self) -> int:
        return self.exact + self.ngram

    @property
    def share(self) -> float:
        return self.overlapping / self.count if self.count else 0.0

    def as_dict(self) -> dict:
        return {"count": self.count, "exact": self.exact, f"shared_{self.n}gram": self.ngram,
                "overlapping": self.overlapping, "share": self.share}

    def describe(self) -> str:
        return (f"{self.overlapping} of {self.count} examples ({100 * self.share:.1f}%): {self.exact} exact, "
                f"{self.ngram} more sharing a {self.n}-word sequence")


def compare(index: TrainingIndex, examples: Iterable[dict]) -> Overlap:
    exact = ngram = count = 0
    positions = []
    for position, example in enumerate(examples):
        count += 1
        kind = index.match(example)
        if kind is not None:
            positions.append(position)
            exact += kind == "exact"
            ngram += kind == "ngram"
    return Overlap(count=count, exact=exact, ngram=ngram, positions=tuple(positions), n=index.n)
