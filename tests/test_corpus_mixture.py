"""Corpus mixtures (issue 52 item 2): pretrain.corpus as named corpora sampled by weight or by one
temperature (p ∝ nᵅ), as a map-style source the pipeline shuffles and resumes as it does one
corpus; held-out MLM accuracy per corpus in the log and results.json."""
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import REPO, assert_same_parameters, config_for, kill_after_checkpoint

from nli_jax.pretraining.mixture import MixtureSource, mixture_probabilities, named_corpora


class Numbered:
    """A source whose example i is {"idx": i, "text": "<name>:i"}."""

    def __init__(self, name, n):
        self.name, self.n = name, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"idx": i, "text": f"{self.name}:{i}"}


def test_temperature_sampling_is_xlmr_and_an_epoch_sees_every_example():
    sizes = {"id": 9000, "jv": 700, "su": 300}
    p = mixture_probabilities(sizes, {}, 0.3)
    n = np.array([9000, 700, 300], float)
    np.testing.assert_allclose([p["id"], p["jv"], p["su"]], n ** 0.3 / (n ** 0.3).sum(), rtol=1e-12)
    assert mixture_probabilities(sizes, {}, 0.0)["jv"] == pytest.approx(700 / 10000)  # no alpha: by size
    assert mixture_probabilities(sizes, {"id": 2, "jv": 1, "su": 1}, 0.0) == {"id": 0.5, "jv": 0.25, "su": 0.25}
    source = MixtureSource({k: Numbered(k, v) for k, v in sizes.items()}, p)
    counts = Counter(source[i]["text"].split(":")[0] for i in range(len(source)))
    for name, q in p.items():
        assert counts[name] / len(source) == pytest.approx(q, abs=2 / len(source))
    seen = {source[i]["text"] for i in range(len(source))}
    assert len(seen) == sum(sizes.values())  # every example of every corpus, the small ones repeated
    indices = [5, len(source) - 1, 9000, 3, 12000]
    assert source.get_many(indices) == [source[i] for i in indices]
    assert [source[i]["idx"] for i in indices] == indices


def test_named_corpora_and_the_old_form():
    assert named_corpora(("/data/corpus/*.txt",)) is None  # today's form: one corpus
    assert named_corpora(("gs://b/x=y/*.txt",)) is None  # '=' in a path is not a name
    assert named_corpora(("id=/a/*.txt", "jv=/b/*.txt", "id=/c/*.txt")) == {"id": ("/a/*.txt", "/c/*.txt"),
                                                                            "jv": ("/b/*.txt",)}


@pytest.mark.parametrize("assignments, message", [
    (("pretrain.corpus=('id=/a/*.txt','/b/*.txt')",), "name every corpus of a mixture"),
    (("pretrain.corpus=('id=/a/*.txt','jv=/b/*.txt')", "pretrain.corpus_weights=('id=1',)"), "weight each corpus once"),
    (("pretrain.corpus=('id=/a/*.txt','jv=/b/*.txt')", "pretrain.corpus_weights=('id=1','jv=0')"), "a weight > 0"),
    (("pretrain.corpus=('id=/a/*.txt','jv=/b/*.txt')", "pretrain.corpus_weights=('id=1','jv=1')",
      "pretrain.corpus_alpha=0.3"), "not both"),
    (("pretrain.corpus=('/a/*.txt',)", "pretrain.corpus_alpha=0.3"), "a mixture needs named corpora"),
    (("pretrain.corpus=('id=/a/*.txt','jv=/b/*.txt')", "pretrain.examples_dir=/x"), "leave examples_dir empty"),
])
def test_a_mixture_that_cannot_be_is_refused_by_the_planner(assignments, message):
    from nli_jax.errors import ConfigValueError
    from nli_jax.planner import build_plan
    with pytest.raises(ConfigValueError, match=message):
        build_plan(config_for("pretrain.indobert_base:cpu_test", *assignments))


def _corpora(root):
    """Two corpora of the shipped fixture's sentences: Indonesian as it is, and a "local" one
    with every word reversed (other pieces), both of 10-line documents."""
    from nli_jax.data import fixture_path
    lines = [line.strip() for line in open(os.path.join(fixture_path("corpus_tiny"), "corpus.txt")) if line.strip()]
    for name, transform in (("id", lambda s: s), ("jv", lambda s: " ".join(w[::-1] for w in s.split()))):
        os.makedirs(root / name, exist_ok=True)
        with open(root / name / "text.txt", "w") as f:
            for i, line in enumerate(lines[:1200] if name == "id" else lines[1200:1500]):
                f.write(transform(line) + ("\n\n" if i % 10 == 9 else "\n"))
    return (f"--config.pretrain.corpus=('id={root}/id/*.txt','jv={root}/jv/*.txt')", "--config.pretrain.corpus_alpha=0.3")


def _pretrain(workdir, *overrides):
    proc = subprocess.run([sys.executable, "-m", "pretrain.main", "--config=configs/pretrain/indobert_base.py:cpu_test",
                           f"--workdir={workdir}", *overrides], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow  # end to end, about a minute on 2 cores
def test_a_killed_mixture_run_resumes_to_the_same_parameters_and_reports_each_corpus(tmp_path):
    common = (*_corpora(tmp_path), "--config.train.max_steps=60", "--config.train.checkpoint_every_steps=20",
              "--config.train.eval_every_steps=30", "--config.train.async_checkpointing=True")
    reference = _pretrain(tmp_path / "reference", *common)
    assert "corpus mixture: id" in reference.stderr and "heldout MLM accuracy per corpus: id" in reference.stderr
    results = json.loads((tmp_path / "reference" / "results.json").read_text())
    heldout = results["splits"]["heldout"]
    assert heldout["masked_tokens_id"] + heldout["masked_tokens_jv"] == heldout["masked_tokens"]
    overall = (heldout["mlm_accuracy_id"] * heldout["masked_tokens_id"]
               + heldout["mlm_accuracy_jv"] * heldout["masked_tokens_jv"]) / heldout["masked_tokens"]
    assert overall == pytest.approx(heldout["mlm_accuracy"], abs=1e-9)
    assert "mlm_accuracy_jv" in results["history"][-1]["heldout"]
    work = tmp_path / "killed"
    kill_after_checkpoint(["pretrain.main", "--config=configs/pretrain/indobert_base.py:cpu_test", f"--workdir={work}",
                           *common], work, 20)
    assert not (work / "results.json").exists()
    _pretrain(work, *common)
    assert_same_parameters(work, tmp_path / "reference", 60)
    assert json.loads((work / "results.json").read_text())["splits"]["heldout"] == heldout
