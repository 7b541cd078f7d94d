"""MASPO's update rules against a deterministic synthetic world.

World: a prompt's quality is q(text) = count("+") - count("-"). A child beats its parent
on a problem when its quality is higher (tie 0.5). A "~" in the child is a trap: it wins
locally but loses downstream (lookahead and global) on even-numbered problems.
The proposer returns [text + "+", text + "-"]: the first child always wins
(reward 1.0 -> +0.5), the second always loses (reward 0.0 -> replaced by its parent).
Every expected number below is computed by hand from these rules.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pytest
from conftest import optimizer_params

from apps_bench.optimizers.cache import Checkpoints
from apps_bench.optimizers.maspo import (
    AgentGraph,
    Comparison,
    Maspo,
    MaspoConfig,
    Node,
    ProblemComparison,
    estimate_rollouts,
    graph_for,
    plan,
    top_k,
)
from apps_bench.optimizers.protocol import Budget, BudgetExhausted, ProblemKey
from apps_bench.optimizers.scoring import Rollout

KEYS = [("train", str(i)) for i in range(20)]


def q(text: str) -> int:
    return text.count("+") - text.count("-")


def win(a: float, b: float) -> float:
    return 1.0 if a > b else 0.0 if a < b else 0.5


class World:
    def __init__(self) -> None:
        self.runs: list[tuple[dict[str, str], list[ProblemKey]]] = []
        self.compares: list[tuple[str, dict[str, str], dict[str, str], list[ProblemKey]]] = []

    def run(self, prompts: Mapping[str, str], keys: Sequence[ProblemKey]) -> list[Rollout]:
        self.runs.append((dict(prompts), list(keys)))
        return [Rollout(key=k, seed=0, passed=q(prompts[next(iter(prompts))]) > 2) for k in keys]

    def compare(self, agent, parent, child, keys, parent_rollouts) -> Comparison:
        assert [r.key for r in parent_rollouts] == list(keys), "parent rollouts must be on the same minibatch"
        self.compares.append((agent, dict(parent), dict(child), list(keys)))
        out = []
        for k in keys:
            local = win(q(child[agent]), q(parent[agent]))
            down = 0.0 if ("~" in child[agent] and int(k[1]) % 2 == 0) else local
            out.append(ProblemComparison(k, local, down, down))
        return Comparison(tuple(out))


def plus_minus(agent: str, text: str, rollouts: Sequence[Rollout]) -> list[str]:
    return [text + "+", text + "-"]


def cfg(**kw) -> MaspoConfig:
    """conf/optimizer/maspo.yaml's settings with the small search these tests run."""
    return MaspoConfig.of(optimizer_params("maspo", **{"K": 2, "Ksub": 2, "T": 2, "D": 1, "minibatch": 4, "seed": 7, **kw}))


def beam(m: Maspo, agent: str) -> list[tuple[str, float]]:
    return [(n.text, round(n.score, 9)) for n in m.beams[agent]]


def test_one_step_replaces_losing_child_with_parent_and_writes_best():
    w = World()
    m = Maspo(AgentGraph(("a",)), {"a": "s"}, w, plus_minus, KEYS, cfg())
    m.step("a")
    # s+ wins (reward 1.0 -> 0 + 0.5), s- loses -> a copy of s with score 0
    assert beam(m, "a") == [("s+", 0.5), ("s", 0.0)]
    assert m.prompts["a"] == "s+" and m.best_score["a"] == 0.5
    assert len(w.runs) == 1 and len(w.compares) == 2


def test_two_steps_cumulative_scores_and_dedup():
    w = World()
    m = Maspo(AgentGraph(("a",)), {"a": "s"}, w, plus_minus, KEYS, cfg())
    m.step("a")
    m.step("a")
    # node s+ (0.5): s++ -> 1.0, s+- loses -> copy s+ (0.5); node s (0): s+ -> 0.5, s- -> copy s (0)
    # candidates [s++ 1.0, s+ 0.5, s+ 0.5, s 0.0] -> top 2 deduplicated
    assert beam(m, "a") == [("s++", 1.0), ("s+", 0.5)]
    assert m.prompts["a"] == "s++" and m.best_score["a"] == 1.0
    # one run per beam node, Ksub comparisons per node: step 1 had 1 node, step 2 had 2
    assert len(w.runs) == 3 and len(w.compares) == 6
    # every comparison pits a child against its own parent on the parent's minibatch
    for (_, parent, child, keys), (run_prompts, run_keys) in zip(w.compares[2:], [w.runs[1]] * 2 + [w.runs[2]] * 2):
        assert parent == run_prompts and keys == run_keys
        assert child["a"] in (parent["a"] + "+", parent["a"] + "-")


def test_reward_weights_and_step_score_with_partial_wins():
    w = World()

    def trap(agent, text, rollouts):
        return [text + "~+"]

    m = Maspo(AgentGraph(("a",)), {"a": "s"}, w, trap, KEYS, cfg(Ksub=1))
    m.step("a")
    keys = w.compares[0][3]
    assert keys == [("train", "10"), ("train", "4"), ("train", "12"), ("train", "1")]  # Random(7) draw
    # local 1.0 everywhere; downstream lost on the 3 even problems: lookahead = global = 0.25
    ev = [e for e in m.events if e["kind"] == "child"][0]
    assert (ev["local"], ev["lookahead"], ev["global_"]) == (1.0, 0.25, 0.25)
    assert ev["reward"] == pytest.approx(0.4 * 1.0 + 0.4 * 0.25 + 0.2 * 0.25)  # 0.55 > 0.5: a win
    assert ev["won"] and ev["score"] == pytest.approx(0.05)
    assert beam(m, "a") == [("s~+", 0.05)] and m.prompts["a"] == "s~+"
    # won locally, lost downstream: mined in order, at most 3 kept
    assert m.hard["a"] == [("train", "10"), ("train", "4"), ("train", "12")]


def test_exact_tie_is_not_a_win():
    class TieWorld(World):
        def compare(self, agent, parent, child, keys, parent_rollouts):
            return Comparison(tuple(ProblemComparison(k, 0.5, 0.5, 0.5) for k in keys))

    m = Maspo(AgentGraph(("a",)), {"a": "s"}, TieWorld(), plus_minus, KEYS, cfg())
    m.step("a")
    assert beam(m, "a") == [("s", 0.0)] and m.prompts["a"] == "s"


def test_misaligned_cases_are_injected_first_into_successor_minibatches():
    w = World()

    def propose(agent, text, rollouts):
        return [text + "~+"] if agent == "a" else [text + "+"]

    g = graph_for("sequential", ["a", "b"])
    m = Maspo(g, {"a": "x", "b": "y"}, w, propose, KEYS, cfg(T=1, K=1, Ksub=1, minibatch=5, hard_cases=3))
    m.step("a")
    hard = list(m.hard["a"])
    assert hard and len(hard) <= 3 and all(int(k[1]) % 2 == 0 for k in hard)
    m.step("b")
    b_keys = w.runs[-1][1]
    assert b_keys[: len(hard)] == hard
    assert len(set(b_keys)) == len(b_keys) == 5
    # an agent never receives its own mined cases: a has no predecessor
    assert all(k not in m.draw_minibatch("a")[:0] for k in hard) and g.predecessors("a") == ()


def test_hard_case_memory_keeps_three_most_recent_distinct():
    m = Maspo(AgentGraph(("a",)), {"a": "s"}, World(), plus_minus, KEYS, cfg())
    m._mine("a", [KEYS[0], KEYS[2]])
    m._mine("a", [KEYS[4], KEYS[0], KEYS[6]])
    assert m.hard["a"] == [KEYS[4], KEYS[0], KEYS[6]]


def test_coordinate_ascent_visiting_order_and_others_held_at_best():
    w = World()
    g = graph_for("sequential", ["a", "b", "c"])
    m = Maspo(g, {"a": "A", "b": "B", "c": "C"}, w, plus_minus, KEYS, cfg(D=2, T=2))
    res = m.run()
    assert res.visits == [
        ("step", 0, "a", 0),
        ("step", 0, "a", 1),
        ("step", 0, "b", 0),
        ("step", 0, "b", 1),
        ("step", 0, "c", 0),
        ("step", 0, "c", 1),
        ("refresh", 1, "a"),
        ("step", 1, "a", 0),
        ("step", 1, "a", 1),
        ("refresh", 1, "b"),
        ("step", 1, "b", 0),
        ("step", 1, "b", 1),
        ("refresh", 1, "c"),
        ("step", 1, "c", 0),
        ("step", 1, "c", 1),
    ]
    assert res.steps_done == 15 and res.stopped == "done"
    # while b is optimized, a is held at its best after its round-0 steps ("A++")
    b_compares = [c for c in w.compares if c[0] == "b"]
    assert b_compares and all(c[1]["a"] == "A++" and c[2]["a"] == "A++" for c in b_compares[:6])
    # each round adds two winning "+" per agent; refresh re-anchors the best at 0
    assert res.prompts == {"a": "A++++", "b": "B++++", "c": "C++++"}
    assert res.best_scores == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_refresh_rescores_against_best_and_reanchors():
    w = World()
    m = Maspo(AgentGraph(("a",)), {"a": "x++"}, w, plus_minus, KEYS, cfg(K=3))
    m.beams["a"] = [Node("x++", 1.0), Node("x+", 0.7), Node("x+++", 0.2)]
    m.best_score["a"] = 1.0
    m.refresh("a")
    # x+++ beats x++ everywhere: 0.7*1 + 0.3*1 - 0.5 = 0.5; x+ loses: 0.7*0 + 0.3*0 - 0.5 = -0.5
    assert beam(m, "a") == [("x+++", 0.5), ("x++", 0.0), ("x+", -0.5)]
    assert m.prompts["a"] == "x+++" and m.best_score["a"] == 0.5
    # one run of the current best on a fresh draw, one comparison per other node, against the best
    assert len(w.runs) == 1 and w.runs[0][0] == {"a": "x++"}
    assert [c[2]["a"] for c in w.compares] == ["x+", "x+++"]
    assert all(c[1]["a"] == "x++" and c[3] == w.runs[0][1] for c in w.compares)


def test_refresh_keeps_best_when_it_still_wins():
    w = World()
    m = Maspo(AgentGraph(("a",)), {"a": "x++"}, w, plus_minus, KEYS, cfg())
    m.beams["a"] = [Node("x++", 2.0), Node("x+", 1.5)]
    m.best_score["a"] = 2.0
    m.refresh("a")
    assert beam(m, "a") == [("x++", 0.0), ("x+", -0.5)]
    assert m.prompts["a"] == "x++" and m.best_score["a"] == 0.0


def test_refresh_with_single_node_beam_costs_nothing():
    w = World()
    m = Maspo(AgentGraph(("a",)), {"a": "x"}, w, plus_minus, KEYS, cfg())
    m.refresh("a")
    assert w.runs == [] and w.compares == [] and beam(m, "a") == [("x", 0.0)]


def test_top_k_dedup_keeps_highest_and_candidate_order_on_ties():
    c = [Node("p", 0.0), Node("q", 0.5), Node("p", 0.5), Node("r", 0.5)]
    assert [(n.text, n.score) for n in top_k(c, 2)] == [("q", 0.5), ("p", 0.5)]
    assert [(n.text, n.score) for n in top_k(c, 5)] == [("q", 0.5), ("p", 0.5), ("r", 0.5)]


def test_no_proposal_carries_the_node():
    m = Maspo(AgentGraph(("a",)), {"a": "s"}, World(), lambda a, t, r: [], KEYS, cfg())
    m.step("a")
    assert beam(m, "a") == [("s", 0.0)]


def test_graph_mappings():
    s = graph_for("sequential", ["analyzer", "coder", "tester", "debugger"])
    assert s.agents == ("analyzer", "coder", "tester", "debugger") and s.partial_rerun
    assert s.predecessors("coder") == ("analyzer",) and s.successors("coder") == ("tester",)
    assert s.rerun_from("tester") == ("tester", "debugger")
    one = graph_for("single", ["solver"])
    assert one.agents == ("solver",) and one.successors("solver") == ()
    for flow in ("independent", "decentralized"):
        g = graph_for(flow, ["coder"] * 4)
        assert g.agents == ("coder",) and g.successors("coder") == ("vote",) and not g.partial_rerun
        assert g.rerun_from("coder") == ("coder",)
    c = graph_for("centralized", ["manager", "analyzer", "coder", "tester"])
    assert c.agents == ("analyzer", "coder", "tester", "manager")
    assert c.predecessors("manager") == ("analyzer", "coder", "tester")
    assert c.rerun_from("analyzer") == c.agents  # whole re-runs
    with pytest.raises(ValueError, match="unknown flow"):
        graph_for("ring", ["a"])
    with pytest.raises(ValueError, match="backwards"):
        AgentGraph(("a", "b"), (("b", "a"),))


def test_plan_lowers_D_then_T_then_minibatch():
    c = MaspoConfig.of(optimizer_params("maspo"))  # K=2 Ksub=2 T=3 D=3 minibatch=10
    # per agent: (1 + (D*T - 1)*K) nodes stepped x mb x (1 + Ksub) + (D - 1) refreshes x K x mb
    assert estimate_rollouts(2, c, 3, 3, 10) == 2 * ((1 + 8 * 2) * 10 * 3 + 2 * 2 * 10) == 1100
    assert plan(2, c, None).D == 3
    p = plan(2, c, 1100)
    assert (p.D, p.T, p.minibatch, p.reductions) == (3, 3, 10, ())
    p = plan(2, c, 500)
    assert (p.D, p.T, p.minibatch, p.reductions, p.estimated_rollouts) == (1, 3, 10, ("D=2", "D=1"), 300)
    p = plan(2, c, 100)
    assert (p.D, p.T, p.minibatch, p.estimated_rollouts) == (1, 1, 10, 60)
    assert p.reductions == ("D=2", "D=1", "T=2", "T=1")
    p = plan(2, c, 50)
    assert (p.D, p.T, p.minibatch, p.estimated_rollouts, p.fits) == (1, 1, 8, 48, True)
    assert p.reductions[-2:] == ("minibatch=9", "minibatch=8")
    assert not plan(2, c, 5).fits


def test_planned_schedule_is_what_runs():
    w = World()
    budget = Budget(max_rollouts=estimate_rollouts(1, cfg(D=3, T=2), 1, 2, 4))
    m = Maspo(AgentGraph(("a",)), {"a": "s"}, w, plus_minus, KEYS, cfg(D=3, T=2), budget=budget)
    assert (m.plan.D, m.plan.T) == (1, 2)
    res = m.run()
    assert res.visits == [("step", 0, "a", 0), ("step", 0, "a", 1)]


def test_budget_exhaustion_stops_and_keeps_best_written():
    World()
    calls = {"n": 0}

    class Capped(World):
        def compare(self, *a, **k):
            calls["n"] += 1
            if calls["n"] > 3:
                raise BudgetExhausted("cap")
            return super().compare(*a, **k)

    m = Maspo(AgentGraph(("a",)), {"a": "s"}, Capped(), plus_minus, KEYS, cfg(T=5))
    res = m.run()
    assert res.stopped == "budget" and res.steps_done == 1
    # step 2 got as far as node s+ (s++ written at once) before the cap hit
    assert res.prompts["a"] == "s++"
    assert res.events[-1]["kind"] == "stopped"


def test_checkpoint_per_step(tmp_path):
    ck = Checkpoints(tmp_path / "ck")
    m = Maspo(AgentGraph(("a",)), {"a": "s"}, World(), plus_minus, KEYS, cfg(T=3), checkpoints=ck)
    res = m.run()
    assert ck.steps() == [1, 2, 3]
    last = ck.latest()
    assert last["prompts"] == res.prompts and last["item"] == ["step", 0, "a", 2]
    assert last["beams"]["a"][0] == {"text": "s+++", "score": 1.5}


def test_same_seed_same_result_and_seed_changes_draws():
    def go(seed):
        w = World()
        g = graph_for("sequential", ["a", "b"])
        res = Maspo(g, {"a": "x", "b": "y"}, w, plus_minus, KEYS, cfg(seed=seed, D=2)).run()
        return res, [r[1] for r in w.runs]

    r1, d1 = go(3)
    r2, d2 = go(3)
    r3, d3 = go(4)
    assert r1.prompts == r2.prompts and d1 == d2
    assert d1 != d3


def test_config_validation_and_params():
    c = MaspoConfig.of(optimizer_params("maspo", K=3, T=1, reward={"local": 0.5, "lookahead": 0.3, "global": 0.2}))
    assert (c.K, c.T, c.w_local, c.w_lookahead) == (3, 1, 0.5, 0.3)
    with pytest.raises(ValueError, match="sum to 1"):
        MaspoConfig.of(optimizer_params("maspo", reward={"local": 0.5}))
    with pytest.raises(ValueError, match="K must be >= 1"):
        MaspoConfig.of(optimizer_params("maspo", K=0))
    with pytest.raises(ValueError, match="seed prompts lack"):
        Maspo(AgentGraph(("a", "b")), {"a": "x"}, World(), plus_minus, KEYS, cfg())
