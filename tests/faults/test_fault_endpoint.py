"""The model endpoint fails: a fault-injecting proxy in front of a real gold server, a real cell through the CLI.

Each selected problem's first model call gets one fault (no `choices`, a choice without its message, a body cut
short, a connection reset, an HTTP 500): every one is a failed attempt the retry policy re-sends within the cell,
so the cell finishes with every problem answered. With no retries allowed, the problems are recorded as errors
(exit 3) and the rerun, the proxy healed, answers exactly those.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli_env, run_cli
from faults.http_proxy import DyingProxy, Reply, Request

from apps_bench.models.gold import GoldServer, load_rows

pytestmark = pytest.mark.slow

FAULTS = ("no_choices", "no_message", "truncated", "reset", "http_500")


class FaultProxy(DyingProxy):
    """Forwards to `upstream`; the first model call about each problem in `plan` (problem question -> fault) gets
    that fault instead of the reply. `injected` counts what was done, `calls` every model call forwarded or not."""

    def __init__(self, upstream: str, plan: dict[str, str]) -> None:
        super().__init__(upstream, alter=self._fault)
        self.plan = dict(plan)
        self.injected: list[str] = []
        self.calls = 0

    def _fault(self, request: Request, reply: Reply) -> Reply | None:
        fault = self._fault_for(request.body) if request.path.endswith("/chat/completions") else None
        if fault == "reset":
            return None
        if fault == "http_500":
            return Reply(500, reply.headers, b'{"error": {"message": "injected burst", "code": 500}}')
        if fault in ("no_choices", "no_message"):
            obj = json.loads(reply.body)
            if fault == "no_choices":
                obj["choices"] = []
            else:
                obj["choices"][0].pop("message")
            return Reply(reply.status, reply.headers, json.dumps(obj).encode())
        if fault == "truncated":
            return Reply(reply.status, reply.headers, reply.body[: len(reply.body) // 2])
        return reply

    def _fault_for(self, body: bytes) -> str | None:
        text = body.decode("utf-8", "replace")
        with self.lock:
            self.calls += 1
            for question, fault in list(self.plan.items()):
                if question in text:
                    del self.plan[question]  # once per problem: the retry goes through
                    self.injected.append(fault)
                    return fault
        return None


def _records(cwd: Path) -> list[dict]:
    (cell,) = (cwd / "outputs" / "cells").iterdir()
    return [json.loads(line) for line in (cell / "records.jsonl").read_text().splitlines() if line.strip()]


def _cell(cwd: Path, proxy: FaultProxy, rows_file: Path, *extra: str):
    args = [
        "model=gold",
        f"model.base_url={proxy.url}/v1",
        "model.retry_backoff_s=0.01",
        "dataset=apps",
        f"dataset.path={rows_file}",
        "dataset.split=train",
        f"limit={len(FAULTS)}",
        "tracking=none",
        "progress=false",
        "allow_any_cell=true",
        *extra,
    ]
    return run_cli(args, cwd, env=cli_env(cwd))


@pytest.fixture()
def gold(apps_data_dir: Path):
    rows_file = apps_data_dir / "train_mini150.jsonl"
    rows = load_rows(str(rows_file), "train")
    server = GoldServer(rows).start()
    try:
        yield server, rows, rows_file
    finally:
        server.stop()


def _plan(rows) -> dict[str, str]:
    """One fault per selected problem (the first rows of the file, as limit= selects them)."""
    snippets = [r.question.strip().splitlines()[0][:40] for r in rows[: len(FAULTS)]]
    assert all('"' not in x and "\\" not in x for x in snippets) and len(set(snippets)) == len(FAULTS)
    return dict(zip(snippets, FAULTS))


def test_malformed_replies_resets_and_bursts_are_retried_within_the_cell(gold, tmp_path: Path):
    server, rows, rows_file = gold
    with FaultProxy(server.base_url.removesuffix("/v1"), _plan(rows)).running() as proxy:
        r = _cell(tmp_path, proxy, rows_file)
    out = r.stdout + r.stderr
    assert sorted(proxy.injected) == sorted(FAULTS), proxy.injected  # every fault reached the cell
    assert r.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    recs = _records(tmp_path)
    assert len(recs) == len({x["key"] for x in recs}) == len(FAULTS)
    assert [x["error"] for x in recs] == [None] * len(FAULTS)
    assert all(x["passed"] for x in recs)
    assert sum(int(x["usage"].get("failed_attempts") or 0) for x in recs) == len(FAULTS)  # each counted as an attempt


def test_out_of_retries_they_are_recorded_errors_the_rerun_answers(gold, tmp_path: Path):
    server, rows, rows_file = gold
    with FaultProxy(server.base_url.removesuffix("/v1"), _plan(rows)).running() as proxy:
        r = _cell(tmp_path, proxy, rows_file, "model.max_retries=0")
    assert sorted(proxy.injected) == sorted(FAULTS)
    assert r.returncode == 3, (r.stdout + r.stderr)[-3000:]  # recorded, with errors to retry
    assert "Traceback" not in r.stdout + r.stderr
    first = _records(tmp_path)
    assert len(first) == len(FAULTS) and all(x["error"] for x in first)
    with FaultProxy(server.base_url.removesuffix("/v1"), {}).running() as healed:
        again = _cell(tmp_path, healed, rows_file, "model.max_retries=0")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    recs = _records(tmp_path)  # the errors' records were dropped for the rerun's answers
    assert len(recs) == len({x["key"] for x in recs}) == len(FAULTS)
    assert all(x["error"] is None and x["passed"] for x in recs)
