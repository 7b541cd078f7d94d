"""`python -m apps_bench.report`: pass@1 by topology x model, mean and spread over seeds, from MLflow.

    python -m apps_bench.report                         # experiment `apps` in the default store
    python -m apps_bench.report --experiment smoke
    python -m apps_bench.report --sweep <parent run id>  # only the cells of one sweep
    python -m apps_bench.report --plot pass_at_1.png     # also a bar chart
"""

from __future__ import annotations

import argparse
import sys

from apps_bench.report.table import ReportError, collect, pivot, plot, render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m apps_bench.report", description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="apps", help="MLflow experiment name (default: apps)")
    ap.add_argument("--sweep", metavar="PARENT_RUN_ID", help="only the child runs of this sweep's parent run")
    ap.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite ./outputs/mlflow.db")
    ap.add_argument("--metric", default="pass_at_1", help="metric to tabulate (default: pass_at_1)")
    ap.add_argument("--dataset", help="only cells of this dataset (e.g. apps)")
    ap.add_argument("--optimizer", help="only cells of this optimizer (e.g. none)")
    ap.add_argument("--include-incomplete", action="store_true", help="also count cells marked incomplete")
    ap.add_argument("--plot", metavar="FILE.png", help="write a bar chart (matplotlib)")
    args = ap.parse_args(argv)
    try:
        runs = collect(
            experiment=args.experiment,
            sweep=args.sweep,
            uri=args.tracking_uri,
            metric=args.metric,
            dataset=args.dataset,
            optimizer=args.optimizer,
            include_incomplete=args.include_incomplete,
        )
        table = pivot(runs, metric=args.metric)
    except ReportError as exc:
        print(f"apps-bench report: {exc}", file=sys.stderr)
        return 2
    print(render(table, metric=args.metric, runs=runs))
    if args.plot:
        plot(table, args.plot, metric=args.metric)
        print(f"chart written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
