"""Grouping, comparability, refusals, cost per role and framework siblings on small hand-made cells."""

from __future__ import annotations

import pytest
from conftest import problem_record

from apps_bench.report.cells import CellData, incomparable_reason, select, table_usage
from apps_bench.report.cost import cost_rows, framework_rows, role_rows
from apps_bench.report.groups import compare_to_baseline, group_cells
from apps_bench.report.plots import pareto_front
from apps_bench.report.stats import holm, mcnemar_exact
from apps_bench.tracking.cell_counts import Tally, role_uses, usage_role_calls
from apps_bench.types import UsageRecord

SEL = {
    "dataset.name": "apps",
    "dataset.revision": "r1",
    "dataset.path": "",
    "dataset.split": "test",
    "limit": "10",
    "offset": "0",
    "only": "[]",
    "difficulty": "None",
}


def _cell(
    topology: str,
    seed: int,
    passed: list[int],
    *,
    model: str = "m",
    profile: str = "seed",
    cap: str = "20",
    selection: dict | None = None,
    framework: str = "langgraph",
    flow: str = "",
    tokens: int = 100,
    calls: int = 2,
    errors: tuple[int, ...] = (),
    rules: str = "2",
) -> CellData:
    probs = [
        {
            "key": f"test/{i}",
            "id": str(i),
            "split": "test",
            "difficulty": "interview",
            "passed": bool(p),
            "error": "boom" if i in errors else "",
            "prompt_tokens": tokens - 20,
            "completion_tokens": 20,
            "total_tokens": tokens,
            "model_calls": calls,
            "tool_calls": 1,
            "latency_s": 1.0,
            "solve_s": 0.9,
            "judge_s": 0.1,
            "tool_s": 0.2,
        }
        for i, p in enumerate(passed)
    ]
    return CellData(
        dataset="apps",
        topology=topology,
        model=model,
        optimizer="none",
        seed=str(seed),
        key=f"{topology}{seed}{profile}{cap}",
        judge_profile=profile,
        max_tests_per_row=cap,
        selection=dict(selection or SEL),
        complete=True,
        source="x",
        framework=framework,
        flow=flow or topology,
        problems=probs,
        judge_rules=rules,
    )


def _counted(cell: CellData, usage: dict[str, dict], events: dict[str, list[dict]] | None = None) -> CellData:
    """The cell with the counts its records' usage (problem key -> usage) and transcripts would give."""
    tally = Tally()
    for key, u in usage.items():
        tally.add(key, UsageRecord.from_json(u))
    tally.add_transcripts({"key": k, "events": e} for k, e in (events or {}).items())
    cell.counts = tally.counts({})
    return cell


def _calls(role: str, n: int, prompt: int, completion: int) -> list[dict]:
    """`n` call entries of `role` that add up to `prompt` and `completion` tokens."""
    return [{"role": role, "prompt_tokens": prompt // n, "completion_tokens": completion // n}] * n


def _usage(calls: list[dict]) -> dict:
    return {
        "prompt_tokens": sum(c["prompt_tokens"] for c in calls),
        "completion_tokens": sum(c["completion_tokens"] for c in calls),
        "model_calls": len(calls),
        "calls": calls,
    }


def test_reasons_name_what_differs():
    a = _cell("single", 0, [1, 0, 1])
    assert incomparable_reason(a, _cell("independent", 0, [1, 1, 1])) is None
    assert "judge profiles (seed vs reference)" in incomparable_reason(a, _cell("x", 0, [1, 1, 1], profile="reference"))
    assert "test caps (max_tests_per_row 20 vs 0)" in incomparable_reason(a, _cell("x", 0, [1, 1, 1], cap="0"))
    why = incomparable_reason(a, _cell("x", 0, [1, 1, 1], selection={**SEL, "limit": "3"}))
    assert "problem selections" in why and "limit: 10 vs 3" in why
    why = incomparable_reason(a, _cell("x", 0, [1, 1, 1], rules="1"))
    assert "different judge rules (profile seed: rules 2 vs 1)" in why and "apps_bench.rescore" in why
    why = incomparable_reason(a, _cell("x", 0, [1, 1, 1], errors=(2,)))
    assert "different judged problems: 1 only in single s0" in why


def test_grid_comparison_with_holm_and_refusals():
    cells = [
        _cell("single", 0, [1, 1, 1, 1, 1, 1, 1, 1]),
        _cell("single", 1, [1, 1, 1, 1, 1, 1, 1, 0]),
        _cell("independent", 0, [0, 0, 0, 1, 1, 1, 1, 1]),
        _cell("independent", 1, [0, 0, 0, 0, 1, 1, 1, 1]),
        _cell("sequential", 0, [1, 1, 1, 1, 1, 1, 1, 0]),
        _cell("sequential", 1, [1, 1, 1, 1, 1, 1, 1, 1]),
        _cell("capped", 0, [1] * 8, cap="0"),  # another test cap: no baseline to pair with
        _cell("lonely", 5, [1] * 8),  # a seed the baseline does not have
        _cell("single", 0, [1] * 8, model="other"),
    ]
    groups = group_cells(cells)
    comps = {(c.label, c.model): c for c in compare_to_baseline(groups, "single")}
    ind, seq = comps[("independent", "m")], comps[("sequential", "m")]
    # over (problem, seed) pairs: single-only 3 (s0: p0-p2) + 4 (s1: p0-p3); independent-only 1 (s1: p7)
    assert (ind.result.a_only, ind.result.b_only) == (1, 7)
    assert ind.result.p_value == pytest.approx(mcnemar_exact(1, 7)) == pytest.approx(2 * 9 / 256)
    assert (seq.result.a_only, seq.result.b_only) == (1, 1) and seq.result.p_value == 1.0
    assert ind.result.diff == pytest.approx(9 / 16 - 15 / 16)
    p = holm([ind.result.p_value, seq.result.p_value])
    assert (ind.p_holm, seq.p_holm) == pytest.approx(tuple(p))  # one family per model: 2 comparisons (lonely refused)
    assert comps[("capped", "m")].result is None and "test caps" in comps[("capped", "m")].refused
    assert comps[("lonely", "m")].result is None and "no seed in common" in comps[("lonely", "m")].refused
    assert ("single", "other") not in comps  # the baseline itself is not compared


def test_cells_judged_under_other_rules_are_refused_and_never_pooled():
    from apps_bench.report.render import compare_table, pass_table

    cells = [
        _cell("single", 0, [1, 1, 1]),
        _cell("single", 0, [1, 0, 1], rules="1"),
        _cell("independent", 0, [0, 0, 1], rules="1"),
    ]
    groups = group_cells(cells)
    assert len(groups) == 3  # the two single cells are two groups: one per rules version
    [cmp] = compare_to_baseline([g for g in groups if g.label == "independent"], "single", all_groups=groups)
    assert cmp.result is not None  # the rules-1 baseline is there: compared with it alone
    assert cmp.pair[1].cells[0].judge_rules == "1"
    [cmp] = compare_to_baseline(group_cells([cells[0], cells[2]]), "single")
    assert cmp.result is None and "different judge rules (profile seed: rules 1 vs 2)" in cmp.refused
    text = compare_table([cmp]) + pass_table(group_cells(cells))
    assert "refused, not compared — different judge rules" in text
    # the report's header names each block once: the two rules versions are two blocks
    assert "judge seed (rules 1) · cap 20 tests" in text and "judge seed (rules 2) · cap 20 tests" in text


def test_seeds_pool_into_one_interval_and_profiles_never_pool():
    cells = [_cell("single", 0, [1, 0]), _cell("single", 1, [1, 1]), _cell("single", 0, [1, 1], profile="reference")]
    groups = group_cells(cells)
    assert len(groups) == 2
    seed = next(g for g in groups if g.comparability[3] == "seed")
    assert seed.seeds == ["0", "1"] and seed.interval.estimate == 0.75 and seed.interval.n_outcomes == 4
    assert [c.judge_profile for c in select(cells, judge="reference")] == ["reference"]


def _varied(seed: int, passed: list[int], **settings: str) -> CellData:
    """A single·m cell whose identity (its run's params) says its settings: a cell of a sweep off the axes."""
    c = _cell("single", seed, passed)
    c.identity = {
        "seed": str(seed),
        "topology.name": "single",
        "model.name": "m",
        "model.temperature": "0.0",
        "topology.prompt_file": "None",
        **settings,
    }
    c.key = "k" + "".join(sorted(settings.values())) + str(seed)
    return c


def test_cells_differing_in_a_setting_are_two_rows_never_pooled():
    from apps_bench.report.render import pass_table

    cells = [
        _varied(0, [1, 1, 1, 1]),
        _varied(1, [1, 1, 1, 0]),
        _varied(0, [0, 0, 1, 1], **{"model.temperature": "0.7"}),
        _varied(1, [0, 1, 1, 1], **{"model.temperature": "0.7"}),
    ]
    groups = group_cells(cells)
    assert [(g.settings, g.seeds, g.interval.estimate) for g in groups] == [
        ((("model.temperature", "0.0"),), ["0", "1"], 7 / 8),
        ((("model.temperature", "0.7"),), ["0", "1"], 5 / 8),
    ]
    rows = pass_table(groups).splitlines()
    assert next(x for x in rows if x.startswith("topology")).split()[:3] == ["topology", "model", "model.temperature"]
    assert [x.split()[:4] for x in rows if x.startswith("single")] == [
        ["single", "m", "0.0", "0.875"],
        ["single", "m", "0.7", "0.625"],
    ]


def test_a_comparison_along_a_setting_pairs_cells_that_differ_only_there():
    from apps_bench.report.groups import Baseline

    cells = [
        _varied(0, [1, 1, 1, 1]),
        _varied(0, [0, 1, 1, 1], **{"model.temperature": "0.7"}),
        _varied(0, [0, 0, 1, 1], **{"model.temperature": "0.7", "model.top_p": "0.5"}),
    ]
    comps = {c.settings: c for c in compare_to_baseline(group_cells(cells), Baseline("model.temperature", "0"))}
    near = comps[(("model.temperature", "0.7"), ("model.top_p", "(unset)"))]
    assert near.pair is not None and near.pair[1].cells[0] is cells[0] and near.result.diff == pytest.approx(-0.25)
    assert near.baseline == "model.temperature=0"
    far = comps[(("model.temperature", "0.7"), ("model.top_p", "0.5"))]  # differs in top_p too: no baseline
    assert far.result is None and "differs from it only in model.temperature" in far.refused


def test_two_cells_the_report_cannot_tell_apart_are_refused():
    from apps_bench.report.cells import ReportError

    a, b = _varied(0, [1, 1]), _varied(0, [0, 0])
    b.key, b.source = "other", "run-b"
    with pytest.raises(
        ReportError, match=r"cannot tell apart 2 cells labelled single · m s0 \(x \[key k0\], run-b \[key other\]\)"
    ):
        group_cells([a, b])


def test_a_prompt_file_is_shown_by_its_name_and_its_digest_left_out():
    from apps_bench.report.cells import setting_columns, setting_values

    idents = [{"topology.prompt_file": f"/data/{n}.yaml", "topology.prompt_file_sha256": n * 4} for n in ("a", "b")]
    keys = setting_columns([("single", i) for i in idents])
    assert keys == ["topology.prompt_file"] and setting_values(idents, keys) == [("a.yaml",), ("b.yaml",)]
    same = [{"topology.prompt_file": "/d/p.yaml", "topology.prompt_file_sha256": x} for x in ("1111", "2222")]
    keys = setting_columns([("single", i) for i in same])  # one file, edited between two cells: its digest tells them apart
    assert keys == ["topology.prompt_file_sha256"]
    two = [{"topology.prompt_file": f"/d{n}/p.yaml"} for n in (1, 2)]  # two files of one name: the whole paths
    assert setting_values(two, ["topology.prompt_file"]) == [("/d1/p.yaml",), ("/d2/p.yaml",)]


def test_cost_per_role_sums_the_roles_of_the_calls():
    from apps_bench.report.cells import problem_row

    calls = [
        {"role": "analyzer", "prompt_tokens": 100, "completion_tokens": 10},
        {"role": "tester", "prompt_tokens": 300, "completion_tokens": 40},
        {"role": "tester", "prompt_tokens": 500, "completion_tokens": 50},
    ]
    recs = [
        problem_record(0, usage=_usage(calls)),
        problem_record(1, usage=_usage(calls[:1] + [{**calls[1], "role": "selector"}])),
    ]
    assert usage_role_calls(recs[0].usage) == {"analyzer": (1, 100, 10), "tester": (2, 800, 90)}
    c = _cell("sequential", 0, [])
    c.problems = [problem_row(r) for r in recs]
    _counted(
        c,
        {r.key: r.usage.to_json() for r in recs},
        {
            "test/0": [
                {"agent": "t", "role": "tester", "kind": "input", "content": "x"},
                {"agent": "t", "role": "tester", "kind": "tool_call", "content": "y"},
            ]
        },
    )
    rows = {r.role: r for r in role_rows(group_cells([c]))}
    assert all(r.measured for r in rows.values())
    # per problem over both problems: exact sums, not shares of characters
    assert (rows["analyzer"].calls, rows["analyzer"].tokens) == (1.0, 110.0)
    assert (rows["tester"].calls, rows["tester"].tokens) == (1.0, 890 / 2)
    assert (rows["selector"].calls, rows["selector"].tokens, rows["selector"].problems) == (0.5, 340 / 2, 1)
    assert rows["tester"].tool_calls == 1.0 and rows["tester"].turns == 1.0  # from the one transcript
    assert next(iter(rows)) == "tester"  # transcript order first
    total = sum(p["total_tokens"] for p in c.problems)
    assert sum(r.tokens for r in rows.values()) * 2 == total
    assert sum(r.calls for r in rows.values()) * 2 == sum(p["model_calls"] for p in c.problems)
    assert sum(r.token_share for r in rows.values()) == pytest.approx(1.0)
    from apps_bench.report.render import role_table

    text = role_table(list(rows.values()))
    assert "≈" not in text and "counted at the HTTP transport per role" in text


def test_records_without_call_roles_are_not_counted_as_measured():
    old = problem_record(
        0,
        usage={
            "prompt_tokens": 5,
            "completion_tokens": 1,
            "model_calls": 1,
            "calls": [{"prompt_tokens": 5, "completion_tokens": 1}],
        },
    )
    assert usage_role_calls(old.usage) is None
    short = problem_record(0, usage={"model_calls": 2, "calls": [{"role": "a", "prompt_tokens": 1}]})
    assert usage_role_calls(short.usage) is None  # entries missing: the record cannot say
    assert usage_role_calls(problem_record(0, usage={"model_calls": 0, "calls": []}).usage) == {}
    row = table_usage({"id": "0", "prompt_tokens": 5, "model_calls": 1})  # a problems.json row
    for usage, per_call in ((old.usage, True), (short.usage, True), (row, False)):
        tally = Tally()
        tally.add("test/1", UsageRecord(model_calls=0, calls=[]))
        tally.add("test/0", usage, per_call=per_call)
        assert not tally.counts({}).measured


def test_cost_per_role_apportions_exact_totals_for_old_records():
    c = _cell("sequential", 0, [1, 0], tokens=1000, calls=3)
    events = [
        {"agent": "a", "role": "analyzer", "kind": "input", "content": "x" * 100},
        {"agent": "a", "role": "analyzer", "kind": "reply", "content": "y" * 50},
        {"agent": "t", "role": "tester", "kind": "input", "content": "x" * 300},
        {"agent": "t", "role": "tester", "kind": "tool_call", "content": "z" * 50},
        {"agent": "t", "role": "tester", "kind": "tool_result", "content": "r" * 100},
        {"agent": "t", "role": "tester", "kind": "reply", "content": "y" * 100},
        {"agent": "team", "role": "team", "kind": "note", "content": "stopped"},
    ]
    uses = role_uses(events)
    assert set(uses) == {"analyzer", "tester"}
    assert (uses["tester"].steps, uses["tester"].tool_calls, uses["tester"].turns) == (2, 1, 1)
    # records from before calls carried roles: no per-call entries
    _counted(
        c,
        {p["key"]: {k: p[k] for k in ("prompt_tokens", "completion_tokens", "model_calls")} for p in c.problems},
        {"test/0": events, "test/1": events},
    )
    rows = {r.role: r for r in role_rows(group_cells([c]))}
    # prompt 980 split 100:400 by characters given, completion 20 split 50:150 by characters produced
    assert rows["analyzer"].tokens == pytest.approx(980 * 100 / 500 + 20 * 50 / 200)
    assert rows["tester"].tokens == pytest.approx(980 * 400 / 500 + 20 * 150 / 200)
    assert rows["analyzer"].calls == pytest.approx(1.0) and rows["tester"].calls == pytest.approx(2.0)
    assert sum(r.token_share for r in rows.values()) == pytest.approx(1.0)
    assert not any(r.measured for r in rows.values())
    from apps_bench.report.render import role_table

    text = role_table(list(rows.values()))
    assert "≈" in text.split("\n")[3] and "estimated, for records from before calls named their role" in text
    [cost] = cost_rows(group_cells([c]))
    assert (cost.tokens_per_problem, cost.tokens_per_solved, cost.calls_per_problem) == (1000, 2000, 3)


def test_framework_row_pairs_siblings_of_one_flow():
    cells = [
        _cell("sequential_langgraph", 0, [1, 1], flow="sequential", tokens=1000, calls=4),
        _cell("sequential_crewai", 0, [1, 0], flow="sequential", framework="crewai", tokens=1500, calls=5),
        _cell("single", 0, [1, 1], flow="single"),
    ]
    groups = group_cells(cells)
    [row] = framework_rows(groups, cost_rows(groups))
    assert (row.flow, row.base, row.other) == ("sequential", "langgraph", "crewai")
    assert row.tokens == (1000, 1500) and row.calls == (4, 5) and row.pass_at_1 == (1.0, 0.5)
    assert row.roles == ()  # no roles given (or estimated ones): no per-role split
    # counted per role on both sides: role by role, a role only one side has is 0 on the other
    per_call = [_usage(_calls("coder", 4, 900, 100)), _usage(_calls("coder", 4, 1000, 100) + _calls("selector", 1, 350, 50))]
    for cell, usage in zip(cells, per_call):
        _counted(cell, {p["key"]: usage for p in cell.problems})
    roles = role_rows(groups)
    [row] = framework_rows(groups, cost_rows(groups), roles)
    assert row.roles == (("coder", (1000, 1100), (4, 4)), ("selector", (0.0, 400), (0.0, 1)))
    from apps_bench.report.render import framework_table

    text = framework_table([row])
    line = next(x for x in text.splitlines() if "selector" in x)
    assert line.split() == [
        "sequential",
        "m",
        "crewai",
        "vs",
        "langgraph",
        "selector",
        "400",
        "vs",
        "0",
        "+400",
        "1.00",
        "vs",
        "0.00",
        "+1.00",
    ]
    no_roles = {"prompt_tokens": 1480, "completion_tokens": 20, "model_calls": 5}  # one side estimated: no per-role comparison
    _counted(cells[1], {"test/0": no_roles, "test/1": per_call[1]})
    [row] = framework_rows(group_cells(cells), cost_rows(group_cells(cells)), role_rows(group_cells(cells)))
    assert row.roles == ()


def test_pareto_front():
    pts = [(100, 0.5), (200, 0.7), (150, 0.4), (300, 0.7), (50, 0.2)]
    assert pareto_front(pts) == [4, 0, 1]
