"""What CI runs (.ci/run): README's install, then the default and slow suites as one session under the
time CI has left, whose spent budget skips the tests that would start too late, each listed."""
import os
import re
import subprocess
import sys

from conftest import REPO


def test_ci_runs_the_readme_install_then_both_suites_in_one_session():
    script = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    commands = [line.split("#")[0].strip() for line in script.splitlines() if line.startswith(("python", "NLI_JAX"))]
    assert commands == ['python -m pip install -e ".[test]"',
                        'NLI_JAX_TEST_BUDGET_S=$(( 5400 - 900 - SECONDS )) python -m pytest -m "not tpu_recipes"'], commands
    for shown in ('pip install -e ".[test]"', "python -m pytest ", "python -m pytest -m slow",
                  'python -m pytest -m "not tpu_recipes"'):
        assert shown in readme, shown


def test_a_spent_budget_skips_the_tests_left_and_names_the_reason():
    def run(budget, *workers):
        env = {k: v for k, v in os.environ.items() if k != "NLI_JAX_TEST_BUDGET_S"}
        if budget is not None:
            env["NLI_JAX_TEST_BUDGET_S"] = budget
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=-ra", "-q", *workers,
                               "tests/test_metrics.py"], cwd=REPO, capture_output=True, text=True, env=env,
                              timeout=300).stdout
    spent = run("0.000001")
    assert re.search(r"SKIPPED \[\d+\] .*not run: the suite's time budget \(NLI_JAX_TEST_BUDGET_S=", spent), spent
    assert " passed" not in spent.splitlines()[-1]
    count = len(_collected("tests/test_metrics.py"))
    assert f"time budget (0 s): {count} test(s) not run" in spent, spent
    for budget in (None, "3600"):
        out = run(budget)
        last = out.splitlines()[-1]
        assert " passed" in last and "skipped" not in last, last
        assert ("time budget (3600 s): 0 test(s) not run" in out) == (budget == "3600"), out
    assert re.search(r"seconds in tests by worker: main \d", out), out
    # Under xdist, as CI runs: each worker's busy seconds (one file: one unit, on one worker).
    out = run("3600", "-n", "2", "--dist", "loadscope")
    assert re.search(r"0 test\(s\) not run; seconds in tests by worker: gw[01] \d+$", out, re.M), out


def _collected(*arguments, env=None):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-n", "0",
                           *arguments], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_the_longest_units_of_work_come_first_each_in_one_piece():
    """A unit (a file, or a test class) is collected in one piece, units in decreasing order of the
    seconds tests/test_seconds.json gives their selected tests (a test not in it: 20 s if slow, 1 s
    otherwise), so a worker never starts a long unit last."""
    import json
    from conftest import TEST_SECONDS, _UNMEASURED_S
    measured = json.loads(TEST_SECONDS.read_text())
    nodeids = _collected("-m", "not tpu_recipes")
    slow = set(_collected("-m", "slow"))
    units, cost = [], {}
    for nodeid in nodeids:
        parts = nodeid.split("::")
        unit = parts[0] + (f"::{parts[1]}" if len(parts) > 2 and parts[1].startswith("Test") else "")
        if not units or units[-1] != unit:
            assert unit not in units, f"{unit} collected in two pieces"
            units.append(unit)
        typical = _UNMEASURED_S["slow" if nodeid in slow else "default"]
        cost[unit] = cost.get(unit, 0.0) + measured.get(nodeid, typical)
    assert len(units) > 60 and "tests/test_families_workflow.py::TestDebertaWorkflow" in units
    assert [cost[u] for u in units] == sorted((cost[u] for u in units), reverse=True)


def test_a_run_records_each_tests_seconds_for_the_order(tmp_path):
    table = tmp_path / "seconds.json"
    table.write_text('{"tests/test_elsewhere.py::test_kept": 12.5}\n')
    env = dict(os.environ, NLI_JAX_RECORD_TEST_SECONDS=str(table))
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", "tests/test_metrics.py"],
                   cwd=REPO, capture_output=True, text=True, env=env, timeout=300, check=True)
    import json
    recorded = json.loads(table.read_text())
    ran = [k for k in recorded if k.startswith("tests/test_metrics.py::")]
    assert sorted(ran) == sorted(_collected("tests/test_metrics.py")) and all(recorded[k] >= 0 for k in ran)
    assert recorded["tests/test_elsewhere.py::test_kept"] == 12.5  # earlier measurements kept
    # A test the budget skips is no measurement: its recorded seconds stay as they were.
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "tests/test_metrics.py"],
                   cwd=REPO, capture_output=True, text=True, env=dict(env, NLI_JAX_TEST_BUDGET_S="0.000001"),
                   timeout=300, check=True)
    assert json.loads(table.read_text()) == recorded
