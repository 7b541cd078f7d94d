"""Records typed down to `verdict` and `usage`: real records.jsonl lines (gold through the CLI: judged
answers, model errors, a vote, a re-scoring) read as ProblemRecord give back the same bytes, and lines
written before the newer fields existed still read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import APPS_DATA_DIR, cli_env, fresh_store, run_cli

from apps_bench.tracking.records import json_line
from apps_bench.types import Candidate, ProblemRecord, Rejudged, RescoreOf, UsageRecord, Verdict, Vote

DATA = APPS_DATA_DIR / "train_mini150.jsonl"
# independent: three agents and a vote; faults with no retry: some problems end in a model error
CELL = [
    "dataset=apps",
    f"dataset.path={DATA}",
    "dataset.split=train",
    "offset=36",
    "limit=6",
    "model=gold",
    "progress=false",
    "topology=independent",
    "model.gold.fault_fraction=0.1",
    "model.max_retries=0",
    "model.request_timeout_s=3",
]


@pytest.fixture(scope="module")
def cell_dir(tmp_path_factory, mlflow_template) -> Path:
    d = tmp_path_factory.mktemp("roundtrip")
    fresh_store(mlflow_template, d / "outputs" / "mlflow.db")
    proc = run_cli(CELL, d)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]  # recorded, with errors
    (found,) = (d / "outputs" / "cells").iterdir()
    env = cli_env(d, OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    proc = subprocess.run(
        [sys.executable, "-m", "apps_bench.rescore", str(found), "judge=reference"],
        cwd=d,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "rescore" in {p.name for p in found.iterdir()}, proc.stdout[-2000:] + proc.stderr[-2000:]
    return found


def _lines(path: Path) -> list[bytes]:
    return [x + b"\n" for x in path.read_bytes().splitlines()]


def test_real_records_read_typed_and_give_back_the_same_bytes(cell_dir: Path):
    (rescored,) = (cell_dir / "rescore").iterdir()
    lines = _lines(cell_dir / "records.jsonl") + _lines(rescored / "records.jsonl")
    records = [ProblemRecord.from_json(json.loads(x)) for x in lines]
    assert [json_line(r.to_json()) for r in records] == lines

    cell = records[: len(_lines(cell_dir / "records.jsonl"))]
    errors = [r for r in cell if r.error]
    judged = [r for r in cell if not r.error]
    assert errors and judged, [r.error for r in cell]  # both kinds are in the file
    assert all(r.verdict is None for r in errors)
    for r in judged:
        assert isinstance(r.verdict, Verdict) and isinstance(r.usage, UsageRecord) and isinstance(r.vote, Vote)
        assert r.verdict.problem_id == r.id and r.usage.model_calls >= 3  # three agents asked
        assert [c.agent for c in r.candidates] == [m for g in r.vote.group_members for m in g]
        assert all(isinstance(c, Candidate) for c in r.candidates)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # the re-scoring: re-judged records name the verdict they replace; a model error is carried over in the short form
    again = {r.key: r for r in records[len(cell) :]}
    assert again.keys() == {r.key for r in cell}
    for r in judged:
        new = again[r.key].rescore_of
        assert isinstance(new, Rejudged) and (new.cell, new.passed, new.profile) == (r.cell, r.passed, "seed")
        assert again[r.key].verdict is not None and again[r.key].verdict.reference_results is not None
    for r in errors:
        assert type(again[r.key].rescore_of) is RescoreOf and again[r.key].rescore_of == RescoreOf(r.cell, False)


def test_lines_from_before_the_newer_fields_still_read(cell_dir: Path):
    """A line as the first records had it: no schema, rescore_of, rounds, turns, candidates, vote or
    completed_at; six usage counters; a verdict without reference_results."""
    first = [json.loads(x) for x in _lines(cell_dir / "records.jsonl")]
    for line in first:
        old = {
            k: v
            for k, v in line.items()
            if k not in ("schema", "rescore_of", "rounds", "turns", "candidates", "vote", "completed_at")
        }
        old["usage"] = {
            k: line["usage"][k]
            for k in ("prompt_tokens", "completion_tokens", "total_tokens", "model_calls", "tool_calls", "failed_calls")
        }
        rec = ProblemRecord.from_json(old)
        assert rec.schema == 1 and rec.vote is None and rec.candidates == [] and rec.rescore_of is None
        assert rec.usage.total_tokens == line["usage"]["total_tokens"] and rec.usage.retries == 0 and rec.usage.calls == []
        assert (rec.verdict is None) == (line["verdict"] is None)
        if rec.verdict is not None:
            assert rec.verdict.to_json() == line["verdict"]


@pytest.mark.parametrize(
    ("where", "change", "says"),
    [
        ("usage", {"graded_tokens": 1}, "the usage has fields this version does not know: ['graded_tokens']"),
        ("verdict", {"graded": True}, "the verdict has fields this version does not know: ['graded']"),
        ("vote", {"winner": None, "group_sizes": [], "group_members": [], "ties": 0}, "the vote has fields"),
    ],
)
def test_a_nested_field_this_version_does_not_know_is_an_error_that_says_which(cell_dir: Path, where, change, says):
    line = next(json.loads(x) for x in _lines(cell_dir / "records.jsonl") if json.loads(x)["verdict"] is not None)
    line[where] = {**(line[where] or {}), **change}
    with pytest.raises(ValueError, match=rf"record '{line['key']}': {says}".replace("[", r"\[").replace("]", r"\]")):
        ProblemRecord.from_json(line)
