"""The report's charts (matplotlib, Agg): pass@1 with intervals, a forest plot of paired
differences, and pass@1 against tokens per problem with its Pareto front."""

from __future__ import annotations

import math
from typing import Any

from apps_bench.report.cost import CostRow
from apps_bench.report.groups import Comparison, Group


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def close(fig: Any) -> None:
    _pyplot().close(fig)


def pass_plot(groups: list[Group], path: str) -> None:
    """Bars = pooled pass@1 per topology × model; error bars = the 95% cluster-bootstrap interval."""
    _save(pass_figure(groups), path)


def pass_figure(groups: list[Group]) -> Any:
    """The figure of `pass_plot` (a sweep's parent run logs it with MLflow's log_figure)."""
    plt = _pyplot()
    labels = list(dict.fromkeys(g.label for g in groups))
    models = sorted({g.model for g in groups})
    at = {(g.label, g.model): g for g in groups}
    width = 0.8 / max(1, len(models))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(labels) + 2), 4.5))
    for i, m in enumerate(models):
        xs = [j + i * width for j in range(len(labels))]
        ivs = [at[(t, m)].interval if (t, m) in at else None for t in labels]
        est = [iv.estimate if iv else math.nan for iv in ivs]
        lo = [iv.estimate - iv.low if iv else 0.0 for iv in ivs]
        hi = [iv.high - iv.estimate if iv else 0.0 for iv in ivs]
        ax.bar(xs, est, width, yerr=[lo, hi], capsize=4, label=m)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel("pass@1 (95% CI, bootstrap over problems)")
    ax.set_ylim(0, 1.05)
    ax.legend(title="model")
    ax.set_title("APPS pass@1 by topology × model")
    fig.tight_layout()
    return fig


def forest_plot(comps: list[Comparison], path: str) -> None:
    """One line per comparison: Δ pass@1 and its paired-bootstrap interval; 0 = no difference."""
    plt = _pyplot()
    done = [c for c in comps if c.result is not None]
    if not done:
        raise ValueError("no comparison to plot (every one was refused)")
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.55 * len(done)))
    for y, c in enumerate(reversed(done)):
        r = c.result
        assert r is not None
        ax.plot([r.low, r.high], [y, y], color="tab:blue", linewidth=2)
        ax.plot([r.diff], [y], "o", color="tab:blue", markersize=7)
        ax.annotate(f"p_Holm={c.p_holm:.3g}", (r.high, y), xytext=(6, -3), textcoords="offset points", fontsize=8)
    ax.axvline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(done)))
    ax.set_yticklabels([c.name for c in reversed(done)])
    lim = max(0.05, *(max(abs(c.result.low), abs(c.result.high)) for c in done if c.result))  # type: ignore[union-attr]
    ax.set_xlim(-lim * 1.15, lim * 1.6)
    ax.set_xlabel("Δ pass@1 vs baseline (95% paired bootstrap CI)")
    ax.set_title("paired differences against the baseline")
    _save(fig, path)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (fewer tokens, higher pass@1)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def pareto_plot(costs: list[CostRow], path: str) -> None:
    """pass@1 against tokens per problem, one point per topology × model; the front joined."""
    plt = _pyplot()
    rows = [c for c in costs if not math.isnan(c.tokens_per_problem) and not math.isnan(c.pass_at_1)]
    if not rows:
        raise ValueError("no cell with tokens and pass@1 to plot")
    pts = [(c.tokens_per_problem, c.pass_at_1) for c in rows]
    front = pareto_front(pts)
    fig, ax = plt.subplots(figsize=(7.0, 4.8))
    models = sorted({c.model for c in rows})
    for m in models:
        mine = [c for c in rows if c.model == m]
        ax.scatter([c.tokens_per_problem for c in mine], [c.pass_at_1 for c in mine], s=50, label=m, zorder=3)
    for c in rows:
        ax.annotate(c.label, (c.tokens_per_problem, c.pass_at_1), xytext=(5, 4), textcoords="offset points", fontsize=8)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "--", color="grey", zorder=2)
    ax.scatter([pts[i][0] for i in front], [pts[i][1] for i in front], s=170, facecolors="none", edgecolors="black",
               zorder=4, label="Pareto front")  # fmt: skip
    ax.set_xlabel("tokens per problem")
    ax.set_ylabel("pass@1")
    ax.set_ylim(min(0.0, min(p[1] for p in pts)), 1.05)
    ax.set_xlim(0, max(p[0] for p in pts) * 1.25)
    ax.legend()
    ax.set_title("pass@1 vs cost per problem")
    _save(fig, path)
