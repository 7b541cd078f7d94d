"""Where a sandbox worker's pids cgroup goes: cgroup v1's pids hierarchy, or the v2 unified one.

v1 (and hybrid hosts) mount the pids controller at /sys/fs/cgroup/pids. A v2-only host has no
per-controller directories: there the workers' cgroups are children of this process's own
cgroup, which works where the pids controller is enabled for its children (`cgroup.subtree_control`,
e.g. a systemd unit with `Delegate=yes`, or a container whose init put itself in a leaf). Where
neither is possible the limit is off, and `pids_parent()` says why: the pool warns once and the
workers report `pids_cgroup: false` with that reason, so a summary never claims a limit it lacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "apps-bench"  # the directory every worker cgroup of this package lives under


@dataclass(frozen=True)
class PidsParent:
    """The directory worker cgroups are made in (None: no pids limit, and `why`), and its hierarchy."""

    path: Path | None
    version: str  # "v1", "v2" or ""
    why: str = ""


def own_v2_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's path in the v2 hierarchy (the `0::<path>` line), None without one."""
    try:
        lines = proc_cgroup.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), None)


def pids_parent(root: Path | None = None, proc_cgroup: Path = Path("/proc/self/cgroup")) -> PidsParent:
    """Where to make worker pids cgroups on this host (only root may); `root` defaults to CGROUP_ROOT."""
    root = root or CGROUP_ROOT
    if os.geteuid() != 0:
        return PidsParent(None, "", "not root (a user namespace cannot make cgroups)")
    if (root / "pids").is_dir() and (root / "pids" / "cgroup.procs").exists():
        return PidsParent(root / "pids" / GROUP, "v1")
    if not (root / "cgroup.controllers").exists():
        return PidsParent(None, "", f"no pids controller: neither {root}/pids (cgroup v1) nor a cgroup v2 hierarchy at {root}")
    rel = own_v2_cgroup(proc_cgroup)
    if rel is None:
        return PidsParent(None, "", "this process is in no cgroup v2 group (/proc/self/cgroup has no 0:: line)")
    own = root.joinpath(*[p for p in rel.split("/") if p])
    try:
        enabled = (own / "cgroup.subtree_control").read_text(encoding="ascii").split()
        available = (own / "cgroup.controllers").read_text(encoding="ascii").split()
    except OSError as exc:
        return PidsParent(None, "", f"cannot read this process's cgroup v2 group {own}: {exc}")
    if "pids" not in enabled:
        if "pids" not in available:
            return PidsParent(None, "", f"cgroup v2: the pids controller is not available in {own}")
        return PidsParent(
            None,
            "",
            f"cgroup v2: the pids controller is not enabled for the children of {own} "
            f"(cgroup.subtree_control; delegate it, e.g. systemd Delegate=yes)",
        )
    return PidsParent(own / GROUP, "v2")


def make(parent: PidsParent, name: str, pids_max: int) -> str:
    """Create `<parent>/<name>` with `pids.max`; -> its path. Raises OSError."""
    assert parent.path is not None
    parent.path.mkdir(exist_ok=True)
    if parent.version == "v2":  # the group itself is an inner node: its children need the controller too
        control = parent.path / "cgroup.subtree_control"
        if "pids" not in control.read_text(encoding="ascii").split():
            control.write_text("+pids")
    path = parent.path / name
    path.mkdir(exist_ok=True)
    (path / "pids.max").write_text(str(pids_max))
    return str(path)


def remove_stale(parent: PidsParent) -> None:
    """Remove empty worker cgroups left by pools whose process is gone (named `<pid>-...`)."""
    if parent.path is None or not parent.path.is_dir():
        return
    for d in parent.path.iterdir():
        pid = d.name.split("-")[0]
        if d.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                d.rmdir()
            except OSError:
                pass
