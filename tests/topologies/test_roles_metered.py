"""Every runner records which agent role made each model call, measured at the transport.

Each runner solves a real APPS row through the pipeline's solve step (`solving.solve_problem`:
real framework, metered clients, the real sandbox) against the gold server on loopback. The
server says which role sent each request: the role whose prompt the request's system message
carries. Checked per runner: every
call entry names a role, the per-role calls and tokens add up exactly to the problem's totals,
and they equal, role by role, what the server answered each role. Sibling runners of one flow
record the same role names (AutoGen's selector model is never asked: the delegation names the worker).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CONF = Path(__file__).resolve().parents[2] / "apps_bench" / "conf"
ROW = "1"  # a train_mini150 stdin row whose reference solution passes
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
SIBLINGS = (
    ("sequential_langgraph", "sequential_crewai"),
    ("centralized_langgraph", "centralized_autogen"),
    ("decentralized_langgraph", "decentralized_openai"),
)


@functools.cache
def _compose(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from apps_bench.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
            return compose("config", overrides=["allow_any_cell=true", *overrides])
    finally:
        GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def problem(apps_data_dir):
    from apps_bench.data import load_problems

    ds = _compose(("dataset=apps_train", f"dataset.path={apps_data_dir / 'train_mini150.jsonl'}")).dataset
    [p] = load_problems(ds, only=(ROW,)).problems
    return p


def _server_role(request: dict, prompts: dict[str, str]) -> str:
    """The role that sent `request`, as the server sees it: whose prompt is in its system message."""
    system = "\n".join(str(m.get("content") or "") for m in request["messages"] if m.get("role") == "system")
    found = [role for role, text in prompts.items() if text.strip() in system]
    assert found, f"a request with no role prompt: {system[:300]!r}"
    assert len(found) == 1, f"the system message holds the prompts of {found}"
    return found[0]


def _solve(topology: str, problem, pool) -> tuple:
    """-> (usage, transcript roles, per-role (calls, prompt, completion) the server answered)."""
    from apps_bench.cell.solving import solve_problem
    from apps_bench.models import open_endpoint
    from apps_bench.topologies.registry import get_topology

    cfg = copy.deepcopy(_compose((f"topology={topology}", "model=gold")))
    runner = get_topology(cfg.topology)
    prompts = {str(k): str(v) for k, v in cfg.topology.prompts.items()}
    with open_endpoint(cfg.model, [problem]) as ep:
        solved = asyncio.run(solve_problem(problem, cfg=cfg, topology=runner, endpoint=ep, pool=pool, seed=0))
        stats = ep.server.stats
        assert solved.error is None and solved.attempt is not None, solved.error
        assert stats.replies == solved.usage.model_calls <= len(stats.last_requests)  # all of them in the window
        served: dict[str, list[int]] = {}
        for request, reply in zip(stats.last_requests, stats.last_replies):
            s = served.setdefault(_server_role(request, prompts), [0, 0, 0])
            s[0] += 1
            s[1] += reply["prompt_tokens"]
            s[2] += reply["completion_tokens"]
    transcript_roles = {e["role"] for e in solved.transcript if e["role"] != "team"}
    return solved.usage, transcript_roles, {k: tuple(v) for k, v in served.items()}


@pytest.fixture(scope="module")
def solved(problem, pool) -> dict:
    return {t: _solve(t, problem, pool) for t in RUNNERS}


@pytest.mark.parametrize("topology", RUNNERS)
def test_every_call_names_its_role_and_the_roles_sum_to_the_totals(solved, topology):
    usage, transcript_roles, served = solved[topology]
    assert usage.calls and all(c.get("role") for c in usage.calls), usage.calls
    by_role: dict[str, list[int]] = {}
    for c in usage.calls:
        r = by_role.setdefault(c["role"], [0, 0, 0])
        r[0] += 1
        r[1] += c["prompt_tokens"]
        r[2] += c["completion_tokens"]
    assert sum(r[0] for r in by_role.values()) == usage.model_calls
    assert sum(r[1] for r in by_role.values()) == usage.prompt_tokens
    assert sum(r[2] for r in by_role.values()) == usage.completion_tokens
    # role by role, what the server answered each role's requests
    assert {k: tuple(v) for k, v in by_role.items()} == served
    # the transcript's role names: every call is an agent's
    assert set(by_role) == transcript_roles


@pytest.mark.parametrize("a, b", SIBLINGS)
def test_sibling_runners_record_the_same_roles(solved, a, b):
    roles_a = {c["role"] for c in solved[a][0].calls}
    roles_b = {c["role"] for c in solved[b][0].calls}
    assert roles_a == roles_b and len(roles_a) >= 1
    # a multi-agent flow: more than one role, or (the debate) one role played by several agents
    assert len(roles_a) > 1 or Counter(c["role"] for c in solved[a][0].calls).most_common(1)[0][1] > 1


def test_records_carry_the_role_per_call(solved):
    """What lands in records.jsonl (types.UsageRecord) keeps each call's role."""
    from apps_bench.types import UsageRecord

    usage = solved["sequential_crewai"][0]
    rec = json.loads(json.dumps(UsageRecord.of(usage).to_json()))
    assert [c["role"] for c in rec["calls"]] == [c["role"] for c in usage.calls]
    assert set(rec["calls"][0]) == {"prompt_tokens", "completion_tokens", "finish_reason", "retries", "tools", "role"}
