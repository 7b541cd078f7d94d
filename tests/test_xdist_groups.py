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
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-p", "groups_plugin", *files], cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    return {parts[1]: parts[2] for line in out.splitlines() if (parts := line.split("\t"))[0] == "GROUP"}


def test_tests_sharing_a_module_fixture_share_a_group_per_parameter_and_xdist_reads_it(tmp_path: Path):
    from xdist.scheduler.loadgroup import LoadGroupScheduling

    groups = _groups(tmp_path, "tests/test_study_acceptance.py", "tests/report/test_report_blocks.py",
                     "tests/judge/test_judge.py")
    study = collections.Counter(g for n, g in groups.items() if n.startswith("tests/test_study_acceptance.py::"))
    assert len(study) == 2 and set(study.values()) == {8}, study  # one study per store, built once each
    blocks = {g for n, g in groups.items() if n.startswith("tests/report/test_report_blocks.py::")}
    assert len(blocks) == 1 and "-" not in blocks  # its one sweep
    judge = {n: g for n, g in groups.items() if n.startswith("tests/judge/test_judge.py::")}
    assert sum(g == "-" for g in judge.values()) >= len(judge) - 1  # only the test using its module's rows is held
    for nodeid, group in groups.items():
        if group != "-":  # xdist's own split of "<nodeid>@<group>" (a "]" after the "@" would lose the group)
            assert LoadGroupScheduling._split_scope(None, f"{nodeid}@{group}") == group, (nodeid, group)  # type: ignore[arg-type]
