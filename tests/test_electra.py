"""ELECTRA (Clark et al., 2020) in nli-jax: import of transformers' ELECTRA checkpoints, the
replaced-token-detection objective through pretrain.main, its export read back by transformers
(ElectraForPreTraining, ElectraForSequenceClassification) with the same logits, fine-tuning the
export, and the refusals of ELECTRA configs nli-jax cannot run.

Tolerance: 1e-4 on logits between nli-jax (float32, XLA CPU) and transformers (float32,
PyTorch CPU), the issue's bound; the measured differences are ~1e-6.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

TOLERANCE = 1e-4


def _run(module, *args, check=True, timeout=900):
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _inputs(vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab_size, (3, 12))
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    return ids, mask, np.zeros_like(ids)


def _torch_logits(model, ids, mask, types):
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types)).logits.numpy()


def _ours(model, ids, mask, types):
    import jax.numpy as jnp
    out = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types), deterministic=True)
    return np.asarray(out["mlm_logits"] if isinstance(out, dict) else out)


@pytest.mark.parametrize("head", ["ElectraForPreTraining", "ElectraForSequenceClassification",
                                  "ElectraForMaskedLM", "ElectraForTokenClassification"])
def test_electra_checkpoints_made_by_transformers_import_with_its_logits(tmp_path, head):
    import torch
    import transformers
    from nli_jax.models import ForMaskedLM, ForSequenceClassification, ForTokenClassification
    from nli_jax.models.models import ForReplacedTokenDetection
    ours_class, kwargs = {"ElectraForPreTraining": (ForReplacedTokenDetection, {}),
                          "ElectraForSequenceClassification": (ForSequenceClassification, {"num_labels": 3}),
                          "ElectraForMaskedLM": (ForMaskedLM, {}),
                          "ElectraForTokenClassification": (ForTokenClassification, {"num_labels": 5})}[head]
    config = transformers.ElectraConfig(vocab_size=500, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=128, max_position_embeddings=64,
                                        **kwargs)
    torch.manual_seed(0)
    reference = getattr(transformers, head)(config).eval()
    reference.save_pretrained(tmp_path / "hf")
    ours = ours_class.from_pretrained(str(tmp_path / "hf"), **kwargs)
    ids, mask, types = _inputs(500)
    real = mask.astype(bool) if head != "ElectraForSequenceClassification" else slice(None)
    np.testing.assert_allclose(_ours(ours, ids, mask, types)[real], _torch_logits(reference, ids, mask, types)[real],
                               atol=TOLERANCE)
    # and back: nli-jax's export is what transformers reads, every weight used
    ours.save_pretrained(str(tmp_path / "export"))
    back, info = getattr(transformers, head).from_pretrained(str(tmp_path / "export"), output_loading_info=True)
    assert not any(info.values()), info
    np.testing.assert_allclose(_torch_logits(back.eval(), ids, mask, types)[real],
                               _torch_logits(reference, ids, mask, types)[real], atol=TOLERANCE)


def test_the_electra_loss_is_transformers_generator_loss_plus_50_times_its_discriminator_loss(tmp_path, monkeypatch):
    """The task's objective on a masked batch, against transformers' own losses from the same
    weights: ElectraForMaskedLM's (labels at the masked positions) + 50 x ElectraForPreTraining's
    (labels: which tokens the generator's samples replaced, over the attention mask)."""
    import jax.numpy as jnp
    import torch
    import transformers
    from conftest import config_for, task_for
    from nli_jax.models import electra
    vocab, length = 300, 16
    common = dict(vocab_size=vocab, embedding_size=32, num_hidden_layers=2, max_position_embeddings=64)
    torch.manual_seed(0)
    discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        hidden_size=64, num_attention_heads=2, intermediate_size=128, **common)).eval()
    generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        hidden_size=32, num_attention_heads=1, intermediate_size=64, **common)).eval()
    generator.electra.embeddings.load_state_dict(discriminator.electra.embeddings.state_dict())  # shared
    discriminator.save_pretrained(tmp_path / "electra")
    generator.save_pretrained(tmp_path / "electra" / electra.GENERATOR_DIRECTORY)
    model = electra.ForElectraPretraining.from_pretrained(str(tmp_path / "electra"), generator_fraction=0.5)

    rng = np.random.default_rng(0)
    original = rng.integers(5, vocab, (4, length))
    attention = np.ones_like(original)
    attention[2, 11:] = 0
    positions = np.stack([rng.choice(np.arange(1, 11), 3, replace=False) for _ in range(4)])
    masked = original.copy()
    np.put_along_axis(masked, positions, 4, axis=1)  # [MASK]
    batch = {"input_ids": masked, "attention_mask": attention, "token_type_ids": np.zeros_like(original),
             "masked_positions": positions, "masked_ids": np.take_along_axis(original, positions, 1),
             "masked_weights": np.ones(positions.shape, np.float32), "weight": np.ones(4, np.float32)}
    sampled = []
    real_sample = electra.sample
    monkeypatch.setattr(electra, "sample", lambda key, logits: sampled.append(real_sample(key, logits)) or sampled[-1])
    task = task_for(config_for("pretrain.electra_small:cpu_test"))
    loss, examples, _ = task.loss(model, {k: jnp.asarray(v) for k, v in batch.items()},
                                  deterministic=True)
    ours = float(loss) / float(examples)

    corrupted = original.copy()
    np.put_along_axis(corrupted, positions, np.asarray(sampled[0]), axis=1)
    replaced = (corrupted != original).astype(np.float32)
    assert 0 < replaced.sum() < replaced.size
    labels = np.full_like(original, -100)
    np.put_along_axis(labels, positions, batch["masked_ids"], axis=1)
    t = lambda x: torch.tensor(x)  # noqa: E731
    with torch.no_grad():
        mlm = generator(input_ids=t(masked), attention_mask=t(attention), labels=t(labels)).loss
        rtd = discriminator(input_ids=t(corrupted), attention_mask=t(attention), labels=t(replaced)).loss
    assert ours == pytest.approx(float(mlm) + 50.0 * float(rtd), rel=1e-5)


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("electra")
    _run("pretrain.main", "--config=configs/pretrain/electra_small.py:cpu_test", f"--workdir={workdir}",
         "--config.train.max_steps=80", "--config.train.eval_every_steps=40", "--config.train.log_every_steps=10")
    return workdir


def test_electra_pretraining_learns_to_detect_replacements_and_exports_for_transformers(electra_run):
    import transformers
    from nli_jax.models.electra import ForElectraPretraining
    from nli_jax.models.models import ForReplacedTokenDetection
    results = json.loads((electra_run / "results.json").read_text())
    heldout = results["splits"]["heldout"]
    # The discriminator learns: what it calls replaced is replaced far more often than the share
    # of replaced tokens (the precision of calling every token replaced), and it finds some.
    assert heldout["replaced_precision"] > 3 * heldout["replaced_share"] and heldout["replaced_f1"] > 0.15, heldout
    # The results describe the exported model: the final step's parameters, whichever step's
    # replaced-token F1 was highest.
    assert results["evaluated_step"] == results["steps"] == 80
    assert results["history"][-1]["step"] == 80
    assert results["history"][-1]["heldout"]["replaced_f1"] == heldout["replaced_f1"]
    curve = [json.loads(line) for line in (electra_run / "metrics.jsonl").read_text().splitlines()]
    losses = [row["train/loss"] for row in curve if "train/loss" in row]
    assert losses[-1] < 0.8 * losses[0], losses

    export = electra_run / "export"
    discriminator, info = transformers.ElectraForPreTraining.from_pretrained(str(export), output_loading_info=True)
    assert not any(info.values()), info
    generator, info = transformers.ElectraForMaskedLM.from_pretrained(str(export / "generator"),
                                                                     output_loading_info=True)
    assert not any(info.values()), info
    assert generator.config.hidden_size == discriminator.config.hidden_size // 2  # cpu_test: fraction 0.5
    # The generator and the discriminator share their embeddings: equal in the export.
    np.testing.assert_array_equal(generator.electra.embeddings.word_embeddings.weight.detach().numpy(),
                                  discriminator.electra.embeddings.word_embeddings.weight.detach().numpy())
    vocab = discriminator.config.vocab_size
    ids, mask, types = _inputs(vocab, seed=1)
    ours = ForReplacedTokenDetection.from_pretrained(str(export))
    real = mask.astype(bool)
    np.testing.assert_allclose(_ours(ours, ids, mask, types)[real],
                               _torch_logits(discriminator.eval(), ids, mask, types)[real], atol=TOLERANCE)
    # Pretraining continues from the export: both halves come back.
    both = ForElectraPretraining.from_pretrained(str(export), generator_fraction=0.5)
    np.testing.assert_allclose(_ours(both.generator, ids, mask, types)[real],
                               _torch_logits(generator.eval(), ids, mask, types)[real], atol=TOLERANCE)


@pytest.mark.parametrize("variant,batch,lr,steps,length,fraction", [
    ("phase=1", 128, 5e-4, 1_000_000, 128, 0.25), ("phase=2", 128, 5e-4, 100_000, 512, 0.25),
    ("cpu_test", 16, 2e-3, 300, 64, 0.5)])
def test_electra_small_configs_carry_the_papers_recipe(variant, batch, lr, steps, length, fraction):
    from conftest import config_for
    from nli_jax.planner import build_plan
    plan = build_plan(config_for(f"pretrain.electra_small:{variant}"), training=False)
    assert plan.task == "electra" and plan.task_options.discriminator_weight == 50.0
    assert (plan.batch.global_batch, plan.optimizer.lr, plan.train.max_steps, plan.data.max_seq_length,
            plan.task_options.generator_fraction) == (batch, lr, steps, length, fraction)
    assert plan.pretrain.sentence_task == "none" and not plan.task_options.whole_word
    assert plan.model.preset == ("tiny-electra" if variant == "cpu_test" else "electra-small")


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_phase_2_starts_from_both_halves_of_phase_1(electra_run, tmp_path):
    """Phase 2 (model.init = phase 1's export) starts from phase 1's final discriminator and
    generator, shared embeddings included."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx
    from conftest import config_for
    from nli_jax.checkpoints import load_tokenizer
    from nli_jax.tasks import create_task
    from nli_jax.planner import build_plan
    from nli_jax.train.setup import build_model
    export = electra_run / "export"
    plan = build_plan(config_for("pretrain.electra_small:phase=2,cpu_test", f"model.init={export}"))
    model = build_model(plan.model, create_task(plan), load_tokenizer(plan.model.tokenizer or str(export)), plan.seed)
    final = ocp.StandardCheckpointer().restore(str(electra_run / "checkpoints" / "80" / "state"))["params"]
    ours = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    flat = lambda tree: {"/".join(str(getattr(k, "key", k)) for k in path): leaf  # noqa: E731
                         for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
    ours, final = flat(ours), flat(final)  # (orbax gives layer indices back as strings)
    assert ours.keys() == final.keys() and any(k.startswith("generator/") for k in ours)
    for key in ours:
        np.testing.assert_array_equal(ours[key], final[key], err_msg=key)
    _run("pretrain.main", "--config=configs/pretrain/electra_small.py:phase=2,cpu_test", f"--workdir={tmp_path}",
         f"--config.model.init={export}", "--config.train.max_steps=10", "--config.train.eval_every_steps=10")
    assert json.loads((tmp_path / "results.json").read_text())["steps"] == 10


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_the_electra_export_fine_tunes_and_transformers_reads_the_classifier(electra_run, tmp_path):
    """Fine-tuning starts from the discriminator (ElectraForSequenceClassification's head: dense,
    GELU, out_proj, no pooler); the fine-tuned export gives transformers nli-jax's logits."""
    import transformers
    from nli_jax.models import ForSequenceClassification
    export = electra_run / "export"
    _run("finetune.main", "--config=configs/indonli_large.py:cpu_test", f"--workdir={tmp_path / 'run'}",
         f"--config.model.init={export}", f"--config.model.tokenizer={export}", "--config.train.max_steps=10")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["steps"] == 10 and 0.0 <= results["splits"]["validation"]["accuracy"] <= 1.0
    _run("finetune.export", f"--checkpoint={tmp_path / 'run'}", f"--output={tmp_path / 'hf'}")
    reference, info = transformers.ElectraForSequenceClassification.from_pretrained(str(tmp_path / "hf"),
                                                                                  output_loading_info=True)
    assert not any(info.values()), info
    ours = ForSequenceClassification.from_pretrained(str(tmp_path / "hf"), num_labels=3)
    ids, mask, types = _inputs(reference.config.vocab_size, seed=2)
    np.testing.assert_allclose(_ours(ours, ids, mask, types), _torch_logits(reference.eval(), ids, mask, types),
                               atol=TOLERANCE)


@pytest.mark.slow  # every IndoNLU task (its first rows) from the ELECTRA export, a few steps each: minutes
def test_the_electra_export_fine_tunes_on_every_indonlu_task(electra_run, indonlu_small, tmp_path):
    from configs import indonlu as indonlu_config
    from finetune import indonlu_benchmark
    export = electra_run / "export"
    indonlu_benchmark.run("scratch", str(tmp_path), str(indonlu_small), indonlu_config.TASKS,
                          overrides=["train.max_steps=3", f"data.tfds_dir={tmp_path / 'tfds'}",
                                     f"model.init={export}", f"model.tokenizer={export}"], cpu_test=True)
    for task in indonlu_config.TASKS:
        results = json.loads((tmp_path / task / "results.json").read_text())
        assert results["steps"] == 3 and 0.0 <= results["splits"]["validation"]["f1"] <= 1.0, task
        assert json.loads((tmp_path / task / "config.json").read_text())["model"]["init"] == str(export)


# --- refusals, one line before compute --------------------------------------------------------

def _refusal(workdir, *overrides, config="configs/pretrain/electra_small.py:cpu_test"):
    proc = _run("pretrain.main", f"--config={config}", f"--workdir={workdir}", *overrides, check=False, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (workdir / "checkpoints").exists()
    return proc.stderr


def test_a_generator_larger_than_the_discriminator_is_refused(tmp_path):
    stderr = _refusal(tmp_path / "w", "--config.task_options.generator_fraction=1.5")
    assert "task_options.generator_fraction" in stderr and "1.5" in stderr


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_an_electra_init_of_another_model_type_is_refused(tmp_path, electra_run, minilm_dir):
    # a BERT checkpoint (MiniLM-L6, with its own tokenizer) for ELECTRA's phase 2
    stderr = _refusal(tmp_path / "w", f"--config.model.init={minilm_dir}", "--config.model.tokenizer=",
                      config="configs/pretrain/electra_small.py:phase=2,cpu_test")
    assert "model_type 'bert'" in stderr and "electra" in stderr
    # and a BERT preset for ELECTRA pretraining
    stderr = _refusal(tmp_path / "w2", "--config.model.preset=tiny-bert")
    assert "tiny-bert" in stderr and "ELECTRA" in stderr
    # and BERT's MLM pretraining of an ELECTRA checkpoint
    stderr = _refusal(tmp_path / "w3", f"--config.model.init={electra_run / 'export'}",
                      config="configs/pretrain/indobert_base.py:phase=2,cpu_test")
    assert "model_type 'electra'" in stderr


@pytest.mark.slow  # end to end, tens of seconds: python -m pytest -m slow
def test_a_generator_with_another_vocabulary_is_refused(tmp_path, electra_run):
    import shutil
    export = tmp_path / "export"
    shutil.copytree(electra_run / "export", export)
    config = json.loads((export / "generator" / "config.json").read_text())
    config["vocab_size"] += 7
    (export / "generator" / "config.json").write_text(json.dumps(config))
    stderr = _refusal(tmp_path / "w", f"--config.model.init={export}",
                      config="configs/pretrain/electra_small.py:phase=2,cpu_test")
    assert "generator" in stderr and "vocabulary" in stderr and str(export) in stderr
