"""How many CPUs this process may use: its affinity mask, capped by a cgroup CPU quota.

`os.cpu_count()` counts the host's cores; a process that SLURM, Ray, joblib, `taskset` or a
container gave fewer must not start one worker per host core. One helper for every pool
sized "one per core" (sandbox workers, solving processes).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (the host's count where the OS has no such call)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(root: Path, rel: str) -> list[Path]:
    """root/rel and every directory above it up to root (a quota anywhere on the way applies)."""
    parts = [p for p in rel.strip("/").split("/") if p]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _quota_v2(root: Path, rel: str) -> float | None:
    limits = []
    for d in _ancestors(root, rel):
        text = _read(d / "cpu.max")  # "<quota> <period>" or "max <period>"
        if text:
            quota, _, period = text.partition(" ")
            if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
                limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def _quota_v1(root: Path, rel: str) -> float | None:
    limits = []
    for d in _ancestors(root, rel):
        quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if quota and period and quota.lstrip("-").isdigit() and period.isdigit():
            if int(quota) > 0 and int(period) > 0:
                limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def cgroup_cpu_quota(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> float | None:
    """The CPU bandwidth quota (in CPUs, e.g. 1.5) of this process's cgroup, None when unlimited.

    Reads cgroup v2 (`cpu.max`) and v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`, under the
    `cpu` controller's mount, named `cpu` or `cpu,cpuacct`), walking up to the root."""
    text = _read(proc_cgroup)
    if not text:
        return None
    limits = []
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hid == "0" and controllers == "":
            q = _quota_v2(root, rel) if (root / "cgroup.controllers").exists() else _quota_v2(root / "unified", rel)
        elif "cpu" in controllers.split(","):
            mount = next((root / m for m in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu") if (root / m).is_dir()), None)
            q = _quota_v1(mount, rel) if mount is not None else None
        else:
            continue
        if q is not None:
            limits.append(q)
    return min(limits) if limits else None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup quota (rounded up), >= 1."""
    n = affinity_cpus()
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)
