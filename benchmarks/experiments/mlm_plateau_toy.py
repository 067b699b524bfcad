"""Is the MLM plateau of docs/pretraining_id_corpus_sample.md a property of BERT or of nli-jax?

A toy masked-LM task that only context can solve: each row is [CLS] t1 t1 t2 t2 t3 t3 t4 (token
pairs drawn uniformly from the vocabulary), one position per row is replaced by [MASK], and the
model must predict it; its pair partner, one position away, holds the answer. A model that does
not attend to its neighbour stays at the uniform loss ln(vocab - 10).

For each seed, nli-jax's ForMaskedLM (2 layers x 128, BERT init) is exported with save_pretrained
and loaded into transformers' BertForMaskedLM; both are trained with AdamW (optax / torch, lr 1e-3,
weight decay 0.01) on the same batches. The table gives both losses over training.

    python -m benchmarks.experiments.mlm_plateau_toy --seeds=0,1,2,3 --steps=800

--json writes every seed's rows (ratios: nli-jax's final loss over transformers', per seed).

Reading: if the two columns track each other, through the plateau and through the drop where one
happens, the plateau is BERT's (its initialisation and post-LayerNorm architecture), not a bug here.
"""
from __future__ import annotations

import math
import os
import tempfile
import time

import numpy as np

from benchmarks import harness


def batches(seed, steps, batch, length, vocab):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = np.repeat(rng.integers(10, vocab, (batch, (length + 1) // 2)), 2, axis=1)[:, :length].astype(np.int32)
        ids[:, 0] = 2  # [CLS]
        pos = rng.integers(1, length, (batch, 1)).astype(np.int32)
        target = np.take_along_axis(ids, pos, 1)
        inputs = ids.copy()
        np.put_along_axis(inputs, pos, 4, 1)  # [MASK]
        yield inputs, pos, target


def run_seed(seed, *, steps, report_every, batch, length, vocab, lr):
    """[(step, nli-jax loss, transformers loss)], each the mean over the report_every steps before it."""
    import jax.numpy as jnp
    import optax
    import torch
    from flax import nnx
    from transformers import BertForMaskedLM

    from nli_jax.losses import weighted_cross_entropy
    from nli_jax.models import ForMaskedLM, preset

    config = preset("scratch-2layer-small", vocab_size=vocab, hidden_size=128, intermediate_size=512,
                    num_attention_heads=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = ForMaskedLM(config, rngs=nnx.Rngs(seed))
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        theirs = BertForMaskedLM.from_pretrained(tmp)
    theirs.train()
    torch_opt = torch.optim.AdamW(theirs.parameters(), lr=lr, weight_decay=0.01)
    optimizer = nnx.Optimizer(ours, optax.adamw(lr, weight_decay=0.01), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, inputs, positions, targets):
        def loss_fn(m):
            total, count = weighted_cross_entropy(m(inputs, masked_positions=positions)["mlm_logits"], targets,
                                                  jnp.ones(targets.shape))
            return total / count
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    rows = []
    window_ours, window_theirs = [], []
    for s, (inputs, positions, targets) in enumerate(batches(seed, steps, batch, length, vocab), 1):
        window_ours.append(float(step(ours, optimizer, jnp.asarray(inputs), jnp.asarray(positions), jnp.asarray(targets))))
        labels = np.full(inputs.shape, -100, np.int64)
        np.put_along_axis(labels, positions, targets, 1)
        loss = theirs(input_ids=torch.from_numpy(inputs.astype(np.int64)), labels=torch.from_numpy(labels)).loss
        loss.backward()
        torch_opt.step()
        torch_opt.zero_grad()
        window_theirs.append(loss.item())
        if s % report_every == 0:  # mean over the last report_every steps: single batches are noisy
            rows.append((s, float(np.mean(window_ours)), float(np.mean(window_theirs))))
            window_ours, window_theirs = [], []
    return rows


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--report_every", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    t = time.time()
    results = {int(s): run_seed(int(s), steps=args.steps, report_every=args.report_every, batch=args.batch,
                                length=args.length, vocab=args.vocab, lr=args.lr) for s in args.seeds.split(",")}
    steps = [s for s, _, _ in next(iter(results.values()))]
    lines = [f"Neighbour-copy toy, length {args.length}, vocab {args.vocab}, batch {args.batch}, AdamW {args.lr:g}; "
             f"uniform loss ln({args.vocab - 10}) = {math.log(args.vocab - 10):.2f}. Mean training loss over the "
             f"{args.report_every} steps before each step shown, nli-jax / transformers.", "",
             "| seed | " + " | ".join(f"step {s}" for s in steps) + " |", "|---|" + "---|" * len(steps)]
    for seed, rows in results.items():
        lines.append(f"| {seed} | " + " | ".join(f"{a:.2f} / {b:.2f}" for _, a, b in rows) + " |")
    lines += ["", f"{time.time() - t:.0f} s"]
    print("\n".join(lines))
    harness.write_result(args.json, {"settings": {k: v for k, v in vars(args).items() if k != "json"},
                                     "seconds": time.time() - t,
                                     "seeds": {str(seed): [{"step": s, "nli_jax_loss": a, "transformers_loss": b}
                                                           for s, a, b in rows] for seed, rows in results.items()}},
                         ratios={f"seed{seed}_nli_jax_over_transformers_final_loss": rows[-1][1] / rows[-1][2]
                                 for seed, rows in results.items()})


if __name__ == "__main__":
    main()
