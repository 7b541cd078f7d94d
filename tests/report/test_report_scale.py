"""The report and `plan` at a study's size, on a real sweep (2 seeds of sequential_langgraph on gold through the
real CLI, real APPS rows, a real SQLite MLflow store) and copies of its cells with new keys and problem ids:
a finished cell saves its counts (counts.json); the report reads records one at a time and never holds a
transcript, so its memory does not grow with transcript size; counts of older or resumed cells are counted
again, never served stale; from MLflow each cell's downloads go as soon as it is read; and `plan` reads the
records of the cells it plans and of the cells its estimate uses, never of unrelated ones."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env, fresh_store, run_cli

from apps_bench.report import cells as cellmod
from apps_bench.report.cost import role_rows
from apps_bench.report.groups import group_cells
from apps_bench.tracking import records
from apps_bench.tracking.records import RecordStore
from apps_bench.types import ProblemRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXPERIMENT = "scale"
LIMIT = 4


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> dict:
    cwd = tmp_path_factory.mktemp("sweep")
    fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    env = cli_env(cwd)
    common = [f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}", f"limit={LIMIT}", "progress=false"]
    args = ["-m", "topology=sequential_langgraph", "seed=0,1", "dataset=apps", f"tracking.experiment={EXPERIMENT}", *common]
    r = run_cli(args, cwd, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    dirs = sorted((cwd / "outputs" / "cells").iterdir())
    assert len(dirs) == 2
    return {"cwd": cwd, "dirs": dirs, "common": common, "uri": f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}"}


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def _copy(src: Path, dst: Path, *, n: int, key: str, pad: int = 1, topology: str | None = None) -> Path:
    """A copy of a real cell folder under a new key, with `n` problems (the real ones cycled, new ids) and
    each transcript text `pad` times as long; no counts.json, as an older cell has none."""
    info = json.loads((src / "cell.json").read_text())
    info["key"] = key
    if topology:
        info["axes"]["topology"] = info["identity"]["topology"]["name"] = topology
    d = dst / f"{info['axes']['topology']}-{key}"
    d.mkdir(parents=True)
    (d / "cell.json").write_text(json.dumps(info))
    shutil.copyfile(src / "summary.json", d / "summary.json")
    recs, trans = _lines(src / "records.jsonl"), {t["key"]: t for t in _lines(src / "transcripts.jsonl")}
    with open(d / "records.jsonl", "w") as fr, open(d / "transcripts.jsonl", "w") as ft:
        for i in range(n):
            r = dict(recs[i % len(recs)], id=str(i), key=f"test/{i}", cell=key)
            events = [dict(e, content=str(e.get("content") or "") * pad) for e in trans[recs[i % len(recs)]["key"]]["events"]]
            fr.write(json.dumps(r) + "\n")
            ft.write(json.dumps({"key": r["key"], "id": r["id"], "events": events}) + "\n")
    return d


def _strings(obj: Any, seen: set[int] | None = None):
    """Every string reachable from `obj` through containers and dataclasses."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k, seen)
            yield from _strings(v, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from _strings(v, seen)
    elif is_dataclass(obj):
        yield from _strings(vars(obj), seen)


def test_a_finished_cell_saves_its_counts(sweep: dict):
    """counts.json, written when the cell finished, holds what its records and transcripts say, counted here again."""
    from apps_bench.tracking import cell_counts

    for d in sweep["dirs"]:
        saved = cell_counts.saved(d)
        assert saved is not None, f"{d} has no current counts.json"
        recs = _lines(d / "records.jsonl")
        assert (saved.problems, saved.model_calls) == (LIMIT, sum(r["usage"]["model_calls"] for r in recs))
        assert saved.total_tokens == sum(r["usage"]["total_tokens"] for r in recs)
        assert saved.measured
        calls: dict[str, int] = {}
        for r in recs:
            for c in r["usage"]["calls"]:
                calls[c["role"]] = calls.get(c["role"], 0) + 1
        inputs: dict[str, int] = {}
        for t in _lines(d / "transcripts.jsonl"):
            for e in t["events"]:
                if e["kind"] == "input":
                    inputs[e["role"]] = inputs.get(e["role"], 0) + 1
        assert {k: v.calls for k, v in saved.roles.items()} == calls
        assert {k: v.turns for k, v in saved.roles.items() if v.turns} == inputs
        assert list(saved.roles) == ["analyzer", "coder", "tester", "debugger"]  # the order the flow runs them


def _read(root: Path) -> tuple[list[cellmod.CellData], int]:
    tracemalloc.start()
    try:
        got = cellmod.from_dirs(root)
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_report_memory_does_not_grow_with_transcript_size(sweep: dict, tmp_path: Path):
    src, n = sweep["dirs"][0], 150
    small = _copy(src, tmp_path / "x1", n=n, key="aaaa00000001")
    large = _copy(src, tmp_path / "x4", n=n, key="aaaa00000001", pad=4)
    grown = (large / "transcripts.jsonl").stat().st_size - (small / "transcripts.jsonl").stat().st_size
    assert grown > 6_000_000  # about 20 KB of transcript a problem, four times over

    # older cells (no counts.json): counted in one pass, then their counts.json read
    (c1,), first1 = _read(tmp_path / "x1")
    (c4,), first4 = _read(tmp_path / "x4")
    # a line at a time, never the file: what the longer transcripts add is a longer line, not the file's growth
    assert first4 - first1 < grown / 5 and first4 < grown / 2, (first1, first4, grown)
    from apps_bench.tracking import cell_counts

    assert cell_counts.saved(small) is not None and cell_counts.saved(large) is not None  # saved for the next read
    (again,), second4 = _read(tmp_path / "x4")
    assert second4 < first4 and again.counts == c4.counts

    assert len(c1.problems) == len(c4.problems) == n
    assert c1.problems == c4.problems and c1.counts is not None and c4.counts is not None
    assert {r: (t.turns, t.replies, t.calls, t.tokens) for r, t in c1.counts.roles.items()} == {
        r: (t.turns, t.replies, t.calls, t.tokens) for r, t in c4.counts.roles.items()
    }
    question = _lines(src / "transcripts.jsonl")[0]["events"][0]["content"][:60]
    assert question.startswith("QUESTION")
    held = list(_strings(c4))
    assert held and not any(question[:30] in s for s in held)  # no transcript text is held
    assert max(len(s) for s in held) < 2000


def test_counts_of_a_resumed_cell_are_counted_again(sweep: dict, tmp_path: Path):
    from apps_bench.tracking import cell_counts

    d = _copy(sweep["dirs"][0], tmp_path / "cells", n=6, key="bbbb00000001")
    (before,) = cellmod.from_dirs(tmp_path / "cells")
    assert before.counts is not None and before.counts.problems == 6
    saved = (d / cell_counts.COUNTS).read_text()

    rec = ProblemRecord.from_json(_lines(d / "records.jsonl")[0])
    extra = ProblemRecord.from_json({**rec.to_json(), "id": "99", "key": "test/99"})
    events = _lines(d / "transcripts.jsonl")[0]["events"]
    with RecordStore(d) as store:  # the cell resumed: one more problem recorded, as a run appends it
        store.append(extra, events)
    assert cell_counts.saved(d) is None  # the files it was counted from changed: not served
    (after,) = cellmod.from_dirs(tmp_path / "cells")
    assert after.counts is not None and after.counts.problems == 7
    assert after.counts.model_calls == before.counts.model_calls + rec.usage.model_calls
    assert after.counts.roles["tester"].turns == before.counts.roles["tester"].turns + 1
    assert (d / cell_counts.COUNTS).read_text() != saved and cell_counts.saved(d) == after.counts

    (d / cell_counts.COUNTS).write_text(json.dumps({**json.loads(saved), "version": 0}))  # another version's file
    assert cell_counts.saved(d) is None


def test_report_from_mlflow_drops_each_cells_downloads(sweep: dict, monkeypatch: pytest.MonkeyPatch):
    local = {c.key: c for c in cellmod.from_dirs(sweep["cwd"] / "outputs" / "cells")}
    downloads: list[str] = []
    left_over: list[list[str]] = []
    real_download, real_cell = cellmod._download, cellmod._cell_of_run

    def download(c: Any, run_id: str, name: str, dst: Path, *rest: Any) -> Any:
        downloads.append(name)
        return real_download(c, run_id, name, dst, *rest)

    def cell_of_run(c: Any, r: Any, by_id: Any, dst: Path, *rest: Any) -> Any:
        left_over.append(sorted(str(p.relative_to(dst.parent)) for p in dst.parent.rglob("*") if p.is_file()))
        return real_cell(c, r, by_id, dst, *rest)

    monkeypatch.setattr(cellmod, "_download", download)
    monkeypatch.setattr(cellmod, "_cell_of_run", cell_of_run)
    found = cellmod.from_mlflow(experiment=EXPERIMENT, uri=sweep["uri"])
    assert len(found) == 2 and left_over == [[], []]  # the first cell's files were gone before the second was read
    from apps_bench.tracking import cell_counts

    assert "transcripts.jsonl" not in downloads and downloads.count(cell_counts.COUNTS) == 2  # current counts: no transcript
    for c in found:
        assert c.counts is not None and local[c.key].counts is not None
        assert c.problems == local[c.key].problems
        assert c.counts.roles == local[c.key].counts.roles

    # a run logged before cells saved their counts: its transcripts are counted, streamed, and give the same figures
    older = found[0].source
    [path] = (sweep["cwd"] / "mlruns").glob(f"*/{older}/artifacts/{cell_counts.COUNTS}")
    path.unlink()
    downloads.clear()
    again = {c.source: c for c in cellmod.from_mlflow(experiment=EXPERIMENT, uri=sweep["uri"])}
    assert downloads.count("transcripts.jsonl") == 1
    assert again[older].counts is not None and again[older].counts.roles == local[found[0].key].counts.roles
    assert [asdict(r) for r in role_rows(group_cells(list(again.values())))] == [
        asdict(r) for r in role_rows(group_cells(list(local.values())))
    ]


def _plan_reads(sweep: dict, cells_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list[str]]:
    from apps_bench.plan import make_plan

    read: list[str] = []
    real_lines, real_iter = records._read_lines, getattr(records, "iter_lines", None)

    def read_lines(path: Path) -> Any:
        read.append(str(path))
        return real_lines(path)

    def iter_lines(path: Path) -> Any:
        read.append(str(path))
        assert real_iter is not None
        return real_iter(path)

    monkeypatch.setattr(records, "_read_lines", read_lines)
    monkeypatch.setattr(records, "iter_lines", iter_lines, raising=False)
    monkeypatch.chdir(sweep["cwd"])
    plan = make_plan(
        ["topology=sequential_langgraph", "seed=0,1,2", "dataset=apps", *sweep["common"]], multirun=True, cells_dir=cells_dir
    )
    return plan, sorted(p.replace(str(cells_dir), "") for p in read)


def test_plan_reads_no_unrelated_records(sweep: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Beside 0 or 20 unrelated finished cells (another topology, 300 problems each): the same files read, the
    same plan."""
    alone, beside = tmp_path / "alone", tmp_path / "beside"
    for root in (alone, beside):
        for d in sweep["dirs"]:
            shutil.copytree(d, root / d.name)
    for i in range(20):
        _copy(sweep["dirs"][0], beside, n=300, key=f"cccc{i:08d}", topology="independent")

    plan0, read0 = _plan_reads(sweep, alone, monkeypatch)
    plan20, read20 = _plan_reads(sweep, beside, monkeypatch)
    assert read20 == read0 and all("independent" not in p for p in read20)
    assert [c["state"] for c in plan0["cells"]] == ["done", "done", "new"]
    for p in (plan0, plan20):
        for c in p["cells"]:
            c["dir"] = Path(c["dir"]).name
        p["finished_cells_read_from"] = ""
    assert plan20 == plan0
    est = plan0["cells"][2]["estimate"]  # seed 2 from its two finished seed replicates
    recs = [r for d in sweep["dirs"] for r in _lines(d / "records.jsonl")]
    assert est["calls_per_problem"] == sum(r["usage"]["model_calls"] for r in recs) / len(recs)
    assert est["tokens_per_problem"] == sum(r["usage"]["total_tokens"] for r in recs) / len(recs)
    assert est["basis"] == f"2 finished seed replicate(s) of this cell, {len(recs)} problems"
