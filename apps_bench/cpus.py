"""How many CPUs this process may use: what sizes the solver and sandbox processes.

A cell under SLURM, Ray or joblib is given fewer CPUs than the host has; counting host
cores there starts one process per host core. The affinity mask (what `taskset`, SLURM's
cpuset and Ray set) and a cgroup v2 CPU quota (what containers set) both bound it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 `cpu.max` quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, quota)
    return max(1, n)


def _cgroup_quota() -> int | None:
    """`cpu.max` of this process's cgroup v2 ("max 100000" = none; "150000 100000" = 2 CPUs, rounded up)."""
    try:
        line = Path("/proc/self/cgroup").read_text().strip().splitlines()
        rel = next(entry.split(":", 2)[2] for entry in line if entry.startswith("0::"))
        quota, period = (CGROUP_ROOT / rel.lstrip("/") / "cpu.max").read_text().split()
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))
