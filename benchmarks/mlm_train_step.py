"""MLM training step (forward, backward, AdamW update): nli-jax vs transformers' PyTorch eager.

    python benchmarks/mlm_train_step.py                 # BERT-base, batch 8 x seq 128, fp32
    python benchmarks/mlm_train_step.py --model tiny-bert --steps 3   # smoke run

Both sides run the same shapes, the same masked positions (15% of tokens, at most 20 per
sequence) and dropout 0.1, in the same process on the same cores. nli-jax computes MLM logits
only at the masked positions (the BERT recipe); the PyTorch peer is `BertForMaskedLM` called
with labels as users do (logits everywhere, loss at labelled positions). Rounds alternate
between the two so machine noise hits both; the median step time of each is reported.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from nli_jax.losses import masked_lm_loss
from nli_jax.models import ForMaskedLM, make_rngs, preset


def make_batch(vocab, batch, length, predictions, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(min(1000, vocab // 2), vocab, (batch, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 3, 4
    n = min(predictions, max(1, round(0.15 * length)))
    positions = np.stack([np.sort(rng.choice(np.arange(1, length - 1), n, replace=False)) for _ in range(batch)])
    positions = np.pad(positions, ((0, 0), (0, predictions - n))).astype(np.int32)
    weights = np.zeros((batch, predictions), np.float32)
    weights[:, :n] = 1
    labels = np.take_along_axis(ids, positions, axis=1)
    masked = ids.copy()
    np.put_along_axis(masked, positions[:, :n], 2, axis=1)  # [MASK]
    return dict(input_ids=masked, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids),
                masked_positions=positions, masked_ids=labels, masked_weights=weights)


def jax_step_fn(model, lr=1e-4):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(lr, weight_decay=0.01)
    opt_state = tx.init(params)

    # Donated state is updated in place: no fresh 94 MB embedding-sized buffers per step.
    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(params, opt_state, rest, batch):
        model = nnx.merge(graphdef, params, rest)

        def loss_fn(m):
            out = m(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    masked_positions=batch["masked_positions"], deterministic=False)
            total, count = masked_lm_loss(out["mlm_logits"], batch["masked_ids"], batch["masked_weights"])
            return total / count
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        params = nnx.state(model, nnx.Param)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, nnx.state(model, nnx.Not(nnx.Param)), loss

    state = [params, opt_state, rest]

    def run(batch):
        state[0], state[1], state[2], loss = step(*state, batch)
        return float(loss)  # blocks until the step is done
    return run


def torch_step_fn(config, lr=1e-4):
    import torch
    import transformers
    hf = transformers.BertConfig(**{k: v for k, v in config.to_hf_dict().items() if k != "dtype"})
    model = transformers.BertForMaskedLM(hf).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def run(batch):
        labels = np.full(batch["input_ids"].shape, -100, np.int64)
        for b in range(labels.shape[0]):
            keep = batch["masked_weights"][b] > 0
            labels[b, batch["masked_positions"][b][keep]] = batch["masked_ids"][b][keep]
        inputs = {k: torch.tensor(batch[k], dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids")}
        loss = model(**inputs, labels=torch.tensor(labels)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())
    return run, torch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="indobert-base", help="preset name (nli_jax.models.PRESETS)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20, help="max_predictions_per_seq")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    config = preset(args.model, max_position_embeddings=max(512, args.seq))
    batch = make_batch(config.vocab_size, args.batch, args.seq, args.predictions)
    jax_run = jax_step_fn(ForMaskedLM(config, rngs=make_rngs(0)))
    torch_run, torch = torch_step_fn(config)
    jbatch = jax.tree.map(jnp.asarray, batch)

    t0 = time.perf_counter()
    jax_run(jbatch)
    compile_s = time.perf_counter() - t0
    torch_run(batch)  # warm-up (allocator, oneDNN primitives)
    jax_run(jbatch)

    times = {"nli-jax": [], "pytorch-eager": []}
    for _ in range(args.rounds):
        for name, run, b in (("nli-jax", jax_run, jbatch), ("pytorch-eager", torch_run, batch)):
            for _ in range(args.steps):
                t = time.perf_counter()
                run(b)
                times[name].append(time.perf_counter() - t)

    tokens = args.batch * args.seq
    result = {"model": args.model, "batch": args.batch, "seq": args.seq, "max_predictions": args.predictions,
              "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
              "jax": jax.__version__, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
              "jax_compile_s": round(compile_s, 1)}
    for name, ts in times.items():
        med = statistics.median(ts)
        result[name] = {"median_step_s": round(med, 3), "tokens_per_s": round(tokens / med, 1), "steps": len(ts)}
    result["ratio_nli_jax_over_pytorch"] = round(result["nli-jax"]["tokens_per_s"] / result["pytorch-eager"]["tokens_per_s"], 3)
    print(f"MLM train step, {args.model}, batch {args.batch} x seq {args.seq}, fp32, {os.cpu_count()} cores")
    for name in times:
        print(f"  {name:14s} {result[name]['tokens_per_s']:8.1f} tokens/s  (median step {result[name]['median_step_s']:.3f} s)")
    print(f"  ratio nli-jax / pytorch-eager: {result['ratio_nli_jax_over_pytorch']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
