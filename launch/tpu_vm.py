"""Runs an nli-jax command on every worker of a Cloud TPU VM (single host or pod slice).

    python -m launch.tpu_vm --tpu=my-v3-8 --zone=europe-west4-a -- \\
        python -m finetune.main --config=configs/indonli_large.py --workdir=gs://bucket/indonli_large

Each worker runs the same command with --multihost added (jax.distributed.initialize() finds
the other hosts on TPU). --dry_run prints the gcloud command instead of running it.
"""
from __future__ import annotations

import shlex
import subprocess
import sys

from absl import app, flags

flags.DEFINE_string("tpu", None, "TPU VM name.")
flags.DEFINE_string("zone", None, "TPU zone.")
flags.DEFINE_string("project", None, "GCP project (default: gcloud's).")
flags.DEFINE_string("repo_dir", "~/nli-jax", "Where the repository is checked out on the workers.")
flags.DEFINE_bool("dry_run", False, "Print the command instead of running it.")
flags.mark_flags_as_required(["tpu", "zone"])
FLAGS = flags.FLAGS


def gcloud_command(tpu: str, zone: str, project: str | None, repo_dir: str, job: list[str]) -> list[str]:
    if not job:
        raise app.UsageError("give the job after --, e.g. -- python -m finetune.main --config=... --workdir=...")
    if job[:3] == ["python", "-m", "finetune.main"] or job[:3] == ["python", "-m", "pretrain.main"]:
        if "--multihost" not in job:
            job = job + ["--multihost"]
    remote = f"cd {repo_dir} && " + " ".join(shlex.quote(a) for a in job)
    cmd = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu, f"--zone={zone}", "--worker=all", f"--command={remote}"]
    if project:
        cmd.insert(5, f"--project={project}")
    return cmd


def main(argv):
    cmd = gcloud_command(FLAGS.tpu, FLAGS.zone, FLAGS.project, FLAGS.repo_dir, argv[1:])
    if FLAGS.dry_run:
        print(" ".join(shlex.quote(a) for a in cmd))
        return 0
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(app.run(main))
