"""The report's charts (matplotlib, Agg): pass@1 with intervals, a forest plot of paired
differences, and pass@1 against tokens per problem with its Pareto front. Each chart names
the comparability blocks it draws (the report's letters, spelled out under the axes), and
with several blocks each bar, point or line carries its block's letter.

Every text stays inside the figure and no two labels overlap (tests/report/test_charts.py measures
them): the footer is wrapped to the figure's width, legends sit beside the axes, and the Pareto
chart's point labels are placed where they collide with nothing (`_place_labels`). A figure is drawn
at the resolution it is saved at (`DPI`): text extents do not scale linearly with it."""

from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING, Any

from apps_bench.report.cost import CostRow
from apps_bench.report.groups import Comparison, Group, blocks, classes, shown
from apps_bench.report.stats import format_p

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox
    from numpy.typing import NDArray

DPI = 110  # the figures' resolution, also when MLflow's log_figure saves one
NOTE_PT = 7  # the blocks' footer's font size
NOTE_EM = 0.8  # a generous width of one monospace character, in ems (hinting rounds advances up at some sizes)
LABEL_PT = 8  # the Pareto chart's point labels
LABEL_PAD_PT = 2.0  # the room kept around each label and point


def _legend_beside(ax: Axes, **kw: Any) -> None:
    """The legend to the right of the axes, where no bar, point or label can be under it."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: str) -> None:
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)


def close(fig: Figure) -> None:
    _pyplot().close(fig)


def _blocks_note(fig: Figure, groups: list[Group]) -> int:
    """The blocks the chart draws, spelled out under the axes (the report's header, in small print); -> its lines."""
    import textwrap

    letters, labels = blocks(groups), classes(groups)
    width = int((fig.get_size_inches()[0] * 72 * 0.98) / (NOTE_PT * NOTE_EM))  # characters that fit the figure
    lines = [ln for cls, letter in letters.items() for ln in textwrap.wrap(f"block {letter}: {labels[cls]}", width)]
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=NOTE_PT, va="bottom", ha="left", family="monospace")
    return len(lines)


def _layout(fig: Figure, lines: int) -> None:
    """The axes laid out above the blocks' `lines` of notes."""
    height = fig.get_size_inches()[1] * 72  # points
    fig.tight_layout(rect=(0, min(0.5, (lines * (NOTE_PT + 2) + 8) / height) if lines else 0, 1, 1))


def _which(groups: list[Group]) -> str:
    letters = sorted(set(blocks(groups).values()), key=lambda x: (len(x), x))
    return f"block {letters[0]}" if len(letters) == 1 else f"blocks {', '.join(letters)}"


def pass_plot(groups: list[Group], path: str) -> None:
    """Bars = pooled pass@1 per topology × model; error bars = the 95% cluster-bootstrap interval."""
    _save(pass_figure(groups), path)


def pass_figure(groups: list[Group]) -> Figure:
    """The figure of `pass_plot` (a sweep's parent run logs it with MLflow's log_figure): one bar group
    per topology (per block and topology when there are several blocks)."""
    plt = _pyplot()
    letters = blocks(groups)
    many = len(letters) > 1
    xs_keys = list(dict.fromkeys((g.comparability, g.label + shown(g.settings)) for g in groups))
    models = sorted({g.model for g in groups})
    at = {(g.comparability, g.label + shown(g.settings), g.model): g for g in groups}
    width = 0.8 / max(1, len(models))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(xs_keys) + 3), 4.5 + 0.15 * len(letters)), dpi=DPI)
    for i, m in enumerate(models):
        xs = [j + i * width for j in range(len(xs_keys))]
        ivs = [at[(c, t, m)].interval if (c, t, m) in at else None for c, t in xs_keys]
        est = [iv.estimate if iv else math.nan for iv in ivs]
        lo = [iv.estimate - iv.low if iv else 0.0 for iv in ivs]
        hi = [iv.high - iv.estimate if iv else 0.0 for iv in ivs]
        ax.bar(xs, est, width, yerr=[lo, hi], capsize=4, label=m)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(xs_keys))])
    ax.set_xticklabels([f"{t} [{letters[c]}]" if many else t for c, t in xs_keys], rotation=30, ha="right")
    ax.set_ylabel("pass@1 (95% CI, bootstrap over problems)")
    ax.set_ylim(0, 1.05)
    _legend_beside(ax, title="model")
    ax.set_title(f"APPS pass@1 by topology × model · {_which(groups)}")
    _layout(fig, _blocks_note(fig, groups))
    return fig


def forest_plot(comps: list[Comparison], path: str, groups: list[Group]) -> None:
    """One line per comparison: Δ pass@1 and its paired-bootstrap interval; 0 = no difference."""
    plt = _pyplot()
    done = [c for c in comps if c.result is not None]
    if not done:
        raise ValueError("no comparison to plot (every one was refused)")
    letters = blocks(groups)
    fig, ax = plt.subplots(figsize=(7.5, 1.6 + 0.55 * len(done) + 0.15 * len(letters)), dpi=DPI)
    for y, c in enumerate(reversed(done)):
        r = c.result
        assert r is not None
        ax.plot([r.low, r.high], [y, y], color="tab:blue", linewidth=2)
        ax.plot([r.diff], [y], "o", color="tab:blue", markersize=7)
        ax.annotate(f"p_Holm={format_p(c.p_holm)}", (r.high, y), xytext=(6, -3), textcoords="offset points", fontsize=8)
    ax.axvline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(done)))
    ax.set_yticklabels([f"{c.name} [{letters.get(c.comparability, '?')}]" for c in reversed(done)])
    lim = max(0.05, *(max(abs(c.result.low), abs(c.result.high)) for c in done if c.result))  # type: ignore[union-attr]
    ax.set_xlim(-lim * 1.15, lim * 1.6)
    ax.set_xlabel("Δ pass@1 vs baseline (95% paired bootstrap CI)")
    ax.set_title(f"paired differences against the baseline · {_which([g for c in done for g in c.pair or ()])}")
    _layout(fig, _blocks_note(fig, [g for c in done for g in c.pair or ()]))
    _save(fig, path)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (fewer tokens, higher pass@1)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def pareto_plot(costs: list[CostRow], path: str, groups: list[Group]) -> None:
    """pass@1 against tokens per problem, one point per topology × model; the front joined."""
    plt = _pyplot()
    rows = [c for c in costs if not math.isnan(c.tokens_per_problem) and not math.isnan(c.pass_at_1)]
    if not rows:
        raise ValueError("no cell with tokens and pass@1 to plot")
    pts = [(c.tokens_per_problem, c.pass_at_1) for c in rows]
    front = pareto_front(pts)
    letters = blocks(groups)
    many = len(letters) > 1
    fig, ax = plt.subplots(figsize=(8.0, 4.8 + 0.15 * len(letters)), dpi=DPI)
    models = sorted({c.model for c in rows})
    for m in models:
        mine = [c for c in rows if c.model == m]
        ax.scatter([c.tokens_per_problem for c in mine], [c.pass_at_1 for c in mine], s=50, label=m, zorder=3)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "--", color="grey", zorder=2)
    ax.scatter(
        [pts[i][0] for i in front],
        [pts[i][1] for i in front],
        s=170,
        facecolors="none",
        edgecolors="black",
        zorder=4,
        label="Pareto front",
    )
    ax.set_xlabel("tokens per problem")
    ax.set_ylabel("pass@1")
    ax.set_ylim(min(0.0, min(p[1] for p in pts)), 1.05)
    ax.set_xlim(0, max(p[0] for p in pts) * 1.25)
    _legend_beside(ax)
    ax.set_title(f"pass@1 vs cost per problem · {_which(groups)}")
    _layout(fig, _blocks_note(fig, groups))  # first: the labels are placed in the axes as they will be drawn
    names = [c.label + shown(c.settings) + (f" [{letters.get(c.comparability, '?')}]" if many else "") for c in rows]
    _place_labels(fig, ax, [(name, x, y) for name, (x, y) in zip(names, pts)], line=[pts[i] for i in front])
    _save(fig, path)


# where a label may go, in points from its point: beside it first, then stacked further up or down
_OFFSETS = [(7, 3), (7, -3), (-7, 3), (-7, -3)] + [
    (dx, sign * (3 + 11 * k)) for k in range(1, 9) for sign in (1, -1) for dx in (7, -7)
]


def _place_labels(fig: Figure, ax: Axes, notes: list[tuple[str, float, float]], line: list[tuple[float, float]]) -> None:
    """Label each point at the first offset (`_OFFSETS`) where the label lies inside the axes and overlaps
    no label placed before it, no other point and not the drawn `line` (the front); where none is free,
    where it overlaps least. A label moved away from its point is joined to it by a thin line. Extents
    come from the renderer, after the layout, at the resolution the figure is saved at."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas (_pyplot) has one; the base class declares none
    pad = LABEL_PAD_PT * fig.dpi / 72
    marker = 7.0 * fig.dpi / 72  # half the Pareto ring's width
    at = ax.transData.transform([(x, y) for _, x, y in notes])
    dots = [Bbox.from_extents(px - marker, py - marker, px + marker, py + marker) for px, py in at]
    area = ax.bbox
    taken: list[Bbox] = []
    path: NDArray[np.float64] | list[tuple[float, float]] = ax.transData.transform(line) if len(line) > 1 else []
    for (x0, y0), (x1, y1) in zip(path[:-1], path[1:]):  # the line as small boxes, one every 3 pixels
        steps = max(1, int(math.hypot(x1 - x0, y1 - y0) / 3))
        taken += [
            Bbox.from_extents(x - 1, y - 1, x + 1, y + 1)
            for x, y in ((x0 + (x1 - x0) * k / steps, y0 + (y1 - y0) * k / steps) for k in range(steps + 1))
        ]

    def clash(a: Bbox, b: Bbox) -> float:
        w = min(a.x1, b.x1) - max(a.x0, b.x0)
        h = min(a.y1, b.y1) - max(a.y0, b.y0)
        return w * h if w > 0 and h > 0 else 0.0

    for i, (text, x, y) in enumerate(notes):
        best: tuple[float, tuple[int, int]] | None = None
        for dx, dy in _OFFSETS:
            probe = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=LABEL_PT,
                ha="left" if dx > 0 else "right",
                va="bottom" if dy > 0 else "top",
            )
            probe.update_positions(renderer)
            box = Text.get_window_extent(probe, renderer).padded(pad)  # the text alone, not the line to its point
            probe.remove()
            outside = box.width * box.height - clash(box, area)
            cost = outside * 10 + sum(clash(box, o) for o in taken) + sum(clash(box, d) for j, d in enumerate(dots) if j != i)
            if best is None or cost < best[0]:
                best = (cost, (dx, dy))
            if cost == 0:
                break
        assert best is not None
        dx, dy = best[1]
        far = abs(dy) > 3
        ann = ax.annotate(
            text,
            (x, y),
            xytext=(dx, dy),
            textcoords="offset points",
            fontsize=LABEL_PT,
            ha="left" if dx > 0 else "right",
            va="bottom" if dy > 0 else "top",
            arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.6, "shrinkA": 0, "shrinkB": 5} if far else None,
        )
        ann.set_in_layout(False)
        ann.update_positions(renderer)
        taken.append(Text.get_window_extent(ann, renderer).padded(pad))
