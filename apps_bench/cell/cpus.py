"""How many CPUs this cell was given: the least of its affinity mask, a cgroup CPU quota, its
SLURM allocation, its Ray task's `num_cpus` and its share of a joblib sweep.

`os.cpu_count()` counts the host's cores; a process that SLURM, Ray, joblib, `taskset` or a
container gave fewer must not start one worker per host core. One helper for every pool
sized "one per core" (sandbox workers, solving processes); `cpu_share()` also says which
source decided, for the summary. Where none of these tells the truth (e.g. several cells
sharing one allocation by hand), set `processes=` and `judge.workers=` explicitly.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SHARE_ENV = "APPS_BENCH_CPU_SHARE"  # "<cpus>:<source>", set for its cells by a launcher that splits the host (joblib)


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


def slurm_cpus(env: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """CPUs of this SLURM task: SLURM_CPUS_PER_TASK, else this node's SLURM_JOB_CPUS_PER_NODE
    (e.g. `4`, `2(x3)`, `4,2`: the first node's count); None outside a SLURM job."""
    if not env.get("SLURM_JOB_ID"):
        return None
    for key in ("SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        m = re.match(r"\s*(\d+)", env.get(key, ""))
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return None


def ray_cpus() -> float | None:
    """`num_cpus` of the Ray task this process runs (None outside a Ray worker). Ray is never
    imported here: a Ray worker has imported it already."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():  # get_runtime_context() would start a local Ray
        return None
    try:
        ctx = ray.get_runtime_context()
        if getattr(ctx, "worker", None) is not None and ctx.worker.mode != getattr(ray, "WORKER_MODE", ctx.worker.mode):
            return None  # the driver: its resources are not a task's
        cpus = (ctx.get_assigned_resources() or {}).get("CPU")
    except Exception:  # noqa: BLE001 - ray imported but not initialized, or an older API
        return None
    return float(cpus) if cpus else None


def launcher_share(env: dict[str, str] | os._Environ[str] = os.environ) -> tuple[int, str] | None:
    """The share a launcher gave this cell (`APPS_BENCH_CPU_SHARE=<cpus>:<source>`), None when unset."""
    cpus, _, source = env.get(SHARE_ENV, "").partition(":")
    return (int(cpus), source or "launcher") if cpus.strip().isdigit() and int(cpus) > 0 else None


@dataclass(frozen=True)
class CpuShare:
    """The CPUs this process may use, and which source decided (`affinity`, `cgroup`, `slurm`, `ray`, `joblib`)."""

    cpus: int
    source: str
    seen: dict[str, float]  # every source that said something, with what it said

    def to_json(self) -> dict[str, object]:
        return {"cpus": self.cpus, "source": self.source, "seen": dict(self.seen)}


def cpu_share() -> CpuShare:
    """The least of every source that applies (each rounded up to whole CPUs), >= 1."""
    seen: dict[str, float] = {"affinity": float(affinity_cpus())}
    quota = cgroup_cpu_quota()
    if quota is not None:
        seen["cgroup"] = quota
    slurm = slurm_cpus()
    if slurm is not None:
        seen["slurm"] = float(slurm)
    ray = ray_cpus()
    if ray is not None:
        seen["ray"] = ray
    share = launcher_share()
    if share is not None:
        seen[share[1]] = float(share[0])
    # ties go to the most specific source (the allocation, not the mask it produced)
    order = [k for k in reversed(list(seen))]
    source = min(order, key=lambda k: max(1, math.ceil(seen[k])))
    return CpuShare(cpus=max(1, math.ceil(seen[source])), source=source, seen=seen)


def usable_cpus() -> int:
    """CPUs this process may use (cpu_share: affinity, cgroup quota, SLURM, Ray, a launcher's share), >= 1."""
    return cpu_share().cpus


def requested_processes(setting: str | int) -> int | None:
    """`processes=<setting>` -> a count of solving processes, or None for `auto`."""
    if str(setting).strip().lower() == "auto":
        return None
    try:
        total = int(setting)
    except (TypeError, ValueError):
        raise ValueError(f"processes must be 'auto' or a positive integer, got {setting!r}") from None
    if total < 1:
        raise ValueError(f"processes must be 'auto' or a positive integer, got {setting!r}")
    return total
