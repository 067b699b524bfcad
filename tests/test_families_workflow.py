"""Every task from each model family added after BERT (DeBERTa-v3, ModernBERT), through the
workflow a researcher runs: the 12 IndoNLU tasks (finetune.indonlu_benchmark), IndoNLI with its
four files (the family's own configs/indonli_*.py:cpu_test), OCNLI and InferES, from a tiny random
model of the family on CPU. Each run finishes with its task's metric per split, predictions for
every validation example, calibration and training dynamics where the task has them, and an
export that transformers loads as the family's class and that predicts what the run predicted.

Real IndoNLU, OCNLI and InferES files are read from the shared data folder (conftest.shared_data;
skipped without it) and cut, in tmp, to their first rows: each run is a few steps."""
import json

import numpy as np
import pytest

from conftest import INDONLU_SMALL_ROWS, config_for, first_rows, task_for

# family -> (preset, transformers' class prefix, the family's IndoNLI config in configs/)
FAMILIES = {"deberta": ("tiny-deberta-v3", "DebertaV2", "indonli_mdeberta"),
            "modernbert": ("tiny-modernbert", "ModernBert", "indonli_mmbert")}
TRAIN, VALID = INDONLU_SMALL_ROWS  # IndoNLU rows (sentences for tagging tasks) per split
STEPS = 6
NLI_SPLITS = ("validation", "test_lay", "test_expert", "diagnostic")
PROBABILITY_TOLERANCE = 2e-6  # predictions.jsonl rounds to 6 decimals; found 5e-7


def _jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def small_data(indonlu_small, shared_data, tmp_path_factory):
    """IndoNLU (conftest.indonlu_small: TRAIN / VALID rows a task), OCNLI (train.3k.json /
    dev.json) and InferES cut to their first rows, in tmp."""
    needed = [shared_data / "ocnli" / "train.3k.json", shared_data / "inferes" / "inferes_train.csv"]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        pytest.skip(f"{len(missing)} of the real datasets' files not found, e.g. {missing[0]} (../shared/data/README.md)")
    root = tmp_path_factory.mktemp("small_data")
    (root / "indonlu").symlink_to(indonlu_small)
    first_rows(shared_data / "ocnli" / "train.3k.json", root / "ocnli" / "train.3k.json", 160, "lines")
    first_rows(shared_data / "ocnli" / "dev.json", root / "ocnli" / "dev.json", 60, "lines")
    first_rows(shared_data / "inferes" / "inferes_train.csv", root / "inferes" / "inferes_train.csv", 400, "csv")
    return root


def _chinese_vocabulary(source, directory):
    """A WordPiece vocabulary of OCNLI's characters: the shipped fixture's is Indonesian."""
    from nli_jax.pretraining.vocab import train_vocabulary
    sentences = directory / "sentences.txt"
    directory.mkdir(parents=True)
    with open(sentences, "w", encoding="utf-8") as out:
        for row in _jsonl(source / "train.3k.json") + _jsonl(source / "dev.json"):
            out.write(f"{row['sentence1']}\n{row['sentence2']}\n")
    return train_vocabulary([str(sentences)], str(directory / "vocab"), vocab_size=2000, min_frequency=1,
                            limit_alphabet=3000)


def _nli_configs(family, data, tmp):
    """{name: config} of the NLI runs: IndoNLI's four fixture files with the family's own config,
    OCNLI and InferES with the NLI cpu_test recipe and the family's tiny preset."""
    from configs import finetune_common
    from nli_jax import cli
    preset, _, indonli = FAMILIES[family]
    common = ["hooks.dynamics.enabled=True", "export_best=True", f"data.tfds_dir={tmp / 'tfds'}"]
    configs = {"indonli": config_for(f"{indonli}:cpu_test", f"eval_splits={NLI_SPLITS}", f"train.max_steps={2 * STEPS}",
                                     *common)}
    for name, splits in (("ocnli", ("validation",)), ("inferes", ("validation", "topic_ood"))):
        c = finetune_common.base_config(name)
        finetune_common.apply_nli_cpu_test(c)
        cli.apply_overrides(c, [f"model.preset={preset}", f"data.source={data / name}", f"train.max_steps={STEPS}",
                                f"eval_splits={splits}", *common])
        configs[name] = c
    configs["ocnli"].task_options.train_size = "3k"
    configs["ocnli"].model.tokenizer = _chinese_vocabulary(data / "ocnli", tmp / "ocnli_vocab")
    configs["inferes"].task_options.holdout_topic = "3"
    return configs


@pytest.fixture(scope="class")
def family_runs(request, small_data, tmp_path_factory):
    """Every task's run from the test class's family: {task: (config, workdir)}. The IndoNLU tasks
    through finetune.indonlu_benchmark (classification with training dynamics; the tagging tasks
    have none), the NLI corpora through the loop finetune.main runs."""
    from finetune import indonlu_benchmark
    from nli_jax.data import indonlu
    from nli_jax.train.loop import train_and_evaluate
    family = request.cls.family
    preset = FAMILIES[family][0]
    tmp = tmp_path_factory.mktemp(family)
    common = [f"model.preset={preset}", f"train.max_steps={STEPS}", "export_best=True", f"data.tfds_dir={tmp / 'tfds'}"]
    runs = {}
    for group, tasks, extra in (("classification", indonlu.CLASSIFICATION_TASKS, ["hooks.dynamics.enabled=True"]),
                                ("tagging", indonlu.SEQUENCE_LABELLING_TASKS, [])):
        workdir, overrides = tmp / group, common + extra
        _, failures = indonlu_benchmark.run_benchmark("large", str(workdir), str(small_data / "indonlu"), tasks,
                                                      overrides, cpu_test=True)
        assert not failures, failures
        configs = indonlu_benchmark.task_configs("large", str(small_data / "indonlu"), tasks, overrides, cpu_test=True)
        runs.update({task: (configs[task], workdir / task) for task in tasks})
    for name, config in _nli_configs(family, small_data, tmp).items():
        train_and_evaluate(config, str(tmp / name))
        runs[name] = (config, tmp / name)
    return family, runs


def _validation(workdir):
    return [r for r in _jsonl(workdir / "predictions.jsonl") if r["split"] == "validation"]


def _examples(config, split):
    """A split of a run's task as its loader reads it, in idx order (predictions.jsonl's)."""
    source = task_for(config).load()[split]
    return sorted((source[i] for i in range(len(source))), key=lambda e: int(e["idx"]))


def _padded(features, pad_id):
    """The examples' input_ids, attention_mask and token_type_ids as one batch, padded at the end
    to the longest (the mask zero there); their lengths."""
    lengths = [len(f["input_ids"]) for f in features]
    batch = {k: np.zeros((len(features), max(lengths)), np.int64)
             for k in ("input_ids", "attention_mask", "token_type_ids")}
    batch["input_ids"][:] = pad_id
    for row, (f, n) in enumerate(zip(features, lengths)):
        batch["input_ids"][row, :n] = f["input_ids"]
        batch["attention_mask"][row, :n] = 1
        batch["token_type_ids"][row, :n] = f["token_type_ids"]
    return batch, lengths


def _transformers_logits(model, features, pad_id):
    """A transformers model's logits for nli-jax-encoded examples, as one padded batch (one call:
    a call per example cost a minute a family); each example's own rows of them."""
    import torch
    batch, lengths = _padded(features, pad_id)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(batch["input_ids"]),
                       attention_mask=torch.tensor(batch["attention_mask"])).logits.float().numpy()
    return [x[:n] if x.ndim == 2 else x for x, n in zip(logits, lengths)]  # token logits: the real tokens'


def _check_export(family, task, config, workdir):
    """The run's export (export_best/) in transformers: the family's class, and the run's
    validation predictions from transformers' logits on inputs its exported tokenizer encodes."""
    import transformers
    prefix = FAMILIES[family][1]
    export = workdir / "export_best"
    written = json.loads((export / "config.json").read_text())
    if written["nli_jax"]["class"] == "ForMultiAspectClassification":  # one softmax per aspect, nli-jax's head
        labels = written["nli_jax"]["labels"]
    else:
        labels = [written["id2label"][str(i)] for i in range(len(written["id2label"]))]
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    bound = task_for(config).bind(tokenizer, labels=labels)
    examples = _examples(config, "validation")
    features = [bound.encoder(tokenizer)(e) for e in examples]
    ours = _validation(workdir)
    assert [r["idx"] for r in ours] == [int(e["idx"]) for e in examples], (family, task)
    from nli_jax.tasks.common import MultiAspectTask, TaggingTask
    tagging = isinstance(bound, TaggingTask)
    if isinstance(bound, MultiAspectTask):  # no transformers head: its encoder loads, nli-jax's head predicts
        import nli_jax
        base, info = transformers.AutoModel.from_pretrained(export, output_loading_info=True)
        assert type(base).__name__ == f"{prefix}Model" and not info["missing_keys"], (family, task, info)
        model = nli_jax.from_pretrained(str(export), task="multi_aspect_classification")
        batch, _ = _padded(features, tokenizer.pad_token_id)  # one call: eagerly, one per example took a minute
        all_logits = np.asarray(model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]))
        for logits, record in zip(all_logits, ours):
            assert record["prediction"] == {a: labels[i] for a, i in zip(bound.aspects, logits.argmax(-1))}, task
        return
    auto = transformers.AutoModelForTokenClassification if tagging else transformers.AutoModelForSequenceClassification
    model = auto.from_pretrained(export).eval()
    head = "TokenClassification" if tagging else "SequenceClassification"
    assert type(model).__name__ == f"{prefix}For{head}", (family, task, type(model).__name__)
    logits = _transformers_logits(model, features, tokenizer.pad_token_id)
    if tagging:  # word logits: the mean of each word's sub-token logits, as the run's
        for e, f, token_logits, record in zip(examples, features, logits, ours):
            words = len(f["word_mask"])
            membership = (f["word_index"][None, :] == np.arange(words)[:, None]).astype(np.float32)
            word_logits = membership @ token_logits / np.maximum(membership.sum(-1, keepdims=True), 1.0)
            tags = bound.predicted_tags(e, word_logits.argmax(-1), f["word_mask"])
            assert tags == record["prediction"], (family, task, record["idx"])
        return
    probabilities = np.stack([np.exp(x - x.max()) / np.exp(x - x.max()).sum() for x in logits])
    assert [labels[i] for i in probabilities.argmax(-1)] == [r["prediction"] for r in ours], (family, task)
    np.testing.assert_allclose(probabilities, [r["probabilities"] for r in ours], atol=PROBABILITY_TOLERANCE)
    return float(np.abs(probabilities - np.asarray([r["probabilities"] for r in ours])).max())


class _FamilyWorkflow:
    """The family's runs and their checks; one subclass per family (FAMILIES), each a unit of
    work of its own under --dist loadscope, so the two families' runs go to both workers."""
    family = None

    @pytest.mark.slow  # one family's 15 runs, shared by its 3 tests: 3-7 minutes on 2 cores at load 4-10
    def test_every_task_trains_and_reports_its_metric_per_split(self, family_runs):
        """results.json: the task's primary metric for every evaluated split, the examples counted;
        predictions.jsonl: one record for every validation example; calibration for every
        classification task; IndoNLI's four files with the diagnostic's tags."""
        from nli_jax.data import indonlu
        family, runs = family_runs
        for task, (config, workdir) in runs.items():
            results = json.loads((workdir / "results.json").read_text())
            assert 0 < results["steps"] <= config.train.max_steps, (family, task)  # or one epoch
            metric = results["primary_metric"]
            assert metric == ("f1" if task in indonlu.TASKS else "accuracy"), (family, task)
            assert set(results["splits"]) == set(config.eval_splits) - {"test"}, (family, task)  # no IndoNLU test files
            for split, report in results["splits"].items():
                assert 0.0 <= report[metric] <= 1.0 and report["count"] > 0, (family, task, split)
            validation = results["splits"]["validation"]
            assert len(_validation(workdir)) == validation["count"], (family, task)
            if task in indonlu.TASKS:
                assert validation["count"] == VALID, (family, task)
            if task not in indonlu.SEQUENCE_LABELLING_TASKS:
                calibration = validation["calibration"]
                assert {"ece", "brier", "nll"} <= set(calibration["raw"]), (family, task, calibration)
        for table in {workdir.parent / "table.md" for task, (_, workdir) in runs.items() if task in indonlu.TASKS}:
            assert f"(run: preset {FAMILIES[family][0]} from scratch)" in table.read_text(), (family, table)
        splits = json.loads((runs["indonli"][1] / "results.json").read_text())["splits"]
        assert set(splits) == set(NLI_SPLITS) and splits["diagnostic"]["by_tag"], family
        ocnli = json.loads((runs["ocnli"][1] / "results.json").read_text())["splits"]["validation"]
        assert set(ocnli["by_genre"]) and set(ocnli["by_level"]) <= {"easy", "medium", "hard"}, family
        inferes = json.loads((runs["inferes"][1] / "results.json").read_text())["splits"]
        assert set(inferes["topic_ood"]["by_topic"]) == {"3"}, family


    @pytest.mark.slow  # reads the runs of the test above
    def test_training_dynamics_cover_every_training_example_of_the_classification_tasks(self, family_runs):
        """hooks.dynamics: each classification run's records hold, for every training example
        it trained on, its gold label's probability."""
        from nli_jax.hooks import dynamics
        family, runs = family_runs
        recorded = [t for t, (c, _) in runs.items() if c.hooks.dynamics.enabled]
        assert len(recorded) == 5 + 3, (family, recorded)  # the 5 IndoNLU classification tasks and the NLI corpora
        for task in recorded:
            config, workdir = runs[task]
            records = dynamics.read_records(str(workdir))
            examples = len(_examples(config, getattr(task_for(config), "train_split", "train")))  # OCNLI's train_3k
            steps = json.loads((workdir / "results.json").read_text())["steps"]
            trained = min(steps * config.train.batch_size, examples)  # each seen at least once
            assert len(np.unique(records["idx"])) == trained and records["idx"].max() < examples, (family, task)
            assert np.all((records["gold_probability"] >= 0) & (records["gold_probability"] <= 1)), (family, task)


    @pytest.mark.slow  # reads the runs of the test above
    def test_every_export_loads_in_transformers_and_predicts_the_runs_predictions(self, family_runs):
        """export_best/ of every run: {Prefix}ForSequenceClassification (EmoT, SmSA, WReTE, IndoNLI,
        OCNLI, InferES) with the run's validation probabilities within 2e-6, {Prefix}ForTokenClassification
        (the 7 tagging tasks) whose sub-token logits averaged per word give the run's tags, and for
        CASA / HoASA (a head transformers has not) the encoder as {Prefix}Model and the run's
        per-aspect labels from nli-jax's reading of the export."""
        family, runs = family_runs
        gaps = {task: _check_export(family, task, config, workdir) for task, (config, workdir) in runs.items()}
        print(f"\n{family} exports, max |transformers - run| probability: "
              + ", ".join(f"{t} {g:.1e}" for t, g in gaps.items() if g is not None))


class TestDebertaWorkflow(_FamilyWorkflow):
    family = "deberta"


class TestModernbertWorkflow(_FamilyWorkflow):
    family = "modernbert"


def test_every_family_has_its_workflow_class():
    assert sorted(c.family for c in _FamilyWorkflow.__subclasses__()) == sorted(FAMILIES)
