"""Issue 42, third round: a run is finite or stopped, its memory is bounded, what it drops or
adjusts is said, and its help and README are true. Each case goes through the real command or
the production function (the loop and its jitted step, the readers, the CLI); docs/errors.md
lists the messages.

Most cases run train_and_evaluate in this process on the cpu_test config (a refusal costs no
compilation); a few run the command line.
"""
import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

CPU_TEST = "configs/indonli_large.py:cpu_test"
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


# --- helpers ---------------------------------------------------------------------------------

def config_with(*assignments, tfds_dir=None, spec=CPU_TEST):
    """A config file's config with `key=value` assignments, as on the command line."""
    import importlib

    from absl import logging as absl_logging

    from nli_jax import cli
    absl_logging.set_verbosity(absl_logging.WARNING)
    path, _, variant = spec.partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    config = module.get_config(variant or None)
    cli.apply_overrides(config, ((f"data.tfds_dir={tfds_dir}",) if tfds_dir else ()) + tuple(assignments))
    return config


def refused(workdir, config, error=Exception):
    """Runs the config, which must be refused before any training step (nothing but train.log
    written); returns the message as one line."""
    from nli_jax.train.loop import train_and_evaluate
    with pytest.raises(error) as info:
        train_and_evaluate(config, str(workdir))
    left = set(os.listdir(workdir)) if os.path.isdir(workdir) else set()
    assert left <= {"train.log"}, f"a refused command wrote {sorted(left)}"
    return " ".join(str(info.value).split())


def env_cpu():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)
    return env


def command(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env_cpu(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture()
def data(tmp_path):
    """A copy of the shipped NLI fixture that a test may change."""
    from nli_jax.data import fixture_path
    target = tmp_path / "data"
    shutil.copytree(fixture_path("nli_tiny"), target)
    return target


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A Hugging Face directory of a tiny BERT classifier with the fixture's vocabulary."""
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import fixture_path
    from nli_jax.models import ForSequenceClassification, make_rngs, preset
    tokenizer = load_tokenizer(fixture_path("tiny_wordpiece"))
    model = ForSequenceClassification(preset("tiny-bert", vocab_size=len(tokenizer)), num_labels=3,
                                      rngs=make_rngs(0))
    directory = tmp_path_factory.mktemp("checkpoint") / "tiny"
    model.save_pretrained(str(directory), tokenizer=tokenizer, label_names=["entailment", "neutral", "contradiction"])
    return directory



def checkpoint_with(tmp_path, tiny_checkpoint, name, change):
    """A copy of the tiny checkpoint whose tensor `name` is change(tensor)."""
    from safetensors.numpy import load_file, save_file
    target = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, target)
    weights = load_file(str(target / "model.safetensors"))
    weights[name] = change(weights[name])
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


LAYER0_QUERY = "bert.encoder.layer.0.attention.self.query.weight"


# --- 2. finite or stopped --------------------------------------------------------------------

def test_a_nan_weight_in_model_init_is_refused_naming_the_tensor(tmp_path, tfds_dir, tiny_checkpoint):
    """Before: 108 steps at loss nan, rc 0, "finished" with accuracy 0.333 (with calibration: a
    traceback about a NaN temperature)."""
    def one_nan(w):
        w = w.copy()
        w[0, 0] = np.nan
        return w
    model = checkpoint_with(tmp_path, tiny_checkpoint, LAYER0_QUERY, one_nan)
    message = refused(tmp_path / "work", config_with(f"model.init='{model}'", tfds_dir=tfds_dir))
    assert f"{model}: tensors holding NaN or Inf" in message and f"{LAYER0_QUERY} (1 of " in message, message


def test_weights_of_an_integer_dtype_are_refused_and_float64_converted_with_a_line(tmp_path, tiny_checkpoint, nli_log):
    """Before: an int32 tensor was cast to float32 without a word."""
    from nli_jax.checkpoints import CheckpointError
    from nli_jax.models import ForSequenceClassification
    model = checkpoint_with(tmp_path, tiny_checkpoint, LAYER0_QUERY, lambda w: (w * 100).astype(np.int32))
    with pytest.raises(CheckpointError, match=rf"{LAYER0_QUERY} \(int32\)") as info:
        ForSequenceClassification.from_pretrained(str(model))
    assert "not float32, bfloat16 or float16" in str(info.value)
    shutil.rmtree(model)
    model = checkpoint_with(tmp_path, tiny_checkpoint, LAYER0_QUERY, lambda w: w.astype(np.float64))
    loaded = ForSequenceClassification.from_pretrained(str(model))
    assert any("1 tensor(s) of float64 converted to float32" in line for line in nli_log), nli_log
    assert loaded.encoder.layers[0].attention.query.kernel[...].dtype == np.float32


def corrupting_step(monkeypatch, at_step):
    """The loop's jitted train step, except that the state it returns at step `at_step` holds a
    NaN parameter and that step's metrics a NaN loss (a diverging step), as a too-large learning
    rate or a bad batch makes one."""
    import jax
    import jax.numpy as jnp

    from nli_jax.train import compiled_step
    real = compiled_step.TrainStep.__call__

    def call(self, state, batch):
        state, metrics = real(self, state, batch)
        if int(jax.device_get(state["step"])) == at_step:
            state = dict(state, params=jax.tree.map(lambda x: x * jnp.nan, state["params"]))
            metrics = dict(metrics, loss_sum=metrics["loss_sum"] * jnp.nan)
        return state, metrics
    monkeypatch.setattr(compiled_step.TrainStep, "__call__", call)


SHORT = ("train.max_steps=6", "train.checkpoint_every_steps=2", "train.eval_every_steps=2", "train.keep_checkpoints=5",
         "eval_splits=('validation',)")


@pytest.mark.parametrize("log_every", [1, 50])
def test_a_step_with_a_nan_loss_stops_the_run_keeping_the_last_good_checkpoint(tmp_path, tfds_dir, monkeypatch,
                                                                               log_every):
    """Before: the loss went nan and the run trained on to "finished" (rc 0). Caught at the log
    step (log_every 1) or, when no log step comes first (50), before the next checkpoint."""
    from nli_jax.train.loop import train_and_evaluate
    from nli_jax.train.step_checks import NonFiniteStepError
    corrupting_step(monkeypatch, at_step=3)
    workdir = tmp_path / "work"
    with pytest.raises(NonFiniteStepError) as info:
        train_and_evaluate(config_with(*SHORT, f"train.log_every_steps={log_every}", tfds_dir=tfds_dir), str(workdir))
    message = " ".join(str(info.value).split())
    assert message.startswith("training step 3 of 6 computed loss nan"), message
    assert "its last checkpoint, step 2, was written before it and is kept" in message
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]
    assert sorted(os.listdir(workdir / "best")) == ["2"]
    state = json.loads((workdir / "run.json").read_text())
    assert state["state"] == "failed" and state["last_checkpoint"] == 2 and state["reason"].startswith("step 3:")
    assert not (workdir / "results.json").exists()
    # The tools see a failed run, not a finished one.
    from nli_jax.errors import RunError
    from nli_jax.workdir import require_finished
    with pytest.raises(RunError, match=r"the run failed at step 3: loss nan .*its last checkpoint: step 2"):
        require_finished(str(workdir), allow_unfinished=False)


def fixture_words():
    from nli_jax.data import fixture_path
    with open(os.path.join(fixture_path("tiny_wordpiece"), "vocab.txt"), encoding="utf-8") as f:
        return [t for t in f.read().split("\n") if t and not t.startswith("[")]


def write_vocab(directory, tokens, specials=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(list(specials) + list(tokens)) + "\n", encoding="utf-8")
    return directory


PRETRAIN_CPU_TEST = "configs/pretrain/indobert_base.py:cpu_test"


def test_pretraining_examples_of_another_vocabulary_are_refused_before_compute(tmp_path):
    """Before: examples built with a larger vocabulary than the run's tokenizer trained at loss
    nan, MLM accuracy 0.000, "finished", and an export was written."""
    from nli_jax.data import fixture_path
    from nli_jax.pretraining.examples import create_examples
    other = write_vocab(tmp_path / "other", [f"kata{i}" for i in range(300)] + fixture_words())
    examples = tmp_path / "examples"
    meta = create_examples([os.path.join(fixture_path("corpus_tiny"), "corpus.txt")], str(other), str(examples),
                           max_seq_length=64, workers=1, progress=False)
    assert meta["vocab_fingerprint"]["size"] == 305 + len(fixture_words())
    message = refused(tmp_path / "work", config_with(f"pretrain.examples_dir='{examples}'", spec=PRETRAIN_CPU_TEST))
    assert f"{examples} holds examples tokenised with another vocabulary ({other}: " in message, message
    assert f"than this run's tokenizer ({fixture_path('tiny_wordpiece')}: " in message


def test_a_vocabulary_without_mask_is_refused_by_create_examples(tmp_path):
    """Before: the examples were built, and masking drew a [MASK] the vocabulary does not have."""
    from nli_jax.checkpoints import CheckpointError
    from nli_jax.data import fixture_path
    from nli_jax.pretraining.examples import create_examples
    vocab = write_vocab(tmp_path / "vocab", fixture_words(), specials=("[PAD]", "[UNK]", "[CLS]", "[SEP]"))
    with pytest.raises(CheckpointError, match=r"vocab.txt lacks the special token\(s\) \['\[MASK\]'\]"):
        create_examples([os.path.join(fixture_path("corpus_tiny"), "corpus.txt")], str(vocab), str(tmp_path / "out"),
                        max_seq_length=64, workers=1, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_binary_file_through_prepare_corpus_is_refused_in_one_line(tmp_path):
    """Before: a binary file (NUL bytes) became a "corpus" of replacement characters, exit 0."""
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"Kalimat pertama.\n" + bytes(range(256)) * 40)
    result = command("pretrain.prepare_corpus", f"--inputs={binary}", f"--output_dir={tmp_path / 'corpus'}",
                     "--shards=2", "--workers=1")
    assert result.returncode == 1, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: {binary}:2: NUL byte at column 1 (a damaged or binary file)"), result.stderr
    assert "Traceback" not in result.stderr
    assert not any(name.startswith("corpus-") or name == ".buckets" for name in os.listdir(tmp_path / "corpus"))


# --- 4. bounded memory -----------------------------------------------------------------------

class RecordingTokenizer:
    """A tokenizer that records the longest text and the most words it was given (then
    tokenises as it would)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.longest, self.most_words = tokenizer, 0, 0

    def __call__(self, *texts, **kwargs):
        for text in texts:
            if isinstance(text, list):
                self.most_words = max(self.most_words, len(text))
            for t in (text if isinstance(text, list) else [text]):
                self.longest = max(self.longest, len(t))
        return self.tokenizer(*texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def long_text(words, seed=0):
    from nli_jax.data import fixture_path
    vocabulary = open(os.path.join(fixture_path("corpus_tiny"), "corpus.txt"), encoding="utf-8").read().split()
    return " ".join(np.random.default_rng(seed).choice(vocabulary, words))


def test_a_16000_word_premise_is_cut_before_tokenisation_to_what_max_seq_length_can_use():
    """Before: encode_text tokenised the whole premise, then truncated (50 such rows: killed)."""
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import fixture_path
    from nli_jax.tasks import common, create_task
    from nli_jax.planner import build_plan
    tokenizer = load_tokenizer(fixture_path("tiny_wordpiece"))
    premise, hypothesis = long_text(16000), "Kalimat pendek."
    task = create_task(build_plan(config_with("data.max_seq_length=64"), training=False))
    recording = RecordingTokenizer(tokenizer)
    encode = task.encoder(recording)
    features = encode({"premise": premise, "hypothesis": hypothesis, "label": 0, "idx": 0})
    whole = tokenizer(premise, hypothesis, truncation="longest_first", max_length=64)["input_ids"]
    assert list(features["input_ids"]) == whole and len(whole) == 64
    assert len(premise) > 90_000 and recording.longest <= 4 * common.CUT_CHARS_PER_TOKEN * 64
    # A single text, a script without spaces, a text of one long word: the same tokens as whole.
    for text in (long_text(5000, seed=1), "一二三四五六七八九十" * 3000, "x" * 100_000):
        for max_length in (16, 64, 129):
            got = common.encode_text(tokenizer, text, None, max_length)["input_ids"]
            assert list(got) == tokenizer(text, truncation=True, max_length=max_length)["input_ids"]


def test_a_tagging_example_of_thousands_of_words_tokenises_only_the_words_it_can_see():
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import fixture_path
    from nli_jax.tasks import create_task
    from nli_jax.planner import build_plan
    from conftest import config_for
    tokenizer = load_tokenizer(fixture_path("tiny_wordpiece"))
    task = create_task(build_plan(config_for("indonlu:task=nerp,cpu_test"), training=False))
    task.labels = tuple(sorted({"O", "B-PER", "I-PER"}))
    words = long_text(20000).split()
    recording = RecordingTokenizer(tokenizer)
    features = task.encoder(recording)({"tokens": words, "tags": ["O"] * len(words), "idx": 0})
    reference = task.encoder(tokenizer)({"tokens": words[:task.data.max_seq_length], "tags": ["O"] * len(words),
                                         "idx": 0})
    for key in ("input_ids", "word_index", "word_mask", "word_labels"):
        np.testing.assert_array_equal(features[key], reference[key])
    assert recording.most_words <= task.data.max_seq_length


def test_evaluation_batches_are_bounded_by_tokens_whatever_eval_batch_size_says(tmp_path, tfds_dir, nli_log,
                                                                                 monkeypatch):
    """Before: --config.train.eval_batch_size=1000000 with packing off was killed at the first
    evaluation (a batch of 10^6 rows x 64 tokens; today 100,000 is the field's bound, still 6,400,000
    tokens). The run's evaluator on its validation split."""
    from nli_jax.data import pipeline
    from nli_jax.train import loop
    from nli_jax.planner import EVAL_TOKENS_PER_DEVICE, build_plan
    from nli_jax.train.setup import prepare
    config = config_with("train.eval_batch_size=100000", "data.packing=False", "data.pad_to_max_length=True",
                         tfds_dir=tfds_dir)
    plan = build_plan(config)
    assert plan.batch.local_eval_batch == EVAL_TOKENS_PER_DEVICE // 64 and plan.batch.eval_batch_asked == 100000
    run = prepare(plan, str(tmp_path / "work"))
    shapes, real = [], pipeline.eval_batches

    def recorded(*args, **kwargs):
        for batch in real(*args, **kwargs):
            shapes.append(batch["input_ids"].shape)
            yield batch
    monkeypatch.setattr(pipeline, "eval_batches", recorded)
    assert run.evaluate(run.params, "validation").report["count"] == 60
    assert shapes == [(1024, 64)]
    loop._log_start(run, loop.planner.step_plan(plan, 300), run.params, 300)
    assert any(line.startswith("train.eval_batch_size=100000: evaluation batches bounded to 1024 rows")
               for line in nli_log), nli_log
    # The shipped configs' own eval batches are under the bound.
    assert build_plan(config_with(spec="configs/indonli_large.py")).batch.eval_batch_asked == 0


def test_grain_workers_read_the_fine_tuning_data_sources():
    """Before: --config.data.workers=2 failed every fine-tuning run with a TypeError (the tfds
    builder could not be rebuilt in a grain worker process). The sources go to the workers pickled."""
    import cloudpickle

    from nli_jax.data import fixture_path
    from nli_jax.data.nli import prepare
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        sources = prepare("indonli", fixture_path("nli_tiny"), tmp)
        source = sources["validation"]
        copy = cloudpickle.loads(cloudpickle.dumps(source))
        assert len(copy) == len(source) and copy[7] == source[7]


@pytest.mark.slow
def test_fine_tuning_with_two_grain_workers_runs_as_with_none(tmp_path):
    runs = {}
    for workers in (0, 2):
        workdir = tmp_path / f"w{workers}"
        result = command("finetune.main", f"--config={CPU_TEST}", f"--workdir={workdir}",
                         f"--config.data.workers={workers}", "--config.train.max_steps=20")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[workers] = json.loads((workdir / "results.json").read_text())
    assert runs[0]["history"] == runs[2]["history"] and runs[0]["splits"] == runs[2]["splits"]


# --- 6. what was dropped or adjusted is said --------------------------------------------------

def test_a_workdir_deleted_mid_run_is_not_reported_finished(tmp_path, tfds_dir, monkeypatch):
    """Before: a run whose workdir was deleted under it recreated it, wrote results.json and
    run.json "finished", exit 0."""
    from nli_jax.errors import RunError
    from nli_jax.train import loop
    workdir = tmp_path / "work"
    real = loop._validate

    def validate_then_delete(run, *args, **kwargs):
        evaluation = real(run, *args, **kwargs)
        if os.path.isdir(workdir):  # at the first evaluation someone removes the run's directory
            shutil.rmtree(workdir)
        return evaluation
    monkeypatch.setattr(loop, "_validate", validate_then_delete)
    with pytest.raises(RunError) as info:
        loop.train_and_evaluate(config_with(*SHORT, tfds_dir=tfds_dir), str(workdir))
    message = " ".join(str(info.value).split())
    assert message.startswith(f"{workdir}/config.json is gone: the workdir was deleted or moved while the run went "
                              "on; the checkpoint of step 2 was not written"), message
    assert not (workdir / "results.json").exists() and not (workdir / "run.json").exists()


def test_duplicate_ids_with_a_train_subset_are_refused_not_half_trained(tmp_path, data, tfds_dir, nli_log):
    """Before: 300 training rows with each id twice and a subset naming all 150 ids trained 150."""
    rows = read_rows(data / "train.jsonl")
    for i, row in enumerate(rows):
        row["pair_id"] = f"p{i // 2}"
    write_rows(data / "train.jsonl", rows)
    subset = tmp_path / "subset.txt"
    subset.write_text("".join(f"p{i}\n" for i in range(len(rows) // 2)))
    message = refused(tmp_path / "work", config_with(f"data.source='{data}'", f"data.train_subset='{subset}'",
                                                     tfds_dir=tfds_dir))
    assert f"--config.data.train_subset='{subset}': 150 of its 150 ids name more than one row" in message, message
    assert any(line == f"{data / 'train.jsonl'}: 150 id(s) occur more than once (300 rows, e.g. ['p0', 'p1', 'p2']): "
               "the rows are told apart by position" for line in nli_log), nli_log


def test_null_ids_become_line_numbers_with_a_count_not_none(data, nli_log):
    """Before: every row with "pair_id": null got the id "None" (all alike)."""
    from nli_jax.data.nli import read_file
    rows = read_rows(data / "val.jsonl")
    for row in rows[:3]:
        row["pair_id"] = None
    write_rows(data / "val.jsonl", rows)
    examples = read_file("indonli", str(data / "val.jsonl"))
    assert [e["id"] for e in examples[:3]] == ["1", "2", "3"] and "None" not in {e["id"] for e in examples}
    assert f"{data / 'val.jsonl'}: 3 row(s) without 'pair_id' (absent or null, e.g. line 1): identified by their " \
           "line number" in nli_log


def test_a_key_given_twice_in_a_dataset_row_is_refused_or_counted(tmp_path, data, tfds_dir, nli_log):
    """Before: json kept the last of two "label" values without a word."""
    from nli_jax.data.nli import read_file
    from nli_jax.data.readers import DataError
    lines = (data / "train.jsonl").read_text().splitlines()
    lines[4] = '{"premise": "Budi membaca buku di taman.", "hypothesis": "Budi membaca.", "label": "c", "label": "e"}'
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    message = refused(tmp_path / "work", config_with(f"data.source='{data}'", tfds_dir=tfds_dir), DataError)
    assert message == (f"{data / 'train.jsonl'}:5: key 'label' appears twice in the row with different values "
                       '("c" and "e"): which one is meant is unknown'), message
    lines = (data / "val.jsonl").read_text().splitlines()
    lines[1] = lines[1][:-1] + ', "note": 1, "note": 1}'
    (data / "val.jsonl").write_text("\n".join(lines) + "\n")
    assert len(read_file("indonli", str(data / "val.jsonl"))) == 60
    assert f"{data / 'val.jsonl'}: 1 row(s) give a key twice with the same value (e.g. line 2: 'note'); read once" \
        in nli_log


def test_ocnli_rows_labelled_dash_are_dropped_with_a_count(tmp_path, nli_log):
    """Before: OCNLI's '-' rows (no majority label) were dropped uncounted."""
    from nli_jax.data.nli import read_file
    dev = tmp_path / "dev.json"
    write_rows(dev, [{"sentence1": f"前提{i}", "sentence2": f"假设{i}", "label": "-" if i in (2, 5) else "neutral",
                      "id": i, "genre": "news"} for i in range(10)])
    assert len(read_file("ocnli", str(dev))) == 8
    assert f"{dev}: 2 of 10 rows dropped: label '-' (no majority label: excluded, as in the OCNLI paper)" in nli_log


def test_a_one_example_validation_split_neither_picks_a_best_step_nor_fits_a_temperature(tmp_path, data, tfds_dir,
                                                                                        nli_log):
    """Before: a validation split of one example picked the first step that guessed it as the
    best and fitted (and exported) a temperature on it."""
    from nli_jax.train.loop import train_and_evaluate
    write_rows(data / "val.jsonl", read_rows(data / "val.jsonl")[:1])
    workdir = tmp_path / "work"
    results = train_and_evaluate(config_with(f"data.source='{data}'", *SHORT, "train.early_stopping_patience=1",
                                             tfds_dir=tfds_dir), str(workdir))
    assert results["best_step"] == results["steps"] == 6 and not results["stopped_early"]
    assert "validation has 1 example(s), fewer than the 10 a best step is chosen on: the final parameters are kept " \
           "and reported (best step = last step) and early stopping is off" in nli_log
    assert results["calibration"]["temperature"] is None and not (workdir / "calibration.json").exists()
    assert results["calibration"]["not_fitted"].startswith("the validation split has 1 labelled prediction(s)")


def test_a_temperature_fitted_at_its_bound_is_neither_stored_nor_exported(tmp_path, nli_log):
    """Before: separable validation predictions gave T = 0.05 (the bound), stored and exported as fitted."""
    import types

    from nli_jax.tasks import create_task
    from nli_jax.hooks.calibration import CalibrationHook
    from nli_jax.train.evaluation import SplitEvaluation
    from nli_jax.planner import build_plan
    task = create_task(build_plan(config_with(), training=False))
    examples = [{"label": i % 3, "idx": i, "premise": "p", "hypothesis": "h"} for i in range(30)]
    run = types.SimpleNamespace(task=task, splits={"validation": examples}, workdir=str(tmp_path))

    def fitted(logits):
        evaluations = {"validation": SplitEvaluation({}, [], "validation", examples, {"logits": logits})}
        results = {"splits": {"validation": {}}, "best_step": 4}
        hook = CalibrationHook(report=True, fit=True)
        hook.final_results(run, None, results, evaluations)
        return hook, results
    # Every prediction right by a margin of 1: the fit runs into T = 0.05.
    hook, results = fitted([np.eye(3, dtype=np.float32)[i % 3] for i in range(30)])
    assert results["calibration"]["temperature"] is None
    assert "reached its bound 0.05 (range [0.05, 20])" in results["calibration"]["not_fitted"]
    assert hook.export_fields() == {} and not (tmp_path / "calibration.json").exists()
    assert "temperature" not in results["splits"]["validation"]["calibration"]
    assert any(line.startswith("calibration: the temperature fitted on 30 validation predictions reached its bound")
               for line in nli_log)
    # By a margin of 5 the fit stops short of the bound (the NLL is flat there): still no fit.
    hook, results = fitted([5.0 * np.eye(3, dtype=np.float32)[i % 3] for i in range(30)])
    assert results["calibration"]["temperature"] is None and hook.export_fields() == {}
    assert results["calibration"]["not_fitted"].startswith("every one of the 30 validation predictions is right")
    # One wrong prediction among them: a temperature with a minimum, stored and exported.
    wrong = np.float32([3.0, 0.0, 0.0])  # example 29's label is 2
    hook, results = fitted([5.0 * np.eye(3, dtype=np.float32)[i % 3] for i in range(29)] + [wrong])
    assert 0.05 < results["calibration"]["temperature"] < 20 and "temperature" in hook.export_fields()
    assert (tmp_path / "calibration.json").exists()


def test_build_vocab_says_when_it_writes_fewer_entries_than_asked(tmp_path):
    """Before: --vocab_size=500 on a small corpus wrote 289 entries without a word."""
    from nli_jax.data import fixture_path
    result = command("pretrain.build_vocab", f"--corpus={fixture_path('corpus_tiny')}/corpus.txt",
                     f"--output_dir={tmp_path / 'vocab'}", "--vocab_size=500")
    assert result.returncode == 0, result.stderr[-2000:]
    entries = (tmp_path / "vocab" / "vocab.txt").read_text().splitlines()
    assert f"--vocab_size=500: the corpus yields {len(entries)} entries" in result.stderr
    assert f"fewer than asked: vocab.txt has {len(entries)}" in result.stderr and len(entries) < 500


# --- 7. help and README true ----------------------------------------------------------------

HELP_DRIVER = r"""
import contextlib, io, json, runpy, sys
module, args = sys.argv[1], sys.argv[2:]
sys.argv = [module, *args, "--help"]
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
from absl import flags
own = ("nli_jax", "finetune", "pretrain", "launch")
expected = sorted({f.name for module, defined in flags.FLAGS.flags_by_module_dict().items()
                   if module.split(".")[0] in own or module.endswith(".py") for f in defined})
print(json.dumps({"help": out.getvalue(), "expected": expected}))
"""

ABSL_COMMANDS = [("finetune.main",), ("finetune.evaluate",), ("finetune.predict",), ("finetune.export",),
                 ("finetune.sweep",), ("finetune.indonlu_benchmark",), ("pretrain.main",), ("pretrain.prepare_corpus",),
                 ("pretrain.build_vocab",), ("pretrain.create_examples",), ("launch.compile",),
                 ("nli_jax.analysis", "artifacts"), ("nli_jax.analysis", "cartography")]


def test_every_commands_help_lists_the_flags_it_takes():
    """Before: `python -m nli_jax.analysis cartography --help` listed no flag (--workdir
    included), nor did finetune.main's and pretrain.main's (--config, --workdir): absl lists the
    main module's flags only. Every flag an nli-jax module defines for the command is listed."""
    from concurrent.futures import ThreadPoolExecutor

    def help_of(command):
        result = subprocess.run([sys.executable, "-c", HELP_DRIVER, *command], cwd=REPO, env=env_cpu(),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return command, json.loads(result.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(2) as pool:
        helps = list(pool.map(help_of, ABSL_COMMANDS))
    missing = {}
    for command, shown in helps:
        listed = {name for name in shown["expected"]
                  if f"--{name}:" in shown["help"] or f"--[no]{name}:" in shown["help"]}
        assert shown["expected"], command
        if set(shown["expected"]) - listed:
            missing[" ".join(command)] = sorted(set(shown["expected"]) - listed)
    assert not missing, missing
    cartography = dict(helps)[("nli_jax.analysis", "cartography")]["help"]
    assert "Dataset cartography" in cartography and "--workdir: A run trained with" in cartography


README_COMMANDS = ("finetune.main", "pretrain.main", "launch.compile", "finetune.sweep")
# The README and the user guides its prose moved to: every override they suggest is checked
# (docs/errors.md shows mistyped keys on purpose; the experiment pages are reports, not guides).
USER_GUIDES = ("README.md", "docs/finetuning.md", "docs/pretraining.md", "docs/models.md", "docs/cloud_tpu.md")


def readme_overrides(text):
    """[(config spec, [--config.KEY=VALUE ...], topology or None, where)] for every command of
    README_COMMANDS in the README's code blocks, and one entry per override it suggests in its
    prose (`--config.KEY=VALUE`), against the README's main config."""
    import re
    import shlex
    found = []
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if len(words) < 3 or words[:2] != ["python", "-m"] or words[2] not in README_COMMANDS:
                continue
            options = dict(w.split("=", 1) for w in words[3:] if w.startswith("--") and "=" in w)
            overrides = [w for w in words[3:] if w.startswith("--config.")]
            found.append((options["--config"], overrides, options.get("--topology"), command.strip()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for override in re.findall(r"`(--config\.[\w.]+=[^`]+)`", prose):
        found.append(("configs/indonli_large.py", shlex.split(override), None, override))
    return found


def parsed_config(spec, overrides):
    """The config as the command line parses it (ml_collections' config flag), overrides applied."""
    from absl import flags
    from ml_collections import config_flags
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
    path, _, variant = spec.partition(":")
    argv = ["readme", f"--config={REPO / path}{':' + variant if variant else ''}", *overrides]
    saved, sys.argv = sys.argv, argv  # the config flag reads its overrides from sys.argv
    try:
        values(argv)
    finally:
        sys.argv = saved
    return values["config"].value


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ml_collections loads config files with load_module
def test_every_config_override_the_readme_suggests_is_accepted_by_its_config():
    """Each `--config.KEY=VALUE` the README and the user guides (USER_GUIDES) show (in a command, or
    in their prose against the README's main config) is parsed as the command line parses it and
    planned (nli_jax.planner: every range and relation check; no file read, nothing trained)
    on the devices it is meant for."""
    import math

    from nli_jax import aot
    from nli_jax.planner import build_plan
    readme = readme_overrides((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(readme) >= 15 and sum(bool(c[1]) for c in readme) >= 8, readme  # the main commands stay in the README
    unique = {}
    for page in USER_GUIDES:
        for spec, overrides, topology, where in readme_overrides((REPO / page).read_text(encoding="utf-8")):
            unique.setdefault((spec, tuple(overrides), topology), (spec, overrides, topology, f"{page}: {where}"))
    cases = list(unique.values())
    # 23 distinct cases, 16 with overrides, were in the README alone before its prose moved to docs/
    assert len(cases) >= 23 and sum(bool(c[1]) for c in cases) >= 16, cases
    refused = []
    for spec, overrides, topology, where in cases:
        try:
            config = parsed_config(spec, overrides)
            shape = dict(config.mesh.shape)
            if topology:  # launch.compile plans with its stand-in files, as it does
                config = aot._with_stand_in_files(config)
                devices = aot.topology(topology).devices()
                count, processes = len(devices), len({d.process_index for d in devices})
            else:
                count, processes = (math.prod(shape.values()) if -1 not in shape.values() else 1), 1
            build_plan(config, devices=count, processes=processes, process_index=0)
        except Exception as e:  # noqa: BLE001 - every refusal is collected and named
            refused.append(f"{where}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    assert not refused, "\n".join(refused)
