"""The Cloud TPU workflow through gcloud: create, setup, run, logs, status, watch, delete.

    python -m launch.tpu create --tpu=nli --zone=us-central2-b --accelerator=v4-32 --spot
    python -m launch.tpu setup  --tpu=nli --zone=us-central2-b
    python -m launch.tpu run    --tpu=nli --zone=us-central2-b --accelerator=v4-32 --run=indonli -- \\
        python -m finetune.main --config=configs/indonli_large.py --workdir=gs://BUCKET/indonli_large
    python -m launch.tpu logs   --tpu=nli --zone=us-central2-b --run=indonli --follow
    python -m launch.tpu status --tpu=nli --zone=us-central2-b --run=indonli
    python -m launch.tpu watch  --tpu=nli --zone=us-central2-b --accelerator=v4-32 --spot --run=indonli -- <same job>
    python -m launch.tpu delete --tpu=nli --zone=us-central2-b

On every worker the repository lives in ~/nli-jax and run NAME writes ~/nli-jax-logs/NAME.log,
NAME.pid and, when the job ends, NAME.exit (its exit status). A run is done when every worker's
NAME.exit says 0. `watch` polls; when the TPU was preempted it deletes and recreates it, sets it
up at --commit and reruns the same job, which resumes from its latest checkpoint in the gs://
workdir. --queued uses a queued resource (named like the TPU) instead of a plain TPU VM.
--dry_run prints every command instead of running it.
"""
from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REMOTE_REPO = "nli-jax"  # relative to each worker's home directory
REMOTE_LOGS = "nli-jax-logs"
# Entry points that take --multihost (jax.distributed.initialize() finds the other TPU hosts).
MULTIHOST_MODULES = {"finetune.main", "pretrain.main", "finetune.evaluate", "finetune.predict"}
# TPU VM states after which the VM must be deleted and created again; the queued resource's too.
VM_LOST = {"PREEMPTED", "TERMINATED", "NOT_FOUND"}
QUEUED_LOST = {"SUSPENDING", "SUSPENDED", "FAILED", "NOT_FOUND"}
# Exit status of a job stopped by SIGTERM (maintenance, preemption notice): rerun it.
SIGTERM_STATUS = 143
ACCELERATOR = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")
# Runtime images per generation (cloud.google.com/tpu/docs/runtimes).
DEFAULT_VERSION = {"v2": "tpu-ubuntu2204-base", "v3": "tpu-ubuntu2204-base", "v4": "tpu-ubuntu2204-base",
                   "v5p": "v2-alpha-tpuv5", "v5litepod": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
STATUS_TAG = "nli-jax-run:"


class UsageError(Exception):
    """Bad input: printed as one line, exit status 1, before anything runs."""


class CommandFailed(Exception):
    """A gcloud (or git) command failed: fatal for one action, retried by `watch`."""


def hosts(accelerator: str) -> int:
    """Number of TPU VM hosts (workers) of an accelerator type such as v4-32."""
    match = ACCELERATOR.match(accelerator or "")
    if not match:
        raise UsageError(f"--accelerator={accelerator}: expected a Cloud TPU type such as v4-8, v4-32, v5p-8, "
                         "v5litepod-8 or v6e-8")
    generation, size = match.group(1), int(match.group(2))
    if size < 1:
        raise UsageError(f"--accelerator={accelerator}: the size must be at least 1")
    # v2-v5p count TensorCores, 8 per host; v5e/v6e count chips: up to 8 on one host, else 4 per host.
    if generation in ("v5litepod", "v6e"):
        return 1 if size <= 8 else size // 4
    return max(1, size // 8)


def location(args) -> list[str]:
    return [f"--zone={args.zone}"] + ([f"--project={args.project}"] if args.project else [])


def ssh(args, command: str, worker: str = "all") -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.tpu, *location(args), f"--worker={worker}",
            f"--command={command}"]


def create_command(args) -> list[str]:
    generation = ACCELERATOR.match(args.accelerator).group(1)
    version = args.version or DEFAULT_VERSION[generation]
    spot = ["--spot"] if args.spot else []
    if args.queued:
        return ["gcloud", "compute", "tpus", "queued-resources", "create", args.tpu, *location(args),
                f"--node-id={args.tpu}", f"--accelerator-type={args.accelerator}", f"--runtime-version={version}",
                *spot]
    return ["gcloud", "compute", "tpus", "tpu-vm", "create", args.tpu, *location(args),
            f"--accelerator-type={args.accelerator}", f"--version={version}", *spot]


def describe_command(args) -> list[str]:
    if args.queued:
        return ["gcloud", "compute", "tpus", "queued-resources", "describe", args.tpu, *location(args),
                "--format=value(state.state)"]
    return ["gcloud", "compute", "tpus", "tpu-vm", "describe", args.tpu, *location(args), "--format=value(state)"]


def delete_command(args) -> list[str]:
    if args.queued:  # --force deletes the queued resource's TPU VM with it
        return ["gcloud", "compute", "tpus", "queued-resources", "delete", args.tpu, *location(args), "--force",
                "--quiet"]
    return ["gcloud", "compute", "tpus", "tpu-vm", "delete", args.tpu, *location(args), "--quiet"]


def archive_path(commit: str) -> str:
    return str(Path(tempfile.gettempdir()) / f"nli-jax-{commit[:12]}.tar.gz")


def setup_commands(args, commit: str) -> list[list[str]]:
    """The repository at `commit` installed on all workers; a git archive, so they need no access to the git host."""
    archive = archive_path(commit)
    remote_archive = Path(archive).name
    install = (f"set -e; rm -rf {REMOTE_REPO}; mkdir -p {REMOTE_REPO} {REMOTE_LOGS}; "
               f"tar -xzf {remote_archive} -C {REMOTE_REPO}; rm {remote_archive}; "
               f"echo {commit} > {REMOTE_REPO}/COMMIT; "
               f"cd {REMOTE_REPO}; python3 -m pip install -q -U pip; python3 -m pip install -q -e . 'jax[tpu]'")
    return [["git", "-C", str(REPO), "archive", "--format=tar.gz", f"--output={archive}", commit],
            ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive, f"{args.tpu}:{remote_archive}", *location(args),
             "--worker=all"],
            ssh(args, install)]


def job_with_multihost(job: list[str], accelerator: str) -> list[str]:
    is_python_module = len(job) >= 3 and job[0] in ("python", "python3") and job[1] == "-m"
    if hosts(accelerator) > 1 and is_python_module and job[2] in MULTIHOST_MODULES and "--multihost" not in job:
        return job + ["--multihost"]
    return job


def remote_run(run: str, job: list[str]) -> str:
    """Starts `job` in the background on a worker; the log collects every attempt, .exit is written when it ends."""
    log, pid, status = (f"{REMOTE_LOGS}/{run}.{suffix}" for suffix in ("log", "pid", "exit"))
    # Ubuntu TPU images have python3 only; a job written as `python -m ...` still runs.
    body = ("command -v python >/dev/null || python() { python3 \"$@\"; }; "
            f"cd {REMOTE_REPO} && {shlex.join(job)}; echo $? > \"$HOME\"/{status}")
    return (f"mkdir -p {REMOTE_LOGS}; rm -f {status}; "
            f"echo \"== $(date -u +%FT%TZ) $(hostname) commit $(cat {REMOTE_REPO}/COMMIT 2>/dev/null)\" >> {log}; "
            f"nohup bash -c {shlex.quote(body)} >> {log} 2>&1 < /dev/null & echo $! > {pid}")


def remote_status(run: str) -> str:
    """One line per worker: `nli-jax-run: HOST exit N | running | dead | absent`."""
    pid, status = f"{REMOTE_LOGS}/{run}.pid", f"{REMOTE_LOGS}/{run}.exit"
    say = f"echo \"{STATUS_TAG} $(hostname)"
    return (f"if [ -f {status} ]; then {say} exit $(cat {status})\"; "
            f"elif [ -f {pid} ] && kill -0 $(cat {pid}) 2>/dev/null; then {say} running\"; "
            f"elif [ -f {pid} ]; then {say} dead\"; else {say} absent\"; fi")


def remote_logs(run: str, lines: int, follow: bool) -> str:
    tail = f"tail -n {lines} {'-F ' if follow else ''}{REMOTE_LOGS}/{run}.log"
    return f"{tail} | sed -u \"s/^/$(hostname): /\""


def parse_status(output: str) -> list[str]:
    """Each worker's state from remote_status's output: 'running', 'dead', 'absent' or 'exit N'."""
    states = []
    for line in output.splitlines():
        if line.startswith(STATUS_TAG):
            parts = line[len(STATUS_TAG):].split()
            states.append(" ".join(parts[1:]))
    return states


def show(cmd: list[str]) -> None:
    print(shlex.join(cmd), flush=True)


def call(args, cmd: list[str]) -> None:
    if args.dry_run:
        show(cmd)
        return
    print("+", shlex.join(cmd), file=sys.stderr, flush=True)
    code = subprocess.call(cmd)
    if code:
        raise CommandFailed(f"{shlex.join(cmd[:6])} ... failed with exit status {code}")


def capture(cmd: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def tpu_state(args) -> str:
    """READY/ACTIVE/PREEMPTED/SUSPENDED/... or NOT_FOUND; UNKNOWN when gcloud itself failed (retried)."""
    code, out, err = capture(describe_command(args))
    if code == 0:
        return out.strip() or "UNKNOWN"
    if "NOT_FOUND" in err or "not found" in err.lower():
        return "NOT_FOUND"
    print(f"warning: describe failed: {err.strip().splitlines()[-1] if err.strip() else code}", file=sys.stderr)
    return "UNKNOWN"


def is_ready(args, state: str) -> bool:
    return state == ("ACTIVE" if args.queued else "READY")


def is_lost(args, state: str) -> bool:
    return state in (QUEUED_LOST if args.queued else VM_LOST)


def wait_ready(args) -> None:
    """Polls until the TPU (or queued resource) is ready; queued resources may wait long for capacity."""
    last, unknown = None, 0
    while True:
        state = tpu_state(args)
        if state != last:
            print(f"{args.tpu}: {state}", flush=True)
            last = state
        if is_ready(args, state):
            return
        unknown = unknown + 1 if state == "UNKNOWN" else 0
        if unknown > args.max_errors:
            raise SystemExit(f"error: describe {args.tpu} failed {unknown} times in a row")
        if state in ("FAILED", "NOT_FOUND") or (not args.queued and is_lost(args, state)):
            raise CommandFailed(f"{args.tpu} is {state} instead of becoming ready")
        time.sleep(args.poll_s)


def resolve_commit(commit: str) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode:
        raise UsageError(f"--commit={commit}: not a commit of {REPO}")
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    if dirty and commit == "HEAD":
        print("warning: uncommitted changes are not copied to the workers (setup ships the commit)", file=sys.stderr)
    return proc.stdout.strip()


def cmd_create(args) -> int:
    call(args, create_command(args))
    if not args.dry_run:
        wait_ready(args)
    return 0


def cmd_setup(args) -> int:
    for cmd in setup_commands(args, args.commit):
        call(args, cmd)
    return 0


def cmd_run(args) -> int:
    call(args, ssh(args, remote_run(args.run, job_with_multihost(args.job, args.accelerator))))
    return 0


def cmd_logs(args) -> int:
    call(args, ssh(args, remote_logs(args.run, args.lines, args.follow), worker=args.worker))
    return 0


def cmd_status(args) -> int:
    if args.dry_run:
        show(describe_command(args))
        if args.run:
            show(ssh(args, remote_status(args.run)))
        return 0
    state = tpu_state(args)
    print(f"{args.tpu}: {state}")
    if args.run and is_ready(args, state):
        code, out, err = capture(ssh(args, remote_status(args.run)))
        for line in out.splitlines():
            if line.startswith(STATUS_TAG):
                print(f"{args.run}: {line[len(STATUS_TAG):].strip()}")
        if code:
            print(f"warning: ssh exited with status {code}: {err.strip()[-300:]}", file=sys.stderr)
    return 0


def cmd_delete(args) -> int:
    call(args, delete_command(args))
    return 0


def cmd_watch(args) -> int:
    """Until every worker reports exit 0: rerun after a preemption (recreate + setup) or a stopped job."""
    workers = hosts(args.accelerator)
    job = job_with_multihost(args.job, args.accelerator)
    recreates = errors = 0
    while True:
        state = tpu_state(args)
        errors = errors + 1 if state == "UNKNOWN" else 0
        if errors > args.max_errors:
            raise SystemExit(f"error: describe {args.tpu} failed {errors} times in a row")
        if is_lost(args, state):
            recreates += 1
            if recreates > args.max_recreates:
                raise SystemExit(f"error: {args.tpu} lost {recreates} times (--max_recreates={args.max_recreates})")
            print(f"{args.tpu}: {state}; recreating ({recreates}/{args.max_recreates})", flush=True)
            try:  # a failure (e.g. no spot capacity) leaves the TPU lost or absent: the next round tries again
                if state != "NOT_FOUND":
                    call(args, delete_command(args))
                call(args, create_command(args))
                wait_ready(args)
                for cmd in setup_commands(args, args.commit):
                    call(args, cmd)
                call(args, ssh(args, remote_run(args.run, job)))
            except CommandFailed as e:
                print(f"warning: {e}; trying again in {args.poll_s:g} s", file=sys.stderr, flush=True)
                time.sleep(args.poll_s)
            continue
        if not is_ready(args, state):
            time.sleep(args.poll_s)
            continue
        code, out, _ = capture(ssh(args, remote_status(args.run)))
        states = parse_status(out)
        if len(states) < workers:  # a worker did not answer: ask again later
            time.sleep(args.poll_s)
            continue
        if all(s == "exit 0" for s in states):
            print(f"{args.run}: done on all {workers} workers", flush=True)
            return 0
        failed = [s for s in states if s.startswith("exit ") and s not in ("exit 0", f"exit {SIGTERM_STATUS}")]
        if failed:
            raise SystemExit(f"error: {args.run} failed ({', '.join(sorted(set(failed)))}); see "
                             f"python -m launch.tpu logs --tpu={args.tpu} {' '.join(location(args))} --run={args.run}")
        if "running" not in states:  # stopped by SIGTERM, or the VM restarted under it: resume
            print(f"{args.run}: not running ({', '.join(sorted(set(states)))}); starting it again", flush=True)
            try:
                call(args, ssh(args, remote_run(args.run, job)))
            except CommandFailed as e:  # the next round asks the workers again
                print(f"warning: {e}", file=sys.stderr, flush=True)
        time.sleep(args.poll_s)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--tpu", help="TPU VM name (and queued resource name with --queued).")
    common.add_argument("--zone", help="TPU zone, e.g. us-central2-b.")
    common.add_argument("--project", help="GCP project (default: gcloud's).")
    common.add_argument("--queued", action="store_true", help="Use a queued resource instead of a plain TPU VM.")
    common.add_argument("--dry_run", action="store_true", help="Print the commands instead of running them.")
    accelerator = argparse.ArgumentParser(add_help=False)
    accelerator.add_argument("--accelerator", help="Accelerator type, e.g. v4-8 (one host) or v4-32 (4 hosts).")
    creation = argparse.ArgumentParser(add_help=False)
    creation.add_argument("--version", help="TPU runtime version (default: tpu-ubuntu2204-base for v2-v4).")
    creation.add_argument("--spot", action="store_true", help="Spot capacity (cheaper; may be preempted).")
    commit = argparse.ArgumentParser(add_help=False)
    commit.add_argument("--commit", default="HEAD", help="Commit of this repository to install on the workers.")
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument("--run", help="Run name: ~/nli-jax-logs/RUN.log on every worker.")
    polling = argparse.ArgumentParser(add_help=False)
    polling.add_argument("--poll_s", type=float, default=60.0, help="Seconds between polls.")
    polling.add_argument("--max_errors", type=int, default=10, help="Give up after this many failed describes in a row")

    parser = argparse.ArgumentParser(prog="python -m launch.tpu", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action")
    sub.add_parser("create", parents=[common, accelerator, creation, polling], help="Create the TPU.")
    sub.add_parser("setup", parents=[common, commit], help="Install the repository at a commit on every worker.")
    sub.add_parser("run", parents=[common, accelerator, run], help="Start JOB (after --) on every worker.")
    logs = sub.add_parser("logs", parents=[common, run], help="Tail the run's log on one or all workers.")
    logs.add_argument("--worker", default="all", help="Worker index, or all.")
    logs.add_argument("--lines", type=int, default=100, help="Lines to show from the end.")
    logs.add_argument("--follow", action="store_true", help="Keep following the log.")
    status = sub.add_parser("status", parents=[common], help="TPU state, and the run's state on every worker.")
    status.add_argument("--run", help="Run name (optional).")
    watch = sub.add_parser("watch", parents=[common, accelerator, creation, commit, run, polling],
                           help="Rerun JOB after preemptions until it is done.")
    watch.add_argument("--max_recreates", type=int, default=20, help="Give up after this many recreations.")
    sub.add_parser("delete", parents=[common], help="Delete the TPU (and its queued resource).")
    return parser


ACTIONS = {"create": cmd_create, "setup": cmd_setup, "run": cmd_run, "logs": cmd_logs, "status": cmd_status,
           "watch": cmd_watch, "delete": cmd_delete}
NEEDS = {"create": ["tpu", "zone", "accelerator"], "setup": ["tpu", "zone"],
         "run": ["tpu", "zone", "accelerator", "run"],
         "logs": ["tpu", "zone", "run"], "status": ["tpu", "zone"], "delete": ["tpu", "zone"],
         "watch": ["tpu", "zone", "accelerator", "run"]}


def check(args) -> None:
    """Every flag checked before any command runs."""
    if not args.action:
        raise UsageError(f"give an action: {', '.join(NEEDS)}")
    missing = [f"--{name}" for name in NEEDS[args.action] if not getattr(args, name, None)]
    if missing:
        raise UsageError(f"{args.action} needs {', '.join(missing)}")
    if not SAFE_NAME.match(args.tpu):
        raise UsageError(f"--tpu={args.tpu}: use letters, digits, '.', '_' and '-'")
    if getattr(args, "accelerator", None):
        hosts(args.accelerator)
    if getattr(args, "run", None) and not SAFE_NAME.match(args.run):
        raise UsageError(f"--run={args.run}: use letters, digits, '.', '_' and '-' (it names files on the workers)")
    wants_job = args.action in ("run", "watch")
    if wants_job and not args.job:
        raise UsageError(f"{args.action}: give the job after --, e.g. -- python -m finetune.main "
                         "--config=configs/indonli_large.py --workdir=gs://BUCKET/indonli_large")
    if args.job and not wants_job:
        raise UsageError(f"{args.action} takes no job after --")
    if getattr(args, "poll_s", 1) <= 0:
        raise UsageError(f"--poll_s={args.poll_s}: must be > 0")
    if getattr(args, "lines", 1) < 1:
        raise UsageError(f"--lines={args.lines}: must be >= 1")
    worker = getattr(args, "worker", "all")
    if worker != "all" and not worker.isdigit():
        raise UsageError(f"--worker={worker}: a worker index (0, 1, ...) or all")
    if not args.dry_run and shutil.which("gcloud") is None:
        raise UsageError("gcloud is not on PATH: install the Google Cloud CLI (cloud.google.com/sdk)")
    if args.action == "watch" and args.dry_run:
        raise UsageError("watch polls the TPU and cannot --dry_run; --dry_run create, setup and run to see commands")
    if getattr(args, "commit", None):
        args.commit = resolve_commit(args.commit)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    job = argv[argv.index("--") + 1:] if "--" in argv else []
    flags = argv[:argv.index("--")] if "--" in argv else argv
    args = build_parser().parse_args(flags)
    args.job = job
    try:
        check(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        return ACTIONS[args.action](args)
    except CommandFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # leaving `logs --follow` or `watch`; what runs on the workers goes on
        return 130


if __name__ == "__main__":
    sys.exit(main())
