"""Continued pretraining from a Hugging Face checkpoint (`configs/pretrain/<x>.py:continue`), checked
against transformers on the real MiniLM-L6 BERT checkpoint; both phases of the shipped recipes
end to end (slow); what the task refuses before compute."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO


def _pretrain(workdir, *overrides, config="configs/pretrain/indobert_base.py:continue,cpu_test", timeout=600):
    proc = subprocess.run([sys.executable, "-m", "pretrain.main", f"--config={config}", f"--workdir={workdir}",
                           *overrides], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _continue_config(init, *overrides, variant="continue,cpu_test"):
    from conftest import config_for
    return config_for(f"pretrain.indobert_base:{variant}", f"model.init={init}", *overrides)


# Step 1 runs at learning rate 0 (the first warmup step): its held-out evaluation is the
# checkpoint as loaded, before any update.
CLI_STEPS = ("--config.train.max_steps=3", "--config.train.eval_every_steps=1", "--config.train.log_every_steps=1")


@pytest.fixture(scope="module")
def continued_minilm(minilm_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("continued_minilm")
    proc = _pretrain(workdir, f"--config.model.init={minilm_dir}", *CLI_STEPS)
    return workdir, proc


def _heldout_batches_and_reference(config, workdir):
    """The production setup's initial model evaluated on the held-out split, with the masked
    batches it saw recorded; returns (its report, the batches, per-batch MLM (sum, weight) from
    the jitted eval step, the initial model)."""
    from nli_jax.data import pipeline
    from nli_jax.planner import build_plan
    from nli_jax.train.setup import prepare
    run = prepare(build_plan(config), str(workdir))
    recorded, masking = [], run.evaluator.batching

    class Recording:  # the run's MLM batching, keeping each evaluation batch
        def __getattr__(self, name):  # the rest of the batching protocol is the run's own
            return getattr(masking, name)

        def evaluation(self, rows, *, min_length=0, rng=None):
            batch = masking.evaluation(rows, min_length=min_length, rng=rng)
            recorded.append(batch)
            return batch
    run.evaluator.batching = Recording()
    report = run.evaluate(run.params, "heldout").report
    mlm = []
    for batch in recorded:
        sums, _ = run.evaluator.eval_step(run.params, pipeline.to_global(batch, run.batch_sharding))
        mlm.append((float(sums["mlm_loss_sum"]), float(sums["mlm_weight"])))
    return report, recorded, mlm, run.model


def _transformers_losses(model, batches):
    """(held-out objective as the loop reports it: per batch MLM mean + NSP mean, weighted by
    examples; MLM mean over all masked tokens) from a transformers *ForPreTraining model."""
    import torch
    objective = examples = mlm_sum = mlm_weight = 0.0
    with torch.no_grad():
        for b in batches:
            out = model(input_ids=torch.tensor(b["input_ids"], dtype=torch.long),
                        attention_mask=torch.tensor(b["attention_mask"]),
                        token_type_ids=torch.tensor(b["token_type_ids"], dtype=torch.long))
            row = torch.tensor(b["weight"])
            pos = torch.tensor(b["masked_positions"], dtype=torch.long)
            vocab = out.prediction_logits.shape[-1]
            logits = torch.gather(out.prediction_logits, 1, pos[..., None].expand(-1, -1, vocab))
            labels = torch.tensor(b["masked_ids"], dtype=torch.long)
            w = torch.tensor(b["masked_weights"]) * row[:, None]
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), reduction="none")
            batch_mlm = float((nll.reshape(labels.shape) * w).sum())
            nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits,
                                                    torch.tensor(b["sentence_label"], dtype=torch.long), reduction="none")
            n = float(row.sum())
            objective += (batch_mlm / float(w.sum()) + float((nsp * row).sum()) / n) * n
            examples += n
            mlm_sum += batch_mlm
            mlm_weight += float(w.sum())
    return objective / examples, mlm_sum / mlm_weight


@pytest.mark.slow
def test_continue_minilm_matches_transformers_and_exports(continued_minilm, minilm_dir, tmp_path):
    """A plain BertModel (no MLM head): the CLI keeps its tokenizer and shape, initialises the MLM
    head (tied decoder) and NSP head, and its held-out loss before any update is what transformers
    computes for the same weights on the same masked batches; the export reloads in
    AutoModelForMaskedLM with nli-jax's MLM logits."""
    import jax.numpy as jnp
    import transformers
    from safetensors.numpy import load_file
    from nli_jax.models import ForMaskedLM
    workdir, proc = continued_minilm
    assert "newly initialised" in proc.stderr and "cls.predictions.transform.dense.weight" in proc.stderr
    results = json.loads((workdir / "results.json").read_text())
    cli_initial = results["history"][0]
    assert cli_initial["step"] == 1
    # A fresh optimizer: step 1 of its own warmup (learning rate 0), the step counter from 0.
    curve = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [1, 2, 3] and curve[0]["train/lr"] == 0.0 < curve[1]["train/lr"]

    config = _continue_config(minilm_dir)
    report, batches, mlm, initial = _heldout_batches_and_reference(config, workdir)
    # The CLI's step-1 evaluation (learning rate 0) is the production setup's initial model.
    np.testing.assert_allclose(cli_initial["heldout"]["loss"], report["loss"], rtol=1e-5)

    # That initial model: MiniLM's encoder exactly, heads initialised as BERT does.
    initial.save_pretrained(str(tmp_path / "initial"))
    ours, theirs = load_file(str(tmp_path / "initial" / "model.safetensors")), load_file(f"{minilm_dir}/model.safetensors")
    for name, value in theirs.items():
        if name.startswith(("embeddings.", "encoder.")) and not name.endswith("position_ids"):  # a buffer
            np.testing.assert_array_equal(ours["bert." + name], value, err_msg=name)
    transform = ours["cls.predictions.transform.dense.weight"]
    assert abs(transform.std() - 0.02) < 0.002 and not ours["cls.predictions.transform.dense.bias"].any()
    assert (ours["cls.predictions.transform.LayerNorm.weight"] == 1).all() and not ours["cls.predictions.bias"].any()

    reference = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "initial")).eval()
    objective, mlm_loss = _transformers_losses(reference, batches)
    ours_mlm = sum(s for s, _ in mlm) / sum(w for _, w in mlm)
    print(f"held-out before training: objective nli-jax {report['loss']:.5f} transformers {objective:.5f}; "
          f"MLM nli-jax {ours_mlm:.5f} transformers {mlm_loss:.5f} (ln V = {np.log(30522):.3f}); "
          f"{sum(w for _, w in mlm):.0f} masked tokens")
    np.testing.assert_allclose(report["loss"], objective, rtol=2e-4)
    np.testing.assert_allclose(ours_mlm, mlm_loss, rtol=2e-4)

    # The export: MiniLM's shape and vocabulary, loads in transformers with the same MLM logits.
    export = workdir / "export"
    exported = json.loads((export / "config.json").read_text())
    assert (exported["hidden_size"], exported["num_hidden_layers"], exported["vocab_size"]) == (384, 6, 30522)
    assert (export / "vocab.txt").read_text().splitlines() == open(f"{minilm_dir}/vocab.txt", encoding="utf-8").read().splitlines()
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(str(export), output_loading_info=True)
    assert not info["missing_keys"], info
    hf.eval()
    b = batches[0]
    jax_model = ForMaskedLM.from_pretrained(str(export), sentence_head=True)
    ours_logits = np.asarray(jax_model(jnp.asarray(b["input_ids"]), jnp.asarray(b["attention_mask"]),
                                       jnp.asarray(b["token_type_ids"]))["mlm_logits"])
    import torch
    with torch.no_grad():
        theirs_logits = hf(input_ids=torch.tensor(b["input_ids"], dtype=torch.long),
                           attention_mask=torch.tensor(b["attention_mask"]),
                           token_type_ids=torch.tensor(b["token_type_ids"], dtype=torch.long)).logits.numpy()
    real = b["attention_mask"].astype(bool)
    diff = np.abs(ours_logits[real] - theirs_logits[real]).max()
    print(f"export: max |MLM logit difference| nli-jax vs AutoModelForMaskedLM {diff:.2e} over {real.sum()} tokens")
    np.testing.assert_allclose(ours_logits[real], theirs_logits[real], atol=2e-3, rtol=1e-4)


@pytest.mark.slow
def test_continue_loads_the_checkpoints_mlm_head(continued_minilm, tmp_path):
    """Continuing the export above (BertForPreTraining: cls.predictions.*, cls.seq_relationship.*)
    loads its heads instead of initialising them: the held-out loss before any update is the
    one the first run ended with, on the same held-out examples and masks."""
    first, _ = continued_minilm
    proc = _pretrain(tmp_path, f"--config.model.init={first / 'export'}", *CLI_STEPS)
    assert "newly initialised" not in proc.stderr, proc.stderr[-2000:]
    ended = json.loads((first / "results.json").read_text())["history"][-1]["heldout"]["loss"]
    started = json.loads((tmp_path / "results.json").read_text())["history"][0]["heldout"]["loss"]
    print(f"held-out loss: first run ended at {ended:.5f}, the continued run starts at {started:.5f}")
    np.testing.assert_allclose(started, ended, rtol=1e-5)


@pytest.mark.parametrize("recipe", ["indobert_base", "indobert_lite_large"])
def test_continue_variant_takes_tokenizer_and_shape_from_the_checkpoint(recipe, minilm_dir):
    """The `continue` variant of a shipped recipe: no tokenizer or preset of its own, a tenth of the
    phase's steps with a 6% warmup; the run's tokenizer and shape are MiniLM's (not the preset's)."""
    import importlib
    from configs.pretrain.common import PHASES
    from nli_jax import cli
    from nli_jax.planner import build_plan
    from nli_jax.train.setup import model_inputs
    module = importlib.import_module(f"configs.pretrain.{recipe}")
    config = module.get_config("continue")
    assert config.model.tokenizer == "" and config.pretrain.continued
    steps = PHASES[config.model.preset][1][2]
    assert config.train.max_steps == steps // 10 and config.optimizer.warmup_steps == steps // 10 * 6 // 100
    cli.apply_overrides(config, [f"model.init={minilm_dir}"])
    checked = model_inputs(build_plan(config, training=False))  # the corpus is not needed to see the model
    assert checked.tokenizer_dir == minilm_dir and len(checked.tokenizer) == 30522
    c = checked.encoder_config
    assert (c.model_type, c.hidden_size, c.num_hidden_layers, c.vocab_size) == ("bert", 384, 6, 30522)


def _checkpoint_copy(minilm_dir, directory, *, files=("config.json", "vocab.txt", "tokenizer_config.json",
                                                      "special_tokens_map.json"), **config_changes):
    """MiniLM's weights (linked) with some of its files and a changed config.json."""
    os.makedirs(directory)
    os.symlink(os.path.join(minilm_dir, "model.safetensors"), os.path.join(directory, "model.safetensors"))
    for name in files:
        shutil.copy(os.path.join(minilm_dir, name), os.path.join(directory, name))
    with open(os.path.join(minilm_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(dict(config, **config_changes), f)
    return str(directory)


def _refused(config, workdir, error, match):
    from nli_jax.train.loop import train_and_evaluate
    with pytest.raises(error, match=match):
        train_and_evaluate(config, str(workdir))
    # Refused before compute: no examples built, nothing that would block the corrected command.
    assert not (workdir / "examples").exists() and not (workdir / "config.json").exists()


def test_continue_without_a_checkpoint_is_refused(tmp_path):
    from nli_jax.errors import ConfigValueError
    config = _continue_config("")
    _refused(config, tmp_path, ConfigValueError, r"--config.model.init='': continued pretraining .* starts from a "
                                                 r"checkpoint: pass --config.model.init=DIR")


def test_continue_from_a_checkpoint_without_tokenizer_is_refused(minilm_dir, tmp_path):
    from nli_jax.checkpoints.hf import CheckpointError
    init = _checkpoint_copy(minilm_dir, tmp_path / "no_tokenizer", files=("config.json",))
    _refused(_continue_config(init), tmp_path / "w", CheckpointError,
             rf"tokenizer directory {init} has no vocabulary: expected one of vocab.txt")


def test_continue_with_a_vocabulary_larger_than_the_model_is_refused(minilm_dir, tmp_path):
    from nli_jax.errors import ConfigValueError
    init = _checkpoint_copy(minilm_dir, tmp_path / "small_vocab", vocab_size=30000)
    _refused(_continue_config(init), tmp_path / "w", ConfigValueError,
             rf"tokenizer {init} has 30522 entries .* embeds only vocab_size 30000")


def test_continue_with_another_tokenizer_is_refused(minilm_dir, tmp_path):
    from nli_jax.data import fixture_path
    from nli_jax.errors import ConfigValueError
    config = _continue_config(minilm_dir, f"model.tokenizer={fixture_path('tiny_wordpiece')}")
    _refused(config, tmp_path, ConfigValueError, r"its vocabulary differs from the one model.init .* use the "
                                                 r"checkpoint's tokenizer")


def test_continue_of_an_unsupported_model_type_is_refused(minilm_dir, tmp_path):
    from nli_jax.errors import RunError
    init = _checkpoint_copy(minilm_dir, tmp_path / "roberta", model_type="roberta")
    _refused(_continue_config(init), tmp_path / "w", RunError,
             r"config.json has model_type 'roberta'; pretraining continues only bert or albert checkpoints")


def test_continue_without_vocab_txt_is_refused(minilm_dir, tmp_path):
    from nli_jax.errors import RunError
    init = _checkpoint_copy(minilm_dir, tmp_path / "tokenizer_json", files=("config.json", "tokenizer.json",
                                                                            "tokenizer_config.json"))
    _refused(_continue_config(init), tmp_path / "w", RunError,
             rf"--config.model.init='{init}': {init} has no vocab.txt .* tokenised into examples with a WordPiece")


def _finetune(workdir, *overrides, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/indonli_base.py:cpu_test",
                           f"--workdir={workdir}", *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["indobert_lite_base", "indobert_base"])
def test_both_phases_then_fine_tuning_on_the_shipped_configs(recipe, tmp_path):
    """Phase 1 then phase 2 (model.init = phase 1's export) of the shipped cpu_test recipes through
    the CLI, then fine-tuning of the phase-2 export on the NLI fixture. Phase 2's first held-out
    evaluation (step 1, learning rate 0) is phase 1's model: its MLM loss is far below a fresh
    model's on the same masked held-out batches."""
    import importlib
    from nli_jax import cli
    config_file = f"configs/pretrain/{recipe}.py"
    phase1, phase2, finetuned = tmp_path / "phase1", tmp_path / "phase2", tmp_path / "finetuned"
    _pretrain(phase1, "--config.train.max_steps=150", config=f"{config_file}:cpu_test")
    first = json.loads((phase1 / "results.json").read_text())
    _pretrain(phase2, f"--config.model.init={phase1 / 'export'}", *CLI_STEPS, config=f"{config_file}:phase=2,cpu_test")
    second = json.loads((phase2 / "results.json").read_text())
    assert second["history"][0]["step"] == 1

    module = importlib.import_module(f"configs.pretrain.{recipe}")
    from_phase1 = module.get_config("phase=2,cpu_test")
    cli.apply_overrides(from_phase1, [f"model.init={phase1 / 'export'}"])
    report, _, mlm, _ = _heldout_batches_and_reference(from_phase1, phase2)
    np.testing.assert_allclose(second["history"][0]["heldout"]["loss"], report["loss"], rtol=1e-5)
    fresh_report, _, fresh_mlm, _ = _heldout_batches_and_reference(module.get_config("phase=2,cpu_test"), phase2)
    started, fresh = (sum(s for s, _ in m) / sum(w for _, w in m) for m in (mlm, fresh_mlm))
    print(f"{recipe}: phase 1 (150 steps) held-out {first['splits']['heldout']}; phase 2 first held-out MLM loss "
          f"{started:.3f} (objective {report['loss']:.3f}) vs a fresh model's {fresh:.3f} "
          f"(objective {fresh_report['loss']:.3f})")
    assert started < fresh - 1.0

    _finetune(finetuned, f"--config.model.init={phase2 / 'export'}", "--config.train.num_epochs=2")
    results = json.loads((finetuned / "results.json").read_text())
    print(f"{recipe}: fine-tuned phase-2 export on the NLI fixture: {results['splits']['validation']}")
    assert 0.0 <= results["splits"]["validation"]["accuracy"] <= 1.0
    saved = json.loads((finetuned / "config.json").read_text())
    assert saved["model"]["init"] == str(phase2 / "export")
