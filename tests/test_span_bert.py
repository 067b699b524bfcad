"""SpanBERT-style span masking (nli_jax/tasks/span_bert.py, configs/pretrain/span_bert.py), added as
one module and one config on the masking rules: its spans follow the clipped geometric
distribution on real text, never split a word, and its :cpu_test variant pretrains and exports
through the command line."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO


def test_span_lengths_are_geometric_clipped_at_ten_with_mean_3_8():
    from configs.pretrain import span_bert
    from nli_jax.planner import build_plan
    rule = build_plan(span_bert.get_config("cpu_test"), training=False).task_options.masking_rule()
    n = np.arange(1, 11)
    expected = 0.2 * 0.8 ** (n - 1) / (1 - 0.8 ** 10)  # Geo(0.2) renormalised on 1..10
    np.testing.assert_allclose(rule.span_lengths, expected, rtol=1e-12)
    assert (rule.unit, rule.max_span, round(rule.mean_span(), 1)) == ("word", 10, 3.8)  # the paper's mean 3.8


def test_spans_on_real_text_follow_the_rule_and_keep_words_whole(shared_data, tmp_path):
    """Masks drawn by the objective's own set-up (its bound task's masking) on real Indonesian text
    (id_corpus_sample, a WordPiece vocabulary trained on it): in full-length rows the first span
    tried is accepted at its drawn length unless the row ends first, so those lengths follow the
    rule; and a word is masked whole or not at all."""
    from configs.pretrain import span_bert
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.pretraining.examples import ExampleSource, create_examples
    from nli_jax.pretraining.masking import mask_batch
    from nli_jax.pretraining.vocab import train_vocabulary
    from nli_jax.tasks import create_task
    from nli_jax.planner import build_plan
    files = [str(shared_data / "id_corpus_sample" / f) for f in ("frog_storytelling.txt", "detik_news_2025.txt")]
    vocab = train_vocabulary(files, str(tmp_path / "vocab"), vocab_size=4000)
    config = span_bert.get_config("phase=1")
    config.model.tokenizer = vocab
    plan = build_plan(config, training=False)
    task = create_task(plan).bind(load_tokenizer(vocab))
    create_examples(files, vocab, str(tmp_path / "examples"), max_seq_length=128, sentence_task="none", workers=2,
                    progress=False)
    source = ExampleSource(str(tmp_path / "examples"), "train")
    rows = [r for r in source.get_many(list(range(min(len(source), 8192)))) if len(r["a"]) + len(r["b"]) >= 100]
    out = mask_batch(rows, np.random.default_rng(0), task.masking_config, task.is_continuation, return_spans=True)
    first = out["accepted_ngrams"][0]
    first = first[first > 0]
    observed = np.bincount(first, minlength=11)[1:] / len(first)
    print(f"{len(first)} rows: first-span lengths {np.round(observed, 3)}, mean {first.mean():.2f} "
          f"(rule {np.round(task.masking.span_lengths, 3)}, mean {task.masking.mean_span():.2f})")
    assert len(first) > 2000 and np.abs(observed - np.asarray(task.masking.span_lengths)).max() < 0.03
    assert 3.5 < first.mean() < 3.9  # a few spans are cut short by the row's end or the budget
    # Whole words: a "##" piece right after a real token is masked exactly when that token is.
    masked = np.zeros(out["input_ids"].shape, bool)
    np.put_along_axis(masked, out["masked_positions"], out["masked_weights"] > 0, axis=1)
    original = out["input_ids"].copy()
    np.put_along_axis(original, out["masked_positions"], np.where(out["masked_weights"] > 0, out["masked_ids"],
                      np.take_along_axis(original, out["masked_positions"], axis=1)), axis=1)
    cfg = task.masking_config
    special = np.isin(original, [cfg.cls_id, cfg.sep_id, cfg.pad_id])
    previous_is_token = np.concatenate([np.zeros((len(masked), 1), bool), ~special[:, :-1]], axis=1)
    pieces = task.is_continuation[original] & (out["attention_mask"] > 0) & previous_is_token
    previous = np.concatenate([np.zeros((len(masked), 1), bool), masked[:, :-1]], axis=1)
    assert pieces.sum() > 1000 and (masked[pieces] == previous[pieces]).all()


def test_the_cpu_test_variant_pretrains_and_exports(tmp_path):
    workdir = tmp_path / "span"
    proc = subprocess.run([sys.executable, "-m", "pretrain.main", "--config=configs/pretrain/span_bert.py:cpu_test",
                           f"--workdir={workdir}", "--config.train.max_steps=40", "--config.train.eval_every_steps=20",
                           "--config.train.checkpoint_every_steps=20", "--config.train.log_every_steps=20"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["task"] == "span_bert" and results["steps"] == 40
    assert 0.0 <= results["splits"]["heldout"]["mlm_accuracy"] <= 1.0
    from transformers import BertForMaskedLM
    model = BertForMaskedLM.from_pretrained(str(workdir / "export"))
    assert model.config.vocab_size > 0 and "sentence" not in json.dumps(results["splits"]["heldout"])
