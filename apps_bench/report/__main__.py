"""`python -m apps_bench.report`: pass@1 with 95% intervals by topology x model, paired
comparisons against a baseline, cost per problem / role / framework, a tidy export.

    python -m apps_bench.report                              # experiment `apps` in the default store
    python -m apps_bench.report --sweep <parent run id> --compare baseline=single
    python -m apps_bench.report --sweep <parent run id> --publish   # (re)write the sweep's comparison on its parent run
    python -m apps_bench.report --cells-dir outputs/cells    # local cell folders instead of MLflow
    python -m apps_bench.report --judge reference            # only verdicts of one judge profile
    python -m apps_bench.report --plots outputs/report       # pass_at_1.png, pareto.png (+ forest.png)
    python -m apps_bench.report --export problems.csv --export problems.parquet
    python -m apps_bench.report --sweep <parent run id> --table apps-paper --format latex   # APPS Table 2's layout
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from apps_bench.config.schema import compose
from apps_bench.errors import AppsBenchError
from apps_bench.report import cells as cellmod
from apps_bench.report import cost, export, groups, options, paper, plots, render, sweep_run
from apps_bench.report import table as metric_table
from apps_bench.report.sweep_run import SweepIncomplete
from apps_bench.report.table import ReportError
from apps_bench.tracking import faults, provenance
from apps_bench.tracking import mlflow as mlf

DEFAULT_FOREST = "outputs/report/forest.png"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m apps_bench.report", description=(__doc__ or "").splitlines()[0])
    src = ap.add_argument_group("where the cells come from")
    src.add_argument("--experiment", default="apps", help="MLflow experiment name (default: apps)")
    src.add_argument("--sweep", metavar="PARENT_RUN_ID", help="only the cells of this sweep (and their re-scoring runs)")
    src.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite ./outputs/mlflow.db")
    src.add_argument("--cells-dir", metavar="DIR", help="read local cell folders (e.g. outputs/cells) instead of MLflow")
    sel = ap.add_argument_group("which cells")
    sel.add_argument("--dataset", help="only cells of this dataset (e.g. apps)")
    sel.add_argument("--optimizer", help="only cells of this optimizer (e.g. none)")
    sel.add_argument("--model", help="only cells of this model (e.g. qwen)")
    sel.add_argument(
        "--config-dir", metavar="DIR", help="the --config-dir the cells ran with: its presets are names --model etc. accept"
    )
    sel.add_argument("--seeds", metavar="S,S", help="only these seeds (e.g. 0 to compare single cells)")
    sel.add_argument("--judge", metavar="PROFILE", help="only verdicts of this judge profile (profiles are never pooled)")
    sel.add_argument(
        "--include-incomplete",
        action="store_true",
        help="also count cells marked incomplete (with --sweep: show the cells there are, naming the missing ones)",
    )
    out = ap.add_argument_group("what to produce")
    out.add_argument(
        "--compare",
        metavar="baseline=TOPOLOGY|SETTING=VALUE",
        nargs="?",
        const="baseline=single",
        help="paired comparison of every topology against the baseline, per model (default baseline: single); "
        "or of every cell against the one that differs from it only in SETTING, set to VALUE "
        "(e.g. model.temperature=0)",
    )
    out.add_argument("--forest", metavar="FILE.png", help=f"forest plot of --compare (default: {DEFAULT_FOREST})")
    out.add_argument("--plot", metavar="FILE.png", help="pass@1 bars with their 95%% intervals")
    out.add_argument("--pareto", metavar="FILE.png", help="pass@1 against tokens per problem, with the Pareto front")
    out.add_argument("--plots", metavar="DIR", help="all charts into DIR: pass_at_1.png, pareto.png, forest.png")
    out.add_argument(
        "--export", metavar="FILE", action="append", default=[], help="tidy per-problem table (.csv or .parquet; repeatable)"
    )
    out.add_argument(
        "--publish",
        action="store_true",
        help="with --sweep: write the sweep's comparison on its parent run (for cells started by hand under it)",
    )
    out.add_argument(
        "--table",
        choices=paper.TABLES,
        help="only this table: apps-paper (test-case average and strict accuracy per difficulty tier, "
        "APPS Table 2's layout) or pass-at-k (pass@1..n, the seeds as n samples)",
    )
    out.add_argument(
        "--format",
        choices=paper.FORMATS,
        default="text",
        help="--table's format: text (default), csv, latex or markdown (for a paper), printed to stdout",
    )
    out.add_argument("--metric", default="pass_at_1", help="another MLflow metric: mean ± std over seeds of the cells' runs")
    ap.add_argument("--debug", action="store_true", help="a failure of the store, the disk or an interrupt: its traceback too")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    uri = None if args.cells_dir else (mlf.tracking_uri() if args.tracking_uri is None else args.tracking_uri)
    safe = "The report only reads: the cells, their records and the store are as they were."
    with faults.answered("apps-bench report", safe, uri=uri, debug=args.debug):
        return _main(args, uri)


def _main(args: argparse.Namespace, uri: str | None) -> int:
    try:
        baseline = options.check(args)  # every bad option, before any cell is read or anything printed
        if uri is not None:
            _store_exists(uri)
            if uri.startswith(("http://", "https://")):  # a server that does not answer: seconds, not minutes
                mlf.check_store(uri, compose().tracking.store)  # (a SQLite store is only read: never probed for writing)
        if args.publish:
            return _publish(args)
        if args.metric != "pass_at_1":
            return _metric_table(args)
        return _report(args, baseline)
    except SweepIncomplete as exc:  # not bad input: the sweep is not whole yet
        print(f"apps-bench report: {exc}", file=sys.stderr)
        return 1
    except AppsBenchError as exc:
        if faults.fault_of(exc, uri) is not None:  # the store or the disk: said by faults.answered, with what is safe
            raise
        print(f"apps-bench report: {exc}", file=sys.stderr)
        return 2


def _store_exists(uri: str) -> None:
    """A local store that does not exist holds nothing to report: say so, and create none."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise ReportError(
            f"nothing to report: there is no MLflow store at {uri[len('sqlite:///') :]} (no cell has logged here). "
            "Run the report where the cells ran, point --tracking-uri (or MLFLOW_TRACKING_URI) at their store, "
            "or read the cell folders with --cells-dir outputs/cells"
        )


def _report(args: argparse.Namespace, baseline: groups.Baseline | None) -> int:
    """The report: the cells chosen, then each block of it in the order it prints."""
    chosen = _chosen(args, *_found(args))
    gs = groups.group_cells(chosen)
    if baseline is not None:  # before anything is printed
        _check_baseline(baseline, gs)
    names = groups.blocks(gs)
    tier_rows = paper.rows_of(gs)
    if args.table:
        print(_paper_table(tier_rows, args.table, args.format))
        return 0
    _print_pass(gs, tier_rows, provenance_warnings=baseline is None)
    comps = _print_comparisons(gs, baseline, names) if baseline is not None else []
    costs = _print_costs(gs, names)
    _write_charts(args, gs, comps, costs)
    for path in args.export:
        n = export.write(chosen, path)
        print(f"tidy table written to {path} ({n} rows)")
    return 0


def _found(args: argparse.Namespace) -> tuple[list[cellmod.CellData], str]:
    """The cells where --cells-dir, --sweep or --experiment points, and how to name that place."""
    if args.cells_dir:
        return cellmod.from_dirs(args.cells_dir), f"cell folders under {args.cells_dir}"
    if args.sweep:
        found, missing = cellmod.sweep_cells(args.sweep, uri=args.tracking_uri)
        if missing:  # never a smaller table that looks whole
            if not args.include_incomplete:
                raise SweepIncomplete(args.sweep, missing)
            print(
                f"warning: sweep {args.sweep}: {len(missing)} member cell(s) missing from these figures:\n  "
                + "\n  ".join(missing)
            )
        return found, f"sweep {args.sweep}"
    return cellmod.from_mlflow(experiment=args.experiment, uri=args.tracking_uri), f"experiment {args.experiment!r}"


def _chosen(args: argparse.Namespace, found: list[cellmod.CellData], where: str) -> list[cellmod.CellData]:
    """The cells the selection options keep; none is a ReportError saying what was there."""
    chosen = cellmod.select(
        found,
        dataset=args.dataset,
        optimizer=args.optimizer,
        judge=args.judge,
        include_incomplete=args.include_incomplete,
        model=args.model,
        seeds=[x.strip() for x in args.seeds.split(",")] if args.seeds else None,
    )
    if not chosen:
        profiles = sorted({c.judge_profile for c in found})
        hint = "" if args.include_incomplete else " (incomplete cells are left out; --include-incomplete counts them)"
        extra = f"; judge profiles there: {', '.join(profiles)}" if args.judge and profiles else ""
        raise ReportError(f"no finished cells with per-problem records in {where}{hint}{extra}")
    return chosen


def _print_pass(gs: list[groups.Group], tier_rows: list[paper.PaperRow], *, provenance_warnings: bool) -> None:
    """pass@1, the APPS figures per tier and pass@k; without --compare, how the cells' provenance differs
    (with it, each comparison says what differs between its own cells)."""
    print(render.pass_table(gs))
    print()
    print(paper.apps_text(tier_rows, header=False, compact=True))
    print()
    print(paper.pass_at_k_text(tier_rows, header=False, compact=True))
    if provenance_warnings:
        for w in provenance.differences(
            {f"{g.label}·{g.model}{groups.shown(g.settings)}·s{c.seed}": c.provenance for g in gs for c in g.cells}
        ):
            print(render.wrap(f"warning: provenance: {w}"))


def _print_comparisons(
    gs: list[groups.Group], baseline: groups.Baseline, names: dict[tuple[str, ...], str]
) -> list[groups.Comparison]:
    """--compare's table, and per comparison what differs between its cells besides what it compares along."""
    comps = groups.compare_to_baseline(gs, baseline)
    print()
    print(render.compare_table(comps, names))
    for c in comps:
        where = f"{c.name} [block {names[c.comparability]}]"
        used = [(g, x) for g in c.pair or () for x in g.cells if x.seed in c.seeds]
        for w in provenance.differences({f"{g.label}{groups.shown(g.settings)}·s{x.seed}": x.provenance for g, x in used}):
            print(render.wrap(f"warning: {where}: provenance: {w}"))
        if c.pair is not None:
            diff = [
                d
                for d in cellmod.setting_differences(c.pair[0].cells[0], c.pair[1].cells[0])
                if not d.startswith(f"{baseline.key}: ")
            ]  # what --compare SETTING=VALUE compares along
            if diff:
                print(render.wrap(f"note: {where}: settings differ ({c.label} vs {c.baseline}): " + "; ".join(diff)))
    return comps


def _print_costs(gs: list[groups.Group], names: dict[tuple[str, ...], str]) -> list[cost.CostRow]:
    """Cost per problem, in money, per agent role and per framework."""
    costs = cost.cost_rows(gs)
    print()
    print(render.cost_table(costs, names))
    print()
    print(render.money_table(costs, names))
    roles = cost.role_rows(gs)
    print()
    print(
        render.role_table(roles, names)
        if roles
        else "cost per agent role: these cells recorded neither the role of each call nor transcripts"
    )
    print()
    print(render.framework_table(cost.framework_rows(gs, costs, roles), names))
    return costs


def _write_charts(
    args: argparse.Namespace, gs: list[groups.Group], comps: list[groups.Comparison], costs: list[cost.CostRow]
) -> None:
    charts = _chart_paths(args, compared=bool(comps))
    if "plot" in charts:
        plots.pass_plot(gs, charts["plot"])
    if "pareto" in charts:
        plots.pareto_plot(costs, charts["pareto"], gs)
    if "forest" in charts:
        if any(c.result is not None for c in comps):
            plots.forest_plot(comps, charts["forest"], gs)
        else:
            charts.pop("forest")
            print("forest plot not written: every comparison was refused")
    for name, path in charts.items():
        print(f"{name} chart written to {path}")


def _paper_table(rows: list[paper.PaperRow], table: str, fmt: str) -> str:
    if fmt != "text":
        return paper.export(rows, table, fmt).rstrip("\n")
    return paper.apps_text(rows) if table == "apps-paper" else paper.pass_at_k_text(rows)


def _check_baseline(baseline: groups.Baseline, gs: list[groups.Group]) -> None:
    """--compare's baseline names a row label the cells have, or a setting they vary and one of its values."""
    if not baseline.on_setting:
        if not any(g.label == baseline.value for g in gs):
            labels = sorted({g.label for g in gs})
            guess = options.closest(baseline.value, labels)
            hint = f"; did you mean --compare baseline={guess}?" if guess else ""
            raise ReportError(f"--compare {baseline}: no such topology among the cells{hint} ({', '.join(labels)})")
        return
    varying = sorted({k for g in gs for k, _ in g.settings})
    if baseline.key not in varying:
        guess = options.closest(baseline.key, varying)
        hint = f"; did you mean --compare {guess}={baseline.value}?" if guess else ""
        have = f"settings that vary among these cells: {', '.join(varying)}" if varying else "these cells vary in no setting"
        raise ReportError(f"--compare {baseline}: {baseline.key} is not a setting these cells differ in{hint} ({have})")
    if not any(baseline.holds(g) for g in gs):
        values = sorted({g.identity.get(baseline.key, "(unset)") for g in gs})
        raise ReportError(f"--compare {baseline}: no cell has {baseline}; its values here: {', '.join(values)}")


def _publish(args: argparse.Namespace) -> int:
    """The sweep's comparison, written on its parent run as the sweep's end writes it; exit 1
    (naming them) when member cells are missing."""
    uri = mlf.tracking_uri() if args.tracking_uri is None else args.tracking_uri
    rows = sweep_run.publish(uri, args.sweep)
    print(f"comparison of sweep {args.sweep} written on its parent run ({len(rows)} rows)")
    return 0


def _chart_paths(args: argparse.Namespace, *, compared: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    if args.plots:
        d = Path(args.plots)
        out.update(plot=str(d / "pass_at_1.png"), pareto=str(d / "pareto.png"))
        if compared:
            out["forest"] = str(d / "forest.png")
    if args.plot:
        out["plot"] = args.plot
    if args.pareto:
        out["pareto"] = args.pareto
    if compared and (args.forest or "forest" not in out):
        out["forest"] = args.forest or DEFAULT_FOREST
    for p in out.values():
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    return out


def _metric_table(args: argparse.Namespace) -> int:
    """Any other run metric: mean ± std over seeds (no per-problem data behind it, so no interval)."""
    runs = metric_table.collect(
        experiment=args.experiment,
        sweep=args.sweep,
        uri=args.tracking_uri,
        metric=args.metric,
        dataset=args.dataset,
        optimizer=args.optimizer,
        include_incomplete=args.include_incomplete,
        judge=args.judge,
    )
    table = metric_table.pivot(runs, metric=args.metric)
    print(metric_table.render(table, metric=args.metric, runs=runs))
    if args.plot:
        metric_table.plot(table, args.plot, metric=args.metric)
        print(f"chart written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
