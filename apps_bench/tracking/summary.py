"""A cell's summary (summary.json), its MLflow metrics, tags and per-problem table, from its records.

Shared by the cell's run (cell/pipeline.py) and re-scoring (rescore.py): the same records give
the same summary whichever command wrote them.
"""

from __future__ import annotations

import json
import statistics
from typing import Any, Mapping, Sequence

from apps_bench.judge import summarize
from apps_bench.judge.pass_at_1 import counted_tests
from apps_bench.report import money, tiers
from apps_bench.report.stats import METHOD_CELL, N_BOOT, bootstrap_interval
from apps_bench.types import JsonObject, ProblemRecord

# Per-problem usage counters, summed over a cell in summary.json and logged as MLflow metrics.
USAGE_TOTALS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "model_calls",
    "tool_calls",
    "failed_calls",
    "failed_attempts",
    "retries",
    "retried_prompt_tokens",
    "retried_completion_tokens",
    "cancelled_calls",
    "requests_with_tools",
    "length_stops",
)


def summarize_cell(
    records: Sequence[ProblemRecord],
    *,
    n_selected: int,
    skipped: Mapping[str, int],
    profile: str,
    stopped_early: bool,
    wall_s: float | None = None,
) -> JsonObject:
    """summary.json: the judge's pass@1 figures over judged problems, the test-case average and strict
    accuracy per tier (`stopped_early`: the judge's stop_on_first_failure, report.tiers), plus errors,
    usage, latency."""
    judged = [r for r in records if not r.error]
    errors = [r for r in records if r.error]
    items = [
        {
            "difficulty": r.difficulty,
            "passed": r.passed,
            "extracted": r.extracted,
            "results": r.verdict.results if r.verdict is not None else (),
        }
        for r in judged
    ]
    s = summarize(items, skipped=skipped, profile=profile)
    out = s.to_dict()
    out["metrics"] = s.metrics()
    out["pass_at_1_ci"] = cell_interval([bool(it["passed"]) for it in items])
    figures = tiers.apps_figures([[problem_tests(r) for r in records]], stopped_early=stopped_early)
    out["metrics"].update(tiers.metrics(figures))
    tot = {k: 0 for k in USAGE_TOTALS}
    finish: dict[str, int] = {}
    for r in records:
        u = r.usage
        for k in tot:
            tot[k] += getattr(u, k)
        for reason, n in u.finish_reasons.items():
            finish[reason] = finish.get(reason, 0) + n
    lat = [float(r.latency_s) for r in judged]
    stop: dict[str, int] = {}
    for r in records:
        stop[r.stop_reason] = stop.get(r.stop_reason, 0) + 1
    out.update(
        n_selected=n_selected,
        n_recorded=len(records),
        n_errors=len(errors),
        n_missing=max(0, n_selected - len(records)),
        complete=len(records) >= n_selected and not errors,
        error_ids=[r.id for r in errors],
        usage=tot,
        latency_s={
            "mean": statistics.fmean(lat) if lat else 0.0,
            "p50": statistics.median(lat) if lat else 0.0,
            "max": max(lat) if lat else 0.0,
        },
        stop_reasons=stop,
        finish_reasons=finish,
        wall_s=wall_s,
    )
    return out


def problem_tests(r: ProblemRecord) -> JsonObject:
    """What report.tiers reads of a record."""
    return {"key": r.key, "difficulty": r.difficulty, "passed": r.passed, "error": r.error, **counted_tests(r.verdict)}


def cell_interval(passed: list[bool]) -> JsonObject:
    """pass@1's 95% bootstrap interval over the judged problems (report.stats; fixed seed)."""
    iv = bootstrap_interval({str(i): [float(p)] for i, p in enumerate(passed)})
    return {"low": iv.low, "high": iv.high, "n": iv.n_problems, "method": METHOD_CELL.format(b=N_BOOT)}


def summary_tags(summary: Mapping[str, Any]) -> dict[str, str]:
    """What a cell's MLflow run shows besides metrics: its warnings, finish reasons and tool protocol."""
    proto = summary.get("tool_protocol") or {}
    warnings = list(summary.get("warnings") or ())
    return {
        **money.tags(summary.get("cost")),
        "warnings": " | ".join(warnings)[:5000] if warnings else "",
        "n_warnings": str(len(warnings)),
        "finish_reasons": json.dumps(summary.get("finish_reasons") or {}, sort_keys=True),
        "tool_protocol": ("api" if proto.get("requests_with_tools") else "prompt_text") if proto.get("model_calls") else "none",
    }


def metrics_of(summary: Mapping[str, Any]) -> dict[str, float]:
    m = dict(summary.get("metrics") or {})
    m.update(money.metrics(summary.get("cost")))
    ci = summary.get("pass_at_1_ci") or {}
    if ci.get("n"):
        m.update(pass_at_1_ci_low=ci["low"], pass_at_1_ci_high=ci["high"])
    m.update(
        n_selected=summary["n_selected"],
        n_recorded=summary["n_recorded"],
        n_errors=summary["n_errors"],
        complete=1.0 if summary["complete"] else 0.0,
        latency_mean_s=summary["latency_s"]["mean"],
        latency_p50_s=summary["latency_s"]["p50"],
        latency_max_s=summary["latency_s"]["max"],
    )
    for k, v in (summary.get("usage") or {}).items():
        m[k] = v
    if summary.get("wall_s") is not None:
        m["wall_s"] = summary["wall_s"]
    return {k: float(v) for k, v in m.items()}


def table_rows(records: Sequence[ProblemRecord]) -> list[JsonObject]:
    """The MLflow table of a cell's problems (problems.json): one flat row per record."""
    rows = []
    for r in records:
        u = r.usage
        rows.append(
            {
                "id": r.id,
                "split": r.split,
                "difficulty": r.difficulty,
                "passed": r.passed,
                "extracted": r.extracted,
                "error": r.error or "",
                **counted_tests(r.verdict),  # tests_kept: the verdict's n_tests (older tables call it so)
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "retried_prompt_tokens": u.retried_prompt_tokens,
                "retried_completion_tokens": u.retried_completion_tokens,
                "model_calls": u.model_calls,
                "tool_calls": u.tool_calls,
                "latency_s": r.latency_s,
                "solve_s": r.solve_s,
                "judge_s": r.judge_s,
                "tool_s": u.tool_s,
                "stop_reason": r.stop_reason,
            }
        )
    return rows
