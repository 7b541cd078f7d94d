"""The Ray launcher's checks that need no cluster: what a cell asks, whether a node can hold it,
and what reaches ray.init (apps_bench/launchers/ray_cluster.py; the real cluster: test_ray_sweep.py)."""

from __future__ import annotations

import pytest

from apps_bench.cell.cpus import ray_cpus
from apps_bench.launchers.ray_cluster import _init_kwargs, alive_nodes, demand, infeasible

NODES = [
    {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 2.0, "memory": 8e9, "node:10.0.0.1": 1.0}},
    {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 16.0, "GPU": 1.0, "memory": 6.4e10}},
    {"Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 128.0, "GPU": 8.0}},
]


def test_demand_uses_rays_names_and_its_one_cpu_default() -> None:
    assert demand({}) == {"CPU": 1.0}
    assert demand({"num_cpus": None, "max_calls": 1}) == {"CPU": 1.0}
    assert demand({"num_cpus": 0}) == {}
    assert demand({"num_cpus": 4, "num_gpus": 1, "memory": 2**30, "resources": {"vllm": 1}}) == {
        "CPU": 4.0,
        "GPU": 1.0,
        "memory": float(2**30),
        "vllm": 1.0,
    }


def test_a_dead_node_holds_nothing() -> None:
    nodes = alive_nodes(NODES)
    assert [n.address for n in nodes] == ["10.0.0.1", "10.0.0.2"]
    assert infeasible({"CPU": 16.0, "GPU": 1.0}, nodes) is None
    why = infeasible({"CPU": 64.0}, nodes)
    assert why is not None and "the largest of its 2 node(s) (10.0.0.2) has CPU=16" in why
    assert "Fix: hydra.launcher.ray.remote.num_cpus=16 (or fewer)" in why


def test_infeasible_names_the_request_and_every_fix() -> None:
    why = infeasible({"CPU": 4.0, "GPU": 2.0}, alive_nodes(NODES))
    assert why is not None
    assert "each cell asks CPU=4, GPU=2 (hydra.launcher.ray.remote)" in why
    assert "hydra.launcher.ray.remote.num_gpus=1" in why and "num_cpus" not in why  # 16 CPUs are enough
    assert infeasible({"CPU": 1.0, "GPU": 1.0}, alive_nodes(NODES[:1])) is not None
    assert "num_gpus=0" in infeasible({"CPU": 1.0, "GPU": 1.0}, alive_nodes(NODES[:1]))
    assert "no live node" in infeasible({"CPU": 1.0}, [])


def test_unset_init_settings_are_not_passed_to_ray() -> None:
    """Joining a running cluster, Ray refuses object_store_memory (and other node settings):
    a null in the preset or an override must leave it out; address stays (null = start one)."""
    kw = _init_kwargs(
        {
            "address": None,
            "object_store_memory": None,
            "num_cpus": None,
            "runtime_env": {"env_vars": {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5055", "APPS_BENCH_PARENT_RUN_ID": "", "N": 3}},
        }
    )
    assert kw == {
        "address": None,
        "runtime_env": {"env_vars": {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5055", "APPS_BENCH_PARENT_RUN_ID": "", "N": "3"}},
    }


def test_asking_for_a_tasks_cpus_outside_ray_starts_no_ray() -> None:
    """Cells size themselves by usable_cpus(), which asks Ray only inside a Ray worker: Ray's
    get_runtime_context() starts a local Ray (and turns on token auth) when none runs."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (.ci/run installs it)")
    assert ray_cpus() is None
    assert not ray.is_initialized()
