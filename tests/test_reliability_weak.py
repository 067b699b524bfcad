"""Reliability, fourth round (issue 53, item 4): the weak cases of the probe, each ending in one
clear line, a count in the log, or a refusal (docs/errors.md: §2, §8, §9, §14, §15, §18). Each
case runs the real command or the real function."""
import csv
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, config_for, task_for
from test_reliability_io import CPU_TEST, VAL, fake_run, one_line_error
from test_reliability_verified import commands, env_cpu

# --- Ctrl-C (§2) ----------------------------------------------------------------------------------

# finetune.main, with SIGINT sent to itself from inside the checkpoint write of step $SIGINT_AT,
# $SIGINT_TIMES times (a second Ctrl-C lands while the first one's checkpoint is still written).
CTRL_C_IN_A_CHECKPOINT = """
import os, signal, sys
from nli_jax.train import checkpointing
original, at, times = checkpointing.Checkpointer.save, int(sys.argv[1]), int(sys.argv[2])
def save(self, step, *args, **kwargs):
    if step == at and not kwargs.get("force"):
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
    return original(self, step, *args, **kwargs)
checkpointing.Checkpointer.save = save
sys.argv = [sys.argv[0]] + sys.argv[3:]
from nli_jax import cli
cli.define_flags()
cli.run(cli.main)
"""


def _ctrl_c_run(workdir, at, times, *extra):
    return subprocess.run([sys.executable, "-c", CTRL_C_IN_A_CHECKPOINT, str(at), str(times), f"--config={CPU_TEST}",
                           f"--workdir={workdir}", "--config.train.max_steps=6",
                           "--config.train.checkpoint_every_steps=2", *extra],
                          cwd=REPO, env=env_cpu(), capture_output=True, text=True, timeout=300)


def test_ctrl_c_during_a_checkpoint_write_saves_it_and_says_how_to_resume(tmp_path):
    """Ctrl-C while step 4's checkpoint was written: ~100 lines of tracebacks, run.json left
    "running". Now the write finishes, one line says the step and how to resume, exit 130."""
    workdir = tmp_path / "run"
    proc = _ctrl_c_run(workdir, 4, 1)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "SIGINT (Ctrl-C): checkpoint saved at step 4; exiting (rerun the same command to resume)" in proc.stderr
    state = json.loads((workdir / "run.json").read_text())
    assert (state["state"], state["step"]) == ("interrupted", 4)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_the_rerun_resumes(tmp_path):
    """Two Ctrl-C in step 4's checkpoint write: it stops at once, one line naming the kept
    checkpoint (step 2), run.json "interrupted"; the rerun resumes from step 2 and finishes."""
    workdir = tmp_path / "run"
    proc = _ctrl_c_run(workdir, 4, 2)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "interrupted (Ctrl-C)" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "interrupted (Ctrl-C) after the checkpoint of step 2 of 6 (kept); rerun the same command to resume from it"), lines
    state = json.loads((workdir / "run.json").read_text())
    assert (state["state"], state["step"]) == ("interrupted", 2)
    rerun = _ctrl_c_run(workdir, 0, 0)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert re.search(r"resumed from \S+ at step 2\n", (workdir / "train.log").read_text())
    assert json.loads((workdir / "run.json").read_text())["state"] == "finished"


# --- a tool's output that is a file (§15) ---------------------------------------------------------

def test_a_tools_output_directory_that_is_a_file_is_refused_naming_it(tmp_path):
    """export / predict / evaluate with --output (--workdir) an existing file: a FileExistsError
    traceback after the checkpoint was read. Now one line naming the path, the file unchanged."""
    run = fake_run(tmp_path / "run")
    existing = tmp_path / "notes.txt"
    existing.write_text("mine\n")
    cases = [
        (("finetune.export", f"--checkpoint={run}", f"--output={existing}"), "--output"),
        (("finetune.predict", f"--checkpoint={run}", f"--output={existing}", f"--input=x={VAL}"), "--output"),
        (("finetune.evaluate", f"--checkpoint={run}", f"--workdir={existing}"), "--workdir"),
        (("pretrain.build_vocab", f"--corpus={VAL}", f"--output_dir={existing}"), "--output_dir"),
    ]
    for proc, (argv, flag) in zip(commands(tmp_path, *(argv for argv, _ in cases)), cases):
        one_line_error(proc, f"{flag}={existing} is a file, not a directory")
    assert existing.read_text() == "mine\n"


# --- readers (§8, §9, §14) ------------------------------------------------------------------------

def _tagging_files(folder, train_tags, validation_tags):
    folder.mkdir()
    for name, tags in (("train_preprocess.txt", train_tags), ("valid_preprocess.txt", validation_tags)):
        words = ["budi", "datang", "ke", "kota"][:len(tags)]
        sentences = ["\n".join(f"{w}\t{t}" for w, t in zip(words, tags))] * 3
        (folder / name).write_text("\n\n".join(sentences) + "\n", encoding="utf-8")


def test_a_tag_outside_the_benchmarks_tag_set_is_refused_naming_file_and_line(tmp_path):
    """A NERP tag seen only in validation (B-ORG) became a 12th class silently: the IndoNLU
    benchmark's NERP has 11 tags (its LABEL2INDEX), whichever of them the files hold."""
    from nli_jax.data import indonlu
    from nli_jax.data.readers import DataError
    nerp = indonlu.TASKS["nerp"]
    _tagging_files(tmp_path / "bad", ["B-PPL", "O", "O", "B-PLC"], ["B-PPL", "O", "B-ORG", "O"])
    with pytest.raises(DataError, match=r"valid_preprocess.txt:3: tag 'B-ORG' is not one of NERP's 11 tags "
                                        r"\(the IndoNLU benchmark's tag set: \['B-EVT', "):
        indonlu.load_examples(nerp, str(tmp_path / "bad"))
    _tagging_files(tmp_path / "ok", ["B-PPL", "O", "O", "B-PLC"], ["B-PPL", "O", "O", "O"])
    assert len(indonlu.load_examples(nerp, str(tmp_path / "ok"))["validation"]) == 3
    assert indonlu.label_vocabulary(nerp) == sorted(indonlu.NERP_TAGS) and len(nerp.labels) == 11
    task = task_for(config_for("indonlu:task=nerp,cpu_test", f"data.source={tmp_path / 'ok'}"))
    assert task.labels == tuple(sorted(indonlu.NERP_TAGS))  # the model's classes, whatever the files hold


def test_tsv_classification_refuses_an_empty_text_as_the_other_readers(tmp_path):
    """`\\u200b\\tpos` (and ` \\tpos`) were read as an example of empty text ([CLS][SEP]), where
    SmSA's reader refuses it."""
    from nli_jax.data.readers import DataError
    (tmp_path / "labels.tsv").write_text("pos\tpositive\nneg\tnegative\n", encoding="utf-8")
    task = task_for(config_for("tsv_classification:cpu_test", f"data.source={tmp_path}",
                               f"task_options.label_map={tmp_path / 'labels.tsv'}"))
    for text in ("\u200b", " ", "\u00a0\u3000"):
        (tmp_path / "train.tsv").write_text(f"bagus sekali\tpos\n{text}\tpos\n", encoding="utf-8")
        with pytest.raises(DataError, match=r"train.tsv:2: empty text or label"):
            task.read_file(str(tmp_path / "train.tsv"))
        with pytest.raises(DataError, match=r"train.tsv:2: empty text or label"):
            task.read_file(str(tmp_path / "train.tsv"), labelled=False)
    (tmp_path / "train.tsv").write_text("bagus sekali\tpos\njelek\tneg\n", encoding="utf-8")
    assert [e["label"] for e in task.read_file(str(tmp_path / "train.tsv"))] == [0, 1]


def test_tsv_classification_refuses_an_empty_data_source(tmp_path):
    """--config.data.source= read train.tsv from the current directory ("dataset file train.tsv not
    found", naming no key; or whatever train.tsv lay there). The task has no files to download."""
    from nli_jax.errors import RunError
    (tmp_path / "labels.tsv").write_text("pos\tpositive\nneg\tnegative\n", encoding="utf-8")
    task = task_for(config_for("tsv_classification:cpu_test", "data.source=",
                               f"task_options.label_map={tmp_path / 'labels.tsv'}"))
    with pytest.raises(RunError, match=r"^--config.data.source='': the directory with your train.tsv and dev.tsv"):
        task.load()


def _inferes(folder, topics):
    folder.mkdir()
    with open(folder / "inferes_train.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["ID", "Premise", "Hypothesis", "Label", "Topic", "Anno", "Anno_Type"])
        for i, topic in enumerate(topics):
            writer.writerow([i, f"el perro {i} corre por el parque", f"un animal {i} se mueve",
                             ("ent", "neutral", "cnt")[i % 3], topic, "a", "Generate"])


def test_inferes_rows_without_a_topic_are_counted_and_left_out_of_a_topic_holdout(tmp_path, nli_log):
    """Rows with an empty Topic became topic "unknown" and stayed in training under
    holdout_topic: they could be the held-out topic. Counted in the log; under holdout_topic left
    out of every split (the paper trains on five topics and tests on the sixth)."""
    topics = [str(1 + i % 3) for i in range(60)]
    for i in (5, 17, 40):
        topics[i] = ""
    _inferes(tmp_path / "data", topics)

    def splits(*assignments):
        task = task_for(config_for("inferes:cpu_test", f"data.source={tmp_path / 'data'}",
                                   f"data.tfds_dir={tmp_path / 'tfds'}", *assignments))
        return {name: [source[i] for i in range(len(source))] for name, source in task.load().items()}
    held_out = splits("task_options.holdout_topic='2'")
    assert all(e["categories"]["topic"] in ("1", "3") for name in ("train", "validation") for e in held_out[name])
    assert sum(len(held_out[n]) for n in ("train", "validation", "topic_ood")) == 57
    assert ("InferES train (inferes_train.csv): 3 of 60 row(s) have an empty Topic (e.g. ID 5): left out of every "
            "split under task_options.holdout_topic=2 (a row of no known topic could be the held-out one)") in nli_log
    nli_log.clear()
    plain = splits()
    assert sum(len(plain[n]) for n in ("train", "validation")) == 60
    assert "InferES train (inferes_train.csv): 3 of 60 row(s) have an empty Topic (e.g. ID 5): reported under topic " \
           "'unknown'" in nli_log


# --- seeds and train.seed (§18) -------------------------------------------------------------------

def test_train_seed_beside_seeds_is_logged_as_unused(tmp_path, monkeypatch, nli_log):
    """--config.seeds=(1,2) with --config.train.seed=7: train.seed was ignored silently."""
    from nli_jax.train import loop
    monkeypatch.setattr(loop, "run_one", lambda plan, workdir, parent=None: {"splits": {}, "seed": plan.train.seed})
    monkeypatch.setattr(loop, "aggregate_seeds", lambda per_seed: {"seeds": sorted(per_seed)})
    loop.train_and_evaluate(config_for("indonli_large:cpu_test", "seeds=(1, 2)", "train.seed=7"), str(tmp_path / "w"))
    assert "train.seed=7 is not used: config.seeds=(1, 2) gives each run its seed" in nli_log
