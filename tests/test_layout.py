"""The house (docs/architecture.md): the top level of `apps_bench/` keeps the commands users type, the
values every room exchanges and the root of its exceptions; everything else lives in a package named for
what it does, and a file name says which module it is (no two modules share one)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "apps_bench"

# module -> why it stays directly in apps_bench/ (at most six, besides __init__ and __main__)
TOP_LEVEL: dict[str, str] = {
    "check": "`python -m apps_bench.check`",
    "optimize": "`python -m apps_bench.optimize`",
    "plan": "`python -m apps_bench.plan`",
    "rescore": "`python -m apps_bench.rescore`",
    "types": "the values every stage exchanges (layer 0)",
    "errors": "the root of the project's exceptions, which every command catches (layer 0)",
}


def top_level_modules(pkg: Path) -> set[str]:
    return {p.stem for p in pkg.glob("*.py")} - {"__init__", "__main__"}


def shared_file_names(pkg: Path) -> dict[str, list[str]]:
    """file name -> the modules that have it (a package's __init__.py and __main__.py apart)."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(pkg.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py") and "conf" not in path.relative_to(pkg).parts:
            where[path.name].append(str(path.relative_to(pkg)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_the_top_level_keeps_the_commands_the_types_and_the_errors():
    assert len(TOP_LEVEL) <= 6
    extra = sorted(top_level_modules(PKG) - set(TOP_LEVEL))
    assert not extra, f"modules directly in apps_bench/ that belong in a package (docs/architecture.md): {extra}"


def test_no_two_modules_share_a_file_name():
    shared = shared_file_names(PKG)
    assert not shared, f"file names used twice: {shared}"


def test_the_checks_see_a_stray_module_and_a_shared_name(tmp_path: Path):
    """Both checks are able to fail: a module dropped at the top, a name given to two packages' modules."""
    for rel in (
        "__init__.py",
        "__main__.py",
        "plan.py",
        "stray.py",
        "judge/__init__.py",
        "judge/core.py",
        "sandbox/__init__.py",
        "sandbox/core.py",
        "cell/__init__.py",
        "conf/x.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert top_level_modules(tmp_path) == {"plan", "stray"}
    assert shared_file_names(tmp_path) == {"core.py": ["judge/core.py", "sandbox/core.py"]}
