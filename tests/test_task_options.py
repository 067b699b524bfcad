"""Each task and objective owns its options (nli_jax.plan.TaskOptions, declared beside the task):
the planner builds them from config.task_options with their defaults and checks, older workdirs'
config.json (written before the options moved out of data.* and pretrain.*) still resume, and a
moved key on the command line says where it lives now."""
import dataclasses
import json
import subprocess
import sys

import pytest

from conftest import REPO

OLDER = REPO / "tests" / "fixtures" / "older_config_json"
# config.json files written by nli-jax at 6f8413a (task options moved) and at 5272312 (schedule, batch
# ramp and run hook options moved; the last four) for these configs.
CASES = {
    "indonli_cpu_test_hypothesis_only": ("configs/indonli_large.py", "cpu_test,hypothesis_only"),
    "ocnli_10k": ("configs/ocnli.py", "train_size=10k"),
    "indonlu_nerp_cpu_test": ("configs/indonlu.py", "task=nerp,model=scratch,cpu_test"),
    "indobert_lite_base_cpu_test": ("configs/pretrain/indobert_lite_base.py", "cpu_test"),
    "electra_small_cpu_test": ("configs/pretrain/electra_small.py", "cpu_test"),
    "crammed_cpu_test": ("configs/pretrain/crammed.py", "cpu_test"),
    "indonlu_smsa_cpu_test": ("configs/indonlu.py", "task=smsa,model=scratch,cpu_test"),
    "indonli_cpu_test_dynamics": ("configs/indonli_large.py", "cpu_test"),
    "inferes_cpu_test": ("configs/inferes.py", "cpu_test"),
}
# What those runs set on the command line (train.record_dynamics=True, dynamics_every_steps=7,
# calibration=False at 5272312), as today's keys.
SET = {"indonli_cpu_test_dynamics": {"hooks.dynamics.enabled": True, "hooks.dynamics.every_steps": 7,
                                     "hooks.calibration.enabled": False}}


def _older(name: str) -> dict:
    return json.loads((OLDER / f"{name}.json").read_text().replace("{REPO}", str(REPO)))


def _config(path: str, variant: str, sets=None):
    import importlib
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    config = module.get_config(variant)
    config.update_from_flattened_dict(sets or {})
    return config


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_older_workdirs_config_is_todays_run(name, tmp_path):
    from nli_jax import workdir as workdir_lib
    from nli_jax import planner
    plan = planner.build_plan(_config(*CASES[name], SET.get(name)), training=False)
    older = _older(name)
    # The workdir check a rerun makes: no difference, so the run resumes.
    options = type(plan.task_options)
    assert workdir_lib.config_differences(older, plan.config_json, options) == []
    # The tools and the analysis read an older run's config.json as today's plan.
    (tmp_path / "config.json").write_text(json.dumps(older))
    saved = planner.build_plan(planner.saved_config(str(tmp_path)), training=False)
    # data's keys a run may change on resume (nli_jax.workdir.RESUMABLE_CHANGES: data.allow_overlap, which
    # the InferES recipe sets since the overlap check) may differ; every other field is the same.
    resumable = {k.split(".", 1)[1]: getattr(plan.data, k.split(".", 1)[1]) for k in workdir_lib.RESUMABLE_CHANGES
                 if k.startswith("data.")}
    assert saved.task_options == plan.task_options and dataclasses.replace(saved.data, **resumable) == plan.data
    assert (saved.optimizer, saved.schedule, saved.batch_ramp, saved.hooks) == (plan.optimizer, plan.schedule,
                                                                                 plan.batch_ramp, plan.hooks)
    if plan.config_json["task_options"]:
        assert workdir_lib.config_differences(older, dict(plan.config_json, task_options={
            **plan.config_json["task_options"], next(iter(plan.config_json["task_options"])): "changed"}), options) != []
    # A moved option that changed is a change of the run (the older value read where it is now).
    calibration = plan.config_json["hooks"]["calibration"]
    changed = dict(plan.config_json, hooks={**plan.config_json["hooks"],
                                            "calibration": {**calibration, "enabled": not calibration["enabled"]}})
    assert workdir_lib.config_differences(older, changed, options) != []


def test_each_task_reads_its_own_options():
    from nli_jax import planner
    plan = planner.build_plan(_config("configs/ocnli.py", "train_size=10k,cpu_test"), training=False)
    assert (plan.task_options.train_size, plan.task_options.hypothesis_only) == ("10k", False)
    from nli_jax.tasks import create_task
    assert create_task(plan).train_split == "train_10k"
    electra = planner.build_plan(_config("configs/pretrain/electra_base.py", ""), training=False).task_options
    assert (electra.generator_fraction, electra.discriminator_weight, electra.max_predictions) == (1 / 3, 50.0, 20)
    albert = planner.build_plan(_config("configs/pretrain/indobert_lite_base.py", "phase=2"), training=False)
    rule = albert.task_options.masking_rule()
    assert (rule.unit, len(rule.span_lengths), rule.max_predictions) == ("word", 3, 80)
    # Options no other task has: a fine-tuning plan carries no masking, a pretraining plan no NLI knob.
    assert not hasattr(plan.data, "hypothesis_only") and not hasattr(albert.pretrain, "max_predictions")


def test_a_missing_option_takes_its_default_and_an_unknown_one_is_refused():
    from nli_jax.errors import ConfigValueError
    from nli_jax import planner
    c = _config("configs/inferes.py", "cpu_test")
    del c.task_options["validation_seed"]
    assert planner.build_plan(c, training=False).task_options.validation_seed == 0
    c.task_options.train_size = "10k"  # OCNLI's, not InferES's
    with pytest.raises(ConfigValueError, match=r"task_options.train_size: not a config key of task 'inferes'"):
        planner.build_plan(c, training=False)
    c = _config("configs/inferes.py", "cpu_test")
    c.task_options.validation_fraction = 1.5
    with pytest.raises(ConfigValueError, match=r"--config.task_options.validation_fraction=1.5: .* must be < 1"):
        planner.build_plan(c, training=False)


def test_a_moved_key_on_the_command_line_names_its_new_place(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "finetune.main", "--config=configs/indonli_large.py:cpu_test",
                           f"--workdir={tmp_path / 'w'}", "--config.data.hypothesis_only=True"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "--config.task_options.hypothesis_only=" in last and last.startswith("error:"), proc.stderr[-2000:]
    assert not (tmp_path / "w").exists()
