"""Any run metric from MLflow, pivoted: rows = topology, columns = model, cells = mean ± std over seeds
(`--metric`; pass@1 itself is reported with intervals from the per-problem records: report.groups)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from apps_bench.report.cells import ReportError, find_runs
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


@dataclass
class Stat:
    mean: float
    std: float
    n: int
    seeds: tuple[str, ...]


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
            )
        )
        p = r.data.params
        classes.add((t.get("judge_profile", "?"), t.get("judge_rules") or p.get("judge.rules", "?"),
                     t.get("max_tests_per_row") or p.get("max_tests_per_row", "?")))  # fmt: skip
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


def pivot(points: list[RunPoint], metric: str = "pass_at_1") -> dict[str, dict[str, Stat]]:
    """topology -> model -> Stat over seeds (other axes must agree or be filtered; they are grouped in)."""
    groups: dict[tuple[str, str], dict[str, float]] = {}
    for p in points:
        label_t = p.topology if p.optimizer in ("none", "?") else f"{p.topology}+{p.optimizer}"
        groups.setdefault((label_t, p.model), {})[p.seed] = p.value  # one value per seed
    table: dict[str, dict[str, Stat]] = {}
    for (topo, model), by_seed in sorted(groups.items()):
        vals = list(by_seed.values())
        table.setdefault(topo, {})[model] = Stat(
            mean=statistics.fmean(vals),
            std=statistics.stdev(vals) if len(vals) > 1 else 0.0,
            n=len(vals),
            seeds=tuple(sorted(by_seed)),
        )
    return table


def render(table: dict[str, dict[str, Stat]], metric: str = "pass_at_1", runs: list[RunPoint] | None = None) -> str:
    models = sorted({m for row in table.values() for m in row})
    head = [f"{metric}: mean ± std over seeds (n seeds)"]
    w0 = max([len("topology")] + [len(t) for t in table])
    cols = [max(len(m), 22) for m in models]
    head.append("topology".ljust(w0) + "  " + "  ".join(m.ljust(w) for m, w in zip(models, cols)))
    head.append("-" * (w0 + 2 + sum(w + 2 for w in cols)))
    for topo, row in table.items():
        cells = []
        for m, w in zip(models, cols):
            s = row.get(m)
            cells.append((f"{s.mean:.3f} ± {s.std:.3f} ({s.n})" if s else "-").ljust(w))
        head.append(topo.ljust(w0) + "  " + "  ".join(cells))
    if runs is not None:
        datasets = sorted({r.dataset for r in runs})
        head.append(f"({len(runs)} cell runs; datasets: {', '.join(datasets)})")
    return "\n".join(head)


def plot(table: dict[str, dict[str, Stat]], path: str, metric: str = "pass_at_1") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = list(table)
    models = sorted({m for row in table.values() for m in row})
    width = 0.8 / max(1, len(models))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(topologies) + 2), 4.5))
    for i, m in enumerate(models):
        xs = [j + i * width for j in range(len(topologies))]
        means = [table[t][m].mean if m in table[t] else math.nan for t in topologies]
        errs = [table[t][m].std if m in table[t] else 0.0 for t in topologies]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=m)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(topologies))])
    ax.set_xticklabels(topologies, rotation=30, ha="right")
    ax.set_ylabel(f"{metric} (mean ± std over seeds)")
    ax.set_ylim(0, 1.05)
    ax.legend(title="model")
    ax.set_title("APPS pass@1 by topology x model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def as_rows(table: dict[str, dict[str, Stat]]) -> list[dict[str, Any]]:
    return [
        {"topology": t, "model": m, "mean": s.mean, "std": s.std, "n": s.n}
        for t, row in table.items()
        for m, s in row.items()
    ]
