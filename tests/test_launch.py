"""launch.tpu: exact gcloud command lines (--dry_run), the worker-side shell strings run by bash, and the
watch loop against a fake gcloud on PATH that simulates one preemption."""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import REPO
from launch import tpu

JOB = ["python", "-m", "finetune.main", "--config=configs/indonli_large.py", "--workdir=gs://BUCKET/indonli_large"]
WHERE = ["--tpu=nli", "--zone=us-central2-b"]


def dry_run(capsys, action, *argv):
    assert tpu.main([action, "--dry_run", *argv]) == 0
    return capsys.readouterr().out.strip().splitlines()


def head_commit():
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_create_vm_and_queued_resource_command_lines(capsys):
    assert dry_run(capsys, "create", *WHERE, "--accelerator=v4-8") == [
        "gcloud compute tpus tpu-vm create nli --zone=us-central2-b --accelerator-type=v4-8 "
        "--version=tpu-ubuntu2204-base"]
    assert dry_run(capsys, "create", *WHERE, "--project=p1", "--accelerator=v4-32", "--spot") == [
        "gcloud compute tpus tpu-vm create nli --zone=us-central2-b --project=p1 --accelerator-type=v4-32 "
        "--version=tpu-ubuntu2204-base --spot"]
    assert dry_run(capsys, "create", *WHERE, "--accelerator=v4-32", "--spot", "--queued") == [
        "gcloud compute tpus queued-resources create nli --zone=us-central2-b --node-id=nli --accelerator-type=v4-32 "
        "--runtime-version=tpu-ubuntu2204-base --spot"]
    assert dry_run(capsys, "create", *WHERE, "--accelerator=v5litepod-8", "--version=my-runtime") == [
        "gcloud compute tpus tpu-vm create nli --zone=us-central2-b --accelerator-type=v5litepod-8 "
        "--version=my-runtime"]


def test_setup_ships_the_commit_as_a_git_archive_to_every_worker(capsys):
    commit = head_commit()
    archive = os.path.join(tempfile.gettempdir(), f"nli-jax-{commit[:12]}.tar.gz")
    lines = dry_run(capsys, "setup", *WHERE, "--commit=HEAD")
    assert lines == [
        f"git -C {REPO} archive --format=tar.gz --output={archive} {commit}",
        f"gcloud compute tpus tpu-vm scp {archive} nli:nli-jax-{commit[:12]}.tar.gz --zone=us-central2-b --worker=all",
        "gcloud compute tpus tpu-vm ssh nli --zone=us-central2-b --worker=all " + shlex.quote(
            f"--command=set -e; rm -rf nli-jax; mkdir -p nli-jax nli-jax-logs; tar -xzf nli-jax-{commit[:12]}.tar.gz "
            f"-C nli-jax; rm nli-jax-{commit[:12]}.tar.gz; echo {commit} > nli-jax/COMMIT; cd nli-jax; "
            "python3 -m pip install -q -U pip; python3 -m pip install -q -e . 'jax[tpu]'")]


def run_command(run, job):
    return ("mkdir -p nli-jax-logs; rm -f nli-jax-logs/{run}.exit; "
            "echo \"== $(date -u +%FT%TZ) $(hostname) commit $(cat nli-jax/COMMIT 2>/dev/null)\" "
            ">> nli-jax-logs/{run}.log; "
            "nohup bash -c {body} >> nli-jax-logs/{run}.log 2>&1 < /dev/null "
            "& echo $! > nli-jax-logs/{run}.pid").format(
        run=run, body=shlex.quote("command -v python >/dev/null || python() { python3 \"$@\"; }; "
                                  f"cd nli-jax && {job}; echo $? > \"$HOME\"/nli-jax-logs/{run}.exit"))


@pytest.mark.parametrize("accelerator,multihost", [("v4-8", ""), ("v4-32", " --multihost")])
def test_run_adds_multihost_only_on_multi_host_slices(capsys, accelerator, multihost):
    lines = dry_run(capsys, "run", *WHERE, f"--accelerator={accelerator}", "--run=indonli", "--", *JOB)
    job = ("python -m finetune.main --config=configs/indonli_large.py --workdir=gs://BUCKET/indonli_large" + multihost)
    assert lines == ["gcloud compute tpus tpu-vm ssh nli --zone=us-central2-b --worker=all "
                     + shlex.quote("--command=" + run_command("indonli", job))]


def test_logs_status_delete_command_lines(capsys):
    assert dry_run(capsys, "logs", *WHERE, "--run=indonli", "--worker=2", "--lines=20") == [
        "gcloud compute tpus tpu-vm ssh nli --zone=us-central2-b --worker=2 "
        + shlex.quote("--command=tail -n 20 nli-jax-logs/indonli.log | sed -u \"s/^/$(hostname): /\"")]
    assert dry_run(capsys, "logs", *WHERE, "--run=indonli", "--follow") == [
        "gcloud compute tpus tpu-vm ssh nli --zone=us-central2-b --worker=all "
        + shlex.quote("--command=tail -n 100 -F nli-jax-logs/indonli.log | sed -u \"s/^/$(hostname): /\"")]
    status = dry_run(capsys, "status", *WHERE, "--run=indonli")
    assert status[0] == "gcloud compute tpus tpu-vm describe nli --zone=us-central2-b '--format=value(state)'"
    assert status[1].startswith("gcloud compute tpus tpu-vm ssh nli --zone=us-central2-b --worker=all '--command=if [")
    assert dry_run(capsys, "status", *WHERE, "--queued") == [
        "gcloud compute tpus queued-resources describe nli --zone=us-central2-b '--format=value(state.state)'"]
    assert dry_run(capsys, "delete", *WHERE) == ["gcloud compute tpus tpu-vm delete nli --zone=us-central2-b --quiet"]
    assert dry_run(capsys, "delete", *WHERE, "--queued") == [
        "gcloud compute tpus queued-resources delete nli --zone=us-central2-b --force --quiet"]


def test_hosts_per_accelerator_type():
    assert [tpu.hosts(a) for a in ("v4-8", "v4-16", "v4-32", "v3-8", "v5p-8", "v5litepod-8", "v5litepod-16",
                                   "v6e-64")] == [1, 2, 4, 1, 1, 1, 4, 16]


@pytest.mark.parametrize("argv,message", [
    (["create", "--zone=z", "--accelerator=v4-8"], "error: create needs --tpu"),
    (["run", "--tpu=t", "--accelerator=v4-8", "--run=r", "--", "true"], "error: run needs --zone"),
    (["create", *WHERE, "--accelerator=v4_8"], "error: --accelerator=v4_8: expected a Cloud TPU type such as v4-8"),
    (["create", *WHERE, "--accelerator=tpu-v4-32"], "error: --accelerator=tpu-v4-32: expected a Cloud TPU type"),
    (["run", *WHERE, "--accelerator=v4-8", "--run=r"], "error: run: give the job after --"),
    (["run", *WHERE, "--accelerator=v4-8", "--run=a b", "--", "true"], "error: --run=a b: use letters"),
    (["delete", *WHERE, "--", "true"], "error: delete takes no job after --"),
    (["setup", *WHERE, "--commit=no-such-commit"], "error: --commit=no-such-commit: not a commit of"),
    (["logs", *WHERE, "--run=r", "--worker=first"], "error: --worker=first: a worker index"),
    (["watch", *WHERE, "--accelerator=v4-8", "--run=r", "--poll_s=0", "--", "true"],
     "error: --poll_s=0.0: must be > 0"),
    ([], "error: give an action: create, setup, run, logs, status, delete, watch"),
])
def test_bad_input_is_one_line_before_anything_runs(capsys, argv, message):
    assert tpu.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


def test_every_action_but_dry_run_needs_gcloud_on_path(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert tpu.main(["delete", *WHERE]) == 1
    err = capsys.readouterr().err
    assert err == "error: gcloud is not on PATH: install the Google Cloud CLI (cloud.google.com/sdk)\n"


def test_worker_side_run_and_status_strings_work_in_bash(tmp_path):
    """The strings `run` and `status` send to every worker, run by bash in a fake home directory."""
    (tmp_path / "nli-jax").mkdir()
    env = {**os.environ, "HOME": str(tmp_path)}

    def worker(command):
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=30).stdout

    def wait_for_exit(run):
        for _ in range(200):
            states = tpu.parse_status(worker(tpu.remote_status(run)))
            if states[0].startswith("exit"):
                return states[0]
            time.sleep(0.05)
        raise AssertionError(f"{run} never ended")

    assert tpu.parse_status(worker(tpu.remote_status("r1"))) == ["absent"]
    go = tmp_path / "go"  # the job waits for it, so that the test sees it running
    job = [sys.executable, "-c", "import os, time; print(\"it's in\", os.getcwd())\n"
                                 f"while not os.path.exists({str(go)!r}): time.sleep(0.01)"]
    worker(tpu.remote_run("r1", job))  # returns at once: the job runs in the background
    assert tpu.parse_status(worker(tpu.remote_status("r1"))) == ["running"]
    go.touch()
    assert wait_for_exit("r1") == "exit 0"
    log = (tmp_path / "nli-jax-logs" / "r1.log").read_text()
    assert log.startswith("== ") and f"it's in {tmp_path / 'nli-jax'}" in log

    worker(tpu.remote_run("r1", [sys.executable, "-c", "import sys; sys.exit(143)"]))  # the rerun of a SIGTERM'd job
    assert wait_for_exit("r1") == "exit 143"
    assert (tmp_path / "nli-jax-logs" / "r1.log").read_text().count("== ") == 2  # both attempts kept

    # As after a reboot: no exit status, and the pid names no process (above any pid_max).
    os.remove(tmp_path / "nli-jax-logs" / "r1.exit")
    (tmp_path / "nli-jax-logs" / "r1.pid").write_text("99999999\n")
    assert tpu.parse_status(worker(tpu.remote_status("r1"))) == ["dead"]


FAKE_GCLOUD = r'''#!{python} -S
"""Records every call; one TPU that is preempted on the second describe after its first job started.
FAKE_CREATE_FAILS=N: the N-th create finds no capacity."""
import json, os, sys
argv, where = sys.argv[1:], os.environ["FAKE_GCLOUD_DIR"]
with open(os.path.join(where, "calls.jsonl"), "a") as f:
    f.write(json.dumps(argv) + "\n")
path = os.path.join(where, "state.json")
state = json.load(open(path)) if os.path.exists(path) else dict(tpu=None, creates=0, runs=0, describes=0, probes=0,
                                                                 create_calls=0)
kind, verb = argv[2], argv[3]
ready, lost = ("ACTIVE", "SUSPENDED") if kind == "queued-resources" else ("READY", "PREEMPTED")
command = next((a[len("--command="):] for a in argv if a.startswith("--command=")), "")
code = 0
if verb == "create":
    state["create_calls"] += 1
if verb == "create" and str(state["create_calls"]) == os.environ.get("FAKE_CREATE_FAILS"):
    print("ERROR: (gcloud) There is no more capacity in the zone", file=sys.stderr)
    code = 1
elif verb == "create":
    state.update(tpu=ready, creates=state["creates"] + 1,
                 workers=int(next(a for a in argv if a.startswith("--accelerator-type=")).split("-")[-1]) // 8)
elif verb == "describe" and os.environ.get("FAKE_DESCRIBE_ERROR"):
    print("ERROR: (gcloud) You do not currently have an active account selected.", file=sys.stderr)
    code = 1
elif verb == "describe":
    if state["tpu"] is None:
        print("ERROR: (gcloud) NOT_FOUND: Resource was not found", file=sys.stderr)
        code = 1
    else:
        if state["creates"] == 1 and state["runs"] == 1:
            state["describes"] += 1
            if state["describes"] == 2:
                state["tpu"] = lost
        print(state["tpu"])
elif verb == "delete":
    state["tpu"] = None
elif verb == "ssh" and "nohup" in command:
    state.update(runs=state["runs"] + 1, probes=0)
elif verb == "ssh" and "nli-jax-run:" in command:
    state["probes"] += 1
    done = state["creates"] == 2 and state["probes"] >= 2
    result = os.environ.get("FAKE_RESULT", "exit 0") if done else "running"
    for w in range(state["workers"]):
        print(f"nli-jax-run: t1v-n-w-{{w}} {{result}}")
json.dump(state, open(path, "w"))
sys.exit(code)
'''


def fake_gcloud(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "gcloud"
    script.write_text(FAKE_GCLOUD.format(python=sys.executable))
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_GCLOUD_DIR": str(tmp_path),
            "TMPDIR": str(tmp_path)}


def launch(env, *argv):
    return subprocess.run([sys.executable, "-m", "launch.tpu", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


def label(call):
    verb = call[3]
    if verb != "ssh":
        return verb
    command = next(a for a in call if a.startswith("--command="))
    return "run" if "nohup" in command else "probe" if "nli-jax-run:" in command else "setup"


@pytest.mark.parametrize("queued", [False, True], ids=["tpu_vm_without_capacity_once", "queued_resource"])
def test_watch_recreates_sets_up_and_reruns_after_a_preemption_until_done(tmp_path, queued):
    env = {**fake_gcloud(tmp_path), "FAKE_CREATE_FAILS": "" if queued else "2"}
    where = [*WHERE, "--accelerator=v4-32"] + (["--queued"] if queued else [])
    commit = f"--commit={head_commit()}"  # not HEAD: a commit made meanwhile in this checkout would change it
    assert launch(env, "create", *where, "--spot", "--poll_s=0.01").returncode == 0
    assert launch(env, "setup", *WHERE, commit).returncode == 0
    assert launch(env, "run", *WHERE, "--accelerator=v4-32", "--run=indonli", "--", *JOB).returncode == 0
    proc = launch(env, "watch", *where, "--spot", commit, "--run=indonli", "--poll_s=0.01", "--", *JOB)
    assert proc.returncode == 0, proc.stderr
    assert "indonli: done on all 4 workers" in proc.stdout
    lost = "SUSPENDED" if queued else "PREEMPTED"
    assert f"nli: {lost}; recreating (1/20)" in proc.stdout

    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    no_capacity = [] if queued else ["create", "describe"]  # the recreate fails, the TPU is NOT_FOUND: again
    assert [label(c) for c in calls] == [
        "create", "describe", "scp", "setup", "run",  # create, setup, run
        "describe", "probe", "describe",  # watch: running, then preempted
        "delete", *no_capacity, "create", "describe", "scp", "setup", "run",  # recreated, same commit and job
        "describe", "probe", "describe", "probe"]  # running, then done
    if not queued:
        assert "nli: NOT_FOUND; recreating (2/20)" in proc.stdout
        assert "warning: gcloud compute tpus tpu-vm create nli ... failed with exit status 1; trying again" \
            in proc.stderr
        del calls[9:11]
    assert calls[0] == calls[9] and "--spot" in calls[0]
    assert calls[2] == calls[11] and calls[3] == calls[12] and calls[4] == calls[13]
    assert calls[4][-1].split("; echo $?")[0].endswith(" ".join(JOB[2:]) + " --multihost")
    assert calls[8][:5] == ["compute", "tpus", "queued-resources" if queued else "tpu-vm", "delete", "nli"]


def test_watch_stops_and_names_the_logs_when_the_job_fails(tmp_path):
    env = {**fake_gcloud(tmp_path), "FAKE_RESULT": "exit 1"}
    where = [*WHERE, "--accelerator=v4-32"]
    assert launch(env, "create", *where).returncode == 0
    assert launch(env, "run", *where, "--run=indonli", "--", *JOB).returncode == 0
    proc = launch(env, "watch", *where, "--run=indonli", "--poll_s=0.01", "--", *JOB)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: indonli failed (exit 1); see python -m launch.tpu logs --tpu=nli --zone=us-central2-b --run=indonli")
    status = launch(env, "status", *WHERE, "--run=indonli")
    assert status.returncode == 0
    assert status.stdout.splitlines() == ["nli: READY"] + [f"indonli: t1v-n-w-{w} exit 1" for w in range(4)]


def test_watch_gives_up_when_describe_keeps_failing(tmp_path):
    env = {**fake_gcloud(tmp_path), "FAKE_DESCRIBE_ERROR": "1"}
    proc = launch(env, "watch", *WHERE, "--accelerator=v4-8", "--run=r", "--poll_s=0.01", "--max_errors=2",
                  "--", "true")
    assert proc.returncode == 1
    warning = "warning: describe failed: ERROR: (gcloud) You do not currently have an active account"
    assert proc.stderr.count(warning) == 3
    assert proc.stderr.strip().splitlines()[-1] == "error: describe nli failed 3 times in a row"
