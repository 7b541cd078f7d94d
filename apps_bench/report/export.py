"""One tidy table: every problem of every selected cell, one row each (for pandas or R)."""

from __future__ import annotations

from pathlib import Path

from apps_bench.report.cells import TEST_COUNTS, CellData
from apps_bench.report.table import ReportError

MEASURES = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "model_calls",
    "tool_calls",
    "latency_s",
    "solve_s",
    "judge_s",
    "tool_s",
)
COLUMNS = (
    "dataset",
    "topology",
    "model",
    "optimizer",
    "seed",
    "cell_key",
    "judge_profile",
    "judge_rules",
    "max_tests_per_row",
    "framework",
    "run_kind",
    "source",
    "problem_id",
    "split",
    "difficulty",
    "passed",
    "error",
    *TEST_COUNTS,
    *MEASURES,
)


def tidy_rows(cells: list[CellData]) -> list[dict[str, object]]:
    rows = []
    for c in cells:
        for p in c.problems:
            measured: dict[str, object] = dict(p)
            rows.append(
                {
                    "dataset": c.dataset,
                    "topology": c.topology,
                    "model": c.model,
                    "optimizer": c.optimizer,
                    "seed": int(c.seed) if c.seed.lstrip("-").isdigit() else c.seed,
                    "cell_key": c.key,
                    "judge_profile": c.judge_profile,
                    "judge_rules": c.judge_rules,
                    "max_tests_per_row": c.max_tests_per_row,
                    "framework": c.framework,
                    "run_kind": c.run_kind,
                    "source": c.source,
                    "problem_id": p["id"],
                    "split": p["split"],
                    "difficulty": p["difficulty"],
                    "passed": p["passed"],
                    "error": p["error"],
                    **{k: measured[k] for k in (*TEST_COUNTS, *MEASURES)},
                }
            )
    return rows


def write(cells: list[CellData], path: str | Path) -> int:
    """Write the table as CSV or parquet (by the file's suffix). -> rows written."""
    import pandas as pd

    path = Path(path)
    df = pd.DataFrame(tidy_rows(cells), columns=list(COLUMNS))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix in (".parquet", ".pq"):
        df.to_parquet(path, index=False)
    else:
        raise ReportError(f"--export {path}: the file must end in .csv or .parquet")
    return len(df)
