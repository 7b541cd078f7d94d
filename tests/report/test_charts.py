"""The report's charts can be read: no two labels of the Pareto chart overlap, nor a label and the legend,
and no text of any chart (title, ticks, legend, labels, the blocks' footer) is cut off by the figure's edge.

A real gold sweep through the real CLI into a real SQLite store: three topologies, where
`sequential_langgraph` and `independent` solve every problem at nearly the same tokens per problem (their
labels used to print on top of each other). The report's own command draws the charts (in this process),
and each is measured as it is saved: matplotlib's renderer gives every text's extent in pixels, so the test
asserts geometry, not pixels."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env, fresh_store, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOPOLOGIES = ("single", "sequential_langgraph", "independent")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict:
    cwd = tmp_path_factory.mktemp("charts")
    db = fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    args = [
        "-m",
        f"topology={','.join(TOPOLOGIES)}",
        "seed=0",
        "dataset=apps",
        f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}",
        "limit=3",
        "progress=false",
    ]
    r = run_cli(args, cwd, env=cli_env(cwd), timeout=500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    parent = re.search(r"MLflow parent run (\w+)", r.stderr).group(1)  # type: ignore[union-attr]
    return {"cwd": cwd, "uri": f"sqlite:///{db}", "parent": parent}


def _texts(fig: Any, renderer: Any) -> list[tuple[str, Any]]:
    """(text, pixel extent) of every text the figure draws: visible, not empty, and no label of a tick
    outside the axis' limits (matplotlib keeps those, undrawn)."""
    from matplotlib.text import Text

    undrawn = set()
    for ax in fig.axes:
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = sorted((lo, hi))
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo - 1e-9 * (hi - lo) <= tick.get_loc() <= hi + 1e-9 * (hi - lo):
                    undrawn |= {id(tick.label1), id(tick.label2)}
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and id(t) not in undrawn
    ]


@pytest.fixture(scope="module")
def charts(sweep: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The report's charts, each measured at the moment the report saves it: file name -> geometry."""
    from matplotlib.figure import Figure

    from apps_bench.report.__main__ import main

    out: dict[str, dict] = {}
    save = Figure.savefig

    def measured(fig: Figure, path: Any, *a: Any, **kw: Any) -> Any:
        dpi = fig.dpi
        fig.set_dpi(kw["dpi"] if isinstance(kw.get("dpi"), (int, float)) else dpi)  # text extents change with dpi
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        ax = fig.axes[0]
        legend = ax.get_legend()
        out[Path(str(path)).name] = {
            "figure": fig.bbox.frozen(),
            "texts": _texts(fig, r),
            "labels": [(t.get_text(), t.get_window_extent(r)) for t in ax.texts if t.get_text().strip()],
            "legend": legend.get_window_extent(r) if legend is not None else None,
        }
        fig.set_dpi(dpi)
        return save(fig, path, *a, **kw)

    d = tmp_path_factory.mktemp("charts_out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", measured)
        assert (
            main(["--sweep", sweep["parent"], "--tracking-uri", sweep["uri"], "--compare", "baseline=single", "--plots", str(d)])
            == 0
        )
    assert set(out) == {"pass_at_1.png", "pareto.png", "forest.png"}
    return out


def _overlap(a: Any, b: Any) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_pareto_charts_labels_do_not_overlap(charts: dict):
    geo = charts["pareto.png"]
    labels = geo["labels"]
    assert sorted(t for t, _ in labels) == sorted(TOPOLOGIES)  # one label per point
    clashes = [(a, b) for i, (a, ea) in enumerate(labels) for b, eb in labels[i + 1 :] if _overlap(ea, eb)]
    assert not clashes, f"labels printed on top of each other: {clashes}"
    on_legend = [t for t, e in labels if geo["legend"] is not None and _overlap(e, geo["legend"])]
    assert not on_legend, f"labels under the legend: {on_legend}"


@pytest.mark.parametrize("name", ["pass_at_1.png", "pareto.png", "forest.png"])
def test_no_text_of_a_chart_is_cut_off(charts: dict, name: str):
    geo = charts[name]
    fig = geo["figure"]
    assert any(t.startswith("block A: ") for t, _ in geo["texts"])  # the footer is measured too
    outside = [
        (t[:60], tuple(round(v) for v in e.extents))
        for t, e in geo["texts"]
        if e.x0 < fig.x0 - 0.5 or e.y0 < fig.y0 - 0.5 or e.x1 > fig.x1 + 0.5 or e.y1 > fig.y1 + 0.5
    ]
    assert not outside, f"{name} is {fig.width:.0f}×{fig.height:.0f} px; text beyond its edge: {outside}"
