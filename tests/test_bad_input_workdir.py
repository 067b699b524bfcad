"""Bad input and faults, second round (docs/errors.md §6-§11): a workdir is one run's (a lock,
tools that never write into a run), a run knows whether it finished (run.json, tools refuse an
unfinished one, results.json survives a resume), text that is empty to a reader is empty,
degenerate data is named, tools check what they are given, and every failure is one line.
Each refusal names the key, file and line, or the holder, before compute."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, config_for
from nli_jax.tasks.indonli import INDONLI

CPU_TEST = "configs/indonli_large.py:cpu_test"
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def env_cpu(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    env.update(extra)
    return env


def cli(module, *args, timeout=300, **env):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env_cpu(**env), capture_output=True,
                          text=True, timeout=timeout)


def one_line_error(proc, *fragments):
    """Exit status 1 and one `error: ...` line naming every fragment, no traceback, no usage."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "USAGE" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def train(workdir, *assignments, spec="indonli_large:cpu_test"):
    from nli_jax.train.loop import train_and_evaluate
    return train_and_evaluate(config_for(spec, f"data.tfds_dir={workdir.parent / 'tfds'}", *assignments),
                              str(workdir))


SHORT = ("train.max_steps=8", "train.checkpoint_every_steps=4", "train.eval_every_steps=4",
         "eval_splits=('validation',)")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 8-step run (checkpoints at 4 and 8)."""
    workdir = tmp_path_factory.mktemp("finished") / "run"
    train(workdir, *SHORT)
    return workdir


# --- 6. a run's workdir is one run's ---------------------------------------------------------

def _start(workdir, *overrides):
    return subprocess.Popen([sys.executable, "-m", "finetune.main", f"--config={CPU_TEST}", f"--workdir={workdir}",
                             f"--config.data.tfds_dir={workdir.parent / 'tfds'}", "--config.train.num_epochs=3",
                             *overrides], cwd=REPO, env=env_cpu(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def _wait_for(path, proc, seconds=300):
    deadline = time.time() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.05)


@pytest.mark.parametrize("second", [pytest.param((), marks=pytest.mark.slow), ("--config.optimizer.lr=0.002",)],
                         ids=["same-command", "other-lr"])
def test_a_second_command_on_a_workdir_in_use_is_refused_naming_the_holder(tmp_path, second):
    """The same command twice at once trained twice (doubled metrics.jsonl); with another lr the
    second died in orbax. The lock refuses the second before it reads anything."""
    workdir = tmp_path / "work"
    first = _start(workdir)
    _wait_for(workdir / "metrics.jsonl", first)
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={workdir}", "--config.train.num_epochs=3",
               f"--config.data.tfds_dir={tmp_path / 'tfds'}", *second)
    line = one_line_error(proc, f"{workdir} is in use: training by pid {first.pid} on", "One command at a time")
    assert "finetune.main" in line
    assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
    steps = [json.loads(row)["step"] for row in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == len(set(steps)), "two runs wrote the workdir"
    assert not (workdir / ".lock").exists()  # released at the end


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_a_killed_runs_rerun_takes_the_workdir_over_at_once(tmp_path):
    workdir = tmp_path / "work"
    first = _start(workdir)
    _wait_for(workdir / "checkpoints" / "18", first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (workdir / ".lock").exists()  # left by the killed run; the kernel released its flock
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={workdir}", "--config.train.num_epochs=3",
               f"--config.data.tfds_dir={tmp_path / 'tfds'}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in (workdir / "train.log").read_text()
    assert json.loads((workdir / "run.json").read_text())["state"] == "finished"


def test_the_bucket_lock_refuses_a_second_holder_and_takes_over_an_expired_lease(tmp_path, monkeypatch):
    """gs://: an object created only if absent; a successor takes an expired lease over."""
    import gcs_emulator
    server, url = gcs_emulator.start()
    try:
        for key, value in gcs_emulator.env(url).items():
            monkeypatch.setenv(key, value)
        from nli_jax import storage, workdir
        storage._configure_emulator()
        run = "gs://nli-test-bucket/runs/one"
        with workdir.lock(run, "training"):
            holder = json.loads(storage.read_text(run + "/.lock"))
            assert holder["pid"] == os.getpid() and holder["expires"] > time.time()
            with pytest.raises(workdir.WorkdirLockedError, match=rf"{run} is in use: training by pid {os.getpid()}"):
                workdir.lock(run, "finetune.evaluate").__enter__()
        assert not storage.exists(run + "/.lock")  # released
        # A holder that died: its lease expired a minute ago; the next command takes over.
        stale = dict(holder, pid=1, expires=time.time() - 60)
        storage.write_text(storage.under(run, ".lock"), json.dumps(stale))
        with workdir.lock(run, "training"):
            assert json.loads(storage.read_text(run + "/.lock"))["pid"] == os.getpid()
        # A live lease (renewed until the future) is respected.
        storage.write_text(storage.under(run, ".lock"), json.dumps(dict(stale, expires=time.time() + 600)))
        with pytest.raises(workdir.WorkdirLockedError, match="its lease renewed until"):
            workdir.lock(run, "training").__enter__()
    finally:
        server.kill()


@pytest.mark.parametrize("tool,flag", [("finetune.export", "--output"), ("finetune.predict", "--output"),
                                       ("finetune.evaluate", "--workdir")])
def test_tools_never_write_into_a_run(finished, tmp_path, tool, flag):
    """export --output=W replaced W/config.json with the Hugging Face config: the run could not
    be resumed. A tool writes to a directory of its own, not the run nor another run."""
    before = (finished / "config.json").read_bytes()
    extra = [f"--input=x={REPO / 'nli_jax/data/fixtures/nli_tiny/val.jsonl'}"] if tool == "finetune.predict" else []
    proc = cli(tool, f"--checkpoint={finished}", f"{flag}={finished}", *extra)
    one_line_error(proc, f"{flag}={finished} is the --checkpoint it reads: a tool never rewrites a run")
    other = tmp_path / "other_run"
    shutil.copytree(finished, other)
    proc = cli(tool, f"--checkpoint={finished}", f"{flag}={other}", *extra)
    one_line_error(proc, f"{flag}={other} holds a training run")
    assert (finished / "config.json").read_bytes() == before


# --- 7. a run knows whether it finished ------------------------------------------------------

def test_tools_refuse_an_interrupted_run_unless_told(tmp_path, monkeypatch):
    """After SIGTERM at step 4 of 8, predict and export used step 4's parameters silently."""
    from nli_jax.errors import RunError
    from nli_jax.train.checkpointing import Checkpointer
    from nli_jax.tools import export_checkpoint, predict_files
    original = Checkpointer.save

    def save_then_sigterm(self, step, *args, **kwargs):
        saved = original(self, step, *args, **kwargs)
        if step == 4 and not kwargs.get("force"):
            os.kill(os.getpid(), signal.SIGTERM)
        return saved
    monkeypatch.setattr(Checkpointer, "save", save_then_sigterm)
    workdir = tmp_path / "run"
    with pytest.raises(SystemExit):
        train(workdir, *SHORT)
    state = json.loads((workdir / "run.json").read_text())
    assert state["state"] == "interrupted" and state["step"] == 4 and state["total_steps"] == 8
    config = config_for("indonli_large:cpu_test", f"data.tfds_dir={tmp_path / 'tfds'}", *SHORT)
    files = {"x": str(REPO / "nli_jax/data/fixtures/nli_tiny/val.jsonl")}
    with pytest.raises(RunError, match=r"the run was interrupted at step 4 of 8; its best parameters so far are "
                                       r"from step 4. Rerun its command to finish it, or pass --allow_unfinished"):
        predict_files(config, str(tmp_path / "pred"), str(workdir), files)
    with pytest.raises(RunError, match="interrupted at step 4 of 8"):
        export_checkpoint(config, str(workdir), str(tmp_path / "hf"))
    assert not (tmp_path / "pred").exists() and not (tmp_path / "hf").exists()
    assert len(predict_files(config, str(tmp_path / "pred"), str(workdir), files, allow_unfinished=True)) == 60


def test_a_killed_run_is_not_finished(tmp_path):
    workdir = tmp_path / "work"
    first = _start(workdir)
    _wait_for(workdir / "checkpoints" / "18", first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    proc = cli("finetune.export", f"--checkpoint={workdir}", f"--output={tmp_path / 'hf'}")
    one_line_error(proc, "the run is still training, or was killed, at step", "--allow_unfinished")


# --- 8. text that is empty to a reader is empty ----------------------------------------------

def _indonli(tmp_path, rows):
    source = tmp_path / "data"
    source.mkdir()
    good = [{"premise": f"Kalimat nomor {i} tentang buku.", "hypothesis": f"Kalimat {i}.", "label": "enc"[i % 3]}
            for i in range(40)]
    (source / "train.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in good[:5] + rows + good[5:])
                                        + "\n", encoding="utf-8")
    (source / "val.jsonl").write_text("\n".join(json.dumps(r) for r in good[:6]) + "\n")
    return source


@pytest.mark.parametrize("text", ["\u00a0\u200b ", "\u200b", "\ufeff\u2060", "\u3000"])
def test_a_premise_of_invisible_characters_is_empty(tmp_path, text):
    """A premise of no-break and zero-width spaces encoded to [CLS][SEP]h[SEP] (a plain " " was refused)."""
    from nli_jax.data import nli
    from nli_jax.data.readers import DataError
    source = _indonli(tmp_path, [{"premise": text, "hypothesis": "h", "label": "e"}])
    with pytest.raises(DataError, match=r"train.jsonl:6: field 'premise' is empty \(only whitespace or invisible"):
        nli.load_examples(INDONLI, str(source))


def _tagging_file(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_a_tagging_line_with_more_fields_than_token_and_tag_names_the_line(tmp_path):
    """`amos<TAB>B-PPL<TAB>O` became the token 'amos<TAB>B-PPL' tagged O."""
    from nli_jax.data import indonlu
    from nli_jax.data.readers import DataError
    path = _tagging_file(tmp_path / "train_preprocess.txt", ["budi\tB-PPL", "datang\tO", "", "amos\tB-PPL\tO"])
    with pytest.raises(DataError, match=r"train_preprocess.txt:4: expected 'token<TAB>tag', got 3 tab-separated"):
        indonlu.read_file(indonlu.TASKS["nerp"], path)
    path = _tagging_file(tmp_path / "t2.txt", ["budi\tB-PPL", "\u00a0\u3000\tO"])
    with pytest.raises(DataError, match=r"t2.txt:2: empty token or tag"):
        indonlu.read_file(indonlu.TASKS["nerp"], path)
    path = _tagging_file(tmp_path / "t3.txt", ["budi\tB-PPL", "\u200b\t\u200b"])
    with pytest.raises(DataError, match=r"t3.txt:2: empty token or tag"):
        indonlu.read_file(indonlu.TASKS["nerp"], path)


def test_a_zero_width_space_token_is_a_word_of_the_official_data(tmp_path):
    """POSP and NERP train hold tokens of one zero-width space (tagged SYM / O) that the
    benchmark counts: they are kept as words, not refused as empty."""
    from nli_jax.data import indonlu
    path = _tagging_file(tmp_path / "t.txt", ["budi\tB-PPL", "\u200b\tO", "datang\tO"])
    (sentence,) = indonlu.read_file(indonlu.TASKS["nerp"], path)
    assert sentence["tokens"] == ["budi", "\u200b", "datang"] and sentence["tags"] == ["B-PPL", "O", "O"]


def test_an_smsa_text_of_a_zero_width_space_is_empty(tmp_path):
    from nli_jax.data import indonlu
    from nli_jax.data.readers import DataError
    (tmp_path / "x.tsv").write_text("ulasan bagus\tpositive\n\u200b\u200b\tnegative\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"x.tsv:2: empty text or label"):
        indonlu.read_file(indonlu.TASKS["smsa"], str(tmp_path / "x.tsv"))


# --- 9. degenerate data is named --------------------------------------------------------------

def test_a_training_split_of_one_label_is_refused_unless_allowed(tmp_path):
    from nli_jax.errors import ConfigValueError
    rows = [json.dumps({"premise": f"Kalimat nomor {i}.", "hypothesis": f"Kalimat {i}.", "label": "e"})
            for i in range(40)]
    source = tmp_path / "data"
    source.mkdir()
    (source / "train.jsonl").write_text("\n".join(rows) + "\n")
    (source / "val.jsonl").write_text("\n".join(rows[:6]) + "\n")
    with pytest.raises(ConfigValueError, match=r"every one of the 40 training examples has the label 'entailment'.*"
                                               r"--config.data.allow_one_label=True"):
        train(tmp_path / "run", f"data.source={source}", *SHORT)
    assert not (tmp_path / "run" / "config.json").exists()
    # (validation is the first training rows: allowed past the overlap check too)
    results = train(tmp_path / "allowed", f"data.source={source}", "data.allow_one_label=True",
                    "data.allow_overlap=True", "train.batch_size=8",
                    "train.max_steps=2", "eval_splits=('validation',)", "optimizer.warmup_steps=0")
    assert results["splits"]["validation"]["count"] == 6


def test_tagging_words_past_max_seq_length_are_counted_and_reported(tmp_path):
    """47.5% of NERP validation words past the cpu_test length were scored 'O' silently."""
    source = tmp_path / "nerp"
    source.mkdir()
    words = ["Budi", "datang", "ke", "Jakarta", "pada", "hari", "Senin", "bersama", "Wati"]
    tags = ["B-PPL", "O", "O", "B-PLC", "O", "O", "O", "O", "B-PPL"]
    sentences = [[f"{w}\t{t}" for w, t in zip(words * (1 + i % 4), tags * (1 + i % 4))] for i in range(40)]
    for name in ("train_preprocess.txt", "valid_preprocess.txt"):
        (source / name).write_text("\n\n".join("\n".join(s) for s in sentences) + "\n", encoding="utf-8")
    results = train(tmp_path / "run", f"data.source={source}", "data.max_seq_length=16", "train.max_steps=2",
                    "eval_splits=('validation',)", "data.allow_overlap=True",  # validation = train
                    spec="indonlu:task=nerp,cpu_test")
    validation = results["splits"]["validation"]
    assert validation["words"] == sum(len(s) for s in sentences)
    assert 0 < validation["words_not_seen"] < validation["words"]
    assert "are past data.max_seq_length=16 tokens" in (tmp_path / "run" / "train.log").read_text()


def test_build_vocab_refuses_a_size_below_what_the_alphabet_needs(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Budi membaca buku di rumah.\nWati menulis surat.\n\n" * 50, encoding="utf-8")
    proc = cli("pretrain.build_vocab", f"--corpus={corpus}", f"--output_dir={tmp_path / 'v3'}", "--vocab_size=3")
    one_line_error(proc, "--vocab_size=3: not more than the 9 special tokens and placeholders")
    proc = cli("pretrain.build_vocab", f"--corpus={corpus}", f"--output_dir={tmp_path / 'v20'}", "--vocab_size=20")
    one_line_error(proc, "--vocab_size=20: the corpus needs at least", "nothing was written")
    assert not (tmp_path / "v20" / "vocab.txt").exists()


def test_pmi_ranks_no_words_for_a_label_without_examples():
    from nli_jax.analysis import artifacts
    hypotheses = [["tidak", "ada"], ["kucing", "tidur"], ["anjing"]] * 4
    top = artifacts.label_word_pmi(hypotheses, [0] * 12, smoothing=1, min_count=1, top_k=3)
    assert len(top[0]) == 3 and top[1] == [] and top[2] == []


# --- 10. tools check what they are given ------------------------------------------------------

def test_a_submission_is_made_from_its_own_benchmarks_predictions(finished, tmp_path):
    from nli_jax import leaderboard
    rows = [json.loads(line) for line in (finished / "predictions.jsonl").read_text().splitlines()]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "predictions.jsonl").write_text("".join(
        json.dumps(dict(r, split="test")) + "\n" for r in rows))
    shutil.copy(finished / "results.json", tmp_path / "run" / "results.json")
    with pytest.raises(leaderboard.SubmissionError, match=r"predictions of task 'indonli' .* not 'ocnli': a ocnli "
                                                          r"submission is made from a ocnli run only"):
        leaderboard.ocnli_submission(str(tmp_path / "run"), str(tmp_path / "ocnli.json"))
    assert not (tmp_path / "ocnli.json").exists()


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_data_path_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path, kind):
    """A val.jsonl that is a symlink to /dev/zero was read until the memory killer stopped it at 23.6 GB."""
    from nli_jax.data import fixture_path
    source = tmp_path / "data"
    source.mkdir()
    shutil.copy(os.path.join(fixture_path("nli_tiny"), "train.jsonl"), source / "train.jsonl")
    val = source / "val.jsonl"
    if kind == "device":
        os.symlink("/dev/zero", val)
    elif kind == "fifo":
        os.mkfifo(val)
    else:
        val.mkdir()
    proc = cli("finetune.main", f"--config={CPU_TEST}", f"--workdir={tmp_path / 'run'}", f"--config.data.source={source}",
               f"--config.data.tfds_dir={tmp_path / 'tfds'}", timeout=120)
    expected = {"device": "(a link to /dev/zero) is a device, not a regular file: not read",
                "fifo": "is a FIFO, not a regular file", "directory": "val.jsonl not found"}[kind]
    one_line_error(proc, str(val), expected)


# --- 11. one line, not a traceback -----------------------------------------------------------

def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_saving_the_best_parameters_is_one_line(tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    from nli_jax.errors import DiskFullError
    original = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        if str(self.directory).endswith("best"):
            _enospc()
        return original(self, step, *args, **kwargs)
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    with pytest.raises(DiskFullError, match=r"no space left on the device of .*run \(.* MiB free\) while writing the "
                                            r"best parameters of step 4 to best/: free some space and rerun"):
        train(tmp_path / "run", *SHORT)


def test_a_full_disk_while_preparing_the_dataset_cache_is_one_line(tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    from nli_jax.errors import DiskFullError
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", _enospc)
    with pytest.raises(DiskFullError, match=r"while writing the array_record copy of indonli.*--config.data.tfds_dir"):
        train(tmp_path / "run", *SHORT)


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_predict_on_a_pretraining_run_is_one_line(tmp_path):
    workdir = tmp_path / "pre"
    train(workdir, "train.max_steps=4", "train.eval_every_steps=4", "train.checkpoint_every_steps=4",
          spec="pretrain.indobert_base:cpu_test")
    proc = cli("finetune.predict", f"--checkpoint={workdir}", f"--output={tmp_path / 'pred'}",
               f"--input=x={REPO / 'nli_jax/data/fixtures/nli_tiny/val.jsonl'}")
    one_line_error(proc, "task 'pretraining' has no files to evaluate or predict on")


@pytest.mark.parametrize("module,args,fragments", [
    ("finetune.evaluate", ["--checkpoint=/no/such/run", "--workdir=OUT"], ["--checkpoint=/no/such/run: no such directory"]),
    ("finetune.sweep", [f"--config={CPU_TEST}", "--workdir=OUT", "--lrs=1e-3,abc"],
     ["--lrs takes numbers and --seeds integers"]),
    ("finetune.evaluate", ["--checkpoint=FINISHED", "--workdir=OUT", "--override=train.eval_batchsize=8"],
     ["no config field 'train.eval_batchsize'; did you mean train.eval_batch_size"]),
])
def test_command_line_mistakes_are_one_line_without_usage(finished, tmp_path, module, args, fragments):
    args = [a.replace("OUT", str(tmp_path / "out")).replace("FINISHED", str(finished)) for a in args]
    one_line_error(cli(module, *args), *fragments)


def test_an_empty_corpus_is_named(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    from nli_jax.errors import RunError
    with pytest.raises(RunError, match=r"holds no training examples \(pretrain.corpus=\[.*empty.txt'\]\)"):
        train(tmp_path / "run", f"pretrain.corpus=('{tmp_path / 'empty.txt'}',)", spec="pretrain.indobert_base:cpu_test")


def test_special_tokens_missing_from_the_vocabulary_are_named(tmp_path):
    from nli_jax.checkpoints import CheckpointError, load_tokenizer
    from nli_jax.data import fixture_path
    vocab = [t for t in open(os.path.join(fixture_path("tiny_wordpiece"), "vocab.txt"), encoding="utf-8").read().split()
             if t not in ("[CLS]", "[MASK]")]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    with pytest.raises(CheckpointError, match=r"vocab.txt lacks the special token\(s\) \['\[CLS\]', '\[MASK\]'\]"):
        load_tokenizer(str(tmp_path))


def test_a_cased_tokenizer_over_a_lowercase_vocabulary_is_warned_about(tmp_path):
    """do_lower_case false over a lowercase vocabulary: 13% of NLI tokens [UNK], silently."""
    from nli_jax.data import fixture_path
    shutil.copytree(fixture_path("tiny_wordpiece"), tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(dict(config, do_lower_case=False)))
    train(tmp_path / "run", f"model.tokenizer={tmp_path / 'tok'}", "train.max_steps=2", "eval_splits=('validation',)")
    log = (tmp_path / "run" / "train.log").read_text()
    assert "of the tokens of the first 256 train examples to [UNK]: its vocabulary is lowercase but it does not " \
           "lowercase the text (do_lower_case false)" in log


def test_every_seed_is_checked_before_the_first_runs(tmp_path):
    """seeds=(1, -2): seed 1 trained, then seed -2 failed its train.seed check."""
    from nli_jax.errors import ConfigValueError
    with pytest.raises(ConfigValueError, match=r"--config.train.seed=-2: train.seed must be >= 0"):
        train(tmp_path / "run", "seeds=(1,-2)", *SHORT)
    assert not (tmp_path / "run" / "seed_1").exists()
