"""The `unshare` launcher in front of each contained worker: what it may print where."""

from __future__ import annotations

import os
import signal
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
