"""What a cell ran on: Python, the installed packages it used, the project's commit, the
sandbox's containment features, the host. Written to cell.json and summary.json and logged
as MLflow tags (`prov.*`), so the report can warn when two compared cells ran on different
software (a framework upgrade can move pass@1 or token counts as much as a topology does).

Tags, not params: a resumed cell after an upgrade records the new versions (params are
immutable in MLflow and would clash).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from apps_bench.cell.cpus import cpu_share
from apps_bench.cell.frameworks import FRAMEWORKS
from apps_bench.types import JsonObject

# Packages every cell uses whatever its framework (distribution names).
CORE_PACKAGES = ("apps-bench", "openai", "httpx", "mlflow", "hydra-core", "omegaconf", "datasets", "numpy")

TAG_PREFIX = "prov."


def framework_packages(framework: str) -> list[str]:
    """Distributions of the modules the topology's framework imports (frameworks.FRAMEWORKS).

    A top-level module is named like its distribution with `_` for `-` for every framework
    there (langchain_core -> langchain-core, autogen_ext -> autogen-ext); asking
    importlib.metadata for the whole module -> distribution map instead costs ~1 s."""
    if not framework:  # re-scoring: no framework ran (and none is imported)
        return []

    modules = FRAMEWORKS.get(framework, ((), ""))[0]
    return list(dict.fromkeys(m.split(".")[0].replace("_", "-") for m in modules))


def package_versions(names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """name -> installed version ('not installed' when absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_info() -> dict[str, str]:
    """Git SHA and dirty flag of the checkout this package runs from ('' outside a checkout)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": "", "git_dirty": ""}
    return {"git_sha": sha, "git_dirty": str(bool(dirty)).lower() if sha else ""}


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("apps-bench")
    except Exception:  # noqa: BLE001 - not installed as a distribution: fall back to unknown
        return "unknown"


def collect(framework: str, sandbox_features: JsonObject | None = None) -> JsonObject:
    """The provenance of a cell run now, by this process."""
    names = [*CORE_PACKAGES, *(p for p in framework_packages(framework) if p not in CORE_PACKAGES)]
    git = git_info()
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "packages": package_versions(names),
        "git_sha": git.get("git_sha", ""),
        "git_dirty": git.get("git_dirty", ""),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count() or 0,
        "usable_cpus": (share := cpu_share()).cpus,  # what sized the solving processes and sandbox workers
        "cpus_source": share.source,  # affinity, cgroup, slurm, ray or joblib: which allocation decided
        "cpus_seen": share.seen,
        "sandbox": dict(sandbox_features) if sandbox_features is not None else None,
    }


SANDBOX_FLAGS = (
    "contained",
    "user_namespace",
    "pid_namespace",
    "net_namespace",
    "ipc_namespace",
    "uts_namespace",
    "mount_namespace",
    "readonly_root",
    "pids_cgroup",
    "uid_switch",
    "subreaper",
)


def sandbox_summary(features: JsonObject | None) -> str:
    """The containment features that change what programs may do, as one comparable string
    (e.g. `contained,pid_namespace,...,uid_switch,numpy==2.4.6,nice=0`: the judged programs' packages
    too, so the report warns when compared cells judged with other versions); a feature the workers disagree on
    shows as `<name>=mixed`."""
    if not features:
        return "unknown"
    on = [f"{k}=mixed" if features.get(k) == "mixed" else k for k in SANDBOX_FLAGS if features.get(k)]
    if not any(features.get(k) for k in ("contained", "pid_namespace", "pids_cgroup", "uid_switch")):
        on.insert(0, "rlimits_only")
    packages = features.get("packages")  # what judged programs could import (sandbox/packages.py): verdicts follow it
    if isinstance(packages, dict):
        on += [f"{name}=={version}" for name, version in sorted(packages.items())]
    elif packages is not None:
        on.append(f"packages={packages}")
    if "nice" in features:
        on.append(f"nice={features['nice']}")
    return ",".join(on)


def sandbox_tags(features: JsonObject | None) -> dict[str, str]:
    """One MLflow tag per sandbox feature (`prov.sandbox.<feature>`), plus `prov.sandbox`, the summary.

    Tags, not params: a resumed cell on another host may run under other containment."""
    if features is None:
        return {}
    tags = {f"{TAG_PREFIX}sandbox": sandbox_summary(features)}
    for k, v in features.items():
        text = v if isinstance(v, str) else json.dumps(v)
        tags[f"{TAG_PREFIX}sandbox.{k}"] = text[:5000]
    return tags


def as_tags(prov: JsonObject) -> dict[str, str]:
    """Flat MLflow tags: prov.python, prov.pkg.<name>, prov.git_sha, prov.git_dirty, prov.host, prov.sandbox[.<feature>],
    prov.server.<tools|kind|accepted>."""
    tags = {
        f"{TAG_PREFIX}python": str(prov.get("python", "")),
        f"{TAG_PREFIX}git_sha": str(prov.get("git_sha", "")),
        f"{TAG_PREFIX}git_dirty": str(prov.get("git_dirty", "")),
        f"{TAG_PREFIX}host": str(prov.get("host", "")),
        f"{TAG_PREFIX}platform": str(prov.get("platform", "")),
        f"{TAG_PREFIX}usable_cpus": str(prov.get("usable_cpus", "")),
        f"{TAG_PREFIX}cpus_source": str(prov.get("cpus_source", "")),
    }
    for name, ver in (prov.get("packages") or {}).items():
        tags[f"{TAG_PREFIX}pkg.{name}"] = str(ver)
    tags.update(sandbox_tags(prov.get("sandbox")))
    tags.update(server_tags(prov.get("server")))
    return tags


def server_tags(server: JsonObject | None) -> dict[str, str]:
    """What the server check found for the cell's tool requests (models/server_gate.py): prov.server.tools
    (called, dropped, as_text, no_call, prompt_text, not_checked), .kind, .accepted."""
    if not isinstance(server, Mapping):
        return {}
    return {
        f"{TAG_PREFIX}server.tools": str(server.get("tools", "")),
        f"{TAG_PREFIX}server.kind": str(server.get("kind", "")),
        f"{TAG_PREFIX}server.accepted": str(bool(server.get("accepted"))).lower(),
    }


def from_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The comparable provenance fields of a run's tags (prefix stripped)."""
    return {k[len(TAG_PREFIX) :]: v for k, v in tags.items() if k.startswith(TAG_PREFIX)}


def comparable(prov: JsonObject) -> dict[str, str]:
    """A provenance dict (cell.json/summary.json form) flattened like the tags, for diffs."""
    return from_tags(as_tags(prov))


# fields whose difference is reported; the host may differ in a cluster without changing results
WATCHED = ("python", "git_sha", "git_dirty", "sandbox")


def differences(provs: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Warnings, one per field that differs among the given cells (label -> flat provenance)."""
    if len(provs) < 2:
        return []
    fields = sorted({f for p in provs.values() for f in p if f in WATCHED or f.startswith("pkg.")})
    out = []
    for f in fields:
        values: dict[str, list[str]] = {}
        for label, p in provs.items():
            if f.startswith("pkg.") and f not in p:
                continue  # a framework package only the other runner uses
            values.setdefault(p.get(f, "(not recorded)"), []).append(label)
        if len(values) > 1:
            shown = "; ".join(
                f"{v}: {', '.join(sorted(ls)[:4])}{' ...' if len(ls) > 4 else ''}" for v, ls in sorted(values.items())
            )
            out.append(f"{f} differs — {shown}")
    return out
