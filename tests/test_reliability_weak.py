"""Reliability, fourth round (issue 53, item 4): the weak cases of the probe, each ending in one
clear line, a count in the log, or a refusal (docs/errors.md: §2, §8, §9, §14, §15, §18). Each
case runs the real command or the real function."""
import csv
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, config_for, task_for
from test_reliability_io import CPU_TEST, VAL, fake_run, one_line_error
from test_reliability_verified import commands, env_cpu

# --- Ctrl-C (§2) ----------------------------------------------------------------------------------

# finetune.main, with SIGINT sent to itself from inside the checkpoint write of step $SIGINT_AT,
# $SIGINT_TIMES times (a second Ctrl-C lands while the first one's checkpoint is still written).
CTRL_C_IN_A_CHECKPOINT = """
import os, signal, sys
from nli_jax.train import checkpointing
original, at, times = checkpointing.Checkpointer.save, int(sys.argv[1]), int(sys.argv[2])
def save(self, step, *args, **kwargs):
    if step == at and not kwargs.get("force"):
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
    return original(self, step, *args, **kwargs)
checkpointing.Checkpointer.save = save
sys.argv = [sys.argv[0]] + sys.argv[3:]
from nli_jax import cli
cli.define_flags()
cli.run(cli.main)
"""


def _ctrl_c_run(workdir, at, times, *extra):
    return subprocess.run([sys.executable, "-c", CTRL_C_IN_A_CHECKPOINT, str(at), str(times), f"--config={CPU_TEST}",
                           f"--workdir={workdir}", "--config.train.max_steps=6",
                           "--config.train.checkpoint_every_steps=2", *extra],
                          cwd=REPO, env=env_cpu(), capture_output=True, text=True, timeout=300)


def test_ctrl_c_during_a_checkpoint_write_saves_it_and_says_how_to_resume(tmp_path):
    """Ctrl-C while step 4's checkpoint was written: ~100 lines of tracebacks, run.json left
    "running". Now the write finishes, one line says the step and how to resume, exit 130."""
    workdir = tmp_path / "run"
    proc = _ctrl_c_run(workdir, 4, 1)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "SIGINT (Ctrl-C): checkpoint saved at step 4; exiting (rerun the same command to resume)" in proc.stderr
    state = json.loads((workdir / "run.json").read_text())
    assert (state["state"], state["step"]) == ("interrupted", 4)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_the_rerun_resumes(tmp_path):
    """Two Ctrl-C in step 4's checkpoint write: it stops at once, one line naming the kept
    checkpoint (step 2), run.json "interrupted"; the rerun resumes from step 2 and finishes."""
    workdir = tmp_path / "run"
    proc = _ctrl_c_run(workdir, 4, 2)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "interrupted (Ctrl-C)" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "interrupted (Ctrl-C) after the checkpoint of step 2 of 6 (kept); rerun the same command to resume from it"), lines
    state = json.loads((workdir / "run.json").read_text())
    assert (state["state"], state["step"]) == ("interrupted", 2)
    rerun = _ctrl_c_run(workdir, 0, 0)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert re.search(r"resumed from \S+ at step 2\n", (workdir / "train.log").read_text())
    assert json.loads((workdir / "run.json").read_text())["state"] == "finished"


# --- a tool's output that is a file (§15) ---------------------------------------------------------

def test_a_tools_output_directory_that_is_a_file_is_refused_naming_it(tmp_path):
    """export / predict / evaluate with --output (--workdir) an existing file: a FileExistsError
    traceback after the checkpoint was read. Now one line naming the path, the file unchanged."""
    run = fake_run(tmp_path / "run")
    existing = tmp_path / "notes.txt"
    existing.write_text("mine\n")
    cases = [
        (("finetune.export", f"--checkpoint={run}", f"--output={existing}"), "--output"),
        (("finetune.predict", f"--checkpoint={run}", f"--output={existing}", f"--input=x={VAL}"), "--output"),
        (("finetune.evaluate", f"--checkpoint={run}", f"--workdir={existing}"), "--workdir"),
        (("pretrain.build_vocab", f"--corpus={VAL}", f"--output_dir={existing}"), "--output_dir"),
    ]
    for proc, (argv, flag) in zip(commands(tmp_path, *(argv for argv, _ in cases)), cases):
        one_line_error(proc, f"{flag}={existing} is a file, not a directory")
    assert existing.read_text() == "mine\n"
