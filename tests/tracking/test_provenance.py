"""Provenance: what a cell ran on, as tags, and the warnings when compared cells differ."""

from __future__ import annotations

import platform

from apps_bench.tracking import provenance


def test_collect_names_the_framework_packages_and_the_interpreter():
    feats = {
        "contained": True,
        "pid_namespace": True,
        "pids_cgroup": True,
        "uid_switch": True,
        "nice": 0,
        "rlimits": ["AS", "CPU"],
        "workers": 2,
    }
    prov = provenance.collect("langgraph", feats)
    assert prov["python"] == platform.python_version() and prov["host"] == platform.node()
    assert {"langgraph", "langchain-core", "langchain-openai", "openai", "mlflow", "hydra-core", "datasets", "numpy"} <= set(
        prov["packages"]
    )
    assert "crewai" in provenance.collect("crewai")["packages"] and "autogen-ext" in provenance.collect("autogen")["packages"]
    assert all(v for v in prov["packages"].values())
    tags = provenance.as_tags(prov)
    assert tags["prov.sandbox"] == "contained,pid_namespace,pids_cgroup,uid_switch,nice=0"
    assert tags["prov.sandbox.uid_switch"] == "true" and tags["prov.sandbox.nice"] == "0"
    assert tags["prov.sandbox.rlimits"] == '["AS", "CPU"]' and tags["prov.sandbox.workers"] == "2"
    weak = provenance.sandbox_summary({"contained": False, "uid_switch": False, "subreaper": True, "nice": 5})
    assert weak == "rlimits_only,subreaper,nice=5"
    assert provenance.sandbox_summary({"contained": "mixed", "uid_switch": True}) == "contained=mixed,uid_switch"
    assert tags["prov.pkg.numpy"] == prov["packages"]["numpy"]
    assert provenance.from_tags({**tags, "other": "x"}) == provenance.comparable(prov)
    assert provenance.package_versions(["surely-not-a-package-x"]) == {"surely-not-a-package-x": "not installed"}


def test_differences_warn_only_about_what_differs():
    a = {"python": "3.11.7", "git_sha": "abc", "pkg.openai": "3.3.0", "pkg.langgraph": "1.2", "host": "h1"}
    b = {"python": "3.11.7", "git_sha": "abc", "pkg.openai": "3.3.0", "pkg.crewai": "1.6", "host": "h2"}
    assert provenance.differences({"a": a, "b": b}) == []  # another host, or a package only one side uses: no warning
    c = {**b, "pkg.openai": "3.4.0", "git_sha": "def"}
    warns = provenance.differences({"a": a, "c": c})
    assert warns == ["git_sha differs — abc: a; def: c", "pkg.openai differs — 3.3.0: a; 3.4.0: c"]
    old = {}  # a cell recorded before provenance existed
    assert any(w.startswith("python differs — (not recorded): old") for w in provenance.differences({"a": a, "old": old}))


def test_the_judged_programs_packages_are_in_the_compared_sandbox():
    """Cells whose programs could import other package versions judged differently: the report must say so."""
    base = {"contained": True, "uid_switch": True, "nice": 0}
    new = provenance.sandbox_summary({**base, "packages": {"numpy": "2.4.6"}})
    old = provenance.sandbox_summary({**base, "packages": {"numpy": "1.26.4"}})
    assert new == "contained,uid_switch,numpy==2.4.6,nice=0"
    assert provenance.differences({"a": {"sandbox": new}, "b": {"sandbox": old}}) == [f"sandbox differs — {old}: b; {new}: a"]
