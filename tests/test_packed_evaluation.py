"""Packed evaluation and packed sequence labelling (data.packing, issue 28).

What a user relies on: evaluation on packed rows predicts exactly what padded evaluation
predicts (real checkpoint, real data, the run's own jitted evaluation step), on fewer computed
tokens; every example is evaluated once, whatever the process count; the seven tagging tasks
train and evaluate packed with each example's word alignment kept, word logits equal to the
padded path's, and a packed training step equal to the padded one.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import config_for, optimizer_plan
from nli_jax.data import pipeline
from nli_jax import planner
from nli_jax.train.optimizers import make_optimizer
from nli_jax.train.setup import prepare
from nli_jax.train.steps import make_train_step

BUCKETS = (32, 64, 128, 256, 512)


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_the_packed_plan_evaluates_every_example_once_within_fixed_rows(processes):
    rng = np.random.default_rng(processes)
    lengths = np.concatenate([rng.integers(3, 60, 3000), rng.integers(100, 500, 400)])
    groups, rows = 2, 4
    plan = pipeline.packed_eval_plan(lengths, groups=groups * processes, rows_per_group=rows, buckets=BUCKETS)
    seen = [i for _, _, _, members in plan for group in members for row in group for i in row]
    assert sorted(seen) == list(range(len(lengths)))
    shapes = {}
    for capacity, size, most, members in plan:
        assert len(members) == groups * processes and capacity >= 128 and capacity in BUCKETS
        assert shapes.setdefault((capacity, size), most) == most and size in (1, 2, 4)  # a few shapes
        for group in members:
            assert len(group) <= size and sum(len(r) for r in group) <= most
            assert all(sum(lengths[i] for i in row) <= capacity for row in group)
    assert len(shapes) <= 2 * len({c for c, _ in shapes})
    # Fewer tokens computed than sorted batches padded to buckets, and rows nearly full.
    computed = sum(capacity * size * len(members) for capacity, size, _, members in plan)
    ordered = np.sort(lengths)
    batch = groups * rows * processes
    padded = sum(len(ordered[i:i + batch]) * pipeline.bucket_length(BUCKETS, ordered[i:i + batch].max())
                 for i in range(0, len(ordered), batch))
    assert computed < 0.8 * padded, (computed, padded)
    assert computed < 1.06 * lengths.sum(), computed / lengths.sum()


def _encode(example):
    n = example["n"]
    return {"input_ids": np.arange(1, n + 1, dtype=np.int32), "attention_mask": np.ones(n, np.int32),
            "token_type_ids": np.zeros(n, np.int32), "label": np.int32(example["idx"] % 3),
            "idx": np.int32(example["idx"])}


@pytest.mark.parametrize("processes", [1, 2])
def test_packed_evaluation_batches_keep_each_example_in_its_segment(processes):
    """Every process yields as many batches of the same shapes; each real example's tokens sit
    at its cls_index in its group's rows, with its own segment and positions from 0."""
    rng = np.random.default_rng(0)
    source = [{"idx": i, "n": int(n)} for i, n in enumerate(rng.integers(2, 200, 101))]
    lengths = np.asarray([e["n"] for e in source])
    batching = pipeline.Batching(buckets=BUCKETS, pad_values=(("input_ids", 0), ("attention_mask", 0),
                                                              ("token_type_ids", 0)), eval_packing_groups=2)
    dummy = dict(_encode(source[0]), idx=np.int32(-1))
    per_process = [list(pipeline.eval_batches(source, _encode, batching, local_batch_size=8, dummy=dummy,
                                              process_index=p, process_count=processes, lengths=lengths))
                   for p in range(processes)]
    assert len({len(b) for b in per_process}) == 1
    for batches in zip(*per_process):
        assert len({tuple((k, v.shape) for k, v in sorted(b.items())) for b in batches}) == 1
    seen = []
    for batch in (b for batches in per_process for b in batches):
        groups, per_group = batch["cls_index"].shape
        assert batch["input_ids"].shape[0] in (groups * 4, groups * 2, groups)  # 4 rows a device (the last: fewer)
        flat = batch["input_ids"].reshape(groups, -1)
        segments, positions = batch["segment_ids"].reshape(groups, -1), batch["position_ids"].reshape(groups, -1)
        for e in range(groups * per_group):
            if batch["weight"][e] == 0:
                assert batch["idx"][e] == -1
                continue
            g, start, n = e // per_group, batch["cls_index"].flat[e], source[int(batch["idx"][e])]["n"]
            np.testing.assert_array_equal(flat[g, start:start + n], np.arange(1, n + 1))
            np.testing.assert_array_equal(positions[g, start:start + n], np.arange(n))
            assert len(set(segments[g, start:start + n])) == 1 and segments[g, start] > 0
            assert start // batch["input_ids"].shape[1] == (start + n - 1) // batch["input_ids"].shape[1]
            seen.append(int(batch["idx"][e]))
    assert sorted(seen) == list(range(101))


def _run(tmp_path, spec, packing, *assignments):
    config = config_for(spec, f"data.packing={packing}", f"data.tfds_dir={tmp_path / 'tfds'}", *assignments)
    return prepare(planner.build_plan(config, training=False), str(tmp_path / f"run_{packing}"))


def test_packed_evaluation_predicts_what_padded_evaluation_predicts(tmp_path, shared_data, minilm_dir):
    """IndoNLI validation through the run's evaluator (its jitted evaluation step), MiniLM, at
    length 128: the same predictions, probabilities and report, on fewer computed tokens."""
    assignments = (f"data.source={shared_data / 'indonli'}", f"model.init={minilm_dir}", "model.dtype=float32",
                   "data.max_seq_length=128", "train.eval_batch_size=32")
    out, tokens = {}, {}
    for packing in (True, False):
        run = _run(tmp_path, "indonli_base", packing, *assignments)
        assert run.batching.eval_packing_groups == (1 if packing else 0)
        source = pipeline.Subset(run.splits["validation"], range(400))
        out[packing] = run.evaluator.evaluate(run.params, "validation", source)
        data = run.evaluator._splits["validation"]
        lengths = data.lengths(0, 1)
        dummy = dict(data.encode(data.examples[0]), idx=np.int32(-1))
        tokens[packing] = sum(b["input_ids"].size for b in pipeline.eval_batches(
            data.examples, data.encode, run.batching, local_batch_size=32, dummy=dummy, lengths=lengths))
    packed, padded = out[True], out[False]
    assert packed.report["count"] == padded.report["count"] == 400
    assert packed.predictions["prediction"] == padded.predictions["prediction"]
    np.testing.assert_allclose(np.stack(packed.predictions["logits"]), np.stack(padded.predictions["logits"]),
                               atol=2e-5)
    assert packed.report["accuracy"] == padded.report["accuracy"]
    np.testing.assert_allclose(packed.report["loss"], padded.report["loss"], rtol=1e-5)
    assert [r["prediction"] for r in packed.records] == [r["prediction"] for r in padded.records]
    assert tokens[True] < 0.85 * tokens[False], tokens


NERP_ASSIGNMENTS = ("data.max_seq_length=128", "train.eval_batch_size=16", "model.dtype=float32")
NERP_SENTENCES = 100  # validation sentences compared, packed and padded (7 padded batches of 16)


def _nerp_run(tmp_path, shared_data, minilm_dir, packing):
    return _run(tmp_path, "indonlu:task=nerp", packing, f"data.source={shared_data / 'indonlu'}",
                f"model.init={minilm_dir}", *NERP_ASSIGNMENTS)


def test_packed_tagging_word_logits_equal_the_padded_ones(tmp_path, shared_data, minilm_dir):
    """NERP validation, MiniLM: every sentence's word logits (average alignment, IndoNLU's) from
    packed rows equal the padded path's, and the evaluator's tags and report are the same."""
    word_logits, evaluations = {}, {}
    for packing in (True, False):
        run = _nerp_run(tmp_path, shared_data, minilm_dir, packing)
        assert run.batching.eval_packing_groups == (1 if packing else 0)
        source = pipeline.Subset(run.splits["validation"], range(NERP_SENTENCES))
        evaluations[packing] = run.evaluator.evaluate(run.params, "validation", source)
        data = run.evaluator._splits["validation"]
        dummy = dict(data.encode(data.examples[0]), idx=np.int32(-1))
        model = nnx.merge(run.steps.graphdef, run.params, run.steps.rest)
        logits_fn = jax.jit(lambda b: run.task.word_logits(model, b, True))
        per_example = {}
        for batch in pipeline.eval_batches(data.examples, data.encode, run.batching, local_batch_size=16,
                                           dummy=dummy, lengths=data.lengths(0, 1)):
            logits = np.asarray(logits_fn({k: jnp.asarray(v) for k, v in batch.items()}))
            for i, idx in enumerate(batch["idx"]):
                if idx >= 0:
                    per_example[int(idx)] = (logits[i], batch["word_mask"][i])
        word_logits[packing] = per_example
    assert sorted(word_logits[True]) == sorted(word_logits[False]) and len(word_logits[True]) == NERP_SENTENCES
    for idx in word_logits[True]:
        (packed, mask), (padded, padded_mask) = word_logits[True][idx], word_logits[False][idx]
        n = int(padded_mask.sum())
        assert n > 0 and int(mask.sum()) == n
        np.testing.assert_allclose(packed[:n], padded[:n], atol=2e-5)
    packed, padded = evaluations[True], evaluations[False]
    assert [r["prediction"] for r in packed.records] == [r["prediction"] for r in padded.records]
    assert packed.report["f1"] == padded.report["f1"]


def test_a_packed_tagging_step_equals_the_padded_step(tmp_path, shared_data, minilm_dir):
    """The jitted train step on NERP sentences (MiniLM, dropout off): loss, gradient norm and
    Adam update from packed rows equal the padded batch's, with and without accumulation."""
    run = _nerp_run(tmp_path, shared_data, minilm_dir, True)
    examples = [run.splits["train"][i] for i in range(16)]
    rows = [run.encode(e) for e in examples]
    overrides = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = type(run.model).from_pretrained(minilm_dir, num_labels=run.model.num_labels, seed=0,
                                            config_overrides=overrides)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx, schedule = make_optimizer(optimizer_plan(lr=1e-4, grad_clip=1.0), total_steps=10, steps_per_epoch=10,
                                  warmup_steps=0)
    padded_batching = pipeline.Batching(buckets=run.batching.buckets, pad_values=run.batching.pad_values)
    results = []
    for accumulation in (1, 2):
        packed_batching = pipeline.Batching(buckets=run.batching.buckets, pad_values=run.batching.pad_values,
                                            packing_groups=accumulation,
                                            per_example_fields=run.batching.per_example_fields)
        packed = packed_batching.training(rows)
        assert packed["input_ids"].size < 0.8 * padded_batching.training(rows)["input_ids"].size
        for batch, steps in ((padded_batching.training(rows), 1), (packed, accumulation)):
            step = jax.jit(make_train_step(graphdef, rest, run.task, tx, schedule, seed=0, accumulation_steps=steps))
            state = {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0)}
            results.append(step(state, batch))
        (padded_state, padded_metrics), (packed_state, packed_metrics) = results[-2:]
        assert float(packed_metrics["weight"]) == float(padded_metrics["weight"]) > 100
        np.testing.assert_allclose(packed_metrics["loss_sum"], padded_metrics["loss_sum"], rtol=1e-5)
        np.testing.assert_allclose(packed_metrics["grad_norm"], padded_metrics["grad_norm"], rtol=1e-4)
        for a, b in zip(jax.tree.leaves(packed_state["params"]), jax.tree.leaves(padded_state["params"])):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)
