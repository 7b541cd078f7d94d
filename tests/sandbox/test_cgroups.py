"""The workers' pids cgroup on cgroup v1 and v2 hosts (apps_bench/sandbox/cgroups.py): where it
goes, and that a host without one says so in the sandbox features instead of dropping it silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps_bench.sandbox import cgroups

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]


def _v2_tree(tmp: Path, *, available: str, enabled: str) -> tuple[Path, Path]:
    """A cgroup v2 layout as the kernel shows it: root/cgroup.controllers, our group a/b."""
    root = tmp / "cg"
    own = root / "a" / "b"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.controllers").write_text(available + "\n")
    (own / "cgroup.subtree_control").write_text(enabled + "\n")
    (own / "cgroup.procs").write_text("")
    proc = tmp / "proc_cgroup"
    proc.write_text("0::/a/b\n")
    return root, proc


@pytest.mark.skipif(not ROOT, reason="only root makes cgroups")
def test_a_v2_only_host_puts_worker_cgroups_under_this_process_group_when_pids_is_delegated(tmp_path: Path):
    root, proc = _v2_tree(tmp_path, available="cpu pids", enabled="pids")
    p = cgroups.pids_parent(root, proc)
    assert p.version == "v2" and p.path == root / "a" / "b" / cgroups.GROUP and not p.why


@pytest.mark.skipif(not ROOT, reason="only root makes cgroups")
@pytest.mark.parametrize(
    "available,enabled,why",
    [
        ("cpu pids", "cpu", "not enabled for the children of"),
        ("cpu", "", "pids controller is not available"),
    ],
)
def test_a_v2_host_without_a_delegated_pids_controller_says_why(tmp_path: Path, available: str, enabled: str, why: str):
    root, proc = _v2_tree(tmp_path, available=available, enabled=enabled)
    p = cgroups.pids_parent(root, proc)
    assert p.path is None and why in p.why


@pytest.mark.skipif(not ROOT, reason="only root makes cgroups")
def test_no_hierarchy_at_all_says_why(tmp_path: Path):
    p = cgroups.pids_parent(tmp_path, tmp_path / "none")
    assert p.path is None and "neither" in p.why


@pytest.mark.skipif(
    not ROOT or not (cgroups.CGROUP_ROOT / "pids" / "cgroup.procs").exists(), reason="needs root and cgroup v1 pids"
)
def test_this_hosts_v1_pids_hierarchy_is_found():
    p = cgroups.pids_parent()
    assert p.version == "v1" and p.path == cgroups.CGROUP_ROOT / "pids" / cgroups.GROUP


UNIFIED = Path("/sys/fs/cgroup/unified")
PROBE = """
import json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from apps_bench.sandbox import cgroups
cgroups.CGROUP_ROOT = Path(sys.argv[1])  # as on a cgroup v2-only host: no /sys/fs/cgroup/pids
from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import SandboxPool
from apps_bench.tracking.provenance import sandbox_summary
with SandboxPool.from_config(judge_config('seed'), workers=1) as p:
    r = p.python_exec("import os; print(os.getpid())", timeout_s=10, output_chars=1000)
    print(json.dumps({"features": p.features, "summary": sandbox_summary(p.features), "ran": r.stdout.strip()}))
"""


@pytest.mark.skipif(
    not ROOT or not (UNIFIED / "cgroup.controllers").exists() or "pids" in (UNIFIED / "cgroup.controllers").read_text().split(),
    reason="needs root and a real cgroup v2 hierarchy without the pids controller",
)
def test_a_real_v2_hierarchy_without_pids_runs_programs_and_records_that_the_limit_is_off():
    out = subprocess.run([sys.executable, "-c", PROBE, str(UNIFIED)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ran"]  # the sandbox still runs programs
    f = got["features"]
    assert f["pids_cgroup"] is False and "pids controller is not available" in f["pids_cgroup_off"]
    assert "pids_cgroup" not in got["summary"].split(",")
    assert "no pids cgroup for the workers" in out.stderr  # warned, once
    assert out.stderr.count("no pids cgroup for the workers") == 1
