"""Corpus mixtures: several named corpora (`pretrain.corpus=("id=/data/id/*.txt", "jv=/data/jv/*.txt")`),
each built into its own examples, sampled with a weight each (`pretrain.corpus_weights=("id=3", "jv=1")`)
or by one temperature for all (`pretrain.corpus_alpha`: p ∝ nᵅ over the corpora's training examples,
XLM-R's α = 0.3; neither: α = 1, in proportion to their sizes).

The mixture is a map-style source like one corpus's, so the input pipeline's seeded shuffle, its
epochs and its exact resume apply unchanged: element i of a mixture "epoch" of L elements is corpus
c's example (i - start_c) mod n_c, where corpus c holds ceil(p_c L) consecutive slots and L is the
smallest length in which every corpus has at least its n_c examples (so an epoch sees every example
of every corpus, the small ones repeated). Held-out examples stay per corpus, each tagged with its
corpus, so the held-out MLM accuracy is reported per corpus.
"""
from __future__ import annotations

import math
import re

import numpy as np

from nli_jax.data.records import read_many

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def named_corpora(patterns) -> dict[str, tuple[str, ...]] | None:
    """{name: globs} when `pretrain.corpus` names its corpora ("name=glob" entries; a name may
    come more than once), None for today's plain globs (one corpus). Raises ValueError for a mix
    of named and plain entries."""
    entries = [p for p in patterns if p]
    named = [p for p in entries if _is_named(p)]
    if not named:
        return None
    if len(named) != len(entries):
        plain = [p for p in entries if p not in named]
        raise ValueError(f"{plain[:3]} name no corpus while other entries do (NAME=GLOB): name every corpus of a "
                         "mixture")
    out: dict[str, tuple[str, ...]] = {}
    for entry in named:
        name, pattern = entry.split("=", 1)
        if not pattern:
            raise ValueError(f"{entry!r}: no glob after the name")
        out[name] = out.get(name, ()) + (pattern,)
    return out


def _is_named(entry: str) -> bool:
    return "=" in entry and bool(NAME.match(entry.split("=", 1)[0]))


def corpus_globs(patterns) -> tuple[str, ...]:
    """The globs of pretrain.corpus's entries, a mixture's names stripped."""
    return tuple(p.split("=", 1)[1] if _is_named(p) else p for p in patterns)


def parse_weights(entries) -> dict[str, float]:
    """{name: weight} of "name=weight" entries; ValueError naming a malformed one."""
    out = {}
    for entry in entries:
        name, _, value = entry.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not NAME.match(name) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"{entry!r}: expected NAME=WEIGHT with a weight > 0")
        if name in out:
            raise ValueError(f"{name!r} is weighted twice")
        out[name] = weight
    return out


def mixture_problems(corpus, weights, alpha: float, examples_dir: str) -> list[str]:
    """Why pretrain.corpus / corpus_weights / corpus_alpha do not make a mixture ([] when they do,
    or when there is no mixture and neither is set)."""
    try:
        names = named_corpora(corpus)
        given = parse_weights(weights)
    except ValueError as e:
        return [f"--config.pretrain.corpus / corpus_weights: {e}"]
    problems = []
    if names is None:
        if given or alpha:
            problems.append("--config.pretrain.corpus_weights / corpus_alpha: a mixture needs named corpora "
                            "(pretrain.corpus=('id=/data/id/*.txt', 'jv=/data/jv/*.txt'))")
        return problems
    if examples_dir:
        problems.append(f"--config.pretrain.examples_dir={examples_dir!r}: a mixture of named corpora builds each "
                        "corpus's examples in the workdir; leave examples_dir empty")
    if given and alpha:
        problems.append("--config.pretrain.corpus_weights and corpus_alpha: give weights or a temperature, not both")
    if given and set(given) != set(names):
        problems.append(f"--config.pretrain.corpus_weights={tuple(weights)}: weights for {sorted(given)} but the "
                        f"corpora are {sorted(names)}: weight each corpus once")
    return problems


def mixture_probabilities(sizes: dict[str, int], weights: dict[str, float], alpha: float) -> dict[str, float]:
    """Each corpus's sampling probability: its weight's share, else nᵅ's share (α = 1 when 0)."""
    raw = ({name: weights[name] for name in sizes} if weights else
           {name: float(n) ** (alpha or 1.0) for name, n in sizes.items()})
    total = sum(raw.values())
    return {name: value / total for name, value in raw.items()}


class MixtureSource:
    """A random-access mixture of random-access sources (each non-empty) at `probabilities`."""

    def __init__(self, sources: dict, probabilities: dict[str, float]):
        self.names = list(sources)
        self.sources = [sources[n] for n in self.names]
        sizes = np.array([len(s) for s in self.sources], np.int64)
        p = np.array([probabilities[n] for n in self.names], np.float64)
        length = max(math.ceil(n / q) for n, q in zip(sizes, p))  # every corpus at least once
        self.slots = np.array([max(int(math.ceil(q * length - 1e-9)), int(n)) for n, q in zip(sizes, p)], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.slots)])
        self.sizes = sizes

    def __len__(self):
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(corpus number, its example) of mixture element `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} examples")
        corpus = int(np.searchsorted(self.starts, index, side="right") - 1)
        return corpus, int((index - self.starts[corpus]) % self.sizes[corpus])

    def __getitem__(self, index):
        corpus, inner = self.locate(int(index))
        return dict(self.sources[corpus][inner], idx=int(index))

    def get_many(self, indices):
        """One batched read per corpus (its source's get_many when it has one)."""
        located = [self.locate(int(i)) for i in indices]
        out = [None] * len(located)
        for corpus, source in enumerate(self.sources):
            where = [k for k, (c, _) in enumerate(located) if c == corpus]
            if not where:
                continue
            inner = [located[k][1] for k in where]
            for k, row in zip(where, read_many(source, inner)):
                out[k] = dict(row, idx=int(indices[k]))
        return out

    def shares(self) -> dict[str, float]:
        """Each corpus's share of the mixture's elements."""
        return {n: float(s) / len(self) for n, s in zip(self.names, self.slots)}


class TaggedConcatenation:
    """Held-out sources one after the other, each example tagged with its corpus number
    (`corpus`) and numbered through (`idx`)."""

    def __init__(self, sources: dict):
        self.names = list(sources)
        self.sources = [sources[n] for n in self.names]
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in self.sources])]).astype(np.int64)

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, index):
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} examples")
        corpus = int(np.searchsorted(self.starts, index, side="right") - 1)
        return dict(self.sources[corpus][index - int(self.starts[corpus])], idx=index, corpus=np.int32(corpus))

    def get_many(self, indices):
        return [self[i] for i in indices]
