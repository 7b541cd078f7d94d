"""Any run metric from MLflow, pivoted: rows = topology (and the settings that tell apart cells of one
topology and model, as columns), columns = model, cells = mean ± std over seeds (`--metric`; pass@1
itself is reported with intervals from the per-problem records: report.groups). As there, only seed
replicates are pooled: runs whose identity (their params) differs in anything but the seed never
share a mean."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from apps_bench.report.cells import ReportError, find_runs, setting_columns, setting_values
from apps_bench.tracking import mlflow as mlf


@dataclass(frozen=True)
class RunPoint:
    topology: str
    model: str
    optimizer: str
    dataset: str
    seed: str
    value: float
    complete: bool
    run_id: str
    identity: tuple[tuple[str, str], ...] = ()  # the run's params but the seed: what its seed replicates share

    @property
    def label(self) -> str:
        return self.topology if self.optimizer in ("none", "?") else f"{self.topology}+{self.optimizer}"


@dataclass
class Stat:
    mean: float
    std: float
    n: int
    seeds: tuple[str, ...]


@dataclass
class Pivot:
    """Rows (topology label, then each setting's value) -> model -> Stat; `settings` names the columns
    after the topology."""

    settings: list[str]
    rows: dict[tuple[str, ...], dict[str, Stat]]


def collect(
    *,
    experiment: str = "apps",
    sweep: str | None = None,
    uri: str | None = None,
    metric: str = "pass_at_1",
    dataset: str | None = None,
    optimizer: str | None = None,
    include_incomplete: bool = False,
    judge: str | None = None,
) -> list[RunPoint]:
    """One point per cell run; runs of several judge profiles, rules versions or test caps are
    refused unless `judge` picks one profile (they are never pooled into one mean)."""
    uri = mlf.tracking_uri() if uri is None else uri
    runs = find_runs(mlf.client(uri), uri, experiment=experiment, sweep=sweep)
    points = []
    classes: set[tuple[str, str, str]] = set()
    for r in runs:
        t = r.data.tags
        if "cell_key" not in t:
            continue
        if dataset and t.get("dataset") != dataset:
            continue
        if optimizer and t.get("optimizer") != optimizer:
            continue
        if judge and t.get("judge_profile") != judge:
            continue
        complete = t.get("complete") == "true"
        if not complete and not include_incomplete:
            continue
        v = r.data.metrics.get(metric)
        if v is None:
            continue
        points.append(
            RunPoint(
                topology=t.get("topology", "?"),
                model=t.get("model", "?"),
                optimizer=t.get("optimizer", "?"),
                dataset=t.get("dataset", "?"),
                seed=t.get("seed", "?"),
                value=float(v),
                complete=complete,
                run_id=r.info.run_id,
                identity=tuple(sorted((k, v) for k, v in r.data.params.items() if k != "seed")),
            )
        )
        p = r.data.params
        classes.add(
            (
                t.get("judge_profile", "?"),
                t.get("judge_rules") or p.get("judge.rules", "?"),
                t.get("max_tests_per_row") or p.get("max_tests_per_row", "?"),
            )
        )
    if len(classes) > 1:
        shown = ", ".join(f"judge={j} rules={v} cap={c}" for j, v, c in sorted(classes))
        raise ReportError(
            f"runs of several judge profiles / rules versions / test caps ({shown}) are never pooled: pick one with "
            "--judge PROFILE (re-score cells judged under older rules: python -m apps_bench.rescore)"
        )
    if not points:
        where = f"sweep {sweep}" if sweep else f"experiment {experiment!r}"
        hint = "" if include_incomplete else " (incomplete cells are left out; --include-incomplete counts them)"
        raise ReportError(f"no finished cell runs with metric {metric!r} in {where} at {uri}{hint}")
    return points


def pivot(points: list[RunPoint], metric: str = "pass_at_1") -> Pivot:
    """(topology, settings...) -> model -> Stat over the seed replicates of each cell identity; ReportError
    when two runs of one identity and seed cannot be told apart."""
    groups: dict[tuple[str, str, tuple[tuple[str, str], ...]], dict[str, RunPoint]] = {}
    for p in points:
        by_seed = groups.setdefault((p.label, p.model, p.identity), {})
        if p.seed in by_seed:
            raise ReportError(
                f"cannot tell apart two runs of {p.label} · {p.model} s{p.seed} (runs {by_seed[p.seed].run_id} and "
                f"{p.run_id}): their params read the same, and a mean never pools cells that differ; narrow the runs "
                "(--experiment, --sweep, --dataset, --judge) so that one of them remains"
            )
        by_seed[p.seed] = p
    idents = [dict(ident) for _, _, ident in groups]
    keys = setting_columns([((label, model), i) for (label, model, _), i in zip(groups, idents)])
    rows: dict[tuple[str, ...], dict[str, Stat]] = {}
    for ((label, model, _), by_seed), shown in sorted(
        zip(groups.items(), setting_values(idents, keys)), key=lambda x: (x[0][0][0], x[1], x[0][0][1])
    ):
        vals = [by_seed[s].value for s in sorted(by_seed)]
        rows.setdefault((label, *shown), {})[model] = Stat(
            mean=statistics.fmean(vals),
            std=statistics.stdev(vals) if len(vals) > 1 else 0.0,
            n=len(vals),
            seeds=tuple(sorted(by_seed)),
        )
    return Pivot(keys, rows)


def render(table: Pivot, metric: str = "pass_at_1", runs: list[RunPoint] | None = None) -> str:
    models = sorted({m for row in table.rows.values() for m in row})
    heads = ["topology", *table.settings]
    widths = [max([len(h)] + [len(r[i]) for r in table.rows]) for i, h in enumerate(heads)]
    head = [f"{metric}: mean ± std over seeds (n seeds)"]
    cols = [max(len(m), 22) for m in models]
    head.append("  ".join(h.ljust(w) for h, w in zip(heads, widths)) + "  " + "  ".join(m.ljust(w) for m, w in zip(models, cols)))
    head.append("-" * (sum(w + 2 for w in widths) + sum(w + 2 for w in cols)))
    for key, row in table.rows.items():
        cells = []
        for m, w in zip(models, cols):
            s = row.get(m)
            cells.append((f"{s.mean:.3f} ± {s.std:.3f} ({s.n})" if s else "-").ljust(w))
        head.append("  ".join(k.ljust(w) for k, w in zip(key, widths)) + "  " + "  ".join(cells))
    if runs is not None:
        datasets = sorted({r.dataset for r in runs})
        head.append(f"({len(runs)} cell runs; datasets: {', '.join(datasets)})")
    return "\n".join(x.rstrip() for x in head)


def plot(table: Pivot, path: str, metric: str = "pass_at_1") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(table.rows)
    names = [" · ".join([r[0], *(f"{k} {v}" for k, v in zip(table.settings, r[1:]))]) for r in rows]
    models = sorted({m for row in table.rows.values() for m in row})
    width = 0.8 / max(1, len(models))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows) + 2), 4.5))
    for i, m in enumerate(models):
        xs = [j + i * width for j in range(len(rows))]
        means = [table.rows[r][m].mean if m in table.rows[r] else math.nan for r in rows]
        errs = [table.rows[r][m].std if m in table.rows[r] else 0.0 for r in rows]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=m)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel(f"{metric} (mean ± std over seeds)")
    ax.legend(title="model")
    ax.set_title(f"APPS {metric} by topology x model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
