"""IndoNLI translate-train (the IndoNLI paper's rows with XLM-R): the corpus (MNLI machine-translated to
Indonesian, the paper's translate_train_small sample) and the task that trains on it
(`task_options.translate_train_source`, optionally mixed with IndoNLI train) and evaluates on
IndoNLI, in one module. The artifact analysis reads its training corpus.
"""
from __future__ import annotations

import dataclasses

from nli_jax.data import nli as nli_data
from nli_jax.data.nli import NLICorpus, SplitFile, register_corpus, row_id
from nli_jax.data.readers import map_label, require_text
from nli_jax.data.records import InMemorySource
from nli_jax.errors import RunError
from nli_jax.plan import DataPlan, option
from nli_jax.tasks.indonli import INDONLI
from nli_jax.tasks.nli import NLIOptions, NLITask, register_nli, reindex


def _translate_train_parse(path: str, number: int, row: dict) -> dict | None:
    if row.get("gold_label") == "-":  # MNLI: no gold label
        return None
    return {"id": row_id(row.get("pairid")), "premise": require_text(path, number, row, "sentence1"),
            "hypothesis": require_text(path, number, row, "sentence2"),
            "label": map_label(path, number, row.get("gold_label"), {"entailment": 0, "neutral": 1, "contradiction": 2},
                               field="gold_label"),
            "categories": {"genre": str(row["genre"])} if row.get("genre") else {}, "tags": []}


TRANSLATE_TRAIN_SMALL = register_corpus(NLICorpus(
    name="indonli_translate_train_small",
    categories=("genre",),
    splits={"train": SplitFile("train.jsonl", required=True), "validation": SplitFile("dev.jsonl")},
    parse=_translate_train_parse,
    label_field="gold_label",
    id_field="pairid",
    dropped_rows="gold_label '-' (no gold label, as MNLI marks them)",
    description="MNLI machine-translated to Indonesian, the IndoNLI paper's translate-train-small sample "
                "(data/translate_train_small.tar.gz in the IndoNLI repository; extract it and pass the folder).",
))


@dataclasses.dataclass(frozen=True)
class TranslateTrainOptions(NLIOptions):
    translate_train_source: str = option("", path=True)  # the extracted translate_train_small folder
    mix_indonli_train: bool = option(False)  # IndoNLI's own training examples too


class TranslateTrainTask(NLITask):
    """IndoNLI's translate-train rows: train on machine-translated MNLI
    (`task_options.translate_train_source`), optionally mixed with IndoNLI train
    (`task_options.mix_indonli_train`), evaluate on IndoNLI."""

    def __init__(self, data: DataPlan, options: TranslateTrainOptions):
        super().__init__(INDONLI, data, options)
        self.name = "indonli_translate_train"

    def load(self, workdir=None):
        indonli = super().load()
        source = self.options.translate_train_source
        if not source:
            raise RunError("--config.task_options.translate_train_source='': the folder of the extracted translate_train_small.tar.gz")
        mt = nli_data.prepare(TRANSLATE_TRAIN_SMALL.name, source, self.data.tfds_dir)["train"]
        train = [dict(mt[i], origin="translate_train") for i in range(len(mt))]
        if self.options.mix_indonli_train:
            train += [dict(indonli["train"][i], origin="indonli") for i in range(len(indonli["train"]))]
        return dict(indonli, train=InMemorySource(reindex(sorted(train, key=lambda e: (e["origin"], e["idx"])))))


register_nli("indonli_translate_train", TranslateTrainOptions, corpus=TRANSLATE_TRAIN_SMALL)(
    lambda plan: TranslateTrainTask(plan.data, plan.task_options))
