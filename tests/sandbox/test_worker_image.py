"""What a sandbox worker holds when it forks a program: every module in it is copied on write into
each program's child, so the worker loads nothing a program or the judge does not need."""

from __future__ import annotations


def test_recording_the_package_versions_leaves_no_metadata_machinery_in_the_worker(pool):
    """The versions come from the packages' `__version__`; `importlib.metadata` (and the email, csv and
    zipfile modules it pulls in, ~10 ms of every worker's start-up) is only for a package without one."""
    assert pool.features["packages"]["numpy"].count(".") >= 1
    r = pool.python_exec(
        "import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('email', 'csv', 'zipfile') or m.startswith('importlib.metadata')))",
        timeout_s=5,
        output_chars=2000,
    )
    assert (r.status, r.stdout) == ("ok", "[]\n"), r
