import subprocess
import sys

from conftest import REPO


def test_tpu_vm_launcher_runs_the_job_on_every_worker_with_multihost():
    proc = subprocess.run([sys.executable, "-m", "launch.tpu_vm", "--tpu=v3-8-a", "--zone=europe-west4-a", "--dry_run",
                           "--", "python", "-m", "finetune.main", "--config=configs/indonli_large.py",
                           "--workdir=gs://b/run"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("gcloud compute tpus tpu-vm ssh v3-8-a --zone=europe-west4-a --worker=all")
    assert "python -m finetune.main --config=configs/indonli_large.py --workdir=gs://b/run --multihost" in out
