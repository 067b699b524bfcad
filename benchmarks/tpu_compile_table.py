"""Every shipped recipe through the TPU compiler on this host (launch.compile, one subprocess
each, one at a time): fits or not, HBM per device, the compiler's step time and the hours it
projects, against the IndoNLU paper's Table 4 hours on the same v3-8 where it has them.

    python -m benchmarks.tpu_compile_table --workdir=/tmp/tpu_table            # every row
    python -m benchmarks.tpu_compile_table --workdir=/tmp/tpu_table --only=pretrain
    python -m benchmarks.tpu_compile_table --workdir=/tmp/tpu_table --extra=--config.model.remat=full
    python -m benchmarks.tpu_compile_table --workdir=/tmp/tpu_table --match=indobert_lite   # recompile these rows
    python -m benchmarks.tpu_compile_table --workdir=/tmp/t --row=configs/indonli_base.py:cpu_test@v4-8  # one row

Each row's JSON report stays in --workdir (a rerun reuses the reports it finds: --fresh
recompiles); the markdown table is printed and written to <workdir>/table.md, the rows (and the
paper's hours over the projected ones, where it has them) to --json (default <workdir>/table.json).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness

REPO = Path(harness.REPO)

PRETRAIN_MODELS = ("indobert_base", "indobert_large", "indobert_lite_base", "indobert_lite_large")
FINETUNE_CONFIGS = ("indonli_large.py", "indonli_base.py", "indonli_lite.py", "indonli_xlmr_large.py",
                    "indonlu.py:task=smsa,model=large", "indonlu.py:task=posp,model=large", "ocnli.py", "inferes.py")


def rows(only: str) -> list[tuple[str, str, str, list[str]]]:
    """(group, config, topology, extra flags) of every row."""
    out = []
    if only in ("", "pretrain"):
        for model in PRETRAIN_MODELS:
            for phase in (1, 2):
                out.append(("pretrain", f"configs/pretrain/{model}.py:phase={phase}", "v3-8", []))
        out.append(("pod", "configs/pretrain/indobert_large.py:phase=2", "v5e-256",
                    ["--config.mesh.shape={'data': 1, 'fsdp': -1}", "--config.train.batch_size=1024"]))
    if only in ("", "finetune"):
        for topology in ("v3-8", "v4-8"):
            for config in FINETUNE_CONFIGS:
                out.append(("finetune", f"configs/{config}", topology, []))
    return out


def paper_hours(config: str) -> tuple[float | None, int] | None:
    """(Table 4's hours, steps) of a pretraining phase (configs/pretrain/common.py PHASES), or None."""
    if "configs/pretrain/" not in config:
        return None
    from configs.pretrain.common import PHASES
    model = config.split("/")[-1].split(".py")[0].replace("_", "-")
    phase = int(config.rsplit("phase=", 1)[1])
    batch, lr, steps, hours = PHASES[model][phase]
    return hours, steps


def run_row(config: str, topology: str, extra: list[str], path: Path, fresh: bool) -> dict:
    if path.is_file() and not fresh:
        return json.loads(path.read_text())
    command = [sys.executable, "-m", "launch.compile", f"--config={config}", f"--topology={topology}",
               "--eval_step=False", f"--output={path}", *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    print(f"  {time.perf_counter() - start:.0f} s, exit {done.returncode}", flush=True)
    if done.returncode == 1 or not path.is_file():
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(path.read_text())


def projected_hours(config: str, report: dict) -> tuple[float, float | None] | None:
    """(the hours the compiler's step time projects for the phase's steps, Table 4's hours or
    None), for a pretraining row that fits with an estimate; else None."""
    paper, step = paper_hours(config), report.get("train_step", {})
    if not paper or not step.get("fits") or step.get("compiler_estimated_seconds") is None:
        return None
    return step["compiler_estimated_seconds"] * paper[1] / 3600, paper[0]


def table_line(config: str, topology: str, extra: list[str], report: dict) -> str:
    name = config.replace("configs/", "") + (" " + " ".join(extra) if extra else "")
    if "error" in report:
        return f"| {name} | {topology} | error: {report['error'][:120]} | | | | | |"
    step, model, batch = report["train_step"], report["model"], report["batch"]
    shape = f"{batch['global']} x {batch['length']}" + (f" (acc {batch['accumulation']})" if batch["accumulation"] > 1 else "")
    remat = {True: "full", False: "none"}.get(model["remat"], model["remat"])  # older reports: a bool
    setting = (f"remat {remat}{', scan' if model.get('scan_layers') else ''}, mesh "
               f"{','.join(f'{k}{v}' for k, v in report['mesh'].items() if v > 1)}")
    paper = paper_hours(config)
    if not step["fits"]:
        return (f"| {name} | {topology} | {shape} | {setting} | **no**: {step['advice']} | | | "
                f"{'' if not paper or not paper[0] else paper[0]} |")
    if step["compiler_estimated_seconds"] is None:  # a Pallas kernel: no estimate
        return (f"| {name} | {topology} | {shape} | {setting} | yes, {step['total_gib']:.2f} GiB "
                f"(temp {step['temporaries_gib']:.2f}) | none ({step.get('no_estimate') or 'Pallas kernels'}) | "
                f"{step['compile_seconds']:.0f} s | |")
    hours = ""
    if paper:
        projected = projected_hours(config, report)[0]
        hours = f"{projected:.1f} h for {paper[1]:,} steps" + (f" (paper {paper[0]} h, x{paper[0] / projected:.2f})"
                                                               if paper[0] else "")
    return (f"| {name} | {topology} | {shape} | {setting} | yes, {step['total_gib']:.2f} GiB "
            f"(temp {step['temporaries_gib']:.2f}) | {step['compiler_estimated_seconds']:.4f} s, MFU "
            f"{step.get('compiler_estimated_mfu', 0):.0%} | {step['compile_seconds']:.0f} s | {hours} |")


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--only", default="", choices=("", "pretrain", "finetune"))
    parser.add_argument("--extra", action="append", default=[], help="flags added to every row's command")
    parser.add_argument("--fresh", action="store_true", help="recompile the rows whose reports --workdir holds")
    parser.add_argument("--match", action="append", default=[],
                        help="recompile only the rows whose config contains this (others: their reports)")
    parser.add_argument("--row", action="append", default=[],
                        help="CONFIG@TOPOLOGY: this row instead of the shipped recipes' (repeatable)")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(harness.line(), flush=True)
    lines = ["| config | topology | batch | setting | fits (HBM per device) | compiler step time | compile | "
             "projected hours |", "|---|---|---|---|---|---|---|---|"]
    chosen = ([("row", *r.rsplit("@", 1), []) for r in args.row] if args.row else rows(args.only))
    reports, ratios = [], {}
    for group, config, topology, extra in chosen:
        extra = extra + args.extra
        key = (config + "_" + topology + "_" + "_".join(extra)).replace("/", "_").replace(":", "_").replace(" ", "")
        key = "".join(c if c.isalnum() or c in "._-=" else "_" for c in key)
        print(f"{config} on {topology} {' '.join(extra)}", flush=True)
        fresh = args.fresh or any(m in config + " " + topology for m in args.match)
        report = run_row(config, topology, extra, workdir / f"{key}.json", fresh)
        lines.append(table_line(config, topology, extra, report))
        hours = projected_hours(config, report)
        reports.append({"config": config, "topology": topology, "extra": extra, "report": report,
                        "projected_hours": hours and hours[0], "paper_hours": hours and hours[1]})
        if hours and hours[1]:
            name = f"{config.replace('configs/', '')}@{topology}{' ' + ' '.join(extra) if extra else ''}"
            ratios[f"{name}: paper_over_projected_hours"] = hours[1] / hours[0]
        print(lines[-1], flush=True)
    (workdir / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    harness.write_result(args.json or str(workdir / "table.json"), {"rows": reports}, ratios=ratios)


if __name__ == "__main__":
    main()
