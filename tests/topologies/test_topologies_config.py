"""Topology configs, role lists, prompt sets and the registry, composed through real Hydra."""

from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path

import pytest
from conftest import CONF_DIR, compose_cell
from omegaconf import OmegaConf

from apps_bench.config.schema import TopologyConfig, typed
from apps_bench.models.clients import MissingFrameworkError
from apps_bench.topologies.prompts import TopologyConfigError, declared_roles, load_prompts, roles_for
from apps_bench.topologies.registry import get_topology

RUNNERS = sorted(p.stem for p in (CONF_DIR / "topology").glob("*.yaml"))  # every shipped topology

CONF = Path(__file__).resolve().parents[2] / "conf"
LANGGRAPH = ["single", "independent", "sequential_langgraph", "centralized_langgraph", "decentralized_langgraph"]
SIBLINGS = {
    "sequential": ("sequential_langgraph", "sequential_crewai"),
    "centralized": ("centralized_langgraph", "centralized_autogen"),
    "decentralized": ("decentralized_langgraph", "decentralized_openai"),
}


@functools.cache
def _composed(name: str, overrides: tuple[str, ...]):
    return compose_cell(f"topology={name}", "allow_any_cell=true", *overrides).topology


def topology(name: str, *overrides: str):
    """The composed topology node (a fresh copy: tests may not share mutations)."""
    return copy.deepcopy(_composed(name, overrides))


def with_file(t, path, size: int | None = None):
    t = with_size(t, size) if size else copy.deepcopy(t)
    t.prompt_file = str(path)
    return t


def with_size(t, size: int):
    t = copy.deepcopy(t)
    t.team_size = size
    return t


@pytest.mark.parametrize("name", RUNNERS)
def test_every_topology_composes_with_prompts_for_every_team_size(name):
    t = topology(name)
    assert t.name == name and t.framework == _runner_class(t).framework
    sizes = [1] if name == "single" else [2, 4, 8, 10]
    assert sorted(int(k) for k in t.roles_by_size) == sizes
    for size in sizes:
        t2 = with_size(t, size)
        roles = roles_for(t2)
        assert len(roles) == size
        prompts = load_prompts(t2)
        for role in set(roles):
            if role in ("analyzer", "requirements", "algorithm_designer", "complexity_analyst", "manager"):
                continue
            # every role that can be final says how to end: one fenced python block
            assert "```python" in prompts[role], (name, role)
    if t.flow in ("sequential",):
        for size in sizes:
            assert roles_for(t, size)[-1] == "debugger"  # the final stage ends with a program
    if t.flow == "centralized":
        assert all(roles_for(t, s)[0] == "manager" for s in sizes)
        assert "```python" in t.prompts["manager"]


@pytest.mark.parametrize("flow", sorted(SIBLINGS))
def test_framework_siblings_share_roles_prompts_and_limits(flow):
    a, b = (OmegaConf.to_container(topology(n)) for n in SIBLINGS[flow])
    for key in ("name", "framework", "_target_"):  # the runner class is the framework's
        assert a.pop(key) != b.pop(key)
    assert a == b  # everything else identical: the difference measures the framework


def test_team_size_without_roles_is_a_clear_error():
    t = topology("sequential_langgraph", "topology.team_size=6")
    with pytest.raises(TopologyConfigError, match=r"no role list for team_size=6; available sizes: \[2, 4, 8, 10\]"):
        roles_for(t)


def test_prompt_override_from_command_line():
    t = topology("single", "topology.prompts.solver=Just solve it.")
    assert load_prompts(t)["solver"] == "Just solve it."


def test_prompt_file_yaml_and_json(tmp_path):
    base = topology("sequential_langgraph")
    f = tmp_path / "p.yaml"
    f.write_text("coder: |\n  Write code.\ndebugger: Fix code.\n")
    ps = load_prompts(with_file(topology("sequential_langgraph"), f, 2))
    assert ps["coder"] == "Write code.\n" and ps["debugger"] == "Fix code."
    j = tmp_path / "p.json"
    j.write_text(json.dumps({"prompts": {"coder": "c", "debugger": "d", "tester": "t"}}))
    ps = load_prompts(with_file(topology("sequential_langgraph"), j, 2))
    assert ps["tester"] == "t"
    assert set(base.prompts) == set(declared_roles(base))


def test_prompt_file_missing_and_extra_roles(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("coder: c\n")
    with pytest.raises(TopologyConfigError, match=r"lacks prompts for roles \['debugger'\]"):
        load_prompts(with_file(topology("sequential_langgraph"), f, 2))
    f.write_text("coder: c\ndebugger: d\ncodr: typo\n")
    with pytest.raises(TopologyConfigError, match=r"roles \['codr'\] that topology 'sequential_langgraph' does not have"):
        load_prompts(with_file(topology("sequential_langgraph"), f, 2))
    with pytest.raises(TopologyConfigError, match="not found"):
        load_prompts(with_file(topology("single"), tmp_path / "nope.yaml"))
    f.write_text("- just\n- a list\n")
    with pytest.raises(TopologyConfigError, match="must map role names"):
        load_prompts(with_file(topology("single"), f))


def _runner_class(t: TopologyConfig) -> type:
    import importlib

    module, _, cls = t._target_.rpartition(".")
    return getattr(importlib.import_module(module), cls)


def test_registry_builds_runners_and_rejects_unknown_names():
    for name in LANGGRAPH:
        runner = get_topology(topology(name))
        assert runner.name == name and runner.framework == "langgraph"
    # a topology is its YAML: a new one names its runner class, no table to edit
    star = topology("single")
    star.name = "star"
    assert type(get_topology(star)).__name__ == "SingleTopology" and get_topology(star).name == "star"
    for target, why in (
        ("apps_bench.topologies.nowhere.Star", "not in this install"),
        ("apps_bench.topologies.single.Star", "has no 'Star'"),
    ):
        star._target_ = target
        with pytest.raises(TopologyConfigError, match=why) as err:
            get_topology(star)
        assert "topology._target_" in str(err.value)
    crew = topology("single")
    crew.framework = "crewai"
    with pytest.raises(TopologyConfigError, match="runs on langgraph"):
        get_topology(crew)


@pytest.mark.parametrize(
    "name, module, command",
    [
        ("sequential_crewai", "crewai", "pip install 'apps-bench[crewai]'"),
        ("centralized_autogen", "autogen_agentchat", "pip install 'apps-bench[autogen]'"),
        ("single", "langgraph", "pip install apps-bench"),
    ],
)
def test_missing_framework_names_the_install_command(monkeypatch, name, module, command):
    cfg = topology(name)
    for mod in list(sys.modules):
        if mod == module or mod.startswith(module + "."):
            monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, module, None)  # what Python does for a package that is absent
    with pytest.raises(MissingFrameworkError) as err:
        get_topology(cfg)
    assert command in str(err.value) and name in str(err.value)


def test_a_missing_dependency_of_the_project_is_not_called_a_missing_framework(monkeypatch):
    """The first problem's warm-up imports (FIRST_PROBLEM: our own HTTP stack) are the project's
    dependencies: one that is missing says so, instead of "the langgraph framework is not installed"."""
    monkeypatch.setitem(sys.modules, "truststore", None)
    with pytest.raises(ImportError) as err:
        get_topology(topology("single"))
    assert not isinstance(err.value, MissingFrameworkError) and "truststore" in str(err.value)


def test_plain_dict_config_is_typed():
    t = OmegaConf.to_container(topology("single"))
    topo = typed(TopologyConfig, t)
    assert topo.max_steps == t["max_steps"] and list(topo.tool_roles) == ["solver"]
    t["max_steps"] = "many"
    with pytest.raises(Exception, match="max_steps"):
        typed(TopologyConfig, t)
    assert OmegaConf.structured(TopologyConfig)  # schema importable without frameworks


def test_no_topology_key_has_a_code_default():
    """The YAML is the only place a topology's settings come from: a key it leaves out is refused, named."""
    from omegaconf.errors import MissingMandatoryValue

    t = OmegaConf.to_container(topology("single"))
    assert t["prompt_file"] is None  # set (to null) by the YAML itself
    del t["prompt_file"]
    with pytest.raises(MissingMandatoryValue, match="prompt_file"):
        typed(TopologyConfig, t)
