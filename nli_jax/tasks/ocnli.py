"""OCNLI (Hu et al., 2020), Chinese NLI: the corpus (four training files by size, dev as the
evaluation split, label '-' dropped as the paper does; accuracy by genre and by level; the artifact
analysis tokenizes it by character) and its task, trained on `task_options.train_size`, in one
module. Its CLUE leaderboard file: nli_jax.leaderboard (`--format=clue_ocnli`), which reads the
label names from this corpus.
"""
from __future__ import annotations

import dataclasses

from nli_jax.data.nli import NLICorpus, SplitFile, register_corpus, row_id
from nli_jax.data.readers import map_label, require_text
from nli_jax.plan import DataPlan, option
from nli_jax.tasks.nli import NLIOptions, NLITask, register_nli

OCNLI_CATEGORIES = ("genre", "level")


def _ocnli_parse(path: str, number: int, row: dict) -> dict | None:
    label = row.get("label")
    if label == "-":  # no majority label: excluded, as in the OCNLI paper
        return None
    return {"id": row_id(row.get("id")), "premise": require_text(path, number, row, "sentence1"),
            "hypothesis": require_text(path, number, row, "sentence2"),
            "label": map_label(path, number, label, {"entailment": 0, "neutral": 1, "contradiction": 2}),
            "categories": {k: str(row[k]) for k in OCNLI_CATEGORIES if row.get(k) is not None}, "tags": []}


OCNLI = register_corpus(NLICorpus(
    name="ocnli",
    categories=OCNLI_CATEGORIES,
    analysis_tokenization="chinese_characters",
    splits={"train_50k": SplitFile("train.50k.json"), "train_30k": SplitFile("train.30k.json"),
            "train_10k": SplitFile("train.10k.json"), "train_3k": SplitFile("train.3k.json"),
            "validation": SplitFile("dev.json", required=True)},
    parse=_ocnli_parse,
    dropped_rows="label '-' (no majority label: excluded, as in the OCNLI paper)",
    base_url="https://raw.githubusercontent.com/CLUEbenchmark/OCNLI/main/data/ocnli/",
    description="OCNLI (Hu et al., 2020), Chinese; dev is the evaluation split; label '-' dropped.",
))


@dataclasses.dataclass(frozen=True)
class OCNLIOptions(NLIOptions):
    train_size: str = option("50k", choices=("50k", "30k", "10k", "3k"))  # OCNLI's training file


class OCNLITask(NLITask):
    """OCNLI: train on `task_options.train_size` (50k / 30k / 10k / 3k), evaluate on dev."""

    def __init__(self, data: DataPlan, options: OCNLIOptions):
        super().__init__(OCNLI, data, options, train_split=f"train_{options.train_size}")

    def load(self, workdir=None):
        splits = super().load()
        if self.train_split not in splits:
            raise FileNotFoundError(f"ocnli: no training file for train_size={self.options.train_size!r} in "
                                    f"{self.data.source} (have {sorted(s for s in splits if s.startswith('train'))})")
        return splits


register_nli("ocnli", OCNLIOptions, corpus=OCNLI)(lambda plan: OCNLITask(plan.data, plan.task_options))
