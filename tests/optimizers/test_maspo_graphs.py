"""MASPO's agent graph for every topology config the house ships, at every team size."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose_cell

from apps_bench.optimizers.maspo import graph_for

CONF = Path(__file__).resolve().parents[2] / "conf"
TOPOLOGIES = [
    "single",
    "independent",
    "sequential_langgraph",
    "sequential_crewai",
    "centralized_langgraph",
    "centralized_autogen",
    "decentralized_langgraph",
    "decentralized_openai",
]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_topology_maps_to_a_graph_over_its_prompt_set(topology):
    from apps_bench.topologies.prompts import load_prompts, roles_for

    sizes = [None] if topology == "single" else [4, 10]  # the default team and the largest (specialist roles)
    for size in sizes:
        over = ["allow_any_cell=true", f"topology={topology}"] + ([f"topology.team_size={size}"] if size else [])
        cfg = compose_cell(*over)
        roles = roles_for(cfg.topology)
        g = graph_for(str(cfg.topology.flow), roles)
        texts = load_prompts(cfg.topology).texts
        assert set(g.agents) <= set(texts)  # every agent has a prompt to optimize
        flow = str(cfg.topology.flow)
        if flow == "sequential":
            assert g.agents == tuple(roles) and g.partial_rerun and g.successors(roles[-1]) == ()
            assert all(g.successors(a) == (b,) for a, b in zip(roles, roles[1:]))
        elif flow == "centralized":
            assert g.agents[-1] == "manager" and not g.partial_rerun
            assert set(g.predecessors("manager")) == set(g.agents[:-1])
        elif flow in ("independent", "decentralized"):
            assert len(g.agents) == 1 and g.successors(g.agents[0]) == ("vote",) and not g.partial_rerun
        else:
            assert g.agents == ("solver",)
