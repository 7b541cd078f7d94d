"""One root for the project's exceptions (apps_bench/errors.py): every exception class defined in the package
derives from `AppsBenchError`, so the commands catch the root, not a list of names that a new class forgets."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types

import pytest

import apps_bench
from apps_bench.errors import AppsBenchError

# Exceptions of the package that stay outside the root, each with why.
OUTSIDE: dict[str, str] = {
    "apps_bench.tracking.faults.SweepStopped": "a SystemExit on purpose: it must pass every `except Exception` on its way out of Hydra",
    "apps_bench.sandbox.harness.NotPlainData": "runs inside the sandboxed program's process, which imports the standard library only",
}


def package_modules() -> list[types.ModuleType]:
    """Every module of apps_bench, imported (their exception classes are what a caller can meet)."""
    return [importlib.import_module(m.name) for m in pkgutil.walk_packages(apps_bench.__path__, "apps_bench.")]


def exceptions_outside_the_root(modules: list[types.ModuleType]) -> list[str]:
    """The exception classes defined in these modules that do not derive from the root (OUTSIDE apart)."""
    found = set()
    for module in modules:
        for obj in vars(module).values():
            if not (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__):
                continue
            name = f"{obj.__module__}.{obj.__qualname__}"
            if not issubclass(obj, AppsBenchError) and name not in OUTSIDE:
                found.add(name)
    return sorted(found)


def test_every_exception_of_the_package_derives_from_the_root():
    modules = package_modules()
    assert len(modules) > 100  # the walk saw the package, not an empty folder
    assert not exceptions_outside_the_root(modules), "derive these from apps_bench.errors.AppsBenchError (keep their other bases)"


def test_the_outside_list_names_real_classes():
    """An entry whose class is gone (or now derives from the root) is removed with it."""
    for name in OUTSIDE:
        module, _, cls = name.rpartition(".")
        obj = getattr(importlib.import_module(module), cls)
        assert not issubclass(obj, AppsBenchError), f"{name} derives from the root now: remove it from OUTSIDE"


def test_the_walk_finds_a_class_that_forgets_the_root(monkeypatch: pytest.MonkeyPatch):
    module = types.ModuleType("apps_bench.forgetful")
    exec(
        "class Forgot(ValueError):\n    pass\n\nclass Remembered(ValueError, Root):\n    pass\n",
        {"Root": AppsBenchError, "__name__": module.__name__},
        vars(module),
    )
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert exceptions_outside_the_root([module]) == ["apps_bench.forgetful.Forgot"]


def test_standard_bases_are_kept():
    """Callers that catch ValueError, OSError & co. still catch the project's subclasses of them."""
    from apps_bench.config.schema import ConfFileError
    from apps_bench.data.apps import DatasetUnavailableError
    from apps_bench.models.clients import MissingFrameworkError
    from apps_bench.optimizers.protocol import EvalKeyError

    assert issubclass(ConfFileError, ValueError) and issubclass(DatasetUnavailableError, OSError)
    assert issubclass(MissingFrameworkError, ImportError) and issubclass(EvalKeyError, PermissionError)
