"""The `unshare` launcher in front of each contained worker: what it may print where."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import RunRequest, SandboxPool
from apps_bench.sandbox.pool import namespaces_possible


@pytest.mark.skipif(not namespaces_possible()[0], reason="needs Linux and the unshare command")
def test_a_worker_killed_before_its_launcher_leaves_nothing_on_the_callers_stderr(capfd):
    """A process-tree kill that goes deepest first (joblib's loky ending a sweep's other cell)
    SIGKILLs a worker while its `unshare` launcher lives; util-linux 2.38's unshare then fails to
    re-raise SIGKILL on itself and says so on its stderr. That line is not the caller's to read."""
    with SandboxPool.from_config(judge_config("seed"), workers=1, contain=True) as p:
        assert p.features["contained"] is True
        (w,) = p._all
        launcher = w.proc
        (worker,) = (int(k) for k in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split())
        os.kill(worker, signal.SIGKILL)
        assert launcher.wait(60) != 0  # the launcher went down with its worker, on its own
        (r,) = p.run(RunRequest("print(6 * 7)", "stdin", [""]))  # the pool replaces the worker
        assert (r.status, r.stdout) == ("ok", "42\n")
    err = capfd.readouterr().err
    assert "unshare" not in err and "sigprocmask" not in err, err


@pytest.mark.skipif(os.geteuid() != 0 or not namespaces_possible()[0], reason="needs root and the unshare command")
def test_a_launcher_that_cannot_make_the_namespaces_says_why_in_the_pools_warning():
    """As uid 1000 in a user namespace allowed no further user namespace (its own limit, not the
    host's), each worker's `unshare --user` fails: the pool falls back loudly, and what the launcher
    said is in that warning, not on a line of its own."""
    script = (
        "import logging, os\n"
        "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
        "from apps_bench.sandbox import SandboxPool, RunRequest\n"
        "from apps_bench.judge.profiles import judge_config\n"
        "with SandboxPool.from_config(judge_config('seed'), workers=1) as p:\n"
        "    (r,) = p.run(RunRequest('print(6 * 7)', 'stdin', ['']))\n"
        "    print(os.geteuid(), r.status, r.stdout.strip(), p.features['contained'])\n"
    )
    inner = (
        f"echo 1 > /proc/sys/user/max_user_namespaces && exec unshare --user --map-user=1000 --map-group=1000 "
        f'{sys.executable} -c "$0"'
    )
    out = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", inner, script], capture_output=True, text=True, timeout=120, cwd="/"
    )
    if out.returncode != 0 and "unshare failed" in out.stderr and "SANDBOX" not in out.stderr:
        pytest.skip(f"user namespaces unavailable: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1000", "ok", "42", "False"], out.stdout + out.stderr
    weak = [line for line in out.stderr.splitlines() if "SANDBOX CONTAINMENT IS WEAK" in line]
    assert len(weak) == 1 and "(unshare: unshare failed: No space left on device)" in weak[0], out.stderr
    assert not any(line.startswith("unshare:") for line in out.stderr.splitlines()), out.stderr
