"""IndoNLI (Mahendra et al., 2021): the corpus (its files, rows, labels e / n / c, the categories it
reports accuracy by: premise size and annotator; the diagnostic split's phenomena as tags) and its
task, in one module. `task_options.hypothesis_only`: the papers' hypothesis-only baseline.
"""
from __future__ import annotations

from nli_jax.data.nli import NLICorpus, SplitFile, register_corpus, row_id
from nli_jax.data.readers import DataError, map_label, read_json_records, require_text
from nli_jax.tasks.nli import NLIOptions, NLITask, register_nli

INDONLI_CATEGORIES = ("sentence_size", "annotator_type")


def _indonli_parse(path: str, number: int, row: dict) -> dict:
    labels = {"e": 0, "n": 1, "c": 2, "entailment": 0, "neutral": 1, "contradiction": 2}
    premise = require_text(path, number, row, "premise")
    hypothesis = require_text(path, number, row, "hypothesis")
    if "label" not in row:
        raise DataError(f"{path}:{number}: missing field 'label'")
    label = map_label(path, number, row["label"], labels)
    categories = {k: str(row[k]) for k in INDONLI_CATEGORIES if row.get(k) is not None}
    tags = row.get("inference_phenomena") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise DataError(f"{path}:{number}: 'inference_phenomena' must be a list of strings")
    return {"id": row_id(row.get("pair_id")), "premise": premise, "hypothesis": hypothesis, "label": label,
            "categories": categories, "tags": [t.strip() for t in tags if t.strip()]}


INDONLI = register_corpus(NLICorpus(
    name="indonli",
    categories=INDONLI_CATEGORIES,
    splits={
        "train": SplitFile("train.jsonl", required=True),
        "validation": SplitFile("val.jsonl", required=True),
        "test_lay": SplitFile("test_lay.jsonl"),
        "test_expert": SplitFile("test_expert.jsonl"),
        # One JSON array of 650 objects despite the .jsonl name; read_json_records takes both.
        "diagnostic": SplitFile("diagnostic.jsonl", reader=read_json_records),
    },
    parse=_indonli_parse,
    placeholder_label="e",
    id_field="pair_id",
    base_url="https://raw.githubusercontent.com/ir-nlp-csui/indonli/main/data/indonli/",
    description="IndoNLI (Mahendra et al., 2021): lay train/validation/test_lay, expert test_expert, diagnostic.",
))


register_nli("indonli", NLIOptions, corpus=INDONLI)(lambda plan: NLITask(INDONLI, plan.data, plan.task_options))
