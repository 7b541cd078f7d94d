"""A trace per problem (apps_bench/tracking/traces.py): every runner through the real CLI, the
real gold server and a real SQLite MLflow store; the same span tree for all eight."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import cli_env, compose_cell, fresh_store, problem_record, run_cli

RUNNERS = (
    "single",
    "independent",
    "sequential_langgraph",
    "sequential_crewai",
    "centralized_langgraph",
    "centralized_autogen",
    "decentralized_langgraph",
    "decentralized_openai",
)
SECRET = "sk-apps-bench-secret-marker-5f2c9"  # the API key: it must appear in no span
TIMING = {"latency_s", "solve_s", "judge_s", "completed_at", "solver"}


def _cell_args(rows: Path, *extra: str) -> list[str]:
    return ["model=gold", "dataset=apps", f"dataset.path={rows}", "dataset.split=train", "progress=false", *extra]


def _run(cwd: Path, args: list[str]) -> None:
    r = run_cli(args, cwd, env=cli_env(cwd, OPENAI_API_KEY=SECRET), timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


def _records(cwd: Path) -> list[dict]:
    [records] = list((cwd / "outputs" / "cells").glob("*/records.jsonl"))
    return [json.loads(x) for x in records.read_text().splitlines() if x.strip()]


def _traces(cwd: Path) -> tuple[object, list]:
    """(the cell's run, its traces as the run's Traces tab lists them)."""
    import mlflow

    from apps_bench.tracking import mlflow as mlf

    uri = f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}"
    c = mlf.client(uri)
    [run] = c.search_runs([c.get_experiment_by_name("apps").experiment_id])
    mlflow.set_tracking_uri(uri)
    traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list")
    return run, traces


def _children(trace, span) -> list:
    return [s for s in trace.data.spans if s.parent_id == span.span_id]


def _without_timing(rec: dict) -> dict:
    out = {k: v for k, v in rec.items() if k not in TIMING}
    out["usage"] = {k: v for k, v in rec["usage"].items() if k != "tool_s"}
    if rec.get("verdict"):
        v = {k: x for k, x in rec["verdict"].items() if k != "seconds"}
        v["results"] = [{k: x for k, x in r.items() if k != "seconds"} for r in v["results"]]
        out["verdict"] = v
    return out


@pytest.mark.parametrize("topology", RUNNERS)
def test_every_runner_gives_one_trace_per_problem_with_turns_calls_tools_and_the_judge(
    topology: str, tmp_path: Path, mlflow_template: Path, apps_data_dir: Path
):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    _run(tmp_path, _cell_args(apps_data_dir / "train_mini150.jsonl", f"topology={topology}", "limit=2", "tracking.traces=true"))
    records = {r["key"]: r for r in _records(tmp_path)}
    transcripts = {}
    [tfile] = list((tmp_path / "outputs" / "cells").glob("*/transcripts.jsonl"))
    for line in tfile.read_text().splitlines():
        d = json.loads(line)
        transcripts[d["key"]] = d["events"]
    run, traces = _traces(tmp_path)
    assert len(records) == 2 and len(traces) == 2
    assert sorted(t.info.tags["problem_key"] for t in traces) == sorted(records)
    for trace in traces:
        rec = records[trace.info.tags["problem_key"]]
        assert trace.info.request_metadata["mlflow.sourceRun"] == run.info.run_id
        assert trace.info.tags["difficulty"] == rec["difficulty"] != ""
        assert trace.info.tags["passed"] == str(rec["passed"]).lower() == "true"
        assert trace.info.tags["error"] == ""
        assert SECRET not in trace.to_json()

        [root] = [s for s in trace.data.spans if s.parent_id is None]
        assert root.name == f"problem {rec['key']}" and root.span_type == "AGENT"
        kids = _children(trace, root)
        turns = [s for s in kids if s.span_type == "AGENT"]
        inputs = [e for e in transcripts[rec["key"]] if e["kind"] == "input"]
        assert [(s.attributes["agent"], s.attributes["round"]) for s in turns] == [(e["agent"], e["round"]) for e in inputs]

        calls = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
        assert all(
            trace.data.spans[[x.span_id for x in trace.data.spans].index(s.parent_id)].span_type == "AGENT"
            and s.parent_id != root.span_id
            for s in calls
        ), "every model call sits in an agent turn"
        # token usage per call equals the record's (the same metering, seen from the trace)
        usage = lambda s: s.attributes["mlflow.chat.tokenUsage"]  # noqa: E731
        role = lambda s: "" if s.name == "chat model" else s.name.removeprefix("chat ")  # noqa: E731
        got = sorted(
            (role(s), usage(s)["input_tokens"], usage(s)["output_tokens"], s.outputs["choices"][0]["finish_reason"])
            for s in calls
        )
        want = sorted(
            (c.get("role", ""), c["prompt_tokens"], c["completion_tokens"], c["finish_reason"]) for c in rec["usage"]["calls"]
        )
        assert got == want and len(calls) == rec["usage"]["model_calls"]
        for s in calls:
            assert s.inputs["messages"] and s.outputs["choices"][0]["message"]["role"] == "assistant"
            assert usage(s)["total_tokens"] == usage(s)["input_tokens"] + usage(s)["output_tokens"]
            assert s.end_time_ns >= s.start_time_ns

        execs = [s for s in trace.data.spans if s.span_type == "TOOL"]
        assert len(execs) == rec["usage"]["tool_calls"] >= 1, "gold calls python_exec in every runner's tool roles"
        for s in execs:
            assert s.name == "python_exec" and s.inputs["code"].strip() and s.outputs["exit_code"] == 0
            assert s.outputs["stdout"].strip() and s.parent_id != root.span_id

        [judge] = [s for s in kids if s.span_type == "EVALUATOR"]
        assert judge.outputs["passed"] is True
        assert [(r["index"], r["outcome"]) for r in judge.outputs["results"]] == [
            (r["index"], r["outcome"]) for r in rec["verdict"]["results"]
        ]
        assert judge.outputs["tests_passed"] == rec["verdict"]["tests_passed"] == len(rec["verdict"]["results"])


def test_traces_change_no_record_and_gold_traces_nothing_by_default(tmp_path: Path, mlflow_template: Path, apps_data_dir: Path):
    rows = apps_data_dir / "train_mini150.jsonl"
    on, off = tmp_path / "on", tmp_path / "off"
    for cwd, extra in ((on, ["tracking.traces=true"]), (off, [])):  # off: gold's default
        fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
        _run(cwd, _cell_args(rows, "topology=centralized_langgraph", "limit=3", *extra))
    assert len(_traces(on)[1]) == 3 and _traces(off)[1] == []
    by_key = lambda cwd: sorted((_without_timing(r) for r in _records(cwd)), key=lambda r: r["key"])  # noqa: E731
    assert by_key(on) == by_key(off)
    [t_on], [t_off] = ((cwd / "outputs" / "cells").glob("*/transcripts.jsonl") for cwd in (on, off))
    key = lambda line: json.loads(line)["key"]  # noqa: E731
    assert sorted(t_on.read_text().splitlines(), key=key) == sorted(t_off.read_text().splitlines(), key=key)


def test_a_killed_cell_rerun_traces_only_the_problems_it_solves(tmp_path: Path, mlflow_template: Path, apps_data_dir: Path):
    import os
    import signal
    import subprocess
    import sys
    import time

    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    args = _cell_args(
        apps_data_dir / "train_mini150.jsonl",
        "topology=single",
        "limit=6",
        "tracking.traces=true",
        "processes=1",
        "concurrency=1",
        "model.gold.latency_ms=400",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "apps_bench", *args],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=cli_env(tmp_path, OPENAI_API_KEY=SECRET),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            recs = list((tmp_path / "outputs" / "cells").glob("*/records.jsonl"))
            if recs and len([x for x in recs[0].read_text().splitlines() if x.strip()]) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the cell ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # a kill at any moment: no clean-up runs
    finally:
        proc.wait(timeout=60)
    before = {r["key"] for r in _records(tmp_path)}
    assert 2 <= len(before) < 6
    _, traces = _traces(tmp_path)
    first = {t.info.tags["problem_key"]: t.info.trace_id for t in traces}
    assert set(first) <= before  # a trace is written after its record, never before

    _run(tmp_path, args)  # the same cell again: resumes, solves only what is left
    records = _records(tmp_path)
    assert len(records) == 6
    run, traces = _traces(tmp_path)
    keys = [t.info.tags["problem_key"] for t in traces]
    assert len(keys) == len(set(keys)), "no problem is traced twice"
    assert set(keys) == set(first) | ({r["key"] for r in records} - before)  # this run's problems, and only them
    assert {t.info.tags["problem_key"]: t.info.trace_id for t in traces if t.info.tags["problem_key"] in first} == first
    assert all(t.info.request_metadata["mlflow.sourceRun"] == run.info.run_id for t in traces)


def test_the_default_is_on_for_real_models_off_for_gold_and_none_without_a_store():
    from apps_bench.config.schema import typed_config
    from apps_bench.tracking.traces import traces_enabled

    real = ("model=openai", "model.base_url=http://127.0.0.1:9/v1", "model.model_id=m")
    assert traces_enabled(typed_config(compose_cell(*real)))
    assert not traces_enabled(typed_config(compose_cell(*real, "tracking.traces=false")))
    assert not traces_enabled(typed_config(compose_cell(*real, "tracking=none")))
    assert not traces_enabled(typed_config(compose_cell(*real, "tracking=none", "tracking.traces=true")))
    assert not traces_enabled(typed_config(compose_cell("model=gold")))
    assert traces_enabled(typed_config(compose_cell("model=gold", "tracking.traces=true")))


def test_a_streamed_reply_is_folded_into_one_message_with_its_tool_calls():
    from apps_bench.tracking.capture import ModelCall
    from apps_bench.tracking.traces import reply_object

    events = [
        {"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]},
        {"choices": [{"index": 0, "delta": {"content": "run it."}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "python_exec", "arguments": '{"co'}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'de": "print(1)"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    call = ModelCall(
        role="solver", start_ns=0, end_ns=1, turn=0, request=b"{}", reply=body.encode(), content_type="text/event-stream"
    )
    obj = reply_object(call)
    [choice] = obj["choices"]
    assert choice["finish_reason"] == "tool_calls" and obj["usage"] == {"prompt_tokens": 7, "completion_tokens": 3}
    assert choice["message"]["content"] == "Let me run it."
    assert choice["message"]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "python_exec", "arguments": '{"code": "print(1)"}'}}
    ]


def test_an_infrastructure_error_is_a_trace_tagged_with_it_and_its_failed_call(
    tmp_path: Path, mlflow_template: Path, apps_data_dir: Path
):
    fresh_store(mlflow_template, tmp_path / "outputs" / "mlflow.db")
    args = _cell_args(
        apps_data_dir / "train_mini150.jsonl",
        "topology=single",
        "limit=2",
        "tracking.traces=true",
        "model.gold.fault_fraction=1.0",
        "model.max_retries=0",
        "model.retry_backoff_s=0",
        "model.request_timeout_s=3",
    )  # a stalled request: no need to wait 30 s for its timeout
    r = run_cli(args, tmp_path, env=cli_env(tmp_path, OPENAI_API_KEY=SECRET), timeout=600)
    assert r.returncode == 3, r.stderr[-3000:]  # incomplete: every problem is an infrastructure error
    records = {x["key"]: x for x in _records(tmp_path)}
    _, traces = _traces(tmp_path)
    assert sorted(t.info.tags["problem_key"] for t in traces) == sorted(records)
    for trace in traces:
        rec = records[trace.info.tags["problem_key"]]
        assert rec["error"] and trace.info.tags["error"] == rec["error"] and trace.info.tags["passed"] == "false"
        assert trace.info.state == "ERROR" and SECRET not in trace.to_json()
        [call] = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
        # the fault gold injects is drawn from the request body's hash: an HTTP error, or a stall the client gives up on
        timed_out = "timed out" in rec["error"]
        assert call.status.status_code == "ERROR" and (
            call.attributes["http_status"] == 0 if timed_out else call.attributes["http_status"] >= 400
        )
        assert not [s for s in trace.data.spans if s.span_type == "EVALUATOR"]  # never judged


# ----------------------------------------------------------------------------- what a trace costs the store


@pytest.fixture(scope="module")
def traced_cell(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path, apps_data_dir: Path) -> Path:
    """A gold sequential_langgraph cell of 30 problems with traces on (14 spans per trace), in its own store."""
    cwd = tmp_path_factory.mktemp("traced_cell")
    fresh_store(mlflow_template, cwd / "outputs" / "mlflow.db")
    _run(
        cwd,
        _cell_args(apps_data_dir / "train_mini150.jsonl", "topology=sequential_langgraph", "limit=30", "tracking.traces=true"),
    )
    return cwd


def _artifact_root(cwd: Path) -> Path:
    from urllib.parse import urlparse

    from apps_bench.tracking import mlflow as mlf

    exp = mlf.client(f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}").get_experiment_by_name("apps")
    loc = exp.artifact_location
    path = Path(urlparse(loc).path) if loc.startswith("file:") else Path(loc)
    return path if path.is_absolute() else cwd / path


def test_each_trace_is_stored_once_as_spans_in_the_store_never_also_as_an_artifact(traced_cell: Path):
    """MLflow's exporter uploads a trace's spans as a traces.json artifact when the store's answer to
    start_trace does not yet say its spans are in the store (the spans' batch still queued): about half
    of a cell's traces were stored twice."""
    import sqlite3

    records = {r["key"] for r in _records(traced_cell)}
    _, traces = _traces(traced_cell)
    assert sorted(t.info.tags["problem_key"] for t in traces) == sorted(records) and len(records) == 30
    for trace in traces:  # whole, from the store's spans: the root, 4 turns, 6 calls, 2 python_exec, the judge
        assert len(trace.data.spans) == 14 and [s.name for s in trace.data.spans if s.span_type == "EVALUATOR"] == ["judge"]
        assert trace.info.tags["mlflow.trace.spansLocation"] == "TRACKING_STORE"
    with sqlite3.connect(traced_cell / "outputs" / "mlflow.db") as db:
        assert db.execute("select count(distinct trace_id), count(*) from spans").fetchone() == (30, 30 * 14)
    root = _artifact_root(traced_cell)
    uploaded = sorted(str(p.relative_to(root)) for p in root.rglob("traces.json")) if root.exists() else []
    assert uploaded == [], f"{len(uploaded)} of 30 traces were also uploaded as artifacts: {uploaded[:3]}"


SAME = re.compile(r"\[the same (\d+) characters as in the span '[^']*'\]")
CLIPPED = re.compile(r"\.\.\. \[\+(\d+) characters: the run's transcripts\.jsonl\]$")


def _read_as_shown(shown: str, whole: str) -> bool:
    """`shown` is `whole` as a span shows it: its own characters where it has them, a reference to
    another span standing for exactly as many characters, and when clipped, a head of it."""
    body, clipped = CLIPPED.sub("", shown), CLIPPED.search(shown)
    pos, last = 0, 0
    for m in SAME.finditer(body):
        literal = body[last : m.start()]
        if not whole.startswith(literal, pos):
            return False
        pos, last = pos + len(literal) + int(m.group(1)), m.end()
    tail = body[last:]
    return whole.startswith(tail, pos) and (clipped is not None or pos + len(tail) == len(whole))


def test_a_trace_keeps_each_text_up_to_its_length_and_the_whole_text_is_in_the_transcript(traced_cell: Path):
    """On main a trace's spans held 78 KB of JSON: every message of every call, each up to 20,000
    characters. Now each text is kept up to `tracking.trace_text_chars` (500), a text shown before
    (whole, or inside a longer one: a turn's input holds the earlier turns' replies) is a reference to
    the span that shows it, and the whole text is in the run's transcripts.jsonl."""
    import sqlite3

    with sqlite3.connect(traced_cell / "outputs" / "mlflow.db") as db:
        per_trace = [n for (n,) in db.execute("select sum(length(content)) from spans group by trace_id")]
    assert len(per_trace) == 30 and max(per_trace) <= 20_000, sorted(per_trace)[-3:]
    transcripts = {}
    [tfile] = list((traced_cell / "outputs" / "cells").glob("*/transcripts.jsonl"))
    for line in tfile.read_text().splitlines():
        d = json.loads(line)
        transcripts[d["key"]] = d["events"]
    _, traces = _traces(traced_cell)
    referred = 0
    for trace in traces:
        key = trace.info.tags["problem_key"]
        inputs = {(e["agent"], e["round"]): e["content"] for e in transcripts[key] if e["kind"] == "input"}
        for span in (s for s in trace.data.spans if s.span_type == "AGENT" and s.parent_id is not None):
            shown = span.inputs["input"]
            assert len(CLIPPED.sub("", shown)) <= 500
            assert _read_as_shown(shown, inputs[(span.attributes["agent"], span.attributes["round"])]), shown
            referred += bool(SAME.search(shown))
        for span in (s for s in trace.data.spans if s.span_type == "CHAT_MODEL"):
            assert (
                set(span.inputs) == {"messages", "tools"}
                and span.inputs["tools"] == ["python_exec"]
                or "tools" not in span.inputs
            )
            for m in span.inputs["messages"]:
                assert len(m["content"] or "") <= 500 + 60, m["content"][-80:]
        execs = [s for s in trace.data.spans if s.span_type == "TOOL"]
        assert not SAME.search(execs[0].inputs["code"]), "the first python_exec shows the code it ran"
    assert referred >= 30 * 3  # the coder's, tester's and debugger's inputs hold the earlier turns' texts


TRACE_TABLES = ("spans", "trace_info", "trace_tags", "trace_request_metadata", "assessments", "trace_metrics", "span_metrics")


def _trace_bytes(db: Path, tmp: Path) -> int:
    """The pages of the trace tables and their indexes, in a VACUUMed copy of `db` (SQLite's dbstat)."""
    import sqlite3

    copy = tmp / f"{db.parent.name}-vacuumed.db"
    with sqlite3.connect(db) as src:
        src.execute(f"VACUUM INTO '{copy}'")
    with sqlite3.connect(copy) as c:
        names = [n for (n,) in c.execute(f"select name from sqlite_master where tbl_name in {TRACE_TABLES}")]
        (size,) = c.execute(f"select sum(pgsize) from dbstat where name in ({','.join('?' * len(names))})", names).fetchone()
    return int(size)


def test_a_14_span_gold_trace_costs_at_most_30_kb_of_store(traced_cell: Path, mlflow_template: Path, tmp_path: Path):
    """#41: 38 KB per trace on main (the question in the root and in every turn's input, the tool call's
    code beside the python_exec's, attributes repeating the span's own fields)."""
    per_trace = (_trace_bytes(traced_cell / "outputs" / "mlflow.db", tmp_path) - _trace_bytes(mlflow_template, tmp_path)) / 30
    assert per_trace <= 30_000, f"{per_trace / 1000:.1f} KB of store per trace"


def test_which_problems_get_a_trace_failed_only_or_a_sample_by_key(tmp_path: Path, mlflow_template: Path, apps_data_dir: Path):
    from apps_bench.tracking.traces import draw

    rows = apps_data_dir / "train_mini150.jsonl"
    failed, sample = tmp_path / "failed", tmp_path / "sample"
    fresh_store(mlflow_template, failed / "outputs" / "mlflow.db")
    _run(
        failed,
        _cell_args(
            rows,
            "topology=single",
            "limit=8",
            "tracking.traces=true",
            "tracking.trace_problems=failed",
            "model.gold.wrong_fraction=0.5",
        ),
    )
    records = _records(failed)
    wrong = {r["key"] for r in records if not r["passed"]}
    assert 0 < len(wrong) < len(records) == 8
    assert sorted(t.info.tags["problem_key"] for t in _traces(failed)[1]) == sorted(wrong)

    fresh_store(mlflow_template, sample / "outputs" / "mlflow.db")
    _run(sample, _cell_args(rows, "topology=single", "limit=8", "tracking.traces=true", "tracking.trace_sample=3"))
    keys = sorted((r["key"] for r in _records(sample)), key=draw)
    assert sorted(t.info.tags["problem_key"] for t in _traces(sample)[1]) == sorted(keys[:3])


def test_a_fraction_samples_by_key_alone():
    from apps_bench.config.schema import typed_config
    from apps_bench.tracking.traces import TraceChoice, draw

    keys = [f"train/{i}" for i in range(400)]
    choice = TraceChoice.of(typed_config(compose_cell("model=gold", "tracking.trace_sample=0.25")), keys)
    chosen = [k for k in keys if choice.wants(problem_record(key=k, passed=True, error=None))]
    assert chosen == [k for k in keys if draw(k) < 0.25] and 70 <= len(chosen) <= 130


@pytest.mark.parametrize("bad", ["tracking.trace_sample=1.0", "tracking.trace_problems=wrong", "tracking.trace_text_chars=10"])
def test_a_bad_trace_setting_is_one_line_exit_2_and_nothing_written(bad: str, tmp_path: Path, apps_data_dir: Path):
    r = run_cli(
        _cell_args(apps_data_dir / "train_mini150.jsonl", "limit=1", "tracking.traces=true", bad), tmp_path, env=cli_env(tmp_path)
    )
    assert r.returncode == 2, r.stderr[-2000:]
    key = bad.split("=")[0]
    [line] = [x for x in r.stderr.splitlines() if key in x]
    assert "tracking." in line and not (tmp_path / "outputs").exists()
