"""The judge: APPS comparison cascades (profiles), scoring through the sandbox, the summary."""

from apps_bench.judge.compare import compare_call, compare_stdin
from apps_bench.judge.core import PROFILES, Judge, check_profile, has_sandbox_error
from apps_bench.judge.summary import Summary, TierStats, summarize

__all__ = [
    "Judge",
    "PROFILES",
    "Summary",
    "TierStats",
    "check_profile",
    "compare_call",
    "compare_stdin",
    "has_sandbox_error",
    "summarize",
]
