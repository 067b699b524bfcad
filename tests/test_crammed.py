"""The crammed recipe (configs/pretrain/crammed.py; issue 41): its schedule, batch ramp and budget as
typed options (nli_jax/train/optimizers.py, nli_jax/train/budget.py), and its :cpu_test variant
pretraining a ModernBERT through the command line to an export that transformers'
ModernBertForMaskedLM loads with nli-jax's logits; a budgeted run killed and resumed ends where an
uninterrupted run of its step count does, with the same parameters."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import REPO

CONFIG = "configs/pretrain/crammed.py"


def _plan(arg="cpu_test", one_cycle=None, batch_ramp=None, **optimizer):
    from configs.pretrain import crammed
    from nli_jax.planner import build_plan
    config = crammed.get_config(arg)
    config.optimizer.update(**optimizer)
    config.schedules.one_cycle.update(**(one_cycle or {}))
    config.batch_ramp.update(**(batch_ramp or {}))
    return build_plan(config, training=False)


def test_the_recipe_is_the_papers():
    plan = _plan(None)
    o, t, m, r = plan.optimizer, plan.train, plan.model, plan.batch_ramp
    assert (o.schedule, plan.schedule.start, plan.schedule.peak, o.grad_clip, o.lr, r.max_accumulation,
            r.fraction) == ("one_cycle", 0.25, 0.75, 0.5, 1e-3, 64, 0.6)
    # Cramming's budget-triangle2 (cramming/utils.py, get_budget_triangle with base_percentage 0.25,
    # falloff 0.25): min(0.25 + x, (1 - x) / 0.25) of the rate at progress x.
    from nli_jax.train.optimizers import learning_rate_schedule
    lr = learning_rate_schedule(o, plan.schedule, total_steps=1000, steps_per_epoch=10, warmup_steps=0)
    x = np.arange(0, 1000, 7)
    np.testing.assert_allclose([float(lr(s)) for s in x], 1e-3 * np.minimum(0.25 + x / 1000, (1 - x / 1000) / 0.25),
                               atol=1e-9)
    assert (t.batch_size * r.max_accumulation, t.budget_minutes, plan.data.max_seq_length) == (8192, 1440.0, 128)
    assert plan.task_options.mask_prob == 0.3 and plan.task_options.max_predictions == 39
    assert plan.pretrain.sentence_task == "none" and m.preset == "crammed-base"
    from nli_jax.models import preset
    c = preset(m.preset, **m.overrides_dict)
    fo = c.family_options
    assert (c.model_type, c.hidden_dropout_prob, c.attention_probs_dropout_prob) == ("modernbert", 0.0, 0.0)
    assert not (fo.attention_bias or fo.mlp_bias or fo.norm_bias or fo.decoder_bias)
    assert fo.global_attn_every_n_layers == 1 and (c.num_hidden_layers, c.hidden_size) == (12, 768)


def test_one_cycle_is_a_triangle_and_the_ramp_reaches_its_top_at_its_fraction():
    from nli_jax.train.batch_ramp import ramp_schedule
    from nli_jax.train.optimizers import learning_rate_schedule
    plan = _plan(one_cycle=dict(peak=0.25, start=0.0), batch_ramp=dict(max_accumulation=8, fraction=0.5))
    lr = learning_rate_schedule(plan.optimizer, plan.schedule, total_steps=400, steps_per_epoch=10, warmup_steps=0)
    values = [float(lr(s)) for s in (0, 50, 100, 250, 400)]
    np.testing.assert_allclose(values, [0.0, 0.5e-3, 1e-3, 0.5e-3, 0.0], atol=1e-9)
    k = ramp_schedule(plan.batch_ramp, 400)
    assert [int(k(jnp.int32(s))) for s in (0, 28, 29, 199, 200, 399)] == [1, 1, 2, 7, 8, 8]


def test_ramped_updates_are_the_optimizer_on_the_mean_gradient_every_k_steps():
    """k(0) = 1, then 2 (a ramp done at once): an update at step 0, then one every second step on
    the mean of two steps' gradients (AdamW, clipped at 0.5), scaled by the schedule at that step;
    zero updates in between."""
    from nli_jax.train.optimizers import make_optimizer
    plan = _plan(batch_ramp=dict(max_accumulation=2, fraction=1e-6), weight_decay=0.0)
    opt = plan.optimizer
    tx, schedule = make_optimizer(opt, plan.schedule, plan.batch_ramp, total_steps=100, steps_per_epoch=10,
                                  warmup_steps=0)
    params = {"w": {"kernel": jnp.ones((3, 2))}}
    grads = [{"w": {"kernel": jnp.full((3, 2), g)}} for g in (0.5, 0.3, -1.1, 0.7, 0.2)]
    state = tx.init(params)
    reference_tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1.0, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                                                                           weight_decay=0.0))
    reference = reference_tx.init(params)
    for step in range(5):
        updates, state = tx.update(grads[step], state, params)
        if step % 2 == 1:
            assert float(jnp.abs(updates["w"]["kernel"]).max()) == 0.0
        else:
            mean = grads[0] if step == 0 else jax.tree.map(lambda a, b: (a + b) / 2, grads[step - 1], grads[step])
            expected, reference = reference_tx.update(mean, reference, params)
            np.testing.assert_allclose(updates["w"]["kernel"], expected["w"]["kernel"] * float(schedule(step)),
                                       rtol=1e-6)
            assert step == 0 or float(jnp.abs(updates["w"]["kernel"]).max()) > 0
        params = optax.apply_updates(params, updates)


def test_one_cycle_with_a_warmup_is_refused_naming_the_keys():
    from nli_jax.planner import ConfigValueError
    with pytest.raises(ConfigValueError, match=r"^--config.optimizer.warmup_steps=10, .*'one_cycle'"):
        _plan(warmup_steps=10)


def test_the_budget_fixes_the_total_once_and_a_resumed_run_keeps_it():
    from nli_jax.plan import StepPlan
    from nli_jax.train.budget import budget_steps
    plan = _plan()
    plan = dataclasses.replace(plan, train=dataclasses.replace(plan.train, budget_minutes=0.5))
    steps = StepPlan(train_examples=1000, steps_per_epoch=10, total_steps=1000, warmup_steps=0, eval_every=10,
                     checkpoint_every=10, log_every=10)
    from nli_jax.train.record import LoopRecord
    calls = []
    fixed, record = budget_steps(plan, steps, LoopRecord(), lambda n: calls.append(n) or 0.25)
    assert fixed.total_steps == 120 and calls == [plan.train.budget_calibration_steps]
    assert record.budget.total_steps == 120
    # As a checkpoint saves and a resumed run reads it: not measured again.
    saved = LoopRecord.from_json(json.loads(json.dumps(record.to_json())))
    resumed, _ = budget_steps(plan, steps, saved, lambda n: 1 / 0)
    assert resumed == fixed
    assert budget_steps(plan, steps, LoopRecord(), lambda n: 1e-4)[0].total_steps == 1000  # the cap
    no_budget = dataclasses.replace(plan, train=dataclasses.replace(plan.train, budget_minutes=0.0))
    assert budget_steps(no_budget, steps, LoopRecord(), lambda n: 1 / 0)[0] is steps


def test_the_objective_continues_a_modernbert_without_a_sentence_task_only():
    """Continuable families come from the family table: ModernBERT's own masked-LM head (the
    crammed recipe's phase 2 or continued pretraining of its export), not with an NSP head."""
    from configs.pretrain import indobert_base
    from nli_jax.tasks import create_task
    from nli_jax.planner import build_plan
    assert "modernbert" in create_task(_plan()).continuable()
    nsp = create_task(build_plan(indobert_base.get_config("cpu_test"), training=False))
    assert nsp.continuable() == ("bert", "albert")


def _pretrain(workdir, *overrides, popen=False):
    command = [sys.executable, "-m", "pretrain.main", f"--config={CONFIG}:cpu_test", f"--workdir={workdir}", *overrides]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    if popen:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((workdir / "results.json").read_text())


@pytest.mark.slow  # one run of the command line, about 30 s on 2 shared cores: python -m pytest -m slow
def test_cpu_test_pretrains_a_modernbert_that_transformers_loads_with_our_logits(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    results = _pretrain(tmp_path / "crammed", "--config.train.max_steps=12", "--config.train.eval_every_steps=12",
                        "--config.train.checkpoint_every_steps=12")
    assert results["steps"] == 12 and 0.0 < results["splits"]["heldout"]["mlm_accuracy"] <= 1.0
    export = str(tmp_path / "crammed" / "export")
    hf, info = transformers.ModernBertForMaskedLM.from_pretrained(export, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert hf.config.decoder_bias is False and hf.config.mlp_bias is False
    from nli_jax.models import ForMaskedLM
    ours = ForMaskedLM.from_pretrained(export)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, hf.config.vocab_size, (3, 40))
    mask = (np.arange(40)[None] < np.asarray([40, 31, 12])[:, None]).astype(np.int64)
    ids[:, 0] = 2
    hf.eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    mine = np.asarray(ours(jnp.asarray(ids), jnp.asarray(mask), jnp.zeros_like(jnp.asarray(ids)))["mlm_logits"])
    gap = np.abs(theirs - mine)[mask > 0].max()
    print(f"max |transformers - nli-jax| MLM logits: {gap:.2e} (logits up to {np.abs(mine).max():.2f})")
    assert gap < 1e-4
    # The export continues (phase 2, or continued pretraining): the objective takes a ModernBERT.
    again = _pretrain(tmp_path / "continued", f"--config.model.init={export}", "--config.train.max_steps=4",
                      "--config.train.eval_every_steps=4", "--config.train.checkpoint_every_steps=4")
    assert again["steps"] == 4
    assert json.loads((tmp_path / "continued" / "config.json").read_text())["model"]["init"] == export


@pytest.mark.slow  # three runs of the command line, about a minute on 2 cores: python -m pytest -m slow
def test_a_budgeted_run_killed_and_resumed_ends_as_an_uninterrupted_run_of_its_steps(tmp_path):
    """The budget fixes the step count before training; SIGKILL after a checkpoint; the rerun reads
    the count back and finishes there, with exactly the parameters of an uninterrupted run given
    that count as train.max_steps (the schedule and ramp laid over the same steps)."""
    budget = ("--config.train.budget_minutes=0.05", "--config.train.max_steps=2000",
              "--config.train.checkpoint_every_steps=10", "--config.train.eval_every_steps=1000",
              "--config.train.log_every_steps=10")
    workdir = tmp_path / "budget"
    proc = _pretrain(workdir, *budget, popen=True)
    root, deadline = workdir / "checkpoints", time.time() + 300
    while time.time() < deadline:
        saved = [int(p) for p in os.listdir(root) if p.isdigit()] if root.is_dir() else []
        if saved and max(saved) >= 20:
            break
        if proc.poll() is not None:
            pytest.fail(f"run ended before it could be killed: {proc.stderr.read()[-3000:]}")
        time.sleep(0.02)
    state = json.loads((workdir / "run.json").read_text())
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL and not (workdir / "results.json").exists()
    total = state["total_steps"]
    assert 20 < total < 2000, state  # fixed by the budget, under the cap
    resumed = _pretrain(workdir, *budget)
    log = (workdir / "train.log").read_text()
    print(next(line for line in log.splitlines() if " budget " in line))
    assert "resumed from" in log and f"{total} steps, as fixed when the run started" in log
    assert resumed["steps"] == total == json.loads((workdir / "run.json").read_text())["step"]
    reference = _pretrain(tmp_path / "reference", *budget[1:], "--config.train.budget_minutes=0",
                          f"--config.train.max_steps={total}")
    assert reference["steps"] == total and reference["splits"] == resumed["splits"]
    from safetensors.numpy import load_file
    a, b = (load_file(str(d / "export" / "model.safetensors")) for d in (workdir, tmp_path / "reference"))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _heldout_evaluation(workdir, **task_options):
    """The run's own evaluator on its held-out split, at the initial parameters (the loop's set-up)."""
    from configs.pretrain import crammed
    from nli_jax.train.loop import checked_setup
    from nli_jax.planner import build_plan
    config = crammed.get_config("cpu_test")
    config.task_options.update(**task_options)
    run, *_ = checked_setup(build_plan(config), str(workdir))
    evaluation = run.evaluator.evaluate(run.params, "heldout", run.splits["heldout"])
    return run, evaluation


def test_runs_trained_at_different_masking_rates_are_scored_on_the_same_heldout_masks(tmp_path):
    """task_options.heldout_mask_prob: the crammed recipe (30% masking) scored at BERT's 15% gets
    the held-out masks of a run trained with BERT's masking (15%, its cap of 10 at 64 tokens),
    through each run's own set-up and evaluator; its training batches keep 30%."""
    _, at_30 = _heldout_evaluation(tmp_path / "a")
    run_30, at_30_scored_at_15 = _heldout_evaluation(tmp_path / "b", heldout_mask_prob=0.15)
    _, at_15 = _heldout_evaluation(tmp_path / "c", mask_prob=0.15, max_predictions=10)  # BERT's 15% and cap at 64
    assert at_30_scored_at_15.report["masked_tokens"] == at_15.report["masked_tokens"]
    assert at_30_scored_at_15.report["mlm_accuracy"] == at_15.report["mlm_accuracy"]  # same params, same masks
    for key in ("mask_correct", "mask_count", "mask_targets"):
        np.testing.assert_array_equal(at_30_scored_at_15.predictions[key], at_15.predictions[key])
    ratio = at_30.report["masked_tokens"] / at_15.report["masked_tokens"]
    print(f"held-out masked tokens: {at_30.report['masked_tokens']} at 30%, {at_15.report['masked_tokens']} at 15% "
          f"(ratio {ratio:.2f})")
    assert 1.8 < ratio < 2.2
    # Training keeps the run's own rate.
    rows = [run_30.encode(run_30.splits["train"][i]) for i in range(run_30.batching.global_rows)]
    trained = run_30.batching.training(rows, rng=np.random.default_rng(0))
    evaluated = run_30.batching.evaluation(rows, rng=np.random.default_rng(0))
    assert 1.7 < trained["masked_weights"].sum() / evaluated["masked_weights"].sum() < 2.3
