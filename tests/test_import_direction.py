"""Imports point down: the rooms of `apps_bench/` in layers (docs/architecture.md, "Who may import
whom"), checked on every first-party import, the ones inside functions included (a lazy import
never fails at import time, so only a reading of the source finds one that climbs or closes a cycle).

`CLIMBS` lists the imports that still go up, each with why: the list may only shrink (an entry
whose import is gone fails too, so it is removed with the fix).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "apps_bench"

# room -> layer; a module may import its own room and any room of a lower layer. A room is a module's
# longest prefix listed here: tracking's record and trace data sit low, its MLflow runs and sweeps high;
# the report's arithmetic (pass@1's interval, money) sits at the bottom, for a cell's summary to use too.
LAYERS: dict[str, int] = {
    "types": 0,
    "errors": 0,
    "cell.cpus": 0,
    "cell.event_loop": 0,
    "cell.frameworks": 0,
    "tracking.capture": 0,
    "report.stats": 0,
    "report.money": 0,
    "report.tiers": 0,
    "sandbox.limits": 0,
    "sandbox.packages": 0,
    "config": 1,
    "data": 1,
    "task": 1,
    "tracking.cell_lock": 1,
    "tracking.records": 1,
    "tracking.mlflow_internals": 1,
    "sandbox": 2,
    "models": 2,
    "judge": 3,
    "topologies": 3,
    "tracking.summary": 3,
    "tracking.traces": 3,
    "cell.solving": 4,
    "cell.step": 4,
    "cell.solver_pool": 4,
    "tracking.provenance": 4,
    "config.validate": 4,
    "cell": 5,
    "tracking": 6,
    "cell.engine": 6,
    "models.server_gate": 6,
    "report": 7,
    "config.overrides": 7,
    "cell.pipeline": 8,
    "rescore": 8,
    "launchers": 8,
    "tracking.callbacks": 8,
    "optimizers": 9,
    "__main__": 10,
    "plan": 11,
    "check": 11,
    "optimize": 11,
    "judge.cli": 11,
    "judge.__main__": 11,
    "__init__": 12,
}

# (importing module, imported module): why it still climbs
CLIMBS: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _graph() -> dict[str, set[str]]:
    """module -> the first-party modules it imports (relative to apps_bench), anywhere in its source."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        name = name.removeprefix("apps_bench").lstrip(".")
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "apps_bench"]
            elif isinstance(node, ast.ImportFrom) and node.level:  # `from .x import y`, `from ..cpus import z`
                package = [] if mod == "__init__" else mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                module = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
                full = [".".join(p for p in (module, a.name) if p) for a in node.names]
                names = [f"apps_bench.{f if f in mods else module}" for f in full]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "apps_bench":
                names = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}".removeprefix("apps_bench.") in mods
                    else str(node.module)
                    for a in node.names
                ]
            for name in names:
                target = resolve(name)
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def _room(mod: str) -> str:
    parts = mod.split(".")
    return next(".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in LAYERS or n == 1)


def climbs(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets if LAYERS[_room(b)] > LAYERS[_room(a)]}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_every_room_has_a_layer():
    rooms = {_room(m) for m in _modules()}
    assert rooms <= set(LAYERS), f"rooms without a layer in LAYERS (and docs/architecture.md): {sorted(rooms - set(LAYERS))}"


def test_no_import_climbs_a_layer():
    new = sorted(climbs(_graph()) - set(CLIMBS))
    assert not new, "imports that climb a layer (docs/architecture.md, 'Who may import whom'):\n" + "\n".join(
        f"  apps_bench.{a} -> apps_bench.{b}" for a, b in new
    )


def test_the_known_climbs_only_shrink():
    gone = sorted(set(CLIMBS) - climbs(_graph()))
    assert not gone, f"these no longer climb: remove them from CLIMBS: {gone}"


def test_no_import_cycle():
    found = cycles(_graph())
    assert not found, "import cycles (lazy imports included): " + "; ".join(" <-> ".join(c) for c in found)


def test_the_checks_see_an_upward_import(tmp_path: Path):
    """The checks are able to fail: a lazy import of the pipeline from the judge is caught as a climb and as a cycle."""
    graph = _graph()
    graph["judge.core"].add("cell.pipeline")
    assert ("judge.core", "cell.pipeline") in climbs(graph) - set(CLIMBS)
    assert any("judge.core" in c and "cell.pipeline" in c for c in cycles(graph))


def test_relative_imports_are_read_too():
    """`from ..cell.cpus import x` and `from . import cgroups` are edges like any other (once they were skipped)."""
    graph = _graph()
    assert {"cell.cpus", "sandbox.cgroups", "sandbox.limits"} <= graph["sandbox.pool"]
    assert "sandbox.packages" in graph["sandbox.limits"]


# Our own modules that load a heavy library from outside the project when imported: an import of one of
# them stays inside the function that needs it, so the commands' --help and every other importer stay light.
HEAVY_AT_IMPORT = frozenset({"tracking.callbacks", "launchers.slurm", "optimizers.gepa_adapter"})
# Modules whose every import is start-up of a sandboxed process (sandbox/__init__: its lazy SandboxPool).
START_UP = frozenset({"sandbox", "sandbox.worker", "sandbox.harness"})
# Modules that run as `python -m` inside a package that imports its modules: the package must not import
# them when it is imported (runpy warns, and the module would run from a second copy).
RUN_AS_MAIN = frozenset({"models.gold"})
# (importer, imported) kept inside a function for a reason of its own; the list may only shrink.
LAZY: dict[tuple[str, str], str] = {
    ("config.validate", "topologies.prompts"): "re-scoring imports validate (through cell.key) and loads no topology code",
}


def lazy_own_imports(mods: dict[str, Path], lazy: dict[tuple[str, str], str] | None = None) -> list[str]:
    """First-party imports inside a function that have no reason to be there: not of a heavy module, not
    in a TYPE_CHECKING block, not guarded by `except ImportError`, not in a sandboxed process's start-up."""
    out = []
    for mod, path in mods.items():
        if mod in START_UP:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or parents.get(id(node)) is tree:
                continue
            target = ("." * node.level + (node.module or "")) if node.level else (node.module or "")
            if not (node.level or target.startswith("apps_bench")):
                continue
            chain, p = [], parents.get(id(node))
            while p is not None and p is not tree:
                chain.append(p)
                p = parents.get(id(p))
            if isinstance(chain[-1], ast.If) and "TYPE_CHECKING" in ast.unparse(chain[-1].test):
                continue
            if any(
                isinstance(c, ast.Try) and any(h.type is not None and "ImportError" in ast.unparse(h.type) for h in c.handlers)
                for c in chain
            ):
                continue
            name = target.removeprefix("apps_bench").lstrip(".")
            allowed = HEAVY_AT_IMPORT | RUN_AS_MAIN
            if (
                (mod, name) in (LAZY if lazy is None else lazy)
                or any(name == h or name.startswith(h + ".") for h in allowed)
                or any(f"{name}.{a.name}".lstrip(".") in allowed for a in node.names)
            ):
                continue
            out.append(f"apps_bench.{mod} line {node.lineno}: from {target} import ...")
    return out


def test_own_modules_are_imported_at_the_top():
    """First-party imports sit at the module top (docs/architecture.md): an import inside a function hides
    an edge from a reader and a cycle from the interpreter, and our own modules are light to import."""
    found = lazy_own_imports(_modules())
    assert not found, "imports of our own modules inside a function (move them to the top):\n  " + "\n  ".join(found)


def test_the_lazy_list_only_shrinks():
    found = lazy_own_imports(_modules(), lazy={})
    gone = [
        pair
        for pair in LAZY
        if not any(f"apps_bench.{pair[0]} line" in f and f"from apps_bench.{pair[1]} import" in f for f in found)
    ]
    assert not gone, f"these are imported at the top now: remove them from LAZY: {gone}"


def test_no_package_imports_a_module_that_runs_as_main():
    """`python -m apps_bench.models.gold` (and the rest of RUN_AS_MAIN) runs without runpy's warning."""
    import subprocess
    import sys

    for mod in RUN_AS_MAIN:
        package = f"apps_bench.{mod}".rpartition(".")[0]
        code = f"import sys, {package}; assert 'apps_bench.{mod}' not in sys.modules"
        assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"{package} imports apps_bench.{mod}"


def test_the_top_import_check_sees_a_lazy_import(tmp_path: Path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from apps_bench.config.schema import compose\n    return compose\n")
    assert lazy_own_imports({"x.m": src}) == ["apps_bench.x.m line 2: from apps_bench.config.schema import ..."]
