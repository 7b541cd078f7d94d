"""The judge: APPS comparison cascades (profiles), scoring through the sandbox, the summary."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from apps_bench.judge.compare import compare_call, compare_stdin
    from apps_bench.judge.core import Judge, has_sandbox_error
    from apps_bench.judge.pass_at_1 import Summary, TierStats, summarize
    from apps_bench.judge.rules import ReferenceRules, SeedRules

# Imported on first use: `python -m apps_bench.judge` imports this package before its
# command runs, and the command starts the sandbox workers first thing (they then warm
# up on the other core while the data and comparison modules are imported).
_WHERE = {
    "compare_call": "compare",
    "compare_stdin": "compare",
    "Judge": "core",
    "has_sandbox_error": "core",
    "ReferenceRules": "rules",
    "SeedRules": "rules",
    "Summary": "pass_at_1",
    "TierStats": "pass_at_1",
    "summarize": "pass_at_1",
}


def __getattr__(name: str) -> object:
    if name in _WHERE:
        return getattr(importlib.import_module(f"apps_bench.judge.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Judge",
    "ReferenceRules",
    "SeedRules",
    "Summary",
    "TierStats",
    "compare_call",
    "compare_stdin",
    "has_sandbox_error",
    "summarize",
]
