"""Runs the cpu_test recipes at another commit and at this working tree, and compares what they
wrote: every step's losses and metrics (metrics.jsonl, timings aside), results.json and
predictions.jsonl. A refactoring that claims "behaviour unchanged" must show no difference.

    python tests/compare_with_commit.py --ref=46b97d8                  # all runs
    python tests/compare_with_commit.py --ref=46b97d8 --runs=finetune,pretrain_bert
    python tests/compare_with_commit.py --ref=46b97d8 --keep=/tmp/cmp  # keep both sides' workdirs
    python tests/compare_with_commit.py --ref=46b97d8 --keep=/tmp/cmp --reuse_ref   # the ref's runs again
    python tests/compare_with_commit.py --ref=46b97d8 --keep=/tmp/cmp --reuse_ref --resume=finetune,pretrain_bert

--resume: the working tree resumes the ref's workdirs (an upgrade in the middle of a run): each
run's newest checkpoint, results.json and predictions.jsonl are removed from a copy of the ref's
workdir, the working tree's command reruns there, and the outcome must equal the ref's
uninterrupted run (every step's loss after the resume too); `finetune.evaluate` of the ref's
finished fine-tuning run must give the ref's results.

The other commit is checked out with `git worktree` into a scratch directory and run from
there (`python -m` from its root imports its own nli_jax, not the installed one). Runs that
need the real datasets (IndoNLU tasks) are skipped when ../shared/data is absent. Exit status 1
when anything differs; the report names the run, file, step and key.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("NLI_JAX_SHARED_DATA", REPO.parent / "shared" / "data"))

# name -> (module, config, extra overrides, needs shared data). Every step is logged, so that
# every step's loss is compared.
RUNS = {
    "finetune": ("finetune.main", "configs/indonli_large.py:cpu_test", [], False),
    "finetune_hypothesis_only": ("finetune.main", "configs/indonli_large.py:cpu_test,hypothesis_only",
                                 ["--config.train.num_epochs=2"], False),
    "finetune_seeds_accumulation": ("finetune.main", "configs/indonli_large.py:cpu_test",
                                    ["--config.seeds=(1,2)", "--config.train.accumulation_steps=2",
                                     "--config.train.num_epochs=2"], False),
    "pretrain_bert": ("pretrain.main", "configs/pretrain/indobert_base.py:cpu_test", [], False),
    "pretrain_albert": ("pretrain.main", "configs/pretrain/indobert_lite_base.py:cpu_test",
                        ["--config.train.max_steps=100"], False),
    "pretrain_electra": ("pretrain.main", "configs/pretrain/electra_small.py:cpu_test",
                         ["--config.train.max_steps=100"], False),
    "pretrain_crammed": ("pretrain.main", "configs/pretrain/crammed.py:cpu_test", [], False),
    "indonlu_smsa": ("finetune.main", "configs/indonlu.py:task=smsa,model=scratch,cpu_test",
                     [f"--config.data.source={SHARED / 'indonlu'}"], True),
    "indonlu_nerp": ("finetune.main", "configs/indonlu.py:task=nerp,model=scratch,cpu_test",
                     [f"--config.data.source={SHARED / 'indonlu'}"], True),
    "indonlu_casa": ("finetune.main", "configs/indonlu.py:task=casa,model=scratch,cpu_test",
                     [f"--config.data.source={SHARED / 'indonlu'}"], True),
}
TIMING_KEYS = ("train/examples_per_s", "train/tokens_per_s", "train/mfu")


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_side(root: pathlib.Path, name: str, workdir: pathlib.Path, tfds: pathlib.Path, more=()) -> None:
    module, config, extra, _ = RUNS[name]
    command = [sys.executable, "-m", module, f"--config={config}", f"--workdir={workdir}",
               "--config.train.log_every_steps=1", f"--config.data.tfds_dir={tfds}", *extra, *more]
    clis = (REPO / "nli_jax" / "cli" / "__init__.py", REPO / "nli_jax" / "train" / "cli.py")  # now, before issue 48
    if root == REPO and any(p.exists() and "--compilation_cache" in p.read_text() for p in clis):
        command.append("--compilation_cache=")  # compiled afresh, as the reference is
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    for key in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "PYTHONPATH"):
        env.pop(key, None)
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed in {root} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def relative(value, workdir: pathlib.Path):
    """JSON values with the run's own workdir written as <workdir> (the two sides' differ)."""
    if isinstance(value, dict):
        return {k: relative(v, workdir) for k, v in value.items()}
    if isinstance(value, list):
        return [relative(v, workdir) for v in value]
    return value.replace(str(workdir), "<workdir>") if isinstance(value, str) else value


def differences(a, b, where: str, out: list[str]) -> None:
    """Every place where two JSON values differ (floats compared exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only in {'ref' if key in a else 'tree'}")
            else:
                differences(a[key], b[key], f"{where}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b)):
            differences(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    elif a != b:
        out.append(f"{where}: {a!r} (ref) vs {b!r} (tree)")


def run_files(workdir: pathlib.Path) -> dict[str, pathlib.Path]:
    """The compared files of a run, or of each seed of a `seeds` run."""
    files = {}
    for results in sorted(workdir.rglob("results.json")):
        rel = results.parent.relative_to(workdir)
        for name in ("results.json", "predictions.jsonl", "metrics.jsonl"):
            files[str(rel / name)] = results.parent / name
    return files


def compare(name: str, ref: pathlib.Path, tree: pathlib.Path) -> list[str]:
    out = []
    ref_files, tree_files = run_files(ref), run_files(tree)
    if set(ref_files) != set(tree_files):
        out.append(f"{name}: files {sorted(ref_files)} (ref) vs {sorted(tree_files)} (tree)")
    for rel in sorted(set(ref_files) & set(tree_files)):
        if rel.endswith(".jsonl"):
            a, b = read_jsonl(ref_files[rel]), read_jsonl(tree_files[rel])
            if rel.endswith("metrics.jsonl"):
                a = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in a]
                b = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in b]
        else:
            a, b = json.loads(ref_files[rel].read_text()), json.loads(tree_files[rel].read_text())
        differences(relative(a, ref), relative(b, tree), f"{name}/{rel}", out)
    # Exported Hugging Face directories: the same weights, byte for byte.
    for export in sorted(p.relative_to(ref) for p in ref.rglob("model.safetensors")):
        if not (tree / export).is_file():
            out.append(f"{name}/{export}: only in ref")
        elif (ref / export).read_bytes() != (tree / export).read_bytes():
            out.append(f"{name}/{export}: the weights differ")
    return out


def check_resume(name: str, scratch: pathlib.Path) -> list[str]:
    """The working tree resumes a copy of the ref's workdir from its second-newest checkpoint."""
    ref = scratch / "ref" / name
    if not (ref / "results.json").is_file():
        return [f"{name}: no finished ref run in {ref} (run with --sides=ref first)"]
    target = scratch / "resume" / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(ref, target)
    steps = sorted(int(p.name) for p in (target / "checkpoints").iterdir() if p.name.isdigit())
    shutil.rmtree(target / "checkpoints" / str(steps[-1]))
    for f in ("results.json", "predictions.jsonl"):
        (target / f).unlink()
    # The fixture files the ref's run read live in its checkout: the same files, given by its paths.
    saved = json.loads((ref / "config.json").read_text())
    paths = [f"--config.data.source={saved['data']['source']}", f"--config.model.tokenizer={saved['model']['tokenizer']}"]
    if "pretrain" in saved:
        paths.append(f"--config.pretrain.corpus={tuple(saved['pretrain']['corpus'])!r}")
    run_side(REPO, name, target, scratch / "tree" / "tfds", paths)
    out = []
    ref_results, results = (json.loads((d / "results.json").read_text()) for d in (ref, target))
    differences(relative(ref_results, ref), relative(results, target), f"{name}/resumed results.json", out)
    differences(read_jsonl(ref / "predictions.jsonl"), read_jsonl(target / "predictions.jsonl"),
                f"{name}/resumed predictions.jsonl", out)
    last = {}  # the resumed run appends the steps after its checkpoint again: the last of each
    for row in read_jsonl(target / "metrics.jsonl"):
        last[row["step"]] = {k: v for k, v in row.items() if k not in TIMING_KEYS}
    expected = {row["step"]: {k: v for k, v in row.items() if k not in TIMING_KEYS}
                for row in read_jsonl(ref / "metrics.jsonl")}
    differences(expected, last, f"{name}/resumed metrics.jsonl", out)
    if "resumed from" not in (target / "train.log").read_text():
        out.append(f"{name}: the rerun did not resume from the ref's checkpoint")
    if RUNS[name][0] == "finetune.main":  # a finished run of the ref evaluated by the tree's tool
        evaluation = scratch / "resume" / f"{name}_evaluate"
        shutil.rmtree(evaluation, ignore_errors=True)
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("XLA_FLAGS", None)
        proc = subprocess.run([sys.executable, "-m", "finetune.evaluate", f"--checkpoint={ref}",
                               f"--workdir={evaluation}"], cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode:
            out.append(f"{name}: finetune.evaluate of the ref's run failed: {proc.stderr[-500:]}")
        else:
            got = json.loads((evaluation / "results.json").read_text())["splits"]
            differences(ref_results["splits"], got, f"{name}/evaluate of the ref's run", out)
    return out


def summary(workdir: pathlib.Path) -> str:
    steps = sum(len(read_jsonl(p)) for p in workdir.rglob("metrics.jsonl"))
    results = json.loads((workdir / "results.json").read_text())
    splits = results.get("splits", {})
    first = next(iter(splits.values()), {})
    metric = results.get("primary_metric") or next((k for k in ("accuracy", "f1", "mlm_accuracy") if k in first), "")
    value = first.get(metric)
    value = value.get("mean") if isinstance(value, dict) else value
    return f"{steps} logged steps, {next(iter(splits), '-')} {metric} {value}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", required=True, help="the commit to compare with (e.g. the one a refactoring started from)")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from {', '.join(RUNS)}")
    parser.add_argument("--keep", default="", help="directory to keep both sides' workdirs in")
    parser.add_argument("--reuse_ref", action="store_true", help="with --keep: reuse the ref's finished runs")
    parser.add_argument("--sides", default="ref,tree", help="run only one side (ref or tree) with --keep")
    parser.add_argument("--resume", default="", help="runs whose ref workdir the working tree resumes")
    parser.add_argument("--expect", default="",
                        help="comma-separated fnmatch patterns of differences the change means to make (e.g. "
                             "'*results.json.compilation.*'): counted and listed per pattern, not failures")
    args = parser.parse_args()
    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        parser.error(f"unknown runs {unknown}; expected {list(RUNS)}")
    scratch = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="nli_jax_compare_"))
    scratch.mkdir(parents=True, exist_ok=True)
    worktree = scratch / "ref_tree"
    if worktree.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, capture_output=True)
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.ref], cwd=REPO, check=True,
                   capture_output=True)
    print(f"CPU: {cpu_model()}; ref {args.ref} ({worktree}) vs working tree {REPO}")
    problems = []
    try:
        for name in names:
            if RUNS[name][3] and not SHARED.is_dir():
                print(f"{name}: skipped (no real data at {SHARED})")
                continue
            sides = {}
            for side, root in (("ref", worktree), ("tree", REPO)):
                workdir = scratch / side / name
                sides[side] = workdir
                if side not in args.sides.split(",") or (
                        side == "ref" and args.reuse_ref and (workdir / "results.json").is_file()):
                    continue
                shutil.rmtree(workdir, ignore_errors=True)
                run_side(root, name, workdir, scratch / side / "tfds")
            if not all((w / "results.json").is_file() for w in sides.values()):
                print(f"{name}: ran {args.sides} only")
                continue
            found = compare(name, sides["ref"], sides["tree"])
            problems += found
            print(f"{name}: {'identical' if not found else f'{len(found)} differences'} ({summary(sides['tree'])})")
        for name in [n for n in args.resume.split(",") if n]:  # while the ref's fixture files exist
            found = check_resume(name, scratch)
            problems += found
            print(f"{name}: resumed from the ref's checkpoint: {'identical' if not found else f'{len(found)} differences'}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, capture_output=True)
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    import fnmatch
    patterns = [p for p in args.expect.split(",") if p]
    expected = {p: [line for line in problems if fnmatch.fnmatch(line, p)] for p in patterns}
    problems = [line for line in problems if not any(fnmatch.fnmatch(line, p) for p in patterns)]
    for pattern, lines in expected.items():
        print(f"expected ({pattern}): {len(lines)} differences")
    print(f"unexpected: {len(problems)} differences")
    for line in problems[:50]:
        print("  " + line)
    if len(problems) > 50:
        print(f"  ... and {len(problems) - 50} more")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
