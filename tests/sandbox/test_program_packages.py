"""What a judged program may import is the judge profile's declared set, not what happens to be installed.

`sortedcontainers` is installed in this venv (selenium brings it) but no profile declares it:
a program importing it fails under both profiles, also after putting site-packages on its
`sys.path` by hand; numpy (declared) works; `python_exec` gets the same environment. A declared
package missing from the machine stops a cell before anything is written (exit 2, the fix),
and a cell records the declared packages' versions in its provenance. Real sandbox, real CLI.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy
import pytest
from conftest import fresh_store, run_cli

from apps_bench.judge import Judge
from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import SandboxPool
from apps_bench.types import Problem
from apps_bench.types import TestSuite as Suite

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sortedcontainers") is None, reason="sortedcontainers is not installed here: nothing to hide"
)

SORTED = "from sortedcontainers import SortedList\ns = SortedList(map(int, input().split()))\nprint(s[0])\n"
SORTED_VIA_PATH = (
    "import sys, os\n"
    f"sys.path.insert(0, {str(Path(importlib.util.find_spec('sortedcontainers').origin).parents[1])!r})\n"
    "import importlib; importlib.invalidate_caches()\n" + SORTED
)
NUMPY = "import numpy\nprint(int(numpy.array(list(map(int, input().split()))).min()))\n"
PROBLEM = Problem(
    id="min",
    question="print the smallest number",
    tests=Suite(
        inputs=("3 1 2\n", "5 4\n"),
        outputs=("1\n", "4\n"),
        n_available=2,
        raw_inputs=("3 1 2\n", "5 4\n"),
        raw_outputs=("1\n", "4\n"),
    ),
)


@pytest.fixture(scope="module")
def judges():
    with SandboxPool.from_config(judge_config("seed"), workers=1) as pool:
        yield pool, {p: Judge.from_config(pool, judge_config(p)) for p in ("seed", "reference")}


@pytest.mark.parametrize("profile", ["seed", "reference"])
def test_an_installed_but_undeclared_package_cannot_be_imported(judges, profile):
    _, by_profile = judges
    for program in (SORTED, SORTED_VIA_PATH):
        v = by_profile[profile].score(PROBLEM, program)
        assert not v.passed and v.tests_passed == 0
    assert by_profile[profile].score(PROBLEM, NUMPY).passed  # the same problem, solved with a declared package


def test_python_exec_has_the_judges_environment(judges):
    pool, _ = judges
    r = pool.python_exec(SORTED, "3 1 2\n", timeout_s=10, output_chars=2000)
    assert r.exit_code == 1 and "No module named 'sortedcontainers'" in r.stderr and "sandbox.packages" in r.stderr
    r = pool.python_exec(NUMPY, "3 1 2\n", timeout_s=10, output_chars=2000)
    assert (r.exit_code, r.stdout) == (0, "1\n")
    assert pool.features["packages"] == {"numpy": numpy.__version__}


def test_a_declared_package_missing_from_the_machine_stops_the_cell(tmp_path: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["model=gold", "progress=false", "judge.sandbox.packages=[numpy,no_such_package_xyz]"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "no_such_package_xyz" in r.stderr and "not installed" in r.stderr and "pip" in r.stderr
    assert "judge.sandbox.packages" in r.stderr
    assert not (tmp_path / "outputs" / "cells").exists()  # refused before the cell's folder


def test_a_cell_records_the_judged_packages(tmp_path: Path, mlflow_template: Path):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    r = run_cli(["model=gold", "progress=false"], tmp_path)  # the demo cell
    assert r.returncode == 0, r.stderr
    [summary] = tmp_path.glob("outputs/cells/**/summary.json")
    s = json.loads(summary.read_text())
    assert s["provenance"]["sandbox"]["packages"] == {"numpy": numpy.__version__}
    assert json.loads((summary.parent / "cell.json").read_text())["identity"]["judge"]["sandbox"]["packages"] == ["numpy"]
