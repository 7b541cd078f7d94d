"""The worker groups of `pytest -n N --dist loadgroup` (conftest.xdist_group_of), as xdist reads them."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PLUGIN = """
import conftest

def pytest_collection_finish(session):
    for item in session.items:
        print("GROUP", item.nodeid, conftest.xdist_group_of(item) or "-", sep="\\t")
"""


def _groups(tmp_path: Path, *files: str) -> dict[str, str]:
    (tmp_path / "groups_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "groups_plugin", *files],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {parts[1]: parts[2] for line in out.splitlines() if (parts := line.split("\t"))[0] == "GROUP"}


def test_tests_sharing_a_module_fixture_share_a_group_per_parameter_and_xdist_reads_it(tmp_path: Path):
    from xdist.scheduler.loadgroup import LoadGroupScheduling

    groups = _groups(
        tmp_path, "tests/test_study_acceptance.py", "tests/report/test_report_blocks.py", "tests/judge/test_judge.py"
    )
    study = collections.Counter(g for n, g in groups.items() if n.startswith("tests/test_study_acceptance.py::"))
    stores = {g: n for g, n in study.items() if ":study=" in g}
    assert stores == {"tests/test_study_acceptance.py:study=sqlite": 8, "tests/test_study_acceptance.py:study=server": 8}, study
    sweeps = {g: n for g, n in study.items() if ":setting_study=" in g}  # one study per store, one per setting sweep
    assert len(sweeps) == 4 and set(sweeps.values()) == {5}, study
    blocks = {g for n, g in groups.items() if n.startswith("tests/report/test_report_blocks.py::")}
    assert len(blocks) == 1 and "-" not in blocks  # its one sweep
    judge = {n: g for n, g in groups.items() if n.startswith("tests/judge/test_judge.py::")}
    assert sum(g == "-" for g in judge.values()) >= len(judge) - 1  # only the test using its module's rows is held
    for nodeid, group in groups.items():
        if group != "-":  # xdist's own split of "<nodeid>@<group>" (a "]" after the "@" would lose the group)
            assert LoadGroupScheduling._split_scope(None, f"{nodeid}@{group}") == group, (nodeid, group)  # type: ignore[arg-type]


GROUPED_MODULE = """
import os
import pytest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with open(os.environ["BUILT_LOG"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")


@pytest.mark.parametrize("i", range(4))
def test_uses_the_module_fixture(built, i):
    pass


@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    pass
"""

HOOK_CONFTEST = """
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("suite_conftest", {conftest!r})
suite = sys.modules["suite_conftest"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
"""


def test_under_two_workers_a_module_fixture_is_built_once(tmp_path: Path):
    """The suite's own hook, run by pytest-xdist itself: without the groups, both workers start on a test of
    the module and each builds its fixture (pytest 9.2 with xdist 3.8 does that: pyproject.toml pins < 9.2)."""
    (tmp_path / "conftest.py").write_text(HOOK_CONFTEST.format(conftest=str(REPO / "tests" / "conftest.py")))
    (tmp_path / "test_grouped.py").write_text(GROUPED_MODULE)
    log = tmp_path / "built.log"
    env = {**os.environ, "BUILT_LOG": str(log)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 passed" in run.stdout, run.stdout
    built = log.read_text().split()
    assert len(built) == 1 and built[0].startswith("gw"), built  # one build, on a worker
