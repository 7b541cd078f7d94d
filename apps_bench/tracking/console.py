"""What a cell prints: a progress bar while it runs, each problem's code and tests (demo,
verbose), and the summary table at the end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from apps_bench.cell.key import Cell
from apps_bench.judge.pass_at_1 import pass_table
from apps_bench.report.money import cost_line
from apps_bench.types import JsonObject, ProblemRecord


def print_problem(rec: ProblemRecord, out: TextIO | None = None) -> None:
    """A problem's extracted code and per-test results (demo / verbose)."""
    out = out or sys.stdout
    v = rec.verdict
    state = "ERROR" if rec.error else ("PASSED" if rec.passed else "FAILED")
    print(f"\n=== problem {rec.id} ({rec.difficulty or '?'}, {rec.mode}) : {state}", file=out)
    if rec.error:
        print(f"error: {rec.error}", file=out)
    prog = rec.program
    if prog:
        print("--- extracted code ---", file=out)
        print(prog.rstrip("\n"), file=out)
        print("--- end of code ---", file=out)
    else:
        print("(no program extracted from the final reply)", file=out)
    if v is None:
        return
    print(f"tests: {v.tests_passed}/{v.n_tests} passed ({v.tests_run} run)", file=out)
    for t in v.results:
        detail = f"  {t.detail}" if t.detail else ""
        print(f"  test {t.index}: {t.outcome.value} ({round(t.seconds, 4):.3f} s){detail}", file=out)


def mlflow_ui(uri: str | None) -> str:
    """How to open the MLflow UI on a store: its address for a server, `mlflow ui` for a database."""
    if not uri:
        return ""
    if uri.startswith(("http://", "https://")):
        return f"MLflow UI: {uri}"
    return f"MLflow UI: mlflow ui --backend-store-uri {uri}"


def print_summary(summary: JsonObject, cell: Cell, cell_dir: Path, run_id: str | None, uri: str | None = None) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=sys.stdout, width=max(100, Console().width))
    ci = summary.get("pass_at_1_ci") or {}
    interval = f"; pass@1 95% CI [{ci['low']:.4f}, {ci['high']:.4f}] (bootstrap over problems)" if ci.get("n") else ""
    t = pass_table(
        summary, title=escape(f"{cell.name} [{cell.key}]"), caption=f"judge profile {summary.get('profile') or '?'}{interval}"
    )
    console.print(t)
    u = summary["usage"]
    lat = summary["latency_s"]
    lines = [
        f"errors (infrastructure, not scored): {summary['n_errors']}"
        + (f"  ids: {', '.join(summary['error_ids'][:20])}" if summary["error_ids"] else ""),
        f"tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion = {u['total_tokens']}",
        f"calls: {u['model_calls']} model ({u['failed_calls']} failed after retries; {u.get('retries', 0)} retries, "
        f"{u.get('cancelled_calls', 0)} cut unanswered), {u['tool_calls']} tool; "
        f"{u.get('requests_with_tools', 0)} requests offered tools",
        "finish reasons: "
        + (", ".join(f"{k}={v}" for k, v in sorted((summary.get("finish_reasons") or {}).items())) or "-")
        + (f"  ({u['length_stops']} replies cut at model.max_tokens)" if u.get("length_stops") else ""),
        f"latency per problem: mean {lat['mean']:.2f} s, p50 {lat['p50']:.2f} s, max {lat['max']:.2f} s"
        + (f"; wall {summary['wall_s']:.2f} s" if summary.get("wall_s") is not None else ""),
        "rows skipped: " + (", ".join(f"{k}={v}" for k, v in sorted((summary.get("skipped") or {}).items())) or "0"),
        cost_line(summary.get("cost"), cell.model_label),
        f"outputs: {cell_dir}" + (f"   MLflow run: {run_id}" if run_id else ""),
        f"report: python -m apps_bench.report --cells-dir {cell_dir}",
    ]
    if run_id and uri:
        lines.append(mlflow_ui(uri))
    lines += [f"WARNING: {w}" for w in summary.get("warnings") or ()]
    for line in lines:
        print(line)
    if not summary["complete"]:
        print(
            f"INCOMPLETE: {summary['n_errors']} problem(s) with errors, {summary['n_missing']} not recorded. "
            "Rerun the same command to retry exactly those.",
        )


class Progress:
    def __init__(self, total: int, done: int, enabled: bool, label: str):
        self.passed = 0
        self.errors = 0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=label, unit="problem", file=sys.stderr, dynamic_ncols=True)

    def update(self, n: int, rec: ProblemRecord) -> None:
        self.passed += rec.passed
        self.errors += bool(rec.error)
        if self.bar is not None:
            self.bar.set_postfix(passed=self.passed, errors=self.errors, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
