"""Vocabulary extension (issue 52 item 1): pretrain.extend_vocab adds pieces trained on new text to
WordPiece and SentencePiece unigram tokenizers; continued pretraining with the extended tokenizer
grows the embeddings, decoder and bias, each new row the mean of its old pieces' rows (checked
against the old tokenizer's own tokenization), and leaves the old tokens' logits unchanged."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, config_for

SYLLABLES = ["ka", "mu", "nga", "ngi", "sa", "ra", "wu", "lo", "pe", "ndu", "mbo", "rik", "tan", "gul", "seng"]


def write_local_text(path, syllables, seed, lines=1500):
    """Synthetic "local language" text: words of 2-4 syllables, one sentence per line, documents
    of 10 sentences (a blank line between them)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(200)]
    with open(path, "w") as f:
        for number in range(lines):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + "\n")
            if number % 10 == 9:
                f.write("\n")
    return str(path)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A tiny BERT with an MLM and NSP head saved with the shipped 185-piece WordPiece tokenizer,
    its decoder bias non-zero (so the bias's mean is checked too)."""
    import jax.numpy as jnp

    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.data import fixture_path
    from nli_jax.models import ForMaskedLM, make_rngs, preset
    directory = tmp_path_factory.mktemp("tiny_checkpoint")
    tokenizer = load_tokenizer(fixture_path("tiny_wordpiece"))
    model = ForMaskedLM(preset("tiny-bert", vocab_size=len(tokenizer), dtype="float32"), rngs=make_rngs(3),
                        sentence_head=True)
    model.mlm.bias[...] = jnp.linspace(-1.0, 1.0, len(tokenizer))
    model.save_pretrained(str(directory), tokenizer=tokenizer)
    return str(directory)


@pytest.fixture(scope="module")
def extended(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint's tokenizer extended with 40 pieces of two synthetic languages."""
    from nli_jax.pretraining.vocab_extension import extend_vocabulary
    root = tmp_path_factory.mktemp("extended")
    corpora = {"jav": [write_local_text(root / "jav.txt", SYLLABLES[:9], 1)],
               "sun": [write_local_text(root / "sun.txt", SYLLABLES[6:], 2)]}
    report = extend_vocabulary(tiny_checkpoint, corpora, 40, str(root / "tokenizer"))
    return str(root / "tokenizer"), report, corpora


def test_wordpiece_extension_tokenizes_with_the_new_pieces(tiny_checkpoint, extended):
    from transformers import AutoTokenizer

    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.pretraining.vocab import load_fast_tokenizer
    directory, report, corpora = extended
    old = load_tokenizer(tiny_checkpoint)
    assert report.kind == "WordPiece" and len(report.pieces) == 40 and report.vocab_size == len(old) + 40
    for loaded in (AutoTokenizer.from_pretrained(directory), load_tokenizer(directory)):
        vocab = loaded.get_vocab()
        assert len(loaded) == len(old) + 40
        assert all(vocab[t] == i for t, i in old.get_vocab().items())  # every old token keeps its id
        assert [vocab[p] for p in report.pieces] == list(range(len(old), len(old) + 40))
    # The example builder's own WordPiece encoder (vocab.txt) agrees with transformers' on the new text.
    line = open(corpora["jav"][0]).readline().strip()
    auto = AutoTokenizer.from_pretrained(directory)
    assert load_fast_tokenizer(directory).encode(line, add_special_tokens=False).tokens == auto.tokenize(line)
    assert any(t in report.pieces for t in auto.tokenize(line))
    for name in ("jav", "sun"):
        f = report.fertility[name]
        assert f["after"] < f["before"], report.table()
    saved = json.loads(open(os.path.join(directory, "vocab_extension.json")).read())
    assert saved["new_pieces"] == list(report.pieces) and set(saved["fertility"]) == {"jav", "sun"}


def _continued_config(init, tokenizer, *assignments):
    return config_for("pretrain.indobert_base:continue,cpu_test", f"model.init={init}", f"model.tokenizer={tokenizer}",
                      *assignments)


def _models(config):
    """(the checkpoint as loaded, the run's grown model, the growth) as the run builds them."""
    from nli_jax.planner import build_plan
    from nli_jax.train.setup import build_model, model_inputs
    plan = build_plan(config)
    checked = model_inputs(plan)
    old = build_model(plan.model, checked.task, checked.tokenizer, plan.seed)
    grown = build_model(plan.model, checked.task, checked.tokenizer, plan.seed, growth=checked.growth)
    return old, grown, checked


def test_new_rows_are_the_mean_of_the_old_pieces_and_old_logits_are_unchanged(tiny_checkpoint, extended):
    import jax.numpy as jnp

    from nli_jax.checkpoints import load_tokenizer
    directory, report, _ = extended
    old_model, model, checked = _models(_continued_config(tiny_checkpoint, directory))
    old_tokenizer, new_tokenizer = load_tokenizer(tiny_checkpoint), load_tokenizer(directory)
    old_size = len(old_tokenizer)
    assert checked.growth.init == "mean" and checked.encoder_config.vocab_size == old_size + 40
    embeddings, bias = np.asarray(model.encoder.embeddings.word.embedding[...]), np.asarray(model.mlm.bias[...])
    old_embeddings, old_bias = np.asarray(old_model.encoder.embeddings.word.embedding[...]), np.asarray(old_model.mlm.bias[...])
    assert embeddings.shape == (old_size + 40, old_embeddings.shape[1]) and bias.shape == (old_size + 40,)
    np.testing.assert_array_equal(embeddings[:old_size], old_embeddings)
    np.testing.assert_array_equal(bias[:old_size], old_bias)
    checked_words = 0
    for piece in report.pieces:
        new_id = new_tokenizer.convert_tokens_to_ids(piece)
        if piece.startswith("##"):
            continue  # a continuation has no string of its own for the old tokenizer: below
        pieces = old_tokenizer.convert_tokens_to_ids(old_tokenizer.tokenize(piece))  # the old tokenizer, as users call it
        assert old_tokenizer.unk_token_id not in pieces
        np.testing.assert_allclose(embeddings[new_id], old_embeddings[pieces].mean(0), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(bias[new_id], old_bias[pieces].mean(), rtol=1e-6, atol=1e-7)
        checked_words += 1
    assert checked_words >= 10
    # A continuation "##xy" is the old tokenizer's pieces of "xy" inside a word: with "k" before it
    # (a single-character first piece the old vocabulary has), the pieces after "k".
    continuations = [p for p in report.pieces if p.startswith("##")]
    for piece in continuations:
        tokens = old_tokenizer.tokenize("k" + piece[2:])
        if tokens[0] != "k":
            continue
        pieces = old_tokenizer.convert_tokens_to_ids(tokens[1:])
        np.testing.assert_allclose(embeddings[new_tokenizer.convert_tokens_to_ids(piece)],
                                   old_embeddings[pieces].mean(0), rtol=1e-6, atol=1e-7)
    # Step 0: the old tokens' logits, on text of old tokens, are the checkpoint's.
    ids = jnp.asarray(np.random.default_rng(0).integers(5, old_size, (2, 16)), jnp.int32)
    ones, zeros = jnp.ones_like(ids), jnp.zeros_like(ids)
    before = np.asarray(old_model(ids, ones, zeros)["mlm_logits"])
    after = np.asarray(model(ids, ones, zeros)["mlm_logits"])
    assert after.shape[-1] == old_size + 40
    np.testing.assert_allclose(after[..., :old_size], before, rtol=1e-6, atol=1e-6)


def test_random_initialisation_as_an_option(tiny_checkpoint, extended):
    directory, report, _ = extended
    old_model, model, checked = _models(_continued_config(tiny_checkpoint, directory,
                                                          "task_options.new_token_init=random"))
    old_size = checked.growth.old_vocab_size
    embeddings = np.asarray(model.encoder.embeddings.word.embedding[...])
    np.testing.assert_array_equal(embeddings[:old_size], np.asarray(old_model.encoder.embeddings.word.embedding[...]))
    new_rows = embeddings[old_size:]
    assert abs(new_rows.std() - 0.02) < 0.005  # BERT's N(0, initializer_range)
    np.testing.assert_array_equal(np.asarray(model.mlm.bias[...])[old_size:], 0.0)


def test_a_tokenizer_that_moves_old_tokens_or_a_fine_tuning_run_is_refused(tiny_checkpoint, extended, tmp_path):
    import shutil

    from nli_jax.errors import ConfigValueError
    from nli_jax.planner import build_plan
    from nli_jax.train.setup import model_inputs
    directory, _, _ = extended
    moved = tmp_path / "moved"
    shutil.copytree(directory, moved)
    os.remove(moved / "tokenizer.json") if (moved / "tokenizer.json").exists() else None
    lines = (moved / "vocab.txt").read_text().splitlines()
    lines[10], lines[11] = lines[11], lines[10]
    (moved / "vocab.txt").write_text("\n".join(lines) + "\n")
    # Larger than the checkpoint and not its extension: refused by its size, as before extensions.
    with pytest.raises(ConfigValueError, match="has 225 entries .* the tokenizer does not fit the model"):
        model_inputs(build_plan(_continued_config(tiny_checkpoint, str(moved))))
    finetune = config_for("indonlu:task=emot,cpu_test", f"model.init={tiny_checkpoint}", f"model.tokenizer={directory}")
    with pytest.raises(ConfigValueError, match="only continued pretraining grows"):
        model_inputs(build_plan(finetune))


def _xlmr_style_tokenizer(directory, text_file):
    """A SentencePiece unigram tokenizer saved as transformers' XLM-R fast tokenizer."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import XLMRobertaTokenizerFast
    unigram = SentencePieceUnigramTokenizer()
    unigram.train([text_file], vocab_size=60, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                  unk_token="<unk>", show_progress=False)
    XLMRobertaTokenizerFast(tokenizer_object=unigram._tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>", mask_token="<mask>", cls_token="<s>",
                            sep_token="</s>").save_pretrained(str(directory))
    return str(directory)


def test_cli_extends_a_sentencepiece_unigram_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from nli_jax.pretraining.vocab_extension import old_pieces
    base_text = write_local_text(tmp_path / "base.txt", SYLLABLES[:6], 3, lines=800)
    base = _xlmr_style_tokenizer(tmp_path / "base", base_text)
    # New words of the base text's letters, so that the old tokenizer has pieces for every new one.
    write_local_text(tmp_path / "jav.txt", SYLLABLES[:6] + ["ri", "su", "mi", "gu"], 4)
    proc = subprocess.run([sys.executable, "-m", "pretrain.extend_vocab", f"--tokenizer={base}",
                           f"--corpus=jav={tmp_path}/jav.txt", "--new_pieces=30", f"--output={tmp_path}/out"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| jav |" in proc.stdout and "Unigram" in proc.stdout
    old, new = AutoTokenizer.from_pretrained(base), AutoTokenizer.from_pretrained(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "vocab_extension.json").read_text())
    assert len(new) == len(old) + len(saved["new_pieces"]) > len(old)
    assert new.convert_tokens_to_ids("<mask>") == old.convert_tokens_to_ids("<mask>")
    line = open(tmp_path / "jav.txt").readline()
    assert any(t in saved["new_pieces"] for t in new.tokenize(line))
    assert saved["fertility"]["jav"]["after"] < saved["fertility"]["jav"]["before"]
    # A word-initial piece's old pieces are the old tokenizer's own tokenization of that word.
    word_initial = [p for p in saved["new_pieces"] if p.startswith("\u2581") and len(p) > 2]
    assert word_initial
    for piece in word_initial:
        assert old_pieces(old, "Unigram", piece) == old.convert_tokens_to_ids(old.tokenize(piece[1:]))


def test_cli_refuses_what_it_cannot_extend(tmp_path, tiny_checkpoint):
    def run(*flags):
        return subprocess.run([sys.executable, "-m", "pretrain.extend_vocab", *flags], cwd=REPO, capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    proc = run(f"--tokenizer={tiny_checkpoint}", f"--corpus=jav={tmp_path}/none*.txt", "--new_pieces=5",
               f"--output={tmp_path}/out")
    assert proc.returncode == 1 and "matches no files" in proc.stderr.strip().splitlines()[-1]
    text = write_local_text(tmp_path / "t.txt", SYLLABLES, 5, lines=50)
    proc = run(f"--tokenizer={tiny_checkpoint}", f"--corpus={text}", "--new_pieces=0", f"--output={tmp_path}/out")
    assert proc.returncode == 1 and "--new_pieces=0" in proc.stderr


@pytest.mark.slow
def test_continued_run_with_the_extended_tokenizer_exports_a_larger_vocabulary(tiny_checkpoint, extended, tmp_path):
    """pretrain.main continues the tiny checkpoint with the extended tokenizer; the export loads in
    transformers with the larger vocabulary and its tokenizer, with nli-jax's logits."""
    import jax.numpy as jnp
    import torch
    from transformers import AutoTokenizer, BertForPreTraining

    from nli_jax.models import ForMaskedLM
    directory, report, corpora = extended
    workdir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pretrain.main", "--config=configs/pretrain/indobert_base.py:continue,cpu_test",
                           f"--workdir={workdir}", f"--config.model.init={tiny_checkpoint}",
                           f"--config.model.tokenizer={directory}", f"--config.pretrain.corpus=('{corpora['jav'][0]}',)",
                           "--config.train.max_steps=4", "--config.train.eval_every_steps=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    export = workdir / "export"
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert len(tokenizer) == report.vocab_size
    line = open(corpora["jav"][0]).readline().strip()
    assert any(t in report.pieces for t in tokenizer.tokenize(line))
    reference = BertForPreTraining.from_pretrained(export).eval()
    assert reference.config.vocab_size == report.vocab_size
    ids = tokenizer(line, return_tensors="np")["input_ids"]
    assert ids.max() >= report.base_vocab_size  # new pieces in the input
    ours = ForMaskedLM.from_pretrained(str(export), sentence_head=True, dtype="float32")
    logits = np.asarray(ours(jnp.asarray(ids), jnp.ones_like(jnp.asarray(ids)), jnp.zeros_like(jnp.asarray(ids)))["mlm_logits"])
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids)).prediction_logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_minilm_grows_with_mean_rows_and_keeps_its_logits(minilm_dir, tmp_path):
    """The real all-MiniLM-L6-v2 BERT (30,522 pieces, no MLM head: one is initialised, tied)."""
    import jax.numpy as jnp

    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.pretraining.vocab_extension import extend_vocabulary
    text = write_local_text(tmp_path / "jav.txt", SYLLABLES, 7)
    report = extend_vocabulary(minilm_dir, {"jav": [text]}, 100, str(tmp_path / "tokenizer"))
    assert report.fertility["jav"]["after"] < report.fertility["jav"]["before"]
    old_model, model, checked = _models(_continued_config(minilm_dir, str(tmp_path / "tokenizer"),
                                                          f"pretrain.corpus=('{text}',)"))
    old_tokenizer = load_tokenizer(minilm_dir)
    embeddings = np.asarray(model.encoder.embeddings.word.embedding[...])
    old_embeddings = np.asarray(old_model.encoder.embeddings.word.embedding[...])
    assert embeddings.shape[0] == 30522 + 100
    for piece in [p for p in report.pieces if not p.startswith("##")][:20]:
        pieces = old_tokenizer.convert_tokens_to_ids(old_tokenizer.tokenize(piece))
        np.testing.assert_allclose(embeddings[checked.tokenizer.convert_tokens_to_ids(piece)],
                                   old_embeddings[pieces].mean(0), rtol=1e-6, atol=1e-7)
    ids = jnp.asarray(np.random.default_rng(0).integers(1000, 30522, (2, 16)), jnp.int32)
    ones, zeros = jnp.ones_like(ids), jnp.zeros_like(ids)
    np.testing.assert_allclose(np.asarray(model(ids, ones, zeros)["mlm_logits"])[..., :30522],
                               np.asarray(old_model(ids, ones, zeros)["mlm_logits"]), rtol=1e-5, atol=1e-5)


def test_a_bpe_tokenizer_or_text_without_new_pieces_is_refused(tmp_path, tiny_checkpoint):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    from nli_jax.errors import RunError
    from nli_jax.pretraining.vocab_extension import extend_vocabulary
    text = write_local_text(tmp_path / "t.txt", SYLLABLES, 6, lines=200)
    bpe = ByteLevelBPETokenizer()
    bpe.train([text], vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    RobertaTokenizerFast(tokenizer_object=bpe._tokenizer).save_pretrained(str(tmp_path / "bpe"))
    with pytest.raises(RunError, match="a BPE tokenizer; vocabulary extension handles WordPiece"):
        extend_vocabulary(str(tmp_path / "bpe"), {"jav": [text]}, 10, str(tmp_path / "out"))
    old_words = tmp_path / "old.txt"
    old_words.write_text("a b c\n" * 50)  # single letters: the old vocabulary has them all
    with pytest.raises(RunError, match="yields no pieces"):
        extend_vocabulary(tiny_checkpoint, {"x": [str(old_words)]}, 10, str(tmp_path / "out2"))
