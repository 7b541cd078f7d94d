"""The report's bad options are answered before any work (issue 25): exit 2, what was wrong with
the fix ("did you mean" where a name is involved), nothing printed on stdout, nothing written, and
no cell read: the folder has no MLflow store at all, so an option error that came after reading
would say "nothing to report" instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli


def _report(tmp_path: Path, *args: str):
    r = run_cli(list(args), tmp_path, module="apps_bench.report", timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert r.stdout == "", r.stdout  # nothing computed or printed first
    assert "nothing to report" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the report wrote something"
    return r.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--export", "out.xlsx"], ["--export out.xlsx", ".csv or .parquet", "--export out.csv"]),
        (["--compare", "baseline=singel"], ["baseline=singel", "no such topology", "did you mean --compare baseline=single?"]),
        (["--compare", "single"], ["--compare 'single'", "write --compare baseline=TOPOLOGY"]),
        (["--judge", "referense"], ["--judge referense", "no such judge profile", "did you mean --judge reference?"]),
        (["--dataset", "app"], ["--dataset app", "did you mean --dataset apps?"]),
        (["--optimizer", "gepaa"], ["--optimizer gepaa", "did you mean --optimizer gepa?"]),
        (["--model", "qwenn"], ["--model qwenn", "no such model preset", "did you mean --model qwen?"]),
        (["--seeds", "0,one"], ["--seeds 0,one", "whole numbers", "not one"]),
        (["--plot", "chart.jpg"], ["--plot chart.jpg", ".png, .pdf, .svg", "--plot chart.png"]),
        (["--forest", "f.png"], ["--forest f.png", "add --compare baseline=TOPOLOGY"]),
        (["--cells-dir", "no/such/dir"], ["--cells-dir no/such/dir", "no such folder"]),
        (["--publish"], ["--publish", "--sweep PARENT_RUN_ID"]),
        (["--metric", "latency_mean_s", "--export", "t.csv"], ["--metric latency_mean_s", "--export", "drop --metric"]),
        (["--format", "latex"], ["--format latex", "add --table apps-paper"]),
        (["--table", "apps-paper", "--plots", "charts"], ["--table apps-paper", "--plots", "drop --table"]),
    ],
)
def test_a_bad_option_is_refused_before_any_work(tmp_path: Path, args: list[str], words: list[str]):
    err = _report(tmp_path, *args)
    assert err.startswith("apps-bench report: bad option"), err
    for w in words:
        assert w in err, (w, err)


def test_every_bad_option_is_listed_at_once(tmp_path: Path):
    err = _report(tmp_path, "--export", "out.xlsx", "--compare", "baseline=singel", "--export", "t.json")
    assert "bad options" in err
    assert "--export out.xlsx" in err and "--export t.json" in err and "did you mean --compare baseline=single?" in err


@pytest.mark.parametrize(
    "spec, key",
    [
        ("model.gold.wrong_fraction=0", "model.wrong_fraction"),  # as the sweep was typed
        ("model.wrong_fraction=0", "model.wrong_fraction"),  # as the report's columns name it
        ("model.local.n_ctx=4096", "model.n_ctx"),
        ("model.temperature=0", "model.temperature"),
        ("topology=single", "baseline"),
    ],
)
def test_compare_takes_a_provider_setting_as_the_command_line_spells_it(spec: str, key: str):
    """The cells' settings are named in the layout their keys hash (flat: model.wrong_fraction); a sweep over
    gold's setting is typed model.gold.wrong_fraction, and --compare accepts it so."""
    from apps_bench.report.options import baseline_of

    baseline = baseline_of(spec)
    assert (baseline.key, baseline.value) == (key, spec.partition("=")[2])
