"""The records store: one line per problem, torn tails cut, error records retried, no duplicates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import problem_record

from apps_bench.tracking.records import CellDirConflict, RecordStore, RecordsUnreadable
from apps_bench.types import ProblemRecord


def _rec(i: int, error: str | None = None) -> ProblemRecord:
    return problem_record(i, passed=error is None, error=error)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_append_and_resume(tmp_path: Path):
    store = RecordStore(tmp_path / "cell")
    store.claim("k1", {"name": "x"})
    assert store.resume().done == {}
    with store:
        for i in range(3):
            store.append(_rec(i), transcript=[{"agent": "solver", "content": f"t{i}"}])
    state = RecordStore(tmp_path / "cell").resume()
    assert set(state.done) == {"test/0", "test/1", "test/2"} and not state.retried
    assert [r["key"] for r in _lines(tmp_path / "cell" / "transcripts.jsonl")] == ["test/0", "test/1", "test/2"]


def test_torn_last_line_is_cut_and_appends_stay_clean(tmp_path: Path):
    store = RecordStore(tmp_path)
    store.claim("k", {})
    with store:
        store.append(_rec(0))
        store.append(_rec(1))
    with open(tmp_path / "records.jsonl", "ab") as f:
        f.write(b'{"key": "test/2", "id": "2", "pass')  # a write cut by kill -9
    state = RecordStore(tmp_path).resume()
    assert set(state.done) == {"test/0", "test/1"} and state.torn_bytes > 0
    with RecordStore(tmp_path) as again:
        again.append(_rec(2))
    recs = _lines(tmp_path / "records.jsonl")  # every line parses: the fragment is gone
    assert [r["key"] for r in recs] == ["test/0", "test/1", "test/2"]


def test_error_records_are_dropped_so_they_are_retried(tmp_path: Path):
    store = RecordStore(tmp_path)
    store.claim("k", {})
    with store:
        store.append(_rec(0))
        store.append(_rec(1, error="ModelEndpointError: 503 after 3 retries"), transcript=[])
        store.append(_rec(2))
    state = RecordStore(tmp_path).resume()
    assert state.retried == ["test/1"] and set(state.done) == {"test/0", "test/2"}
    assert [r["key"] for r in _lines(tmp_path / "records.jsonl")] == ["test/0", "test/2"]
    assert all(r["key"] != "test/1" for r in _lines(tmp_path / "transcripts.jsonl"))
    with RecordStore(tmp_path) as again:
        again.append(_rec(1))
    keys = [r["key"] for r in _lines(tmp_path / "records.jsonl")]
    assert sorted(keys) == ["test/0", "test/1", "test/2"] and len(keys) == len(set(keys))


def test_duplicate_lines_are_compacted(tmp_path: Path):
    (tmp_path / "records.jsonl").write_text(
        "\n".join(json.dumps(r.to_json()) for r in [_rec(0), _rec(0), _rec(1)]) + "\nnot json\n"
    )
    state = RecordStore(tmp_path).resume()
    assert set(state.done) == {"test/0", "test/1"} and state.corrupt_lines == 1
    assert len(_lines(tmp_path / "records.jsonl")) == 2


def test_a_folder_never_mixes_two_cells(tmp_path: Path):
    RecordStore(tmp_path).claim("aaaa", {})
    RecordStore(tmp_path).claim("aaaa", {})  # same cell: fine
    with pytest.raises(CellDirConflict, match="aaaa.*bbbb"):
        RecordStore(tmp_path).claim("bbbb", {})


def _problem_record(**over: object) -> dict:
    """One line as a cell writes it (step.record_of's fields), with `over` changed."""
    from apps_bench.types import Outcome, ProblemRecord, TestResult, UsageRecord, Verdict

    verdict = Verdict(
        problem_id="7",
        passed=True,
        n_tests=1,
        tests_run=1,
        tests_passed=1,
        profile="seed",
        results=(TestResult(0, Outcome.PASS),),
    )
    rec = ProblemRecord(
        key="test/7",
        id="7",
        split="test",
        difficulty="interview",
        mode="stdin",
        cell="k1",
        program="print(1)",
        extracted=True,
        passed=True,
        verdict=verdict,
        usage=UsageRecord(model_calls=1),
        tool_calls_by_role={},
        latency_s=1.5,
        solve_s=1.0,
        judge_s=0.5,
        solver="main",
        error=None,
        stop_reason="done",
    ).to_json()
    return {**rec, **over}


def test_a_record_says_its_schema_and_one_written_before_it_did_reads_as_version_1():
    from apps_bench.types import RECORD_SCHEMA, ProblemRecord

    line = _problem_record()
    assert line["schema"] == RECORD_SCHEMA and ProblemRecord.from_json(line).to_json() == line
    old = {k: v for k, v in line.items() if k not in ("schema", "rescore_of")}  # a line from before both fields
    read = ProblemRecord.from_json(old)
    assert read.schema == 1 and read.rescore_of is None and read.to_json() == {**old, "schema": 1, "rescore_of": None}


def test_a_record_this_version_cannot_read_is_an_error_that_says_why():
    from apps_bench.types import RECORD_SCHEMA, ProblemRecord

    newer = RECORD_SCHEMA + 1
    with pytest.raises(
        ValueError, match=f"'test/7' is records schema version {newer}; this apps-bench reads versions 1 to {RECORD_SCHEMA}"
    ):
        ProblemRecord.from_json(_problem_record(schema=newer))
    for bad in ("1", 0, True, None):
        with pytest.raises(ValueError, match="not a records.jsonl version"):
            ProblemRecord.from_json(_problem_record(schema=bad))
    lacking = {k: v for k, v in _problem_record().items() if k not in ("passed", "solver")}
    with pytest.raises(ValueError, match=r"lacks fields every record has: \['passed', 'solver'\]"):
        ProblemRecord.from_json(lacking)


def test_records_come_back_as_the_type_they_were_written_as(tmp_path: Path):
    store = RecordStore(tmp_path)
    store.claim("k", {})
    with store:
        store.append(_rec(0))
        store.append(_rec(1, error="ModelEndpointError: 503"))
    (first, second) = RecordStore(tmp_path).records()
    assert first == _rec(0) and second == _rec(1, error="ModelEndpointError: 503")
    assert RecordStore(tmp_path).resume().done == {"test/0": _rec(0)}


@pytest.mark.parametrize("change", [{"schema": 99}, {"graded_by": "someone"}], ids=["newer schema", "unknown field"])
def test_a_record_this_version_cannot_read_is_an_error_and_never_dropped(tmp_path: Path, change: dict):
    """Resume drops only lines that are not JSON (a torn write): a record of a newer version, or with a field
    this version does not know, stops the run with its reason, and the file is left as it was."""
    lines = [json.dumps(_rec(0).to_json()), json.dumps({**_rec(1).to_json(), **change}), json.dumps(_rec(2, error="x").to_json())]
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    before = (tmp_path / "records.jsonl").read_bytes()
    with pytest.raises(RecordsUnreadable, match="'test/1'"):
        RecordStore(tmp_path).resume()
    with pytest.raises(RecordsUnreadable, match="records.jsonl"):
        RecordStore(tmp_path).records()
    assert (tmp_path / "records.jsonl").read_bytes() == before
