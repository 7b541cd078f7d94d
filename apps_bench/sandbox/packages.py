"""What a judged program may import: the standard library and the judge profile's packages.

Programs used to run with the project's own site-packages on their path, so installing an
extra changed verdicts (selenium brought `sortedcontainers`: a program importing it passed
where it had failed), and two machines with different extras gave different pass@1 for the
same answers. The third-party packages a program may import are now a fixed set, the judge
profile's `sandbox.packages` (conf/judge/<profile>.yaml; in the cell key and the profile's
rules), checked installed when the config is read and their versions recorded by the
workers. The `python_exec` tool runs in the same workers, so an agent tests its code in the
environment that will judge it.

How: each sandbox worker, before it forks any program, imports the declared packages, drops
every other third-party module from `sys.modules` (the worker's own code included: it keeps
running from what it already holds) and puts `DeclaredOnly` at the head of `sys.meta_path`,
which is asked before any path entry, so no `sys.path` change of a program's makes another
package importable. This is about reproducible verdicts, not security: a program that removes
the hook or loads a file by path gets what the filesystem view offers; the containment around
the process is the boundary.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from types import ModuleType

# What the APPS prelude imports besides the standard library (harness.PRELUDE: `import numpy as np`).
PRELUDE_PACKAGES = ("numpy",)


def _top(name: str) -> str:
    return name.partition(".")[0]


def _always(top: str) -> bool:
    """Importable by every program: the standard library and the interpreter's built-in modules."""
    return top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "__main__"


def check_declared(names: Iterable[object]) -> tuple[str, ...]:
    """The declared packages as import names, checked: top-level module names, no standard library
    module, no repeat, the prelude's included, each installed here. ValueError names what is wrong."""
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"judge.sandbox.packages lists {name!r}: each entry is the top-level module a program "
                "imports (e.g. numpy), one per entry"
            )
        if _always(name):
            raise ValueError(
                f"judge.sandbox.packages lists {name!r}, which is part of the standard library (always "
                "importable): list only third-party packages"
            )
        if name in out:
            raise ValueError(f"judge.sandbox.packages lists {name!r} twice")
        out.append(name)
    missing_prelude = [p for p in PRELUDE_PACKAGES if p not in out]
    if missing_prelude:
        raise ValueError(
            f"judge.sandbox.packages must include {', '.join(missing_prelude)}: the APPS prelude every "
            "program runs with imports it (conf/judge/seed.yaml declares it)"
        )
    absent = [n for n in out if importlib.util.find_spec(n) is None]
    if absent:
        raise ValueError(
            f"judge.sandbox.packages declares {', '.join(absent)}, not installed for {sys.executable}: judged programs "
            f"may import it, so verdicts would differ from a machine that has it. Install it (`{sys.executable} -m pip "
            f"install {' '.join(absent)}`) or use a judge profile that does not declare it"
        )
    return tuple(out)


class DeclaredOnly:
    """A `sys.meta_path` finder that refuses every top-level module outside the standard library
    and the declared packages (their submodules follow their package)."""

    def __init__(self, packages: Iterable[str]) -> None:
        self.packages = frozenset(packages)
        # The interpreter's own library directories: a standard module sys.stdlib_module_names does
        # not list (the platform's `_sysconfigdata_*`, which `sysconfig` imports) is found there.
        lib = os.path.dirname(os.__file__)
        self.stdlib_dirs = [lib, os.path.join(lib, "lib-dynload")]

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> None:
        top = _top(fullname)
        if _always(top) or top in self.packages:
            return None  # the ordinary finders decide
        if "." not in fullname and PathFinder.find_spec(fullname, self.stdlib_dirs) is not None:
            return None
        raise ModuleNotFoundError(
            f"No module named {fullname!r} (judged programs may import the standard library and "
            f"{', '.join(sorted(self.packages))} only: the judge profile's sandbox.packages)",
            name=fullname,
        )

    def invalidate_caches(self) -> None:
        pass


def versions(packages: Iterable[str]) -> dict[str, str]:
    """Import name -> the version of the imported package (its `__version__`, else its distribution's)."""
    out: dict[str, str] = {}
    for name in packages:
        v = getattr(sys.modules.get(name), "__version__", None)
        if not isinstance(v, str):
            # Only here: importing importlib.metadata costs every worker ~10 ms of start-up.
            from importlib.metadata import PackageNotFoundError, version

            try:
                v = version(name)
            except PackageNotFoundError:
                v = "unknown"
        out[name] = v
    return out


def restrict(packages: Iterable[str]) -> list[str]:
    """In this (worker) process: import the declared packages, drop every other third-party module
    from `sys.modules`, and refuse new ones. Returns the dropped module names."""
    allowed = tuple(packages)
    for name in allowed:
        __import__(name)
    dropped = [m for m in list(sys.modules) if not (_always(_top(m)) or _top(m) in allowed)]
    for m in dropped:
        del sys.modules[m]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, DeclaredOnly)]
    sys.meta_path.insert(0, DeclaredOnly(allowed))
    importlib.invalidate_caches()
    return dropped
