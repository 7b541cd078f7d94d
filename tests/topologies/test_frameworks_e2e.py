"""End to end: the CrewAI, AutoGen and OpenAI-SDK runners through their real frameworks.

Each runner is built from its real Hydra config (registry.get_topology), talks to the
gold server over loopback HTTP through the metered ModelClients, runs python_exec in
the real SandboxPool, and its submissions are judged by the real Judge on real APPS
rows. Checked: the gold pass rate is reached, the transcript/usage show the flow
(stage order; manager after every worker with one delegation per worker; N x R debate
calls, concurrent within a round), and the usage counted at the HTTP layer equals what
the server says it served.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import compose_cell

from apps_bench.types import Usage

CONF = Path(__file__).resolve().parents[2] / "apps_bench" / "conf"
IDS = ("8", "9", "4655")  # real APPS test rows whose reference solutions pass strictly


@functools.cache
def compose(*overrides: str) -> Any:
    """The real Hydra composition of conf/ (cached: a composed config is only read here)."""
    return _compose(*overrides)


def _compose(*overrides: str) -> Any:
    return compose_cell(*overrides)


@pytest.fixture(scope="module")
def problems(apps_data_dir: Path) -> list:
    from apps_bench.data import load_problems

    found = []
    for name in ("test_0-49_partial.jsonl", "test_more.jsonl"):
        found += load_problems(compose("dataset=apps", f"dataset.path={apps_data_dir / name}").dataset, only=IDS).problems
    assert sorted(p.id for p in found) == sorted(IDS)
    return sorted(found, key=lambda p: IDS.index(p.id))


@pytest.fixture(scope="module")
def judge(pool):
    from apps_bench.judge import Judge
    from apps_bench.judge.profiles import judge_config

    return Judge.from_config(pool, judge_config("seed"))


@pytest.fixture(scope="module")
def gold_passes(problems, judge) -> dict[str, bool]:
    """The gold pass rate: each problem's first reference solution, judged directly."""
    out = {p.id: judge.score(p, p.solutions[0]).passed for p in problems}
    assert all(out.values()), out  # these rows were chosen because their reference passes
    return out


def _endpoint(problems, **settings: Any):

    from apps_bench.models import open_endpoint

    model_cfg = compose(*(f"model.{k}={v}" for k, v in settings.items())).model
    return model_cfg, open_endpoint(model_cfg, problems)


def solve(topology_cfg: Any, problem, ep, model_cfg, pool, seed: int = 0):
    """One problem through the runner by the one solve step a cell uses (solving.solve_problem: the
    problem's tests-free view, metered clients, python_exec); returns (attempt, server usage delta)."""
    import dataclasses

    from omegaconf import OmegaConf

    from apps_bench.cell.solving import solve_problem
    from apps_bench.config.schema import typed_config
    from apps_bench.topologies.registry import get_topology

    topology = get_topology(topology_cfg)  # imports the framework before the problem's clock starts
    cfg = dataclasses.replace(
        typed_config(compose()), topology=OmegaConf.to_object(topology_cfg), model=OmegaConf.to_object(model_cfg)
    )
    stats = ep.server.stats
    before = (stats.replies, stats.prompt_tokens, stats.completion_tokens, len(stats.seeds))
    solved = asyncio.run(solve_problem(problem, cfg=cfg, topology=topology, endpoint=ep, pool=pool, seed=seed))
    assert solved.attempt is not None, solved.error  # the runner returned (its own errors are the attempt's)
    served = {
        "replies": stats.replies - before[0],
        "prompt_tokens": stats.prompt_tokens - before[1],
        "completion_tokens": stats.completion_tokens - before[2],
        "seeds": stats.seeds[before[3] :],
    }
    return solved.attempt, served


def assert_usage_matches(attempt, served) -> None:
    u = attempt.usage
    assert u.model_calls > 0 and u.prompt_tokens > 0 and u.completion_tokens > 0
    assert u.failed_calls == 0
    assert u.model_calls == served["replies"]
    assert u.prompt_tokens == served["prompt_tokens"]
    assert u.completion_tokens == served["completion_tokens"]


def events(attempt, kind: str) -> list:
    return [e for e in attempt.transcript if e.kind == kind]


# ------------------------------------------------------------------ configs


@pytest.mark.parametrize(
    "ours, sibling",
    [
        ("sequential_crewai", "sequential_langgraph"),
        ("centralized_autogen", "centralized_langgraph"),
        ("decentralized_openai", "decentralized_langgraph"),
    ],
)
def test_sibling_configs_are_equal_but_for_name_and_framework(ours: str, sibling: str) -> None:
    from omegaconf import OmegaConf

    a = OmegaConf.to_container(compose(f"topology={ours}").topology, resolve=True)
    b = OmegaConf.to_container(compose(f"topology={sibling}").topology, resolve=True)
    assert a["name"] == ours and a["framework"] == ours.split("_")[1]
    assert a.pop("_target_") != b.pop("_target_")  # the runner class: the framework's
    for d in (a, b):
        d.pop("name"), d.pop("framework")
    assert a == b  # same roles, prompts, tool roles, team sizes, rounds and limits


# ------------------------------------------------------------------ sequential (CrewAI)


@pytest.mark.slow
def test_sequential_crewai_end_to_end(problems, pool, judge, gold_passes) -> None:
    cfg = compose("topology=sequential_crewai").topology
    stages = list(cfg.roles_by_size["4"])
    model_cfg, endpoint = _endpoint(problems)
    with endpoint as ep:
        for problem in problems:
            attempt, served = solve(cfg, problem, ep, model_cfg, pool)
            assert attempt.error is None and attempt.stop_reason == "done", attempt.transcript[-3:]
            assert judge.score(problem, attempt.program).passed == gold_passes[problem.id]
            # the stage order, each stage once, each given the earlier stages' outputs as context
            inputs = events(attempt, "input")
            assert [e.agent for e in inputs] == stages
            assert problem.question.split()[0] in inputs[0].content
            assert "context you're working with" in inputs[-1].content
            # ... and that is what CrewAI sent: the last stage's requests carry the earlier outputs
            requests = [json.dumps(r["messages"]) for r in list(ep.server.stats.last_requests)[-served["replies"] :]]
            last_stage = [r for r in requests if f"You are {stages[-1]}." in r]
            assert last_stage and all("context you're working with" in r for r in last_stage)
            assert all(r.count("Reference solution for problem") >= len(stages) - 1 for r in last_stage)
            assert [e.agent for e in events(attempt, "reply")] == stages
            assert attempt.turns == len(stages)
            # python_exec only for the tool roles (tester, debugger), run in the sandbox
            tool_roles = [s for s in stages if s in cfg.tool_roles]
            assert [e.agent for e in events(attempt, "tool_call")] == tool_roles
            assert attempt.usage.tool_calls == len(tool_roles)
            # gold: one call per stage, one more for each stage that ran the tool (ReAct Action)
            assert attempt.usage.model_calls == len(stages) + len(tool_roles)
            assert_usage_matches(attempt, served)
            assert len(set(served["seeds"])) == len(stages)  # every stage its own seed


# ------------------------------------------------------------------ centralized (AutoGen)


@pytest.mark.slow
def test_centralized_autogen_end_to_end(problems, pool, judge, gold_passes) -> None:
    cfg = compose("topology=centralized_autogen").topology
    manager, *workers = list(cfg.roles_by_size["4"])
    model_cfg, endpoint = _endpoint(problems)
    with endpoint as ep:
        for problem in problems:
            before = Counter(ep.server.stats.kinds)
            attempt, served = solve(cfg, problem, ep, model_cfg, pool)
            kinds = Counter(ep.server.stats.kinds) - before
            assert attempt.error is None and attempt.stop_reason == "done", attempt.transcript[-3:]
            assert judge.score(problem, attempt.program).passed == gold_passes[problem.id]
            # the manager speaks first, after every worker, and last; each delegation reaches its worker
            speakers = [e.agent for e in events(attempt, "input")]
            assert speakers == [manager, workers[0], manager, workers[1], manager, workers[2], manager]
            delegated = [json.loads(e.content)["args"]["worker"] for e in events(attempt, "tool_call") if e.agent == manager]
            assert delegated == workers
            assert attempt.turns == len(workers)  # delegations, as in the LangGraph sibling
            # a worker sees the problem and its instruction only (as in the LangGraph sibling),
            # not the group chat: its requests hold no other worker's message
            tester_input = next(e for e in events(attempt, "input") if e.agent == "tester")
            assert "Instruction for the tester" in tester_input.content
            requests = list(ep.server.stats.last_requests)[-served["replies"] :]
            worker_requests = [
                r for r in requests if r["messages"][0]["role"] == "system" and "delegate" not in str(r.get("tools"))
            ]
            assert len(worker_requests) == len(workers) + 1  # the tester's second call reads its tool result
            for r in worker_requests:
                assert [m["role"] for m in r["messages"][:3]] == ["system", "user", "user"]
                assert problem.question.split()[0] in r["messages"][1]["content"]
                assert r["messages"][2].get("name") == manager
                assert not any(m.get("name") in workers for m in r["messages"])
            # the worker the delegation named spoke next, as in the LangGraph sibling: the selector
            # model is never asked (a small real model's picks sent every turn back to the manager)
            assert kinds["select"] == 0
            assert not any(c["role"] == "selector" for c in attempt.usage.calls)
            assert kinds["delegate"] == len(workers)
            # only the tester runs code
            assert [e.agent for e in events(attempt, "tool_call") if e.agent != manager] == ["tester"]
            assert attempt.usage.tool_calls == 1
            assert_usage_matches(attempt, served)


@pytest.mark.slow
def test_centralized_autogen_stops_at_the_delegation_cap(problems, pool) -> None:
    cfg = compose("topology=centralized_autogen", "topology.max_turns=2").topology
    model_cfg, endpoint = _endpoint(problems[:1])
    with endpoint as ep:
        attempt, served = solve(cfg, problems[0], ep, model_cfg, pool)
    assert attempt.stop_reason == "turn_cap" and attempt.error is None
    assert attempt.turns == 2  # a third delegation was asked for and never answered: the chat hit its cap
    assert len([e for e in events(attempt, "tool_call") if e.agent == "manager"]) == 3
    assert [e.agent for e in events(attempt, "input")] == ["manager", "analyzer", "manager", "coder", "manager"]
    # no final program from the manager: the last worker program is submitted
    assert attempt.program is not None and attempt.program.strip() == problems[0].solutions[0].strip()
    assert_usage_matches(attempt, served)


# ------------------------------------------------------------------ decentralized (OpenAI SDK)


@pytest.mark.slow
def test_decentralized_openai_end_to_end(problems, pool, judge, gold_passes) -> None:
    cfg = compose("topology=decentralized_openai").topology
    n, r = int(cfg.team_size), int(cfg.rounds)
    model_cfg, endpoint = _endpoint(problems, **{"gold.latency_ms": 30})
    with endpoint as ep:
        for problem in problems:
            ep.server.stats.max_in_flight = 0
            attempt, served = solve(cfg, problem, ep, model_cfg, pool, seed=3)
            assert attempt.error is None and attempt.stop_reason == "done"
            assert judge.score(problem, attempt.program).passed == gold_passes[problem.id]
            assert attempt.rounds == r and attempt.turns == n * r
            inputs = events(attempt, "input")
            assert Counter((e.agent, e.round) for e in inputs) == Counter((f"debater_{i}", k) for i in range(n) for k in range(r))
            # later rounds show the peers' previous answers
            later = next(e for e in inputs if e.round == 1 and e.agent == "debater_0")
            assert all(f"Answer of debater_{j} from round 0" in later.content for j in range(1, n))
            # N x R turns, each a python_exec call then a final answer (gold); peers run concurrently
            assert attempt.usage.model_calls == 2 * n * r
            assert attempt.usage.tool_calls == n * r
            assert ep.server.stats.max_in_flight >= 2
            assert_usage_matches(attempt, served)
            # each agent its own seed, derived from the cell seed; agent 0 keeps it
            assert len(set(served["seeds"])) == n and 3 in served["seeds"]
            # every agent voted for the same (reference) program
            assert attempt.vote is not None and attempt.vote.group_sizes == (n,) and attempt.vote.winner == 0
            assert [c.agent for c in attempt.candidates] == [f"debater_{i}" for i in range(n)]


@pytest.mark.slow
def test_decentralized_openai_votes_over_wrong_answers(problems, pool, judge) -> None:
    """Gold's seeded wrong answers: the team submits its largest group, never a test-chosen one."""
    cfg = compose("topology=decentralized_openai", "topology.team_size=8", "topology.rounds=1").topology
    model_cfg, endpoint = _endpoint(problems[:1], **{"gold.wrong_fraction": 0.5})
    problem = problems[0]
    with endpoint as ep:
        attempt, _ = solve(cfg, problem, ep, model_cfg, pool, seed=11)
    vote = attempt.vote
    assert vote is not None and sum(vote.group_sizes) == 8
    assert len(vote.group_sizes) == 2  # the reference program and the (seed-independent) wrong one
    winner = vote.winner
    assert vote.group_sizes[winner] == max(vote.group_sizes)
    if vote.group_sizes[0] == vote.group_sizes[1]:
        assert winner == 0  # a tie goes to the group seen first
    members = set(vote.group_members[winner])
    chosen = [c for c in attempt.candidates if c.agent in members]
    assert all(c.program.strip() == attempt.program.strip() for c in chosen)
    wrong = "gold-deliberately-wrong-answer" in attempt.program
    assert judge.score(problem, attempt.program).passed is (not wrong)


# ------------------------------------------------------------------ wall clock


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["sequential_crewai", "centralized_autogen", "decentralized_openai"])
def test_wall_clock_limit_keeps_what_exists(topology: str, problems, pool) -> None:
    """A slow model and a short per-problem limit: the attempt ends with stop_reason
    time_limit, keeps the turns made so far, and submits their program. The limit falls while
    a 3 s call is unanswered, so the endpoint ran out the clock: an infrastructure error.
    (Limit = 1.5 x latency: the first turn's tool calls may take up to 1.5 s on a loaded
    machine before the limit falls; with a 0.4 s latency they did, and the limit fell
    during a tool call, which is rightly not the endpoint's fault.)"""
    cfg = compose(f"topology={topology}", "topology.time_limit_s=4.5").topology
    model_cfg, endpoint = _endpoint(problems[:1], **{"gold.latency_ms": 3000})
    with endpoint as ep:
        attempt, served = solve(cfg, problems[0], ep, model_cfg, pool)
    assert attempt.stop_reason == "time_limit" and "did not answer" in (attempt.error or ""), attempt.error
    assert any(e.kind == "note" and "limit" in e.content.lower() for e in attempt.transcript)
    replies = [e for e in attempt.transcript if e.kind == "reply" and "```python" in e.content]
    if attempt.program is not None:
        assert replies  # the submission comes from a reply that was made before the limit
    assert attempt.usage.model_calls <= served["replies"]


# ------------------------------------------------------------------ endpoint failures


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["sequential_crewai", "centralized_autogen", "decentralized_openai"])
def test_endpoint_failure_is_an_infrastructure_error(topology: str, problems, pool) -> None:
    """Every request fails (gold fault injection, no retries): the attempt carries the error
    for the record (never scored as a wrong answer), the failed calls are counted, and the
    framework's own wrapping (AutoGen re-raises agent errors as RuntimeError) does not crash the cell."""
    cfg = compose(f"topology={topology}").topology
    model_cfg, endpoint = _endpoint(problems[:1], **{"gold.fault_fraction": 1.0}, max_retries=0, request_timeout_s=1)
    with endpoint as ep:
        attempt, served = solve(cfg, problems[0], ep, model_cfg, pool)
    assert attempt.stop_reason == "error"
    assert attempt.error and attempt.error.startswith("model endpoint failed:") and "Traceback" not in attempt.error
    assert attempt.program is None
    assert attempt.usage.failed_calls >= 1 and attempt.usage.model_calls == served["replies"] == 0


# ------------------------------------------------------------------ team sizes


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 10])
@pytest.mark.parametrize("topology", ["sequential_crewai", "centralized_autogen", "decentralized_openai"])
def test_team_size_sets_the_roles(topology: str, size: int, problems, pool, judge, gold_passes) -> None:
    """team_size is a setting: the role list for that size (from config) is the flow that runs."""
    cfg = compose(f"topology={topology}", f"topology.team_size={size}").topology
    roles = list(cfg.roles_by_size[str(size)])
    problem = problems[1]
    model_cfg, endpoint = _endpoint([problem])
    with endpoint as ep:
        attempt, served = solve(cfg, problem, ep, model_cfg, pool)
    assert attempt.stop_reason == "done" and attempt.error is None
    assert judge.score(problem, attempt.program).passed == gold_passes[problem.id]
    speakers = [e.agent for e in events(attempt, "input")]
    if topology == "sequential_crewai":
        assert speakers == roles
    elif topology == "centralized_autogen":
        manager, workers = roles[0], roles[1:]
        assert speakers == [s for w in workers for s in (manager, w)] + [manager]
    else:
        assert Counter(speakers) == {f"debater_{i}": int(cfg.rounds) for i in range(size)}
    assert_usage_matches(attempt, served)


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["sequential_crewai", "centralized_autogen", "decentralized_openai"])
def test_unreachable_endpoint_is_an_infrastructure_error(topology: str, problems, pool) -> None:
    """Connection refused (CrewAI re-raises it as a builtin ConnectionError, AutoGen as a
    RuntimeError): every runner still reports the SDK's error as Attempt.error."""
    import socket

    from apps_bench.models import Endpoint

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = compose(f"topology={topology}").topology
    model_cfg = compose("model.max_retries=0", "model.request_timeout_s=2").model
    dead = Endpoint(f"http://127.0.0.1:{port}/v1", "gold", "x", "openai")
    from apps_bench.models import ModelClients
    from apps_bench.sandbox.tool import PythonExecTool
    from apps_bench.topologies.context import build_context
    from apps_bench.topologies.registry import get_topology

    runner = get_topology(cfg)
    usage = Usage()
    ctx = build_context(
        problems[0],
        cfg,
        models=ModelClients(dead, model_cfg, usage),
        tool=PythonExecTool(pool, 5.0, 1000, usage),
        seed=0,
        usage=usage,
    )
    attempt = asyncio.run(runner.solve(ctx))
    assert attempt.stop_reason == "error" and attempt.program is None
    assert attempt.error and "APIConnectionError" in attempt.error
    assert attempt.usage.failed_calls >= 1 and attempt.usage.model_calls == 0


# ------------------------------------------------------------------ step cap


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["sequential_crewai", "centralized_autogen", "decentralized_openai"])
def test_step_cap_is_recorded(topology: str, problems, pool) -> None:
    """max_steps=1: an agent that still calls python_exec when its budget is spent ends its
    turn with step_cap (gold always runs the tool first), the flow goes on, and the attempt says so."""
    cfg = compose(f"topology={topology}", "topology.max_steps=1").topology
    model_cfg, endpoint = _endpoint(problems[:1])
    with endpoint as ep:
        attempt, served = solve(cfg, problems[0], ep, model_cfg, pool)
    assert attempt.stop_reason == "step_cap" and attempt.error is None
    capped = {e.agent for e in attempt.transcript if e.kind == "note" and "step cap" in e.content}
    assert capped and capped <= set(cfg.tool_roles) | {f"debater_{i}" for i in range(int(cfg.team_size))}
    assert attempt.usage.tool_calls <= len(capped) * int(cfg.rounds)
    assert_usage_matches(attempt, served)
