"""One prepared accelerator check (issue 51, item 4): the loop's own train steps in bfloat16 on one
GPU (or TPU chip), each against transformers + PyTorch on the same device for the same steps.

    python -m benchmarks.device_check --json=device_check.json     # one H100 / H200: under 8 minutes
    python -m benchmarks.device_check --tiny                         # CPU: tiny shapes, a few steps

Rows (full mode): BERT-base MLM at 128 and 512 (the indobert-base preset: BERT-base's shape,
30,522 pieces), IndoBERT-large MLM at 128 and 512, ModernBERT-base MLM at 512 (the preset: 22
layers, windows of 128, 50,368 pieces), and IndoNLI fine-tuning of IndoBERT-large at 128 (3
labels). Models are drawn at random from the presets: nothing is downloaded, no data is read.

nli-jax: the loop's own step (nli_jax.train.compiled_step.initial_state_and_step, built by
benchmarks.mlm_train_step.loop_step_fn: the state donated, in its shardings) with the plan of
configs/pretrain/indobert_base.py (MLM rows: AdamW, clipping at 1.0) or configs/indonli_large.py
(fine-tuning: Adam), the model computing in bfloat16 over float32 parameters; MLM logits at the
masked positions only (15% of the tokens), as the loop computes them. transformers + PyTorch:
AutoModelForMaskedLM / AutoModelForSequenceClassification of the same config.json on the same
device, float32 parameters under torch.autocast(bfloat16), labels passed as users do (logits at
every position), torch.optim.AdamW / Adam, clip_grad_norm_ (benchmarks.mlm_train_step.torch_step_fn).

Timing: benchmarks.harness.time_sides, the side that goes first rotating; each timed call is one
step that returns when its loss is on the host. tokens/s = batch x length / median step seconds.
MFU = tokens/s x the model's training FLOPs per token (PretrainedModel.training_flops_per_token,
the same numerator for both sides) / the device's peak dense bfloat16 FLOP/s (PEAK_BF16_TFLOPS by
jax's device_kind; --peak_tflops for another chip; none on a CPU unless given). Rows stop being
started once --budget_s seconds have passed (what is left is reported as skipped).

Packages: nli-jax's own (setup.py) and torch. A machine without network lacks some; the check
names every missing module first and how to bring it as wheels (docs/performance.md,
"Accelerator check").
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.util
import os
import time
import traceback

# JAX and PyTorch share the device: JAX takes memory as it needs it instead of 75% up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Its import sets the host allocator as the command line does (on a CPU-only run it may re-execute
# the interpreter): before anything is printed.
from benchmarks import harness, mlm_train_step  # noqa: E402

# Dense bfloat16 peak per device, TFLOP/s, by (a prefix of) jax's device_kind; the longest matching
# prefix wins. NVIDIA datasheets (SXM parts unless named): H100 SXM 989.4, H100 PCIe 756, H100 NVL
# 835, H200 989.4, H200 NVL 835, A100 312, L4 121, A10G 70 (its spec sheet's 140 is with sparsity).
# Cloud TPU (per jax device: a core on v2/v3, a chip after; nli_jax.aot's table): v2 22.5,
# v3 61.5, v4 275, v5e 197, v5p 459, v6e 918.
PEAK_BF16_TFLOPS = {
    "NVIDIA H100": 989.4, "NVIDIA H100 PCIe": 756.0, "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200": 989.4, "NVIDIA H200 NVL": 835.0,
    "NVIDIA A100": 312.0, "NVIDIA L4": 121.0, "NVIDIA A10G": 70.0,
    "TPU v2": 22.5, "TPU v3": 61.5, "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v5": 459.0,
    "TPU v5p": 459.0, "TPU v6 lite": 918.0, "TPU v6e": 918.0,
}

# Import name -> pip name of what a run of this check needs (setup.py's install_requires that the
# step imports, and torch for the peer).
REQUIRED = {"jax": "jax", "jaxlib": "jaxlib", "flax": "flax", "optax": "optax", "orbax.checkpoint": "orbax-checkpoint",
            "ml_collections": "ml-collections", "absl": "absl-py", "numpy": "numpy", "safetensors": "safetensors",
            "transformers": "transformers", "tokenizers": "tokenizers", "huggingface_hub": "huggingface-hub",
            "sentencepiece": "sentencepiece", "grain": "grain", "array_record": "array-record",
            "tensorflow_datasets": "tensorflow-datasets", "importlib_resources": "importlib_resources",
            "tensorboardX": "tensorboardX", "gcsfs": "gcsfs", "matplotlib": "matplotlib", "torch": "torch"}


@dataclasses.dataclass(frozen=True)
class Row:
    name: str  # what the table says
    model: str  # preset (nli_jax.models.PRESETS)
    task: str  # "mlm" or "indonli"
    batch: int
    length: int


FULL_ROWS = (
    Row("BERT-base MLM, 64 x 128", "indobert-base", "mlm", 64, 128),
    Row("BERT-base MLM, 16 x 512", "indobert-base", "mlm", 16, 512),
    Row("IndoBERT-large MLM, 64 x 128", "indobert-large", "mlm", 64, 128),
    Row("IndoBERT-large MLM, 16 x 512", "indobert-large", "mlm", 16, 512),
    Row("ModernBERT-base MLM, 16 x 512", "modernbert-base", "mlm", 16, 512),
    Row("IndoNLI fine-tuning, IndoBERT-large, 32 x 128", "indobert-large", "indonli", 32, 128),
)
# The same kinds of row at the cpu_test shapes: what the default test suite runs, so the check
# cannot rot between device loans.
TINY_ROWS = (
    Row("tiny-bert MLM, 4 x 32", "tiny-bert", "mlm", 4, 32),
    Row("tiny-bert MLM, 2 x 64", "tiny-bert", "mlm", 2, 64),
    Row("tiny-modernbert MLM, 2 x 64", "tiny-modernbert", "mlm", 2, 64),
    Row("IndoNLI fine-tuning, tiny-bert, 4 x 32", "tiny-bert", "indonli", 4, 32),
)


def missing_packages() -> list[str]:
    """pip names of the modules this check imports that are not installed."""
    return [pip for module, pip in REQUIRED.items() if importlib.util.find_spec(module.split(".")[0]) is None
            or (module != module.split(".")[0] and importlib.util.find_spec(module) is None)]


def peak_tflops(device_kind: str) -> float:
    """The device's dense bfloat16 peak per PEAK_BF16_TFLOPS (longest matching prefix); 0 if unknown."""
    matches = [k for k in PEAK_BF16_TFLOPS if device_kind.startswith(k)]
    return PEAK_BF16_TFLOPS[max(matches, key=len)] if matches else 0.0


def finetune_plan(batch: int, length: int):
    """configs/indonli_large.py's plan (Adam 1e-5, 3 labels) at this batch and length, bfloat16."""
    from configs import indonli_large
    from nli_jax.planner import build_plan
    config = indonli_large.get_config()
    config.model.dtype = "bfloat16"
    config.train.batch_size = batch
    config.data.max_seq_length = length
    return build_plan(config)


def classification_batch(vocab: int, batch: int, length: int, seed: int = 0) -> dict:
    """Sentence pairs of random ids filling the row: [CLS] premise [SEP] hypothesis [SEP], 3 labels."""
    import numpy as np
    rng = np.random.default_rng(seed)
    ids = rng.integers(min(1000, vocab // 2), vocab, (batch, length)).astype(np.int32)
    split = length * 2 // 3
    ids[:, 0], ids[:, split], ids[:, -1] = 3, 4, 4
    types = (np.arange(length)[None, :] > split).astype(np.int32).repeat(batch, 0)
    return dict(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=types,
                label=rng.integers(0, 3, (batch,)).astype(np.int32), weight=np.ones((batch,), np.float32))


def sides_for(row: Row, device: str):
    """({"nli-jax": call, "pytorch": call}, training FLOPs per token) for one row; each call is one step."""
    from nli_jax.models import ForMaskedLM, ForSequenceClassification, make_rngs, preset
    config = preset(row.model, dtype="bfloat16", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if row.task == "mlm":
        plan = mlm_train_step.pretraining_plan(1e-4)
        model = ForMaskedLM(config, sentence_head=False, rngs=make_rngs(0))
        batch = mlm_train_step.make_batch(config.vocab_size, row.batch, row.length, round(0.15 * row.length))
        num_labels = 0
    else:
        plan = finetune_plan(row.batch, row.length)
        model = ForSequenceClassification(config, num_labels=3, rngs=make_rngs(0))
        batch = classification_batch(config.vocab_size, row.batch, row.length)
        num_labels = 3
    flops_per_token = model.training_flops_per_token(row.length)
    run, convert = mlm_train_step.loop_step_fn(model, plan)
    torch_run, torch_convert, _ = mlm_train_step.torch_step_fn(config, plan.optimizer, device=device, bf16=True,
                                                               num_labels=num_labels)
    return ({"nli-jax": functools.partial(run, convert(batch)),
             "pytorch": functools.partial(torch_run, torch_convert(batch))}, flops_per_token)


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--tiny", action="store_true", help="the tiny rows (CPU: what the test suite runs)")
    parser.add_argument("--rows", default="", help="comma-separated row numbers (1-based) to run; default all")
    parser.add_argument("--rounds", type=int, default=0, help="rounds of timed steps per side (default 3; tiny 2)")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per side per round (default 5; tiny 1)")
    parser.add_argument("--budget_s", type=float, default=420.0, help="start no row after this many seconds")
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the device's dense bf16 peak per device "
                        "(default: PEAK_BF16_TFLOPS by device kind)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(harness.line(), flush=True)
    missing = missing_packages()
    if missing:
        raise SystemExit(f"missing packages: {' '.join(missing)}; bring them as wheels (docs/performance.md, "
                         "'Accelerator check'): on a machine with network, pip download -d wheels "
                         f"{' '.join(missing)}; here, pip install --no-index --find-links wheels {' '.join(missing)}")
    harness.quiet_absl()
    import jax
    import torch
    import transformers
    transformers.logging.set_verbosity_error()  # presets' config.json without ModernBERT's special ids

    backend = jax.default_backend()
    device_kind = jax.devices()[0].device_kind
    torch_device = "cuda" if backend == "gpu" and torch.cuda.is_available() else "cpu"
    if backend == "cpu" and not args.tiny:
        print("no accelerator (jax's backend is cpu): running the full rows on the CPU; --tiny for a smoke run")
    peak = args.peak_tflops or peak_tflops(device_kind)
    print(f"accelerator: {device_kind} ({backend}, {jax.device_count()} device(s)); jax {jax.__version__}, "
          f"torch {torch.__version__} on {torch_device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if torch_device == 'cuda' else ''}; "
          f"peak bf16 {peak or 'unknown'} TFLOP/s", flush=True)
    rows = TINY_ROWS if args.tiny else FULL_ROWS
    if args.rows:
        rows = tuple(rows[int(i) - 1] for i in args.rows.split(","))
    rounds = args.rounds or (2 if args.tiny else 3)
    steps = args.steps or (1 if args.tiny else 5)
    result = {"device_kind": device_kind, "backend": backend, "peak_bf16_tflops": peak, "jax": jax.__version__,
              "torch": torch.__version__, "torch_device": torch_device, "rounds": rounds, "steps_per_round": steps,
              "rows": []}
    ratios = {}
    for number, row in enumerate(rows, 1):
        if time.perf_counter() - started > args.budget_s:
            result["rows"].append({"name": row.name, "skipped": f"--budget_s {args.budget_s:.0f} spent"})
            print(f"  {row.name}: skipped (--budget_s {args.budget_s:.0f} s spent)", flush=True)
            continue
        try:
            calls, flops_per_token = sides_for(row, torch_device)
            timings = harness.time_sides(calls, rounds=rounds, calls=steps, warmup=2)
        except Exception as error:  # noqa: BLE001 - one failing row must not cost a lease the others
            result["rows"].append({"name": row.name, "error": f"{type(error).__name__}: {error}"})
            traceback.print_exc()
            print(f"  {row.name}: FAILED {type(error).__name__}: {error}", flush=True)
            calls = None
            torch.cuda.empty_cache() if torch_device == "cuda" else None
            continue
        tokens = row.batch * row.length
        entry = {"name": row.name, "model": row.model, "task": row.task, "batch": row.batch, "length": row.length,
                 "training_flops_per_token": flops_per_token, "sides": {}}
        for side, timing in timings.items():
            tokens_per_s = tokens / timing.median
            entry["sides"][side] = dict(timing.summary(), tokens_per_s=tokens_per_s,
                                        mfu=tokens_per_s * flops_per_token / (peak * 1e12) if peak else None)
        key = f"row{number}_nli_jax_over_pytorch_tokens_per_s"
        ratios[key] = timings["pytorch"].median / timings["nli-jax"].median
        entry["ratio"] = ratios[key]
        result["rows"].append(entry)
        print(f"  {row.name}: nli-jax {_side(entry['sides']['nli-jax'])}; pytorch {_side(entry['sides']['pytorch'])}; "
              f"ratio {entry['ratio']:.2f}x", flush=True)
        del calls
        torch.cuda.empty_cache() if torch_device == "cuda" else None
    result["seconds"] = time.perf_counter() - started
    print(f"\nFor docs/performance.md ({datetime.date.today().isoformat()}, {result['seconds']:.0f} s):")
    print("| accelerator (date) | measurement | command | nli-jax | transformers + PyTorch | ratio |\n|---|---|---|---|---|---|")
    for entry in result["rows"]:
        if "skipped" in entry or "error" in entry:
            continue
        print(f"| {device_kind}, {jax.__version__} / torch {torch.__version__} ({datetime.date.today().isoformat()}) "
              f"| {entry['name']}, bf16, the loop's own step | `{harness.command()}` | {_side(entry['sides']['nli-jax'])} "
              f"| {_side(entry['sides']['pytorch'])} | **{entry['ratio']:.2f}×** |")
    harness.write_result(args.json, result, ratios=ratios)


def _side(side: dict) -> str:
    mfu = f", MFU {100 * side['mfu']:.1f}%" if side["mfu"] is not None else ""
    return f"{side['tokens_per_s']:,.0f} tokens/s (median step {side['median_s'] * 1e3:.1f} ms{mfu})"


if __name__ == "__main__":
    main()
