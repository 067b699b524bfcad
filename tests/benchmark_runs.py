"""Running a benchmark's command as a user would (python -m benchmarks.NAME ... --json=FILE from the
repository root) and checking what every result holds, for tests/test_benchmarks*.py."""
import datetime
import json
import subprocess
import sys

import pytest

from conftest import REPO


def run_benchmark(module: str, *args, tmp_path, json_path=None, timeout: int = 600, env=None):
    """(the finished process, its JSON result). The result is read from --json=FILE unless the
    command writes it elsewhere itself (json_path: no --json is passed)."""
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", module, *map(str, args)] + ([] if json_path else [f"--json={out}"])
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads((json_path or out).read_text())
    check_result(result, module, proc.stdout)
    return proc, result


def check_result(result: dict, module: str, stdout: str) -> None:
    """The machine described in the printout and the JSON, the command line and the date recorded."""
    assert stdout.startswith("CPU: "), stdout[:500]  # printed before any figure
    machine = result["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and isinstance(machine["isa"], list) and "thp" in machine
    assert result["command"].startswith(f"python -m {module}"), result["command"]
    assert datetime.datetime.fromisoformat(result["date"]).year >= 2025
    assert isinstance(result["ratios"], dict)


def assert_ratio(result: dict, name: str, numerator: float, denominator: float) -> None:
    """The named ratio is there, positive, and the quotient of the two sides' figures."""
    assert numerator > 0 and denominator > 0, (name, numerator, denominator)
    assert result["ratios"][name] == pytest.approx(numerator / denominator, rel=1e-6), (name, result["ratios"])
