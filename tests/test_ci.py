"""What CI runs (.ci/run): README's install, the default suite, then the slow suite under the time
CI has left, whose spent budget skips the tests that would start too late, each listed."""
import os
import re
import subprocess
import sys

from conftest import REPO


def test_ci_runs_the_readme_install_then_both_suites():
    script = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    commands = [line.split("#")[0].strip() for line in script.splitlines() if line.startswith(("python", "NLI_JAX"))]
    assert commands == ['python -m pip install -e ".[test]"', "python -m pytest",
                        "NLI_JAX_TEST_BUDGET_S=$(( 5400 - 900 - SECONDS )) python -m pytest -m slow"], commands
    for shown in ('pip install -e ".[test]"', "python -m pytest ", "python -m pytest -m slow"):
        assert shown in readme, shown


def test_a_spent_budget_skips_the_tests_left_and_names_the_reason():
    def run(budget):
        env = {k: v for k, v in os.environ.items() if k != "NLI_JAX_TEST_BUDGET_S"}
        if budget is not None:
            env["NLI_JAX_TEST_BUDGET_S"] = budget
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=-ra", "-q",
                               "tests/test_metrics.py"], cwd=REPO, capture_output=True, text=True, env=env,
                              timeout=300).stdout
    spent = run("0.000001")
    assert re.search(r"SKIPPED \[\d+\] .*not run: the suite's time budget \(NLI_JAX_TEST_BUDGET_S=", spent), spent
    assert " passed" not in spent.splitlines()[-1]
    for budget in (None, "3600"):
        last = run(budget).splitlines()[-1]
        assert " passed" in last and "skipped" not in last, last
