"""Training steps/s of a 2-process CPU run (finetune.main cpu_test, 127.0.0.1 coordinator), to
compare the loop's preemption check between code versions: run it here and on another checkout.

    python benchmarks/multiprocess_steps.py                            # this checkout
    git archive HEAD | tar -x -C /tmp/before && python benchmarks/multiprocess_steps.py --repo=/tmp/before

Both processes pad to max_seq_length (data.pad_to_max_length) so that only the loop differs
between versions, not the batch shapes. steps/s is the median over the log intervals after the
first (compilation), from metrics.jsonl's examples/s and the global batch.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/machine.py
import machine  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(repo: str, steps: int, log_every: int, processes: int, devices: int) -> float:
    workdir = tempfile.mkdtemp(prefix="multiprocess_steps_")
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--log_every", type=int, default=50)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1, help="CPU devices per process")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    print(machine.line(), flush=True)  # ratios differ between CPUs
    rates = [run(args.repo, args.steps, args.log_every, args.processes, args.devices) for _ in range(args.repeats)]
    print(f"{args.repo}: {args.processes} processes x {args.devices} CPU device(s), {args.steps} steps: "
          f"{' '.join(f'{r:.1f}' for r in rates)} steps/s (median of log intervals)")
    return rates


if __name__ == "__main__":
    main()
