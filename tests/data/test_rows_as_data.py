"""Rows are checked as data (apps_bench/data/apps.py, rows.py): repeated problem ids are refused
naming them and their lines, a UTF-8 byte-order mark is read, and a row whose tests cannot be run
(an fn_name that is not an identifier) is skipped and counted, never charged to the model.
Loader calls on real APPS rows, and cells through the real CLI on the gold model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from omegaconf import OmegaConf

from apps_bench.config.schema import DatasetConfig, typed
from apps_bench.data import SKIP_REASONS, RowError, load_problems, parse_row

CONF = Path(__file__).resolve().parents[2] / "apps_bench" / "conf"


def _local(path: Path) -> DatasetConfig:
    return typed(
        DatasetConfig,
        OmegaConf.merge(OmegaConf.load(CONF / "dataset" / "apps.yaml"), {"source": "file", "path": str(path), "split": "train"}),
    )


def _rows(apps_data_dir: Path) -> list[dict]:
    with (apps_data_dir / "train_mini150.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _call_based(rows: list[dict]) -> dict:
    return next(r for r in rows if json.loads(r["input_output"]).get("fn_name"))


def _write(path: Path, rows: list[dict], prefix: str = "") -> Path:
    path.write_text(prefix + "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _records(cwd: Path) -> list[dict]:
    files = list(cwd.glob("outputs/cells/*/records.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


def _cell(cwd: Path, rows_file: Path, *extra: str):
    return run_cli(
        [
            "dataset=apps",
            f"dataset.path={rows_file}",
            "dataset.split=train",
            "model=gold",
            "tracking=none",
            "progress=false",
            *extra,
        ],
        cwd,
    )


# ------------------------------------------------------------------ the loader


def test_repeated_ids_are_refused_naming_each_id_and_its_lines(apps_data_dir: Path, tmp_path: Path):
    rows = _rows(apps_data_dir)[:3]
    ids = [str(r["problem_id"]) for r in rows]
    path = _write(tmp_path / "rows.jsonl", [*rows, rows[0], rows[1]])
    with pytest.raises(ValueError) as e:
        load_problems(_local(path))
    said = str(e.value)
    assert f"problem_id {ids[0]} on line 1, line 4" in said and f"problem_id {ids[1]} on line 2, line 5" in said
    assert str(path) in said and f"problem_id {ids[2]} " not in said
    # a selection that holds each id once is fine: the check is on the rows a cell would run
    assert [p.id for p in load_problems(_local(path), limit=3).problems] == ids


def test_a_byte_order_mark_is_read_as_nothing(apps_data_dir: Path, tmp_path: Path):
    rows = _rows(apps_data_dir)[:3]
    res = load_problems(_local(_write(tmp_path / "bom.jsonl", rows, prefix="\ufeff")))
    assert [p.id for p in res.problems] == [str(r["problem_id"]) for r in rows] and res.skipped == {}


@pytest.mark.parametrize("name", ["not a name", "class", "3sum", "Solution.solve"])
def test_an_fn_name_no_program_can_define_is_a_skipped_row(apps_data_dir: Path, name: str):
    row = _call_based(_rows(apps_data_dir))
    io = json.loads(row["input_output"])
    with pytest.raises(RowError) as e:
        parse_row({**row, "input_output": json.dumps({**io, "fn_name": name})})
    assert e.value.reason == "bad_fn_name" and e.value.reason in SKIP_REASONS
    assert parse_row(row).tests.fn_name == io["fn_name"]  # the real row's own name is fine


# ------------------------------------------------------------------ cells through the CLI


@pytest.mark.slow
def test_a_cell_on_rows_with_repeated_ids_is_refused_and_writes_nothing(apps_data_dir: Path, tmp_path: Path):
    rows = _rows(apps_data_dir)[:3]
    path = _write(tmp_path / "rows.jsonl", [*rows, rows[0]])
    r = _cell(tmp_path, path)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert f"problem_id {rows[0]['problem_id']} on line 1, line 4" in r.stderr
    assert not (tmp_path / "outputs" / "cells").exists()


@pytest.mark.slow
def test_a_cell_reads_a_bom_file_whole_and_skips_an_unjudgeable_row_uncharged(apps_data_dir: Path, tmp_path: Path):
    rows = _rows(apps_data_dir)
    plain = rows[:2]
    bad = _call_based(rows)
    bad = {**bad, "input_output": json.dumps({**json.loads(bad["input_output"]), "fn_name": "not a name"})}
    path = _write(tmp_path / "rows.jsonl", [*plain, bad], prefix="\ufeff")
    r = _cell(tmp_path, path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    recs = _records(tmp_path)
    # the first row (behind the mark) ran; the row whose tests cannot be run did not, and is not charged
    assert sorted(x["id"] for x in recs) == sorted(str(x["problem_id"]) for x in plain)
    assert all(x["passed"] for x in recs)
    assert "rows skipped: bad_fn_name=1" in r.stdout
    assert f"id {bad['problem_id']}: bad_fn_name" in r.stderr
