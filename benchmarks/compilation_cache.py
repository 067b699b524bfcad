"""What the persistent compilation cache saves: the same fine-tuning command three times with one
fresh cache directory: cold, a rerun in a new workdir, and a sweep's next cell (another learning
rate and seed). Each run's results.json `compilation` gives the programs compiled, their seconds
(XLA compilation, or reading the program back) and how many came from the cache.

    python -m benchmarks.compilation_cache --workdir=/tmp/compilation_cache

Default: MiniLM-L6 on the first 256 IndoNLI training pairs of ../shared/data, 1 epoch at length
128, then the 2,197 validation pairs; --cpu_test runs the tiny cpu_test config instead (no data).
Writes --json (default <workdir>/result.json) with the ratios of the cold run's compilation
seconds to each later run's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks import harness


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--train_pairs", type=int, default=256)
    parser.add_argument("--cpu_test", action="store_true", help="the tiny cpu_test config (fixture data, no model)")
    args = parser.parse_args()
    print(harness.line(), flush=True)
    shutil.rmtree(args.workdir, ignore_errors=True)
    cache = os.path.join(args.workdir, "cache")
    if args.cpu_test:
        base = ["--config=configs/indonli_base.py:cpu_test", "--config.train.max_steps=8"]
    else:
        base = ["--config=configs/indonli_base.py", f"--config.model.init={harness.require_minilm()}",
                f"--config.data.source={os.path.join(args.data, 'indonli')}", "--config.data.max_seq_length=128",
                f"--config.data.max_train_examples={args.train_pairs}", "--config.train.num_epochs=1",
                "--config.train.batch_size=32", "--config.train.early_stopping_patience=0"]
    runs = {"cold": [], "rerun": [], "next_sweep_cell": ["--config.optimizer.lr=3e-5", "--config.train.seed=2"]}
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.setdefault("JAX_PLATFORMS", "cpu")
    out = {"finetune_flags": base, "runs": {}}
    for name, extra in runs.items():
        workdir = os.path.join(args.workdir, name)
        command = [sys.executable, "-m", "finetune.main", *base, *extra, f"--workdir={workdir}",
                   f"--config.data.tfds_dir={os.path.join(args.workdir, 'tfds')}", f"--compilation_cache={cache}"]
        start = time.time()
        proc = subprocess.run(command, cwd=harness.REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
            compiled = json.load(f)["compilation"]
        out["runs"][name] = dict(compiled, wall_s=time.time() - start)
    print("model:", "cpu_test (tiny)" if args.cpu_test else f"MiniLM-L6, {args.train_pairs} IndoNLI pairs x 1 epoch, "
          "length 128, validation 2,197 pairs")
    print(f"{'run':<16} {'programs':>8} {'from cache':>10} {'compile s':>9} {'wall s':>7}")
    for name, r in out["runs"].items():
        print(f"{name:<16} {r['programs']:>8} {r['cache_hits']:>10} {r['seconds']:>9.1f} {r['wall_s']:>7.1f}")
    cold, ratios = out["runs"]["cold"], {}
    for name in ("rerun", "next_sweep_cell"):
        r = out["runs"][name]
        ratios[f"cold_over_{name}_compile_s"] = cold["seconds"] / max(r["seconds"], 1e-9)
        print(f"{name}: compilation {r['seconds']:.1f} s against {cold['seconds']:.1f} s cold "
              f"({ratios[f'cold_over_{name}_compile_s']:.1f}x less); wall {r['wall_s']:.1f} s against "
              f"{cold['wall_s']:.1f} s")
    harness.write_result(args.json or os.path.join(args.workdir, "result.json"), out, ratios=ratios)


if __name__ == "__main__":
    main()
