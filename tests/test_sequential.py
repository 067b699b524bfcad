"""Sequential fine-tuning (nli_jax/train/run_init.py): `model.init` naming a finished run's workdir
starts from its best parameters; the classification head is the source's when the labels agree
(same class, same labels, same order) and new otherwise, checked on the parameters; run.json and
results.json record it; bad sources are refused in one line naming the path before any data is
read; the contamination check also compares the evaluation splits with the source runs' training
data (a model trained on SmSA is never scored on NusaX-Indonesian)."""
import functools
import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from configs import indonli_large, indonlu, nusax as nusax_config
from nli_jax import planner
from nli_jax.errors import RunError
from nli_jax.hooks.overlap import OverlapError
from nli_jax.models.models import ForSequenceClassification
from nli_jax.train import run_init
from nli_jax.train.loop import train_and_evaluate
from nli_jax.train.setup import load_source_run, model_inputs, prepare


def nusax(shared_data, lang, init="", steps=2):
    config = nusax_config.get_config(f"lang={lang},cpu_test")
    config.data.source = str(shared_data / "nusax" / "sentiment")
    config.train.max_steps = steps
    config.model.init = str(init)
    return config


@pytest.fixture(scope="module")
def source_run(shared_data, tmp_path_factory):
    """A finished NusaX-Javanese run of the tiny model (2 steps)."""
    workdir = tmp_path_factory.mktemp("sequential") / "javanese"
    train_and_evaluate(nusax(shared_data, "javanese"), str(workdir))
    return workdir


def flat(params) -> dict:
    return {"/".join(str(getattr(p, "key", p)) for p in path): np.asarray(value)
            for path, value in jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]}


def source_params(workdir) -> dict:
    """The source run's best parameters, read back from its export."""
    model = ForSequenceClassification.from_pretrained(load_source_run(str(workdir)).directory)
    return flat(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_the_head_is_kept_only_for_the_same_head_class_and_labels_in_the_same_order(tmp_path):
    source = run_init.RunInit(workdir="/w", run_identity="id", content_digest="d", best_step=3, task="nusax",
                              labels=("negative", "neutral", "positive"), head_class="ForSequenceClassification",
                              directory=str(tmp_path), tokenizer_dir=str(tmp_path))
    assert source.head_decision("ForSequenceClassification", ["negative", "neutral", "positive"]) == (
        True, "same labels in the same order (negative, neutral, positive)")
    kept, why = source.head_decision("ForSequenceClassification", ["positive", "neutral", "negative"])
    assert not kept and why.startswith("same labels in another order")
    kept, why = source.head_decision("ForSequenceClassification", ["entailment", "neutral", "contradiction"])
    assert not kept and why.startswith("labels differ")
    kept, why = source.head_decision("ForTokenClassification", ["negative", "neutral", "positive"])
    assert not kept and "ForTokenClassification" in why
    assert source.record(False, why)["head"] == "new"


def test_same_labels_keep_the_sources_head_other_labels_get_a_new_one(shared_data, source_run, tmp_path):
    theirs = source_params(source_run)
    encoder = [k for k in theirs if k.startswith("encoder/")]
    head = [k for k in theirs if k.startswith("classifier/")]
    assert encoder and head

    same = prepare(planner.build_plan(nusax(shared_data, "madurese", init=source_run)), str(tmp_path / "mad"))
    ours = flat(same.params)
    assert same.init_from["head"] == "kept" and same.init_from["workdir"] == str(source_run)
    for k in encoder + head:
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)

    nli = indonli_large.indonli_config("cpu_test", init="")
    nli.model.init = str(source_run)
    other = prepare(planner.build_plan(nli), str(tmp_path / "nli"))
    ours = flat(other.params)
    assert other.init_from["head"] == "new" and other.init_from["head_reason"].startswith("labels differ")
    for k in encoder:
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)
    for k in head:
        assert ours[k].shape == theirs[k].shape and not np.array_equal(ours[k], theirs[k]), k


def test_a_sequential_run_records_its_source_in_run_json_and_results(shared_data, source_run, tmp_path):
    workdir = tmp_path / "madurese"
    results = train_and_evaluate(nusax(shared_data, "madurese", init=source_run), str(workdir))
    state = json.loads((workdir / "run.json").read_text())
    assert state["state"] == "finished"
    recorded = state["init_from"]
    assert recorded == results["init_from"]
    assert recorded["workdir"] == str(source_run) and recorded["head"] == "kept"
    assert recorded["best_step"] == 2 and recorded["labels"] == ["negative", "neutral", "positive"]
    assert recorded["run_identity"].startswith("config-sha256:") and recorded["content_digest"].startswith("sha256:")
    inputs = json.loads((workdir / "inputs.json").read_text())["model.init"]
    assert inputs == {f"{source_run}/best/2": f"{recorded['run_identity']}|{recorded['content_digest']}"}


def _refusal(shared_data, init) -> str:
    with pytest.raises(RunError) as e:
        model_inputs(planner.build_plan(nusax(shared_data, "madurese", init=init)))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"--config.model.init={init}: ")
    return message


def test_bad_sources_are_refused_in_one_line_naming_the_path(shared_data, source_run, tmp_path):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(source_run, unfinished)
    (unfinished / "run.json").write_text(json.dumps({"state": "interrupted", "step": 1, "total_steps": 2}))
    assert "the run was interrupted at step 1 of 2. Rerun its command to finish it, then start from it" in \
        _refusal(shared_data, unfinished)

    no_best = tmp_path / "no_best"
    shutil.copytree(source_run, no_best)
    shutil.rmtree(no_best / "best")
    assert "has no best/" in _refusal(shared_data, no_best)

    seeds = tmp_path / "seeds"
    shutil.copytree(source_run, seeds / "seed_1")
    shutil.copy(source_run / "results.json", seeds / "results.json")
    assert "holds the runs of several seeds (seed_1): name one of them" in _refusal(shared_data, seeds)

    foreign = tmp_path / "foreign"  # best/ copied into another run: its recorded identity is not this config's
    shutil.copytree(source_run, foreign)
    config = json.loads((foreign / "config.json").read_text())
    config["train"]["seed"] += 1
    (foreign / "config.json").write_text(json.dumps(config))
    assert "was written by another run" in _refusal(shared_data, foreign)


def test_a_model_trained_on_smsa_is_never_scored_on_nusax_indonesian(shared_data, tmp_path):
    smsa = indonlu.get_config("task=smsa,model=scratch,cpu_test")
    smsa.data.source = str(shared_data / "indonlu")
    smsa.train.max_steps = 2
    train_and_evaluate(smsa, str(tmp_path / "smsa"))
    # By provenance (NusaX's texts are SmSA's), before the text overlap (74 of NusaX-Indonesian's 100
    # validation texts are in SmSA's training split; docs/finetuning.md): also for a translation, which
    # shares no text with SmSA.
    for language in ("indonesian", "javanese"):
        with pytest.raises(OverlapError, match=r"model.init=.*smsa: the run .*smsa trained on smsa, and nusax's texts "
                                               r"are smsa's"):
            train_and_evaluate(nusax(shared_data, language, init=tmp_path / "smsa"), str(tmp_path / f"nusax_{language}"))
    # Allowed, the run records the text overlap with the run it starts from: 74 of the 100.
    allowed = nusax(shared_data, "indonesian", init=tmp_path / "smsa")
    allowed.data.allow_overlap = True
    results = train_and_evaluate(allowed, str(tmp_path / "nusax_allowed"))
    assert results["overlap"]["validation"]["earlier_runs"][str(tmp_path / "smsa")]["overlapping"] == 74


def test_the_chain_runs_its_links_in_order_and_a_rerun_resumes_without_rerunning_finished_links(shared_data, tmp_path):
    from finetune import chain
    sources = {"nusax": str(shared_data / "nusax" / "sentiment")}
    run = functools.partial(chain.run, ["javanese", "madurese"], "base", str(tmp_path / "chain"), sources,
                            ["train.max_steps=2"], cpu_test=True, direct=True)
    text, failures = run()
    assert not failures and "| javanese -> madurese |" in text and "| madurese directly |" in text
    first, second = tmp_path / "chain" / "1_javanese", tmp_path / "chain" / "2_madurese"
    recorded = json.loads((second / "run.json").read_text())["init_from"]
    assert recorded["workdir"] == str(first) and recorded["head"] == "kept"
    assert "init_from" not in json.loads((tmp_path / "chain" / "direct_madurese" / "results.json").read_text())
    finished = {p: p.stat().st_mtime_ns for p in (first / "results.json", first / "train.log")}
    (second / "results.json").unlink()  # the second link stopped after its last checkpoint
    (second / "run.json").write_text(json.dumps({"state": "interrupted", "step": 2, "total_steps": 2}))
    text_again, failures = run()
    assert not failures and text_again == text
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # the first link was not run again
    log = (second / "train.log").read_text()
    assert "resumed from" in log and "at step 2" in log.split("resumed from")[1]


def test_the_chain_refuses_an_unknown_link_or_a_single_link_before_any_run(tmp_path):
    from absl import app
    from finetune import chain
    with pytest.raises(app.UsageError, match=r"--links: unknown link 'klingon'; a link is a NusaX language"):
        chain.chain_of(["indonesian", "klingon"], "base", {})
    with pytest.raises(app.UsageError, match=r"--links=javanese: a chain needs at least two links"):
        chain.chain_of(["javanese"], "base", {})
    assert not list(tmp_path.iterdir())
