"""Training steps/s of a 2-process CPU run (finetune.main cpu_test, 127.0.0.1 coordinator), to
compare the loop's preemption check between code versions: run it here and on another checkout.

    python -m benchmarks.multiprocess_steps                            # this checkout
    git archive 694b415 | tar -x -C /tmp/before && python -m benchmarks.multiprocess_steps --repo=/tmp/before

Both processes pad to max_seq_length (data.pad_to_max_length) so that only the loop differs
between versions, not the batch shapes. steps/s is the median over the log intervals after the
first (compilation), from metrics.jsonl's examples/s and the global batch. --peer_repo runs another
checkout the same way, alternating with this one, and gives the ratio of the medians.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

from benchmarks import harness


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(repo: str, steps: int, log_every: int, processes: int, devices: int) -> float:
    with tempfile.TemporaryDirectory(prefix="multiprocess_steps_") as workdir:  # runs and data copies go with it
        return _run(repo, workdir, steps, log_every, processes, devices)


def _run(repo: str, workdir: str, steps: int, log_every: int, processes: int, devices: int) -> float:
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    batch = 16
    common = ["--config=configs/indonli_large.py:cpu_test", f"--workdir={workdir}/run",
              f"--config.train.max_steps={steps}", f"--config.train.log_every_steps={log_every}",
              f"--config.train.eval_every_steps={10 * steps}", "--config.eval_splits=('validation',)",
              "--config.data.pad_to_max_length=True", f"--config.data.tfds_dir={workdir}/tfds",
              f"--config.train.batch_size={batch}"]
    procs = [subprocess.Popen([sys.executable, "-m", "finetune.main", *common,
                               f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}",
                               f"--process_id={i}"], cwd=repo, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(processes)]
    outputs = [p.communicate(timeout=1200)[0] for p in procs]
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            raise RuntimeError("\n=====\n".join(o[-3000:] for o in outputs))
    with open(os.path.join(workdir, "run", "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return statistics.median(r["train/examples_per_s"] / batch for r in rows[1:])


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--repo", default=harness.REPO, help="the checkout to run (default: this one)")
    parser.add_argument("--peer_repo", default="", help="another checkout, run alternately with --repo")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--log_every", type=int, default=50)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1, help="CPU devices per process")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    print(harness.line(), flush=True)  # ratios differ between CPUs
    repos = {"repo": args.repo, **({"peer_repo": args.peer_repo} if args.peer_repo else {})}
    rates = {name: [] for name in repos}
    for r in range(args.repeats):
        for name in (list(repos) if r % 2 == 0 else list(repos)[::-1]):
            rates[name].append(run(repos[name], args.steps, args.log_every, args.processes, args.devices))
    result = {"processes": args.processes, "devices": args.devices, "steps": args.steps, "sides": {}}
    for name, values in rates.items():
        result["sides"][name] = {"steps_per_s": values, "median_steps_per_s": statistics.median(values),
                                 "path": os.path.abspath(repos[name])}
        print(f"{repos[name]}: {args.processes} processes x {args.devices} CPU device(s), {args.steps} steps: "
              f"{' '.join(f'{v:.1f}' for v in values)} steps/s (median of log intervals)")
    ratios = {}
    if args.peer_repo:
        ratios["repo_over_peer_repo_steps_per_s"] = (result["sides"]["repo"]["median_steps_per_s"]
                                                     / result["sides"]["peer_repo"]["median_steps_per_s"])
        print(f"ratio {args.repo} / {args.peer_repo} (steps/s, medians): {ratios['repo_over_peer_repo_steps_per_s']:.3f}")
    harness.write_result(args.json, result, ratios=ratios)
    return rates


if __name__ == "__main__":
    main()
