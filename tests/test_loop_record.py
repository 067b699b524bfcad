"""The training loop's record (nli_jax/train/record.py): typed, frozen, replaced rather than changed,
and read back from what a checkpoint saved, today's or an older nli-jax's dict."""
import dataclasses
import json

import pytest


def test_validations_decide_the_best_step_and_early_stopping_without_changing_the_record():
    from nli_jax.train.record import LoopRecord
    start = LoopRecord()
    record = start
    for step, metric in ((10, 0.5), (20, 0.7), (30, 0.6), (40, 0.69)):
        record = record.after_validation(step, {"step": step, "validation": {"accuracy": metric}}, metric,
                                         selects=True, patience=2)
    assert start == LoopRecord() and len(record.history) == 4  # the first is unchanged
    assert (record.best_step, record.best_metric, record.evals_without_improvement, record.stopped_early) == (
        20, 0.7, 2, True)
    latest = LoopRecord().after_validation(5, {}, 0.9, selects=False, patience=1).after_validation(
        6, {}, 0.1, selects=False, patience=1)
    assert (latest.best_step, latest.stopped_early) == (6, False)  # a task reporting its final parameters
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.best_step = 30


def test_a_checkpoints_record_reads_back_as_it_was_saved_and_as_an_older_nli_jax_saved_it():
    from nli_jax.train.record import BudgetRecord, LoopRecord
    record = LoopRecord().after_validation(10, {"step": 10, "epoch": 1.0, "validation": {"accuracy": 0.5}}, 0.5,
                                           selects=True, patience=0)
    record = record.with_tokens({"computed": 640, "real": 500}).with_budget(BudgetRecord(25.0, 0.1, 15000, 10**6))
    assert LoopRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    # What the loop at 5272312 saved (a dict, with the checkpoint's own optimizer_state flag).
    older = {"best_metric": 0.5, "best_step": 10, "evals_without_improvement": 0, "stopped_early": False,
             "history": [{"step": 10, "epoch": 1.0, "validation": {"accuracy": 0.5}}],
             "train_tokens": {"computed": 640, "real": 500}, "optimizer_state": True,
             "budget": {"minutes": 25.0, "seconds_per_step": 0.1, "total_steps": 15000, "cap": 1000000}}
    assert LoopRecord.from_json(older) == record
    with pytest.raises(ValueError, match="loop metadata is not the loop's bookkeeping"):
        LoopRecord.from_json({"best_step": 3})
