"""Every option of every config group composes (real Hydra, the package's own conf/), typos
fail at compose time, and the cell key changes exactly when a result-changing setting does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_cell
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import apps_bench
from apps_bench.cell.key import CellRefused, guard, resolve_cell

CONF = Path(apps_bench.__file__).resolve().parent / "conf"


def _groups() -> list[tuple[str, str]]:
    pairs = []
    for group in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name != "hydra"):
        for opt in sorted(group.glob("*.yaml")):
            pairs.append((group.name, opt.stem))
    for opt in sorted((CONF / "hydra" / "launcher").glob("*.yaml")):
        pairs.append(("hydra/launcher", opt.stem))
    return pairs


def _compose(overrides: list[str], hydra_cfg: bool = False):
    return compose_cell(*overrides, hydra_cfg=hydra_cfg)


def test_every_group_has_options():
    groups = {g for g, _ in _groups()}
    assert {"dataset", "topology", "model", "optimizer", "grid", "judge", "experiment", "hydra/launcher"} <= groups
    opts = {g: {o for gg, o in _groups() if gg == g} for g in groups}
    assert {"apps", "demo"} <= opts["dataset"]
    assert {"gold", "qwen", "qwen_122b", "openai"} <= opts["model"]
    assert {"single"} <= opts["topology"]
    assert {"none"} <= opts["optimizer"]
    assert {"local_parallel", "slurm", "slurm_local", "ray_cluster"} <= opts["hydra/launcher"]


@pytest.mark.parametrize("group,option", _groups())
def test_compose_every_option(group: str, option: str):
    cfg = _compose([f"{group}={option}"], hydra_cfg=group.startswith("hydra/"))
    if group.startswith("hydra/"):
        launcher = cfg.hydra.launcher
        assert "_target_" in launcher and str(launcher._target_).startswith("hydra_plugins.")
        return
    job = OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    assert isinstance(job, dict)
    if group in ("dataset", "topology", "model", "optimizer", "grid"):
        assert job[group]["name"] == option
    cell = resolve_cell(cfg)
    assert len(cell.key) == 12


def test_default_cell_is_inside_the_grid():
    cfg = _compose([])
    cell = guard(cfg)
    assert cell.axes() == {"dataset": "demo", "topology": "single", "model": "gold", "optimizer": "none", "seed": 0}
    assert cfg.max_tests_per_row == 20 and cfg.concurrency == 64 and cfg.processes == "auto" and cfg.allow_any_cell is False
    assert cfg.tool.timeout_s == 10


STUDY_TOPOLOGIES = [
    "single",
    "independent",
    "sequential_langgraph",
    "sequential_crewai",
    "centralized_langgraph",
    "centralized_autogen",
    "decentralized_langgraph",
    "decentralized_openai",
]


def test_study_grid_axes():
    grid = OmegaConf.to_container(_compose([]).grid)
    axes = grid["axes"]
    assert set(STUDY_TOPOLOGIES) <= set(axes["topology"])
    assert {"qwen", "qwen_122b", "gold"} <= set(axes["model"])
    assert {"none", "maspo", "gepa"} <= set(axes["optimizer"])
    assert {0, 1, 2} <= set(axes["seed"])
    assert {"apps", "demo"} <= set(axes["dataset"])


@pytest.mark.parametrize("topology", STUDY_TOPOLOGIES)
def test_study_cells_are_allowed(topology: str):
    cfg = _compose([f"topology={topology}", "model=qwen_122b", "dataset=apps", "seed=2"])
    assert guard(cfg).axes() == {"dataset": "apps", "topology": topology, "model": "qwen_122b", "optimizer": "none", "seed": 2}
    data = OmegaConf.to_container(cfg, resolve=True)
    for model in ("qwen", "gold"):
        for seed in (0, 1):
            data["model"]["name"], data["seed"] = model, seed
            guard(data)


@pytest.mark.parametrize(
    "overrides,axis,value",
    [
        (["seed=7"], "seed", "7"),
        (["model=openai"], "model", "openai"),
        (["dataset=apps_train"], "dataset", "apps_train"),
    ],
)
def test_cells_outside_the_grid_are_refused(overrides, axis, value):
    cfg = _compose(overrides)
    with pytest.raises(CellRefused) as e:
        guard(cfg)
    msg = str(e.value)
    assert f"{axis}={value}" in msg and "allow_any_cell=true" in msg
    assert guard(_compose(overrides + ["allow_any_cell=true"])).axes()[axis] is not None


def test_grid_exclusion_is_refused():
    cfg = _compose(["model=gold", "optimizer.name=maspo"])
    with pytest.raises(CellRefused, match="model=gold, optimizer=maspo.*allow_any_cell=true"):
        guard(cfg)


@pytest.mark.parametrize(
    "override",
    ["dataset.revison=x", "topology.max_step=3", "sed=1", "judge.profil=seed", "model.temprature=0.1"],
)
def test_typos_fail_at_compose_time(override: str):
    with pytest.raises(ConfigCompositionException):
        _compose([override])


@pytest.mark.parametrize("override", ["seed=abc", "concurrency=many", "max_tests_per_row=x", "judge.timeout_s=slow"])
def test_wrong_types_fail_at_compose_time(override: str):
    with pytest.raises(ConfigCompositionException):
        _compose([override])


def test_unknown_group_option_lists_choices():
    with pytest.raises(Exception) as e:
        _compose(["topology=singel"])
    assert "single" in str(e.value)


@pytest.fixture(scope="module")
def base() -> dict:
    return OmegaConf.to_container(_compose([]), resolve=True)


def _key_with(base: dict, dotted: str) -> str:
    """Key of the default cell with one setting changed (as an override would change it)."""
    import copy

    import yaml

    data = copy.deepcopy(base)
    path, value = dotted.split("=", 1)
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    node[leaf] = yaml.safe_load(value)
    return resolve_cell(data).key


@pytest.mark.parametrize(
    "override",
    [
        "concurrency=3",
        "out_dir=/tmp/x",
        "verbose=true",
        "progress=false",
        "tracking.experiment=other",
        "model.gold.latency_ms=500",
        "model.gold.fault_fraction=0.5",
        "model.max_retries=0",
        "judge.workers=1",
        "allow_any_cell=true",
        "model.base_url=http://elsewhere/v1",
    ],
)
def test_run_only_settings_keep_the_cell(base: dict, override: str):
    assert _key_with(base, override) == resolve_cell(base).key


@pytest.mark.parametrize(
    "override",
    [
        "seed=1",
        "max_tests_per_row=5",
        "limit=1",
        "offset=3",
        "judge.timeout_s=2",
        "judge.profile=reference",
        "model.temperature=0.7",
        "model.top_p=0.5",
        "model.model_id=other",
        "topology.prompts.solver=hello",
        "topology.max_steps=3",
        "topology.team_size=2",
        "tool.timeout_s=5",
        "model.gold.wrong_fraction=0.5",
        "dataset.revision=abc",
        "dataset.path=/data/x.jsonl",
        # every sandbox limit that can change a verdict
        "judge.sandbox.output_cap_bytes=1000",
        "judge.sandbox.pids_max=64",
        "judge.sandbox.nproc=32",
        "judge.sandbox.nofile=64",
        "judge.sandbox.tmp_size=64m",
        "judge.sandbox.shm_size=16m",
        "judge.sandbox.grace_s=1",
        "judge.sandbox.first_test_slack_s=1",
        "judge.sandbox.cpu_slack_s=5",
        "judge.sandbox.exec_memory_bytes=1000000",
        "judge.sandbox.stderr_chars=100",
        "judge.sandbox.packages=[numpy,sortedcontainers]",
    ],
)
def test_result_settings_change_the_cell(base: dict, override: str):
    assert _key_with(base, override) != resolve_cell(base).key


def test_one_key_whatever_shape_the_cell_comes_in(base: dict):
    """The key is computed from the typed config's data, so the Hydra node, its plain data, the typed
    Config and hand-written data that says the same in other types (1 for 1.0) give one key."""
    import copy

    from apps_bench.config.schema import typed_config

    node = _compose([])
    by_hand = copy.deepcopy(base)
    by_hand["judge"]["timeout_s"] = int(by_hand["judge"]["timeout_s"])  # 4.0 in conf/judge/seed.yaml
    by_hand["tool"]["timeout_s"] = int(by_hand["tool"]["timeout_s"])
    assert json.dumps(by_hand, sort_keys=True) != json.dumps(base, sort_keys=True)  # "4" where the composed cell says "4.0"
    keys = {resolve_cell(x).key for x in (node, base, typed_config(node), by_hand)}
    assert keys == {resolve_cell(base).key}


def test_composed_overrides_change_the_cell(base: dict):
    ref = resolve_cell(base).key
    for override in ("dataset=apps", "model=qwen", "topology=independent", "judge.sandbox.output_cap_bytes=1000"):
        assert resolve_cell(_compose([override])).key != ref, override
    assert resolve_cell(_compose(["concurrency=2", "verbose=true"])).key == ref


def test_experiment_files_are_global_deltas():
    cfg = _compose(["experiment=smoke"], hydra_cfg=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert "seed" in cfg.hydra.sweeper.params
    study = _compose(["experiment=study"], hydra_cfg=True)
    topos = str(study.hydra.sweeper.params.topology).split(",")
    assert sorted(topos) == sorted(STUDY_TOPOLOGIES)
    assert study.dataset.name == "apps" and study.limit == 50


def test_sandbox_limits_are_the_values_the_code_had_before_they_were_config():
    """Moving the limits into conf/judge kept each value: verdicts of a cell do not change."""
    from apps_bench.config.schema import typed
    from apps_bench.sandbox.limits import SandboxLimits

    was = {
        "output_cap_bytes": 8 << 20,
        "pids_max": 128,
        "nproc": 64,
        "nofile": 256,
        "tmp_size": "256m",
        "shm_size": "64m",
        "grace_s": 0.25,
        "first_test_slack_s": 0.5,
        "cpu_slack_s": 2,
        "exec_memory_bytes": 2 << 30,
        "stderr_chars": 2000,
        "packages": ["numpy"],
    }  # added later: what a program may import (the rules were bumped with it)
    for profile in ("seed", "reference"):
        cfg = _compose([f"judge={profile}"])
        assert typed(SandboxLimits, cfg.judge.sandbox).to_dict() == was, profile
        assert resolve_cell(cfg).identity["judge"]["sandbox"] == was


def test_a_misspelt_or_bad_sandbox_limit_fails_at_compose_or_guard():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="output_cap"):
        _compose(["judge.sandbox.output_cap=1"])
    with pytest.raises(CellRefused, match=r"judge\.sandbox\.nproc=0: .*must be > 0"):
        guard(_compose(["judge.sandbox.nproc=0"]))


def test_no_setting_has_a_default_in_code():
    """The YAML under conf/ is the only place a setting's default lives: every field of every schema
    class is MISSING (a YAML that leaves a key out fails to type, naming it), none defaulted in code."""
    import dataclasses

    import omegaconf

    from apps_bench.config import schema as config

    assert config.MISSING == omegaconf.MISSING  # the schemas' marker is OmegaConf's "value the YAML must set"
    MISSING = config.MISSING
    schemas = [
        c
        for c in vars(config).values()
        if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == config.__name__
    ]
    assert config.Config in schemas and config.ModelConfig in schemas and len(schemas) >= 12
    defaulted = [
        f"{c.__name__}.{f.name}"
        for c in schemas
        for f in dataclasses.fields(c)
        if f.default is not MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert defaulted == []


def test_a_target_names_what_is_missing_and_a_missing_dependency_passes_through(tmp_path, monkeypatch):
    """`_target_` (a runner class, an optimizer method) resolves in one place: a module or attribute that
    is not there is a TargetError naming it; a module that is there but imports something missing
    raises that ImportError, even when the missing name is a prefix of the module's (`depx` of `depx_runner`)."""
    from apps_bench.config.schema import TargetError, resolve_target

    (tmp_path / "depx_runner.py").write_text("import depx\n")
    (tmp_path / "fine_runner.py").write_text("class Runner:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_target("fine_runner.Runner").__name__ == "Runner"
    with pytest.raises(TargetError, match="module fine_runner has no 'Star'"):
        resolve_target("fine_runner.Star")
    with pytest.raises(TargetError, match="no module 'nowhere_runner'"):
        resolve_target("nowhere_runner.Runner")
    with pytest.raises(TargetError, match="not a module.attribute path"):
        resolve_target("Runner")
    with pytest.raises(ModuleNotFoundError) as err:
        resolve_target("depx_runner.Runner")
    assert not isinstance(err.value, TargetError) and err.value.name == "depx"


# ------------------------------------------- conf/ read without composing a cell (config.read_option)

_CELL_GROUPS = ("dataset", "topology", "model", "optimizer", "grid", "judge", "tracking")


@pytest.mark.parametrize("group,option", [(g, o) for g, o in _groups() if g in _CELL_GROUPS])
def test_an_option_read_from_its_file_is_the_option_a_cell_composes(group: str, option: str):
    """The commands that read one group (the judge command, re-scoring) read its file without Hydra: the
    value is the one a cell composes with `group=option`, or the file is refused when only composition
    reads it right (a defaults list, a @package line), never a different value."""
    from apps_bench.config.schema import ConfFileError, compose, read_option

    path = CONF / group / f"{option}.yaml"
    composed = getattr(compose([f"{group}={option}"]), group)
    if "defaults" in OmegaConf.load(path):
        with pytest.raises(ConfFileError, match=f"{path}.*defaults list"):
            read_option(group, option)
    else:
        assert read_option(group, option) == composed


def test_a_setting_read_from_config_yaml_is_the_default_cell_s():
    """conf/config.yaml's top-level settings read without composing are the default cell's values
    (no group the default cell composes writes a top-level key)."""
    from dataclasses import fields

    from apps_bench.config.schema import ConfFileError, Config, compose, read_setting

    cell = compose()
    top = {f.name for f in fields(Config)} - set(_CELL_GROUPS) - {"tool", "server_check"}
    assert {"max_tests_per_row", "limit", "seed", "concurrency"} <= top
    for key in sorted(top | {"tool", "server_check"}):
        assert read_setting(key) == getattr(cell, key), key
    with pytest.raises(ConfFileError, match="sets no 'judge'"):
        read_setting("judge")  # a group, not a setting of config.yaml


def test_an_option_read_from_its_file_honours_the_config_dir_and_overrides(tmp_path: Path):
    """A `--config-dir` preset of a packaged name takes its place, as in a composition; overrides are typed."""
    from omegaconf.errors import ValidationError

    from apps_bench.config.schema import ConfFileError, config_dirs, read_option

    (tmp_path / "dataset").mkdir()  # the packaged file with another split (its `name` key rules out config_dir_preset)
    (tmp_path / "dataset" / "apps.yaml").write_text(
        (CONF / "dataset" / "apps.yaml").read_text().replace("split: test", "split: valid")
    )
    assert read_option("dataset", "apps").split == "test"
    with config_dirs([str(tmp_path)]):
        assert read_option("dataset", "apps").split == "valid"
    judge = read_option("judge", "seed", ["timeout_s=3", "sandbox.nproc=8"])
    assert (judge.timeout_s, judge.sandbox.nproc) == (3.0, 8) and isinstance(judge.timeout_s, float)
    with pytest.raises(ValidationError, match="timeout_s"):
        read_option("judge", "seed", ["timeout_s=soon"])
    with pytest.raises(ConfFileError, match="no judge option 'nonesuch'"):
        read_option("judge", "nonesuch")
    (tmp_path / "judge").mkdir()  # a file Hydra would place elsewhere: only a composition reads it right
    (tmp_path / "judge" / "moved.yaml").write_text("# a profile\n# @package _global_\njudge:\n  timeout_s: 1\n")
    with config_dirs([str(tmp_path)]), pytest.raises(ConfFileError, match="moved.yaml composes other config files"):
        read_option("judge", "moved")


# the Qwen presets' own settings: everything else comes from the family's base, conf/model/shared/qwen.yaml
QWEN_OWN = {
    "qwen": {"name", "model_id"},
    "qwen_122b": {"name", "model_id", "request_timeout_s"},
    "qwen_thinking": {
        "name",
        "model_id",
        "temperature",
        "top_p",
        "max_tokens",
        "extra_body",
        "request_timeout_s",
        "max_concurrency",
    },
}


@pytest.mark.parametrize("preset", sorted(QWEN_OWN))
def test_a_qwen_preset_sets_only_what_differs_from_its_family(preset: str):
    """Each Qwen preset file names the family's base and writes only its own settings; composed, it differs
    from the family's first preset exactly there (names and model ids apart)."""
    import yaml

    text = yaml.safe_load((CONF / "model" / f"{preset}.yaml").read_text())
    assert "shared/qwen@_here_" in text["defaults"]
    assert set(text) - {"defaults"} == QWEN_OWN[preset]
    first = OmegaConf.to_container(_compose(["model=qwen"]).model, resolve=True)
    mine = OmegaConf.to_container(_compose([f"model={preset}"]).model, resolve=True)
    assert isinstance(first, dict) and isinstance(mine, dict)
    differ = {k for k in first if first[k] != mine[k]} - {"name", "model_id"}
    assert differ == QWEN_OWN[preset] - {"name", "model_id"}
    assert mine["extra_body"]["top_k"] == 20 and mine["provider"] == "openai"  # the family's, in every preset
