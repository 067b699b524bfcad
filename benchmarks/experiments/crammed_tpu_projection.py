"""The crammed base-sized recipe and IndoBERT-base phase 1 projected on the paper's TPU v3-8 by the
TPU compiler on this host (issue 41, item 5): FLOPs per token, the compiler's step time, tokens per
hour, and what a day (Cramming's budget) or the paper's 1M steps buys.

    python -m benchmarks.experiments.crammed_tpu_projection --workdir=/tmp/crammed_tpu
    python -m benchmarks.experiments.crammed_tpu_projection --workdir=/tmp/s \\
        --rows="configs/pretrain/crammed.py:cpu_test@v3-8,configs/pretrain/indobert_base.py:cpu_test@v3-8"  # smoke

Each row is `python -m launch.compile --config=... --topology=v3-8` (benchmarks.tpu_compile_table.run_row:
its JSON report kept in --workdir and reused unless --fresh). The crammed rows compile with
--config.model.attention=plain: with no dropout, "auto" picks the splash kernel on a TPU target,
which the compiler's cost model cannot see into (no time estimate); the plain attention's estimate
is the conservative one. FLOPs per token: the compiler's count per device x devices / tokens of a
step (and the model's formula, nli_jax's training_flops_per_token). Tokens per hour: tokens of a
step / the compiler's step time x 3,600. The step times are the compiler's estimates (optimistic:
docs/tpu_compile.md), not measurements.
"""
from __future__ import annotations

import os
from pathlib import Path

from benchmarks import harness
from benchmarks.tpu_compile_table import run_row

PLAIN = "--config.model.attention=plain"
ROWS = ("configs/pretrain/crammed.py@v3-8@" + PLAIN,
        "configs/pretrain/crammed.py@v3-8@" + PLAIN + " --config.train.batch_size=256",
        "configs/pretrain/indobert_base.py:phase=1@v3-8@")
DAY_S = 24 * 3600  # Cramming's budget (configs/pretrain/crammed.py: train.budget_minutes 1,440)


def projection(report: dict) -> dict:
    step, batch, devices = report["train_step"], report["batch"], report["devices"]
    tokens = batch["global"] * batch["length"]
    out = {"parameters": report["model"]["parameters"], "batch": batch["global"], "length": batch["length"],
           "tokens_per_step": tokens, "fits": step["fits"]}
    if not step["fits"] or step.get("compiler_estimated_seconds") is None:
        return out
    seconds = step["compiler_estimated_seconds"]
    out.update(hbm_gib=step["total_gib"], compiler_flops_per_token=step["compiler_tflops_per_device"] * 1e12 * devices
               / tokens, formula_flops_per_token=step["formula_tflops_per_device"] * 1e12 * devices / tokens,
               step_seconds=seconds, mfu=step["compiler_estimated_mfu"], tokens_per_hour=tokens / seconds * 3600,
               steps_per_day=DAY_S / seconds, tokens_per_day=tokens / seconds * DAY_S,
               hours_for_1m_steps=seconds * 1e6 / 3600)
    return out


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--rows", default=",".join(ROWS), help="CONFIG@TOPOLOGY[@FLAGS], comma-separated")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    print(harness.line(), flush=True)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in [r for r in args.rows.split(",") if r]:
        config, topology, *rest = spec.split("@")
        extra = rest[0].split() if rest and rest[0] else []
        key = "".join(c if c.isalnum() or c in "._-=" else "_" for c in f"{config}_{topology}_{'_'.join(extra)}")
        print(f"{config} on {topology} {' '.join(extra)}", flush=True)
        report = run_row(config, topology, extra, workdir / f"{key}.json", args.fresh)
        if "error" in report:
            raise SystemExit(f"{spec}: {report['error']}")
        rows.append({"config": config, "topology": topology, "extra": extra, "command": report.get("command"),
                     **projection(report)})
    lines = ["| recipe | batch x length | params | HBM/core | FLOPs/token (compiler; formula) | compiler step | MFU | "
             "tokens/hour | a day buys | 1M steps take |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["config"].replace("configs/pretrain/", "") + (" " + " ".join(r["extra"]) if r["extra"] else "")
        if "step_seconds" not in r:
            lines.append(f"| {name} | {r['batch']} x {r['length']} | {r['parameters'] / 1e6:.1f}M | no estimate |"
                         " | | | | | |")
            continue
        lines.append(f"| {name} | {r['batch']} x {r['length']} | {r['parameters'] / 1e6:.1f}M | {r['hbm_gib']:.2f} GiB | "
                     f"{r['compiler_flops_per_token'] / 1e6:.1f}M; {r['formula_flops_per_token'] / 1e6:.1f}M | "
                     f"{r['step_seconds']:.4f} s | {r['mfu']:.0%} | {r['tokens_per_hour'] / 1e9:.3f}B | "
                     f"{r['steps_per_day'] / 1e6:.2f}M steps, {r['tokens_per_day'] / 1e9:.1f}B tokens | "
                     f"{r['hours_for_1m_steps']:.1f} h |")
    text = "\n".join(lines)
    print(text)
    (workdir / "table.md").write_text(text + "\n")
    ratios = {}
    timed = [r for r in rows if "step_seconds" in r]
    if len(timed) >= 2:
        ratios["first_over_last_tokens_per_hour"] = timed[0]["tokens_per_hour"] / timed[-1]["tokens_per_hour"]
    harness.write_result(args.json or os.path.join(args.workdir, "crammed_tpu_projection.json"), {"rows": rows},
                         ratios=ratios)


if __name__ == "__main__":
    main()
