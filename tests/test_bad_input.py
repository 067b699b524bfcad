"""Bad files, bad configs and faults against the training loop, as a hostile but realistic user
tries them (docs/errors.md lists every case with its message). Each refusal must name the key or
the file (and line), happen before any training step, and leave what was written before intact;
each fault in a checkpoint must end in a resumed run or in a message naming the directory.

Most cases run in this process (train_and_evaluate on the cpu_test config: a refusal costs no
compilation); the command-line cases run `python -m finetune.main`. One short training run
(4 steps, checkpoints at 2 and 4) is shared by the resume and fault cases.
"""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from nli_jax.tasks.indonli import INDONLI

CPU_TEST = "configs/indonli_large.py:cpu_test"
# Reading a damaged checkpoint fails inside orbax while some of its tensorstore reads are still
# pending; their callbacks later find orbax's asyncio loop closed ("Event loop is closed",
# reported at garbage collection in whichever test runs then). Harmless, and a command exits.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


# --- helpers ---------------------------------------------------------------------------------

def config_with(*assignments, tfds_dir=None):
    """The cpu_test config with `key=value` assignments (Python literals, as on the command line)."""
    from absl import logging as absl_logging

    from configs import indonli_large
    from nli_jax import cli
    absl_logging.set_verbosity(absl_logging.WARNING)
    config = indonli_large.get_config("cpu_test")
    cli.apply_overrides(config, ((f"data.tfds_dir={tfds_dir}",) if tfds_dir else ()) + assignments)
    return config


def snapshot(directory):
    """{relative path: sha256} of every file (train.log excepted: refusals append to it)."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel != "train.log":
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def refused(workdir, config, error=Exception):
    """Runs the config in `workdir`, which must refuse it before any training step; returns the
    message. A workdir that did not exist holds no config.json / inputs.json afterwards, and an
    existing one is unchanged (train.log aside)."""
    from nli_jax.train.loop import train_and_evaluate
    existed = os.path.isdir(workdir)
    before = snapshot(workdir) if existed else None
    with pytest.raises(error) as info:
        train_and_evaluate(config, str(workdir))
    if existed:
        assert snapshot(workdir) == before, "a refused command changed the workdir"
    else:
        left = set(os.listdir(workdir)) if os.path.isdir(workdir) else set()
        assert left <= {"train.log"}, f"a refused command wrote {sorted(left)}"
    assert not os.path.isdir(os.path.join(workdir, "checkpoints")) or existed
    return " ".join(str(info.value).split())


def env_cpu(devices=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def cli_run(workdir, *overrides, devices=None, module="finetune.main", config=CPU_TEST):
    return subprocess.run([sys.executable, "-m", module, f"--config={config}", f"--workdir={workdir}", *overrides],
                          cwd=REPO, env=env_cpu(devices), capture_output=True, text=True, timeout=300)


def nli_rows(n, start=0):
    return [json.dumps({"premise": f"Kalimat nomor {i} tentang buku.", "hypothesis": f"Kalimat {i}.",
                        "label": "enc"[i % 3]}) for i in range(start, start + n)]


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Copies of the shipped fixture data and tokenizer that tests may change (and restore)."""
    from nli_jax.data import fixture_path
    root = tmp_path_factory.mktemp("inputs")
    shutil.copytree(fixture_path("nli_tiny"), root / "data")
    shutil.copytree(fixture_path("tiny_wordpiece"), root / "tokenizer")
    return root


RESUMABLE = ("train.max_steps=4", "train.checkpoint_every_steps=2", "train.eval_every_steps=2",
             "train.keep_checkpoints=3", "eval_splits=('validation',)", "train.log_every_steps=1")


def resumable_config(inputs, tfds_dir, *extra):
    return config_with(f"data.source='{inputs / 'data'}'", f"model.tokenizer='{inputs / 'tokenizer'}'",
                       *RESUMABLE, *extra, tfds_dir=tfds_dir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, inputs, tfds_dir):
    """A finished 4-step run with checkpoints at steps 2 and 4 (the reference for every resume)."""
    from nli_jax.train.loop import train_and_evaluate
    workdir = tmp_path_factory.mktemp("trained") / "work"
    train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
    return workdir


def copy_run(trained, tmp_path):
    target = tmp_path / "work"
    shutil.copytree(trained, target)
    return target


def final_params(workdir, step=4):
    import jax
    import orbax.checkpoint as ocp
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(os.path.join(workdir, "checkpoints", str(step), "state"))
    return jax.tree.leaves(state["params"])


def assert_same_run(workdir, reference):
    for a, b in zip(final_params(workdir), final_params(reference)):
        np.testing.assert_array_equal(a, b)
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (workdir, reference))
    assert ra["splits"] == rb["splits"] and ra["history"] == rb["history"]


class restored_afterwards:
    """Changes a file for the length of a block, then puts its bytes back."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.original = self.path.read_bytes()
        return self.path

    def __exit__(self, *exc):
        self.path.write_bytes(self.original)


# --- 1. config values: ranges and relations, before anything is written ----------------------

@pytest.mark.parametrize("assignment,key,words", [
    ("optimizer.lr=-1e-3", "optimizer.lr", "must be > 0"),  # gradient ascent to the end, exit 0
    ("optimizer.lr=0.0", "optimizer.lr", "must be > 0"),
    ("train.num_epochs=0", "train.num_epochs", "must be >= 1"),  # results.json of an untrained model
    ("train.batch_size=0", "train.batch_size", "must be >= 1"),
    ("train.max_steps=-5", "train.max_steps", "must be >= 0"),
    ("optimizer.name='sgd'", "optimizer.name", "must be one of ['adam', 'adamw', 'lamb']"),
    ("optimizer.schedule='cosine'", "optimizer.schedule", "must be one of"),
    ("optimizer.b2=1.0", "optimizer.b2", "must be < 1"),
    ("optimizer.warmup_ratio=1.5", "optimizer.warmup_ratio", "must be < 1"),
    ("model.overrides.hidden_dropout_prob=1.0", "model.overrides.hidden_dropout_prob", "must be < 1"),
    ("train.accumulation_steps=3", "train.batch_size", "accumulation_steps"),  # 16 % 3
    ("eval_splits=('validaton',)", "eval_splits", "is not a split of task 'indonli'"),
    ("seeds=(1,1)", "seeds", "listed twice"),
    ("task='indonly'", "task", "did you mean indonli"),
    ("model.preset='tiny-bret'", "model.preset", "did you mean tiny-bert"),
    ("mesh.shape={'data': 2}", "mesh.shape", "needs 2 devices, there are 1"),
    ("mesh.shape={'batch': -1}", "mesh.shape", "unknown mesh axes ['batch']"),
])
def test_config_value_out_of_range_is_refused_naming_the_key(tmp_path, tfds_dir, assignment, key, words):
    message = refused(tmp_path / "work", config_with(assignment, tfds_dir=tfds_dir))
    assert f"--config.{key}=" in message and words in message, message


def test_every_problem_of_a_config_is_named_on_one_line(tmp_path, tfds_dir):
    message = refused(tmp_path / "work", config_with("optimizer.lr=-1.0", "train.num_epochs=0",
                                                     "optimizer.name='sgd'", tfds_dir=tfds_dir))
    for key in ("optimizer.lr", "train.num_epochs", "optimizer.name"):
        assert f"--config.{key}=" in message


def test_a_config_file_key_nli_jax_does_not_have_or_lacks_is_refused(tmp_path, tfds_dir):
    """A user's config file with a mistyped key (set in the file, not on the command line, which
    refuses it when parsing flags) was silently ignored; one missing a key fails by name."""
    config = config_with(tfds_dir=tfds_dir)
    with config.unlocked():
        config.train.batchsize = 8
    assert "train.batchsize: not a config key of nli-jax (did you mean train.batch_size" in refused(
        tmp_path / "work", config)
    config = config_with(tfds_dir=tfds_dir)
    with config.unlocked():
        del config.train["seed"]
    assert "the config has no train.seed" in refused(tmp_path / "other", config)


def test_micro_batch_and_eval_batch_against_devices_and_processes():
    """batch 6 on 4 devices (and the other relations with devices), checked without the devices."""
    from nli_jax.errors import ConfigValueError
    from nli_jax.planner import build_plan
    with pytest.raises(ConfigValueError, match=r"--config.train.batch_size=6: the micro-batch of 6 examples .* 4 data"):
        build_plan(config_with("train.batch_size=6"), devices=4, processes=1)
    with pytest.raises(ConfigValueError, match=r"--config.train.eval_batch_size=10: must divide by the 4 data"):
        build_plan(config_with("train.eval_batch_size=10"), devices=4, processes=1)
    with pytest.raises(ConfigValueError, match=r"--config.train.batch_size=6: must divide by processes x accum"):
        build_plan(config_with("train.batch_size=6"), devices=4, processes=4)
    build_plan(config_with("train.batch_size=8", "train.accumulation_steps=2"), devices=4, processes=1)


def test_max_seq_length_below_what_a_pair_needs_is_refused(tmp_path, tfds_dir):
    # Silently ignored before: the tokenizer cannot cut a pair to 2 tokens and returned ~21.
    message = refused(tmp_path / "work", config_with("data.max_seq_length=2", tfds_dir=tfds_dir))
    assert "--config.data.max_seq_length=2: too short" in message and "needs at least 5 tokens" in message
    # Hypothesis-only needs [CLS] h [SEP]: 3.
    message = refused(tmp_path / "ho", config_with("data.max_seq_length=2", "task_options.hypothesis_only=True",
                                                   tfds_dir=tfds_dir))
    assert "needs at least 3 tokens" in message


def test_max_seq_length_above_the_model_positions_is_refused_before_training(tmp_path, tfds_dir):
    # Used to fail with a ValueError at step 3, when a long batch came.
    message = refused(tmp_path / "work", config_with("data.max_seq_length=129", tfds_dir=tfds_dir))
    assert "--config.data.max_seq_length=129: longer than the 128 positions" in message
    assert "tiny-bert" in message


def test_encoder_never_returns_more_tokens_than_max_seq_length():
    """The guard behind the check above: an encoding longer than asked is an error, not data."""
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import fixture_path
    from nli_jax.tasks.common import encode_text
    tokenizer = load_tokenizer(fixture_path("tiny_wordpiece"))
    assert len(encode_text(tokenizer, "ani membaca buku di rumah", "ani membaca", 6)["input_ids"]) == 6
    with pytest.raises(ValueError, match="data.max_seq_length"):
        encode_text(tokenizer, "ani membaca buku di rumah", "ani membaca", 2)


def test_warmup_longer_than_the_whole_run_is_refused(tmp_path, tfds_dir):
    # 300 examples / 16 = 18 steps per epoch, 2 epochs: 36 steps.
    message = refused(tmp_path / "work", config_with("train.num_epochs=2", "optimizer.warmup_steps=40",
                                                     tfds_dir=tfds_dir))
    assert "--config.optimizer.warmup_steps=40: not shorter than the whole run (36 steps" in message


def test_batch_larger_than_the_training_split_is_refused(tmp_path, tfds_dir):
    message = refused(tmp_path / "work", config_with("train.batch_size=512", "train.eval_batch_size=512",
                                                     tfds_dir=tfds_dir))
    assert "--config.train.batch_size=512: the training split has 300 examples, fewer than one batch" in message


def test_pretraining_relations_are_checked(tmp_path):
    from configs.pretrain import indobert_lite_base
    from nli_jax.errors import ConfigValueError
    from nli_jax import cli
    from nli_jax.planner import build_plan
    config = indobert_lite_base.get_config("cpu_test")
    cli.apply_overrides(config, ["task_options.max_predictions=100"])
    with pytest.raises(ConfigValueError, match=r"--config.task_options.max_predictions=100: more predictions than"):
        build_plan(config)
    config = indobert_lite_base.get_config("phase=1")  # the real recipe needs a tokenizer and a corpus
    with pytest.raises(ConfigValueError, match=r"model.tokenizer.*pretrain.corpus"):
        build_plan(config)


# --- 1. tokenizer against model and text -----------------------------------------------------

def fixture_words():
    from nli_jax.data import fixture_path
    with open(os.path.join(fixture_path("tiny_wordpiece"), "vocab.txt"), encoding="utf-8") as f:
        return [t for t in f.read().split("\n") if t and not t.startswith("[")]


def write_vocab(directory, tokens):
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (directory / "vocab.txt").write_text("\n".join(specials + list(tokens)) + "\n", encoding="utf-8")
    return directory


def test_tokenizer_directory_without_a_vocabulary_is_refused(tmp_path, tfds_dir):
    # tokenizer_config.json alone used to load as a 5-entry tokenizer: every word [UNK].
    from nli_jax.checkpoints import CheckpointError
    from nli_jax.data import fixture_path
    broken = tmp_path / "tokenizer"
    broken.mkdir()
    shutil.copy(os.path.join(fixture_path("tiny_wordpiece"), "tokenizer_config.json"), broken)
    message = refused(tmp_path / "work", config_with(f"model.tokenizer='{broken}'", tfds_dir=tfds_dir),
                      CheckpointError)
    assert str(broken) in message and "has no vocabulary" in message and "vocab.txt" in message


def test_tokenizer_with_only_special_tokens_is_refused(tmp_path, tfds_dir):
    from nli_jax.checkpoints import CheckpointError
    message = refused(tmp_path / "work", config_with(f"model.tokenizer='{write_vocab(tmp_path / 'tok', [])}'",
                                                     tfds_dir=tfds_dir), CheckpointError)
    assert "has only its 5 special tokens" in message


def test_tokenizer_that_maps_most_training_text_to_unk_is_refused(tmp_path, tfds_dir):
    chinese = write_vocab(tmp_path / "zh", [chr(c) for c in range(0x4E00, 0x4E00 + 200)])
    message = refused(tmp_path / "work", config_with(f"model.tokenizer='{chinese}'", tfds_dir=tfds_dir))
    assert f"tokenizer {chinese} maps 100% of the tokens of the first 256 train examples to [UNK]" in message


def test_damaged_tokenizer_json_names_the_directory(tmp_path, tfds_dir):
    from nli_jax.checkpoints import CheckpointError
    broken = tmp_path / "tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordPie')
    message = refused(tmp_path / "work", config_with(f"model.tokenizer='{broken}'", tfds_dir=tfds_dir),
                      CheckpointError)
    assert f"tokenizer in {broken} cannot be loaded" in message


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


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(tmp_path, tfds_dir, tiny_checkpoint):
    words = fixture_words() + [f"kata{i}" for i in range(100)]
    bigger = write_vocab(tmp_path / "big", words)
    message = refused(tmp_path / "work", config_with(f"model.init='{tiny_checkpoint}'", f"model.tokenizer='{bigger}'",
                                                     tfds_dir=tfds_dir))
    assert f"tokenizer {bigger} has {len(words) + 5} entries" in message and "vocab_size 185" in message


def test_tokenizer_other_than_the_checkpoints_own_is_refused(tmp_path, tfds_dir, tiny_checkpoint):
    """Same size, other order: every id would select another word's embedding."""
    words = fixture_words()
    shuffled = write_vocab(tmp_path / "shuffled", list(reversed(words)) + [f"[unused{i}]" for i in range(10)])
    message = refused(tmp_path / "work", config_with(f"model.init='{tiny_checkpoint}'",
                                                     f"model.tokenizer='{shuffled}'", tfds_dir=tfds_dir))
    assert "--config.model.tokenizer=" in message and "vocabulary differs from the one model.init" in message


def test_truncated_safetensors_names_the_file(tmp_path, tiny_checkpoint):
    from nli_jax.checkpoints import CheckpointError
    from nli_jax.models import ForSequenceClassification
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_checkpoint, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=rf"{weights}: unreadable safetensors file"):
        ForSequenceClassification.from_pretrained(str(damaged))
    weights.write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"{weights}: unreadable safetensors file"):
        ForSequenceClassification.from_pretrained(str(damaged))


def test_malformed_shard_index_names_the_file(tmp_path, tiny_checkpoint):
    from nli_jax.checkpoints import CheckpointError
    from nli_jax.models import ForSequenceClassification
    damaged = tmp_path / "sharded"
    shutil.copytree(tiny_checkpoint, damaged)
    (damaged / "model.safetensors").unlink()
    (damaged / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: not a shard index"):
        ForSequenceClassification.from_pretrained(str(damaged))


def test_truncated_pytorch_weights_name_the_file(tmp_path, tiny_checkpoint):
    pytest.importorskip("torch")
    from nli_jax.checkpoints import CheckpointError
    from nli_jax.models import ForSequenceClassification
    damaged = tmp_path / "torch"
    shutil.copytree(tiny_checkpoint, damaged)
    (damaged / "model.safetensors").unlink()
    (damaged / "pytorch_model.bin").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin: unreadable PyTorch weights"):
        ForSequenceClassification.from_pretrained(str(damaged))


# --- 1. readers: one reader per format, rows counted as lines --------------------------------

def smsa_rows(n):
    words = ["bagus", "buruk", "biasa"]
    labels = ["positive", "negative", "neutral"]
    return [f"ulasan nomor {i} {words[i % 3]}\t{labels[i % 3]}" for i in range(n)]


def test_smsa_rows_that_begin_with_a_quote_are_rows_not_csv_quoting(tmp_path):
    """Rows 100-200 used to become one example (csv quoting): quotes are text in these files."""
    from nli_jax.data import indonlu
    rows = smsa_rows(1100)
    rows[100] = '"pelayanan lambat sekali\tnegative'  # an opening quote with no closing one
    rows[150] = '"enak" katanya, "murah" juga\tpositive'
    rows[200] = 'makanan "biasa saja\tneutral'
    path = tmp_path / "train_preprocess.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    examples = indonlu.read_file(indonlu.TASKS["smsa"], str(path))
    assert len(examples) == len(rows) == 1100
    assert examples[100]["text"] == '"pelayanan lambat sekali' and examples[100]["line"] == 101
    assert examples[150]["text"] == '"enak" katanya, "murah" juga'
    assert [e["line"] for e in examples] == list(range(1, 1101))


def test_smsa_row_with_a_tab_inside_the_text_names_the_line(tmp_path):
    from nli_jax.data import indonlu
    from nli_jax.data.readers import DataError
    rows = smsa_rows(10)
    rows[6] = "teks\tdengan tab\tpositive"
    path = tmp_path / "train_preprocess.tsv"
    path.write_text("\n".join(rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"train_preprocess.tsv:7: expected 2 columns, got 3 \(tab-separated\)"):
        indonlu.read_file(indonlu.TASKS["smsa"], str(path))


def test_smsa_example_count_equals_row_count_in_a_whole_run_directory(tmp_path):
    from nli_jax.data import indonlu
    train, valid = smsa_rows(300), smsa_rows(40)
    train[5] = '"kutipan tanpa penutup\tnegative'
    (tmp_path / "train_preprocess.tsv").write_text("\n".join(train) + "\n\n", encoding="utf-8")
    (tmp_path / "valid_preprocess.tsv").write_text("\r\n".join(valid), encoding="utf-8")
    examples = indonlu.load_examples(indonlu.TASKS["smsa"], str(tmp_path))
    assert (len(examples["train"]), len(examples["validation"])) == (300, 40)


def test_real_smsa_counts_match_the_rows(shared_data):
    from nli_jax.data import indonlu
    directory = shared_data / "indonlu" / "smsa_doc-sentiment-prosa"
    examples = indonlu.load_examples(indonlu.TASKS["smsa"], str(directory))
    for split, name in (("train", "train_preprocess.tsv"), ("validation", "valid_preprocess.tsv")):
        rows = [line for line in (directory / name).read_text(encoding="utf-8").split("\n") if line.strip()]
        assert len(examples[split]) == len(rows)


def test_csv_stray_quote_is_an_error_naming_the_line(tmp_path):
    from nli_jax.data import indonlu
    from nli_jax.data.readers import DataError
    rows = ["label,tweet"] + [f"happy,cuitan nomor {i}" for i in range(8)]
    rows[4] = 'anger,"kesal" sekali hari ini'  # a quote then more text: not CSV
    path = tmp_path / "train_preprocess.csv"
    path.write_text("\n".join(rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"train_preprocess.csv:5: malformed CSV"):
        indonlu.read_file(indonlu.TASKS["emot"], str(path))


def test_nul_byte_is_an_error_naming_the_line(tmp_path):
    from nli_jax.data import indonlu
    from nli_jax.data.readers import DataError
    rows = ["label,tweet"] + [f"happy,cuitan nomor {i}" for i in range(8)]
    rows[3] = "sadness,sedih\x00sekali"
    path = tmp_path / "train_preprocess.csv"
    path.write_text("\n".join(rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"train_preprocess.csv:4: NUL byte"):
        indonlu.read_file(indonlu.TASKS["emot"], str(path))
    # A file cut by a crash and zero-filled, in any reader.
    (tmp_path / "train.jsonl").write_bytes("\n".join(nli_rows(4)).encode() + b"\n\0\0\0\0")
    from nli_jax.data import nli
    with pytest.raises(DataError, match=r"train.jsonl:5: NUL byte"):
        nli.read_file("indonli", str(tmp_path / "train.jsonl"))


def test_csv_quoted_field_over_several_lines_is_one_row_and_logged(tmp_path):
    """Legal CSV (EmoT's train file has one, and pandas reads it so): one row, logged with its lines."""
    import logging

    from nli_jax.data import indonlu
    rows = ["label,tweet", "happy,satu", 'love,"dua\nbaris"', "fear,tiga"]
    path = tmp_path / "train_preprocess.csv"
    path.write_text("\n".join(rows), encoding="utf-8")
    messages = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("nli_jax").addHandler(handler)
    try:
        examples = indonlu.read_file(indonlu.TASKS["emot"], str(path))
    finally:
        logging.getLogger("nli_jax").removeHandler(handler)
    assert [e["line"] for e in examples] == [2, 3, 5] and examples[1]["text"] == "dua\nbaris"
    assert any(f"{path}: 1 row(s) with a quoted field spanning several lines" in m and "lines 3-4" in m
               for m in messages)


def test_jsonl_line_separator_inside_a_string_is_not_a_new_line(tmp_path):
    """str.splitlines() also splits on U+2028, \\x0c, \\x1c...: line numbers and rows went wrong."""
    from nli_jax.data import nli
    rows = nli_rows(6)
    rows[2] = json.dumps({"premise": "baris\u2028pertama\x0ckedua", "hypothesis": "h", "label": "e"},
                         ensure_ascii=False)
    rows[4] = '{"premise": "a", "hypothesis": "b", "label": "x"}'
    (tmp_path / "train.jsonl").write_text("\n".join(rows), encoding="utf-8")
    (tmp_path / "val.jsonl").write_text("\n".join(nli_rows(3)), encoding="utf-8")
    from nli_jax.data.readers import DataError
    with pytest.raises(DataError, match=r"train.jsonl:5: unknown label 'x'"):
        nli.load_examples(INDONLI, str(tmp_path))
    rows[4] = nli_rows(1)[0]
    (tmp_path / "train.jsonl").write_text("\n".join(rows), encoding="utf-8")
    examples = nli.load_examples(INDONLI, str(tmp_path))["train"]
    assert len(examples) == 6 and examples[2]["premise"] == "baris\u2028pertama\x0ckedua"


def test_json_array_errors_name_the_line_of_the_record(tmp_path):
    from nli_jax.data import nli
    from nli_jax.data.readers import DataError
    (tmp_path / "train.jsonl").write_text("\n".join(nli_rows(3)), encoding="utf-8")
    (tmp_path / "val.jsonl").write_text("\n".join(nli_rows(3)), encoding="utf-8")
    records = [{"pair_id": i, "premise": "a", "hypothesis": "b", "label": "e", "inference_phenomena": ["NEG"]}
               for i in range(4)]
    records[2]["label"] = "q"
    (tmp_path / "diagnostic.jsonl").write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]")
    with pytest.raises(DataError, match=r"diagnostic.jsonl:4: unknown label 'q'"):
        nli.load_examples(INDONLI, str(tmp_path))
    (tmp_path / "diagnostic.jsonl").write_text('[\n{"pair_id": 1},\n{"pair_id": 2,,}\n]')
    with pytest.raises(DataError, match=r"diagnostic.jsonl:3: malformed JSON array"):
        nli.load_examples(INDONLI, str(tmp_path))
    (tmp_path / "diagnostic.jsonl").write_text("[]")
    with pytest.raises(DataError, match=r"diagnostic.jsonl: no examples"):
        nli.load_examples(INDONLI, str(tmp_path))


def test_non_utf8_pretraining_corpus_names_the_line(tmp_path):
    from nli_jax.data.readers import DataError
    from nli_jax.pretraining.examples import _documents
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("Kalimat satu.\nKalimat dua.\n\n".encode() + "Caf\xe9 tiga.\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"corpus.txt:4: not UTF-8"):
        list(_documents(str(corpus)))


def test_pretraining_examples_of_other_settings_are_rebuilt_or_refused(tmp_path):
    """Examples built in the workdir by a refused attempt are not reused with other settings
    (they were before: only the length and sentence task were compared); once the workdir has
    trained on them, other settings are refused."""
    from conftest import config_for, task_for
    from nli_jax.errors import RunError
    config = config_for("pretrain.indobert_lite_base:cpu_test", "pretrain.dupe_factor=2")
    task = task_for(config)
    examples = tmp_path / "work" / "examples"
    examples.mkdir(parents=True)
    corpus = sorted(__import__("glob").glob(config.pretrain.corpus[0]))
    (examples / "examples.json").write_text(json.dumps({
        "max_seq_length": 64, "short_seq_prob": 0.1, "sentence_task": "sop", "dupe_factor": 1, "seed": 12345,
        "heldout_permille": 100, "vocab_dir": os.path.abspath(config.model.tokenizer),
        "corpus": [os.path.abspath(f) for f in corpus]}))
    assert task.stale_settings(str(examples), corpus) == ["dupe_factor: 1 -> 2"]
    (tmp_path / "work" / "checkpoints" / "20").mkdir(parents=True)
    with pytest.raises(RunError, match=r"examples was built with other settings \(dupe_factor: 1 -> 2\) and this "
                                       r"workdir has trained on them"):
        task.load(str(tmp_path / "work"))
    assert (examples / "examples.json").is_file()


# --- 1. inputs changed under a workdir ------------------------------------------------------

def test_data_changed_between_a_kill_and_the_rerun_is_refused(trained, inputs, tfds_dir, tmp_path):
    """Used to resume and silently mix old and new data (history jumped from epoch 5 to 11)."""
    workdir = copy_run(trained, tmp_path)
    with restored_afterwards(inputs / "data" / "train.jsonl") as train:
        rows = train.read_text(encoding="utf-8").splitlines()
        train.write_text("\n".join(rows[:-20] + nli_rows(20)) + "\n", encoding="utf-8")
        message = refused(workdir, resumable_config(inputs, tfds_dir))
    assert f"data file {train} changed" in message and "trained on other inputs" in message


def test_a_data_file_that_appears_is_named(trained, inputs, tfds_dir, tmp_path):
    workdir = copy_run(trained, tmp_path)
    added = inputs / "data" / "test_extra.jsonl"
    # A held-out split that was absent: the final evaluation would change under the same workdir.
    lay = inputs / "data" / "test_lay.jsonl"
    lay.rename(added)
    try:
        message = refused(workdir, resumable_config(inputs, tfds_dir))
    finally:
        added.rename(lay)
    assert f"data file {lay} is no longer read" in message


def test_tokenizer_changed_under_a_workdir_is_refused(trained, inputs, tfds_dir, tmp_path):
    workdir = copy_run(trained, tmp_path)
    with restored_afterwards(inputs / "tokenizer" / "vocab.txt") as vocab:
        lines = vocab.read_text(encoding="utf-8").split("\n")
        lines[10], lines[11] = lines[11], lines[10]  # same size: the ids of two words swap
        vocab.write_text("\n".join(lines), encoding="utf-8")
        message = refused(workdir, resumable_config(inputs, tfds_dir))
    assert f"tokenizer file {vocab} changed" in message


def test_model_init_files_are_fingerprinted(tmp_path, tiny_checkpoint):
    from nli_jax.train import inputs as inputs_lib
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, model)
    before = inputs_lib.fingerprint(model_dir=str(model))
    assert str(model / "model.safetensors") in before["model.init"] and str(model / "config.json") in before["model.init"]
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    (tmp_path / "work").mkdir()
    inputs_lib.write_inputs(str(tmp_path / "work"), before)
    with pytest.raises(inputs_lib.InputsChangedError, match=rf"model.init file {weights} changed"):
        inputs_lib.check_inputs(str(tmp_path / "work"), inputs_lib.fingerprint(model_dir=str(model)), trained=True)
    # Big files are hashed by size and their first, middle and last MiB.
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (inputs_lib.WHOLE_FILE_LIMIT + 10))
    assert inputs_lib.file_digest(str(big)).startswith(f"size:{inputs_lib.WHOLE_FILE_LIMIT + 10},")


def test_evaluating_a_run_with_another_tokenizer_is_refused(trained, inputs, tmp_path):
    from nli_jax import cli
    from nli_jax.train.inputs import InputsChangedError
    from nli_jax.tools import evaluate_checkpoint
    config = cli.checkpoint_config(None, str(trained))
    with restored_afterwards(inputs / "tokenizer" / "vocab.txt") as vocab:
        lines = vocab.read_text(encoding="utf-8").split("\n")
        lines[10], lines[11] = lines[11], lines[10]
        vocab.write_text("\n".join(lines), encoding="utf-8")
        with pytest.raises(InputsChangedError, match=rf"trained with another tokenizer .*tokenizer file {vocab} changed"):
            evaluate_checkpoint(config, str(tmp_path / "eval"), str(trained))


def test_unreadable_config_json_or_inputs_json_is_named(trained, inputs, tfds_dir, tmp_path):
    from nli_jax.workdir import WorkdirConfigError
    from nli_jax.train.inputs import InputsChangedError
    workdir = copy_run(trained, tmp_path)
    (workdir / "config.json").write_text('{"task": "indo')  # SIGKILL while it was written, by an old version
    message = refused(workdir, resumable_config(inputs, tfds_dir), WorkdirConfigError)
    assert f"{workdir / 'config.json'} is unreadable" in message
    shutil.copy(trained / "config.json", workdir / "config.json")
    (workdir / "inputs.json").write_text("")
    message = refused(workdir, resumable_config(inputs, tfds_dir), InputsChangedError)
    assert f"{workdir / 'inputs.json'} is unreadable" in message


def test_checkpoints_without_config_json_are_refused(trained, inputs, tfds_dir, tmp_path):
    workdir = copy_run(trained, tmp_path)
    (workdir / "config.json").unlink()
    message = refused(workdir, resumable_config(inputs, tfds_dir))
    assert "holds checkpoints or results but no config.json" in message


# --- 2. interruptions and damaged checkpoints -------------------------------------------------

def largest_file(directory):
    files = [os.path.join(root, f) for root, _, names in os.walk(directory) for f in names]
    return max(files, key=os.path.getsize)


@pytest.mark.parametrize("damage", [
    pytest.param(lambda step: open(largest_file(step / "state" / "ocdbt.process_0"), "r+b").truncate(100),
                 id="truncated-array-file"),
    pytest.param(lambda step: open(step / "loop" / "metadata", "w").close(), id="empty-loop-metadata"),
    pytest.param(lambda step: (step / "data" / "process_0-of-1.json").write_text('{\n "next_ind'),
                 id="truncated-data-iterator-json", marks=pytest.mark.slow),
])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(trained, inputs, tfds_dir, tmp_path, damage):
    from nli_jax.train.loop import train_and_evaluate
    workdir = copy_run(trained, tmp_path)
    (workdir / "results.json").unlink()
    damage(workdir / "checkpoints" / "4")
    train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    log = (workdir / "train.log").read_text()
    bad = [line for line in log.splitlines() if "is unreadable" in line]
    assert len(bad) == 1 and f"checkpoint {workdir / 'checkpoints' / '4'} is unreadable" in bad[0]
    assert "resumed from step 2" in bad[0] and "resumed from" in log
    # Nothing lost: the damaged step is kept aside, and the rerun reaches the same parameters.
    assert (workdir / "checkpoints_unreadable" / "4").is_dir()
    assert_same_run(workdir, trained)


def test_empty_checkpoint_metadata_file_still_resumes(trained, inputs, tfds_dir, tmp_path):
    """orbax's _CHECKPOINT_METADATA (timestamps) is not needed to restore: the step is used."""
    from nli_jax.train.loop import train_and_evaluate
    workdir = copy_run(trained, tmp_path)
    open(workdir / "checkpoints" / "4" / "_CHECKPOINT_METADATA", "w").close()
    train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    assert f"resumed from {workdir / 'checkpoints'} at step 4" in (workdir / "train.log").read_text()
    assert_same_run(workdir, trained)


def test_the_final_checkpoint_leaves_out_the_optimizer_state_and_a_rerun_evaluates_from_it(trained, inputs, tfds_dir,
                                                                                           tmp_path):
    """No step follows the last one: its checkpoint holds the parameters and the step, not Adam's
    moments. A run killed after it (no results.json yet) evaluates from it again, untrained."""
    import orbax.checkpoint as ocp
    from nli_jax.train.loop import train_and_evaluate
    with ocp.StandardCheckpointer() as checkpointer:
        saved = {step: checkpointer.restore(os.path.join(trained, "checkpoints", step, "state"))
                 for step in ("2", "4")}
    assert sorted(saved["2"]) == ["opt_state", "params", "step"]
    assert sorted(saved["4"]) == ["params", "step"]
    workdir = copy_run(trained, tmp_path)
    (workdir / "results.json").unlink()
    train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    log = (workdir / "train.log").read_text()
    assert f"resumed from {workdir / 'checkpoints'} at step 4" in log
    assert log.split("resumed from")[1].count("step 4/4") == 0  # no step trained again
    assert_same_run(workdir, trained)


def test_best_parameters_whose_write_did_not_finish_are_taken_from_the_checkpoint(trained, inputs, tfds_dir, tmp_path):
    """best/ is written in the background: a kill can leave the checkpoint that names the best
    step committed and best/<step> not. The rerun takes that step's parameters from the checkpoint."""
    from nli_jax.train.loop import train_and_evaluate
    workdir = copy_run(trained, tmp_path)
    best_step = json.loads((trained / "results.json").read_text())["best_step"]
    shutil.rmtree(workdir / "best" / str(best_step))
    (workdir / "results.json").unlink()
    train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    log = (workdir / "train.log").read_text()
    assert f"best parameters {workdir / 'best' / str(best_step)} are missing" in log
    assert (workdir / "best" / str(best_step)).is_dir()  # written again
    assert_same_run(workdir, trained)


def test_no_intact_checkpoint_names_the_directory_and_changes_nothing(trained, inputs, tfds_dir, tmp_path):
    from nli_jax.train.checkpointing import CheckpointUnreadableError
    workdir = copy_run(trained, tmp_path)
    for step in ("2", "4"):
        open(workdir / "checkpoints" / step / "loop" / "metadata", "w").close()
    message = refused(workdir, resumable_config(inputs, tfds_dir), CheckpointUnreadableError)
    assert f"no intact checkpoint in {workdir / 'checkpoints'}" in message
    assert "step 4: JSONDecodeError" in message and "step 2: JSONDecodeError" in message


def test_unreadable_best_parameters_are_taken_from_the_same_steps_checkpoint(trained, inputs, tfds_dir, tmp_path):
    from nli_jax.train.loop import train_and_evaluate
    workdir = copy_run(trained, tmp_path)
    best_step = json.loads((trained / "results.json").read_text())["best_step"]
    open(largest_file(workdir / "best" / str(best_step) / "params"), "r+b").truncate(100)
    train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    assert f"took step {best_step}'s parameters from" in (workdir / "train.log").read_text()
    assert (workdir / "checkpoints_unreadable" / f"best-{best_step}").is_dir()
    assert_same_run(workdir, trained)


def test_unreadable_best_parameters_without_a_checkpoint_name_the_directory(trained, inputs, tfds_dir, tmp_path):
    from nli_jax.train.loop import train_and_evaluate
    from nli_jax.train.checkpointing import CheckpointUnreadableError
    workdir = copy_run(trained, tmp_path)
    best_step = json.loads((trained / "results.json").read_text())["best_step"]
    open(largest_file(workdir / "best" / str(best_step) / "params"), "r+b").truncate(100)
    shutil.rmtree(workdir / "checkpoints" / str(best_step))
    with pytest.raises(CheckpointUnreadableError, match=rf"best parameters in {workdir / 'best' / str(best_step)} "
                                                        r"are unreadable"):
        train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    assert (workdir / "best" / str(best_step)).is_dir()


def test_saving_a_step_that_exists_is_a_no_op(tmp_path):
    """SIGTERM on a checkpoint step asks for the step just saved: StepAlreadyExistsError before."""
    import grain
    import jax.numpy as jnp
    from nli_jax.train.checkpointing import Checkpointer
    ckpt = Checkpointer(str(tmp_path), async_save=True)
    iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
    next(iterator)
    from nli_jax.train.record import LoopRecord
    loop = LoopRecord()
    state = {"step": jnp.int32(2), "x": jnp.ones(3)}
    assert ckpt.save(2, state, iterator, loop)
    assert not ckpt.save(2, state, iterator, loop, force=True)  # while the async save may still run
    ckpt.wait()
    assert not ckpt.save(2, state, iterator, loop, force=True)
    ckpt.close()
    ckpt = Checkpointer(str(tmp_path), async_save=False)  # a rerun of the command
    assert not ckpt.save(2, state, iterator, loop, force=True)
    ckpt.close()


def test_best_step_saved_before_an_interruption_is_saved_again_after_the_resume(tmp_path):
    """SIGKILL between saving a new best (step 6) and the checkpoint of step 6: the resumed run
    (from step 4) reaches step 6 again and saves it again; the final evaluation reads the loop's
    best step, and best/ is left with that one step."""
    import jax
    import jax.numpy as jnp
    from nli_jax.train.checkpointing import Checkpointer, CheckpointUnreadableError
    ckpt = Checkpointer(str(tmp_path), async_save=False)
    params = {"w": jnp.ones(3)}
    ckpt.save_best(2, params, {"step": 2})
    ckpt.save_best(6, {"w": jnp.full(3, 6.0)}, {"step": 6})  # before the interruption
    ckpt.save_best(6, {"w": jnp.full(3, 7.0)}, {"step": 6})  # after the resume: no StepAlreadyExistsError
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
    restored, info = ckpt.restore_best(abstract, step=6)
    assert info == {"step": 6} and float(restored["w"][0]) == 7.0
    restored, _ = ckpt.restore_best(abstract, step=2)  # the loop's best when step 6 did not improve again
    assert float(restored["w"][0]) == 1.0
    ckpt.prune_best(2)
    assert ckpt.best.all_steps() == [2]
    with pytest.raises(CheckpointUnreadableError, match=r"the run's best step 6 has no parameters in"):
        ckpt.restore_best(abstract, step=6)
    ckpt.close()


def test_sigterm_on_a_checkpoint_step_saves_and_exits_143(inputs, tfds_dir, tmp_path, monkeypatch, trained):
    """The signal arrives while step 2's regular checkpoint is written; the loop must exit 143 with
    that checkpoint, and the rerun finish exactly as an uninterrupted run."""
    from nli_jax.train.loop import train_and_evaluate
    from nli_jax.train.checkpointing import Checkpointer
    original = Checkpointer.save

    def save_then_sigterm(self, step, *args, **kwargs):
        saved = original(self, step, *args, **kwargs)
        if step == 2 and not kwargs.get("force"):
            os.kill(os.getpid(), signal.SIGTERM)
        return saved
    monkeypatch.setattr(Checkpointer, "save", save_then_sigterm)
    workdir = tmp_path / "work"
    with pytest.raises(SystemExit) as exit_info:
        train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    assert exit_info.value.code == 143
    assert "SIGTERM: checkpoint saved at step 2" in (workdir / "train.log").read_text()
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]
    monkeypatch.setattr(Checkpointer, "save", original)
    train_and_evaluate(resumable_config(inputs, tfds_dir), str(workdir))
    assert_same_run(workdir, trained)


# --- 3. the command line: one line, the key, nothing written ---------------------------------

def test_mistyped_config_key_is_one_line_with_the_closest_keys(tmp_path):
    proc = cli_run(tmp_path / "work", "--config.train.batchsize=8")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: unknown config key 'train.batchsize' (--config.train.batchsize=8); did you mean "
                     "train.batch_size or train.eval_batch_size or train.seed?"], proc.stderr[-2000:]
    assert not (tmp_path / "work").exists()


def test_config_value_error_is_one_line_without_a_traceback(tmp_path):
    proc = cli_run(tmp_path / "work", "--config.optimizer.lr=-1e-3")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "error: --config.optimizer.lr=-0.001: optimizer.lr must be > 0" in proc.stderr
    assert not (tmp_path / "work").exists()


def test_refusal_for_the_devices_writes_nothing_that_blocks_the_corrected_command(tmp_path):
    """batch 6 on 4 devices used to write config.json, and then refused batch 8 as a changed key."""
    from nli_jax.planner import config_dict
    from nli_jax.workdir import check_config
    workdir = tmp_path / "work"
    proc = cli_run(workdir, "--config.train.batch_size=6", devices=4)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--config.train.batch_size=6: the micro-batch of 6 examples" in proc.stderr
    assert not workdir.exists() or set(os.listdir(workdir)) <= {"train.log"}
    check_config(str(workdir), config_dict(config_with("train.batch_size=8")))


def test_override_typo_names_the_closest_keys():
    from absl import app

    from nli_jax import cli
    with pytest.raises(app.UsageError, match=r"no config field 'train.eval_batchsize'; did you mean "
                                             r"train.eval_batch_size"):
        cli.apply_overrides(config_with(), ["train.eval_batchsize=32"])


# --- 4. files written ------------------------------------------------------------------------

def test_exports_are_readable_by_the_group(tmp_path, tiny_checkpoint):
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.models import ForSequenceClassification
    previous = os.umask(0o022)
    try:
        model = ForSequenceClassification.from_pretrained(str(tiny_checkpoint))
        model.save_pretrained(str(tmp_path / "export"), tokenizer=load_tokenizer(str(tiny_checkpoint)))
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "export").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_downloaded_dataset_files_are_readable_by_the_group(tmp_path):
    import functools
    import http.server
    import threading

    from nli_jax.data import fixture_path, records
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=fixture_path("nli_tiny"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    previous = os.umask(0o022)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        records.download_files({"val.jsonl": base + "val.jsonl"}, str(tmp_path / "dl"), required={"val.jsonl"})
    finally:
        os.umask(previous)
        server.shutdown()
    assert (tmp_path / "dl" / "val.jsonl").stat().st_mode & 0o777 == 0o644


def test_every_file_of_a_run_is_readable_by_the_group(trained):
    unreadable = [os.path.relpath(os.path.join(root, f), trained) for root, _, files in os.walk(trained)
                  for f in files if os.stat(os.path.join(root, f)).st_mode & 0o044 != 0o044]
    assert not unreadable
