"""The command line's persistent compilation cache (--compilation_cache, on by default): a rerun
reads its programs back instead of compiling them, results.json says so, and an empty flag turns
the cache off. The tests' own runs keep their private cache (conftest), so these runs drop it."""
import json
import re
import os
import subprocess
import sys

from conftest import REPO

CPU_TEST = "configs/indonli_base.py:cpu_test"


def _finetune(workdir, *flags):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), JAX_EXPLAIN_CACHE_MISSES="true")
    proc = subprocess.run([sys.executable, "-m", "finetune.main", f"--config={CPU_TEST}", f"--workdir={workdir}",
                           f"--config.data.tfds_dir={workdir.parent / 'tfds'}", "--config.train.max_steps=4",
                           *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((workdir / "results.json").read_text())["compilation"], proc.stderr


def test_a_sweeps_next_cell_reads_every_program_from_the_cache(tmp_path):
    """Another learning rate and seed (a sweep's next cell; a rerun is the easier case): the seed
    and the peak learning rate are inputs of the compiled train step, so the train step, the
    eval step per bucket and the small programs all come back from the cache."""
    cache = tmp_path / "cache"
    cold, _ = _finetune(tmp_path / "a", f"--compilation_cache={cache}")
    assert cold["cache_dir"] == str(cache) and cold["programs"] > 0 and cold["cache_misses"] > 0
    assert cold["cache_hits"] == 0 and any(cache.iterdir())
    warm, log = _finetune(tmp_path / "b", f"--compilation_cache={cache}", "--config.optimizer.lr=3e-4",
                          "--config.train.seed=7")
    misses = sorted(set(re.findall(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)'", log)))
    # One run in a few compiled one small program more than the other (seen once: 34 programs, 33 read back).
    assert warm["cache_hits"] >= warm["programs"] - 1 and warm["cache_misses"] <= 1, (warm, cold, misses)
    assert "jit_train_step" not in misses and "jit_eval_step" not in misses, misses
    assert warm["seconds"] < 0.25 * cold["seconds"], (warm, cold)
    assert f"read from the persistent cache {cache}" in log


def test_an_empty_flag_turns_the_cache_off_and_the_environment_wins(tmp_path):
    code = ("import jax; from nli_jax.train import compilation; d = compilation.configure_cache({!r}); "
            "print(d, jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    run = lambda arg, **extra: subprocess.run([sys.executable, "-c", code.format(arg)], cwd=REPO, text=True,  # noqa: E731
                                              capture_output=True, env=dict(env, **extra), check=True).stdout.split()
    assert run("")[:2] == ["None", "False"]
    assert run(str(tmp_path / "c")) == [str(tmp_path / "c"), "True", str(tmp_path / "c")]
    assert run(str(tmp_path / "c"), JAX_COMPILATION_CACHE_DIR=str(tmp_path / "env"))[0] == str(tmp_path / "env")
