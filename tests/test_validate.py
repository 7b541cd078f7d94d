"""Bad settings through the real entrypoint: one message naming the setting, its value, what is
allowed and the fix; exit code 2; no cell folder and no MLflow run (the store is a real SQLite
file that the refused command must leave without a run). Plus the rule table on its own."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import APPS_DATA_DIR, cli_env, compose_cell, fresh_store, run_cli

TRAIN = APPS_DATA_DIR / "train_mini150.jsonl"
TEST_ROWS = APPS_DATA_DIR / "test_more.jsonl"


def _runs_in(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("select count(*) from runs").fetchone()[0]


def _refused(tmp_path: Path, mlflow_template: Path, args: list[str]) -> str:
    """Run the CLI with a real (empty) store; assert the refusal leaves nothing behind; -> stderr."""
    db = fresh_store(mlflow_template, tmp_path / "store" / "mlflow.db")
    r = run_cli(args, tmp_path, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{db}"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "nothing was run" in r.stderr
    assert not (tmp_path / "outputs" / "cells").exists()
    assert _runs_in(db) == 0
    return r.stderr


# (overrides, what the message must say: the setting=value, what is allowed, the fix)
LOCAL = ["dataset=apps", f"dataset.path={TRAIN}", "allow_any_cell=true"]
CASES = {
    "negative limit": (["limit=-1"], ["limit=-1", "a whole number >= 1, or null", "Fix: limit=50"]),
    "zero concurrency": (["concurrency=0"], ["concurrency=0", "a whole number >= 1", "Fix: concurrency=1"]),
    "zero processes": (["processes=0"], ["processes=0", "auto (one per CPU core)", "Fix: processes=auto"]),
    "ids that match nothing": (["only=[424242]"], ["only=[424242]", "none of these is there", "drop only"]),
    "offset past the end (demo)": (["offset=2"], ["offset=2", "less than the 2 problems", "offset=1 or lower"]),
    "offset past the end (file)": (
        [*LOCAL, "offset=150"],
        ["offset=150", "less than the 150 problems", "offset=149 or lower"],
    ),
    "difficulty without rows": (
        ["difficulty=competition"],
        ["difficulty=competition", "none of competition", "difficulty=null"],
    ),
    "difficulty misspelt": (["difficulty=hard"], ["difficulty=hard", "introductory, interview or competition"]),
    "pool path ignored by test_minus_eval": (
        [
            "dataset=apps",
            f"dataset.path={TEST_ROWS}",
            "optimizer=maspo",
            "allow_any_cell=true",
            "optimizer.params.pool.source=test_minus_eval",
            f"optimizer.params.pool.path={TRAIN}",
        ],
        [f"optimizer.params.pool.path={TRAIN}", "would ignore it", "Fix: optimizer.params.pool.path=null"],
    ),
    "zero rollout budget": (
        [*LOCAL, "optimizer=maspo", f"optimizer.params.pool.path={TRAIN}", "optimizer.params.budget.rollouts=0"],
        ["optimizer.params.budget.rollouts=0", "a whole number >= 1, or null (no cap)"],
    ),
    "zero time limit": (["topology.time_limit_s=0"], ["topology.time_limit_s=0", "seconds > 0", "Fix: topology.time_limit_s="]),
    "gold knob on a real model": (
        [
            "model=openai",
            "model.gold.latency_ms=50",
            "model.base_url=http://127.0.0.1:9/v1",
            "model.model_id=m",
            "allow_any_cell=true",
        ],
        ["model.gold.latency_ms=50", "only model=gold", "would ignore it"],
    ),
    "local-server setting on another model": (
        [
            "model=openai",
            "model.local.n_ctx=4096",
            "model.base_url=http://127.0.0.1:9/v1",
            "model.model_id=m",
            "allow_any_cell=true",
        ],
        ["model.local.n_ctx=4096", "only model=local", "would ignore it", "Fix: drop model.local.n_ctx, or model=local"],
    ),
    "unknown GGUF type to convert to": (
        ["model=local", "model.local.gguf_requantize=q5_k"],
        ["model.local.gguf_requantize=q5_k", "one of q8_0, q4_0, f16, or null", "Fix: model.local.gguf_requantize=q8_0"],
    ),
    # gold's and the local server's settings moved under their own keys (#44): the old spelling names the new one
    "gold knob in the flat spelling": (
        ["model.wrong_fraction=0.3"],
        [
            "model.wrong_fraction=0.3: unknown setting (did you mean model.gold.wrong_fraction)",
            "Fix: model.gold.wrong_fraction=0.3",
        ],
    ),
    "local-server setting in the flat spelling": (
        ["model=local", "model.n_ctx=4096"],
        ["model.n_ctx=4096: unknown setting (did you mean model.local.n_ctx)", "Fix: model.local.n_ctx=4096"],
    ),
    "rounds on a flow without rounds": (["topology.rounds=3"], ["topology.rounds=3", "only the decentralized"]),
    "misspelt optimizer parameter": (
        [*LOCAL, "optimizer=maspo", f"optimizer.params.pool.path={TRAIN}", "+optimizer.params.minibtch=4"],
        ["optimizer.params.minibtch=4", "no setting of optimizer=maspo", "Fix: optimizer.params.minibatch=4"],
    ),
    "misspelt nested optimizer parameter": (
        [*LOCAL, "optimizer=gepa", f"optimizer.params.pool.path={TRAIN}", "+optimizer.params.budget.rolouts=5"],
        ["optimizer.params.budget.rolouts=5", "Fix: optimizer.params.budget.rollouts=5"],
    ),
    "another method's parameter": (
        [*LOCAL, "optimizer=gepa", f"optimizer.params.pool.path={TRAIN}", "optimizer.params.K=2"],
        [
            "optimizer.params.K=2",
            "a setting of optimizer=maspo; optimizer=gepa has none",
            "Fix: optimizer=maspo optimizer.params.K=2",
        ],
    ),
    "a parameter without its method": (
        [*LOCAL, "optimizer.params.hard_cases=2"],
        ["optimizer.params.hard_cases=2", "optimizer=none has none"],
    ),
    "an optimizer's name without its option": (
        ["optimizer.name=gepa", "allow_any_cell=true"],
        ["optimizer.name=gepa: comes with the optimizer option", "Fix: optimizer=gepa"],
    ),
    # names come from groups: the label and the runner are the option's (#39)
    "a misspelt group": (
        ["topolgy=independent"],
        ["topolgy=independent", "did you mean the group topology", "Fix: topology=independent"],
    ),
    "a topology's name apart from its option": (
        ["topology.name=independent"],
        ["topology.name=independent: comes with the topology option", "Fix: topology=independent"],
    ),
    "a runner apart from its option": (
        ["topology._target_=apps_bench.topologies.independent.IndependentTopology"],
        [
            "topology._target_=apps_bench.topologies.independent.IndependentTopology: comes with the topology option",
            "Fix: topology=NAME (options: centralized_autogen",
        ],
    ),
    # the rules class is not in the cell key: set apart from its profile, records would name one profile and
    # judge by another's rules
    "a judge's rules apart from its profile": (
        ["judge._target_=apps_bench.judge.rules.ReferenceRules"],
        ["judge._target_=apps_bench.judge.rules.ReferenceRules: comes with the judge option", "Fix: judge=NAME"],
    ),
    "a model's provider apart from its preset": (
        ["model.provider=openai"],
        ["model.provider=openai: comes with the model option"],
    ),
    # Hydra's deletions and repeated keys (#43)
    "deleting an axis": (
        ["~topology"],
        ["~topology: a cell needs a topology", "Fix: drop ~topology (the default option), or topology=NAME"],
    ),
    "deleting a setting": (
        ["~limit"],
        ["~limit: a setting of the schema", "Fix: drop ~limit (its default), or limit=VALUE (null: none)"],
    ),
    "a setting given twice": (["seed=0", "seed=1"], ["seed=1: given twice (seed=0 and seed=1)", "-m seed=A,B"]),
    "a group given twice": (
        ["topology=single", "topology=independent"],
        ["given twice (topology=single and topology=independent)"],
    ),
    "misspelt MASPO weight": (
        [*LOCAL, "optimizer=maspo", f"optimizer.params.pool.path={TRAIN}", "+optimizer.params.reward.lokal=0.1"],
        ["optimizer.params.reward={local:0.4,lookahead:0.4,global:0.2,lokal:0.1}", "weights local, lookahead and global"],
    ),
    "unknown GEPA choice": (
        [*LOCAL, "optimizer=gepa", f"optimizer.params.pool.path={TRAIN}", "optimizer.params.acceptance=always"],
        ["optimizer.params.acceptance=always", "one of strict_improvement, improvement_or_equal"],
    ),
    "team size without roles": (
        ["topology=independent", "topology.team_size=3"],
        ["topology.team_size=3", "2, 4, 8, 10", "Fix: topology.team_size=2"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_setting_is_refused_before_anything_exists(case: str, tmp_path: Path, mlflow_template: Path):
    args, expected = CASES[case]
    err = _refused(tmp_path, mlflow_template, args)
    for text in expected:
        assert text in err, f"{text!r} not in:\n{err}"


def test_every_bad_setting_is_named_in_one_message(tmp_path: Path, mlflow_template: Path):
    err = _refused(tmp_path, mlflow_template, ["limit=0", "concurrency=-3", "model.top_p=0", "tool.timeout_s=-1"])
    assert "invalid settings" in err
    for key in ("limit=0", "concurrency=-3", "model.top_p=0", "tool.timeout_s=-1"):
        assert f"  {key}: " in err, err


def test_one_bad_cell_refuses_the_whole_sweep(tmp_path: Path, mlflow_template: Path):
    # the second cell selects nothing (offset past the demo's 2 problems): no cell runs, no parent run
    err = _refused(tmp_path, mlflow_template, ["-m", "offset=0,5"])
    assert "1 of 2 cells of this sweep are refused" in err and "offset=5" in err


def test_some_ids_missing_still_runs_with_a_warning(tmp_path: Path):
    r = run_cli(["only=[demo-call,424242]", "processes=1"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no row has IDs 424242" in r.stderr
    assert "1 problems" in r.stderr


# --- the rule table without a subprocess ----------------------------------------------------


def _composed(*overrides: str) -> dict:
    from omegaconf import OmegaConf

    cfg = compose_cell(*overrides)
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data


def test_every_shipped_option_passes_the_checks():
    from apps_bench.config.validate import check_settings

    for topo in (
        "single",
        "independent",
        "sequential_langgraph",
        "sequential_crewai",
        "centralized_langgraph",
        "centralized_autogen",
        "decentralized_langgraph",
        "decentralized_openai",
    ):
        check_settings(_composed(f"topology={topo}"))
    for model in ("gold", "qwen", "qwen_122b", "openai"):
        check_settings(_composed(f"model={model}"))
    check_settings(_composed("dataset=apps", "optimizer=maspo"))
    check_settings(_composed("dataset=apps", "optimizer=gepa"))


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["optimizer=gepa", "dataset=apps", "optimizer.params.minibatch=0"], "optimizer.params.minibatch"),
        (["optimizer=maspo", "dataset=apps", "optimizer.params.K=0"], "optimizer.params.K"),
        (["optimizer=maspo", "dataset=apps", "optimizer.params.budget.tokens=-5"], "optimizer.params.budget.tokens"),
        (["optimizer=maspo", "dataset=apps", "optimizer.params.pool.source=eval"], "optimizer.params.pool.source"),
        (["optimizer=maspo", "optimizer.params.pool.path=null"], "optimizer.params.pool.path"),  # demo: no train split
        (["judge.timeout_s=0"], "judge.timeout_s"),
        (["model.max_tokens=0"], "model.max_tokens"),
        (["model.gold.wrong_fraction=1.5"], "model.gold.wrong_fraction"),
        (["offset=-1"], "offset"),
        (["optimizer=gepa", "dataset=apps", "+optimizer.params.K=2"], "optimizer.params.K"),  # MASPO's, not GEPA's
        (["tracking.backend=wandb"], "tracking.backend"),
    ],
)
def test_rule_names_the_setting(overrides: list[str], key: str):
    from apps_bench.config.validate import InvalidSettings, check_settings

    with pytest.raises(InvalidSettings) as err:
        check_settings(_composed(*overrides))
    assert [b.key for b in err.value.bad] == [key]
    assert f"{key}=" in str(err.value) and "Fix:" in str(err.value)


def test_a_key_the_method_lacks_fails_at_composition(tmp_path: Path):
    """Each method's schema (config/schema.py) is in its YAML's defaults list: a parameter it does not have, given
    on the command line or written into the YAML, is refused when Hydra composes the cell."""
    import shutil

    from conftest import CONF_DIR
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="optimizer.params.K"):
        compose_cell("optimizer=gepa", "optimizer.params.K=2")  # MASPO's, not GEPA's
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    maspo = conf / "optimizer" / "maspo.yaml"
    maspo.write_text(maspo.read_text().replace("  hard_cases: 3", "  hard_case: 3"))
    GlobalHydra.instance().clear()
    try:
        with (
            initialize_config_dir(version_base="1.3", config_dir=str(conf)),
            pytest.raises(ConfigCompositionException, match="hard_case"),
        ):
            compose("config", overrides=["optimizer=maspo"])
    finally:
        GlobalHydra.instance().clear()


def test_the_plan_shows_a_bad_cell_refused(tmp_path: Path):
    from apps_bench.plan import make_plan

    plan = make_plan(["limit=-1", "allow_any_cell=true"], multirun=False, cells_dir=tmp_path)
    (cell,) = plan["cells"]
    assert cell["allowed"] is False and "limit=-1: a whole number >= 1" in cell["guard"]
    plan = make_plan(["offset=0,5"], multirun=True, cells_dir=tmp_path)
    assert [c["allowed"] for c in plan["cells"]] == [True, False]
    assert "offset=5: less than the 2 problems" in plan["cells"][1]["guard"]


def test_the_checks_read_the_typed_config():
    """The cell is typed once at the door (validate.typed_cell) and the settings check reads the typed Config:
    given the Config, it names the same bad settings, in the same words, as given the composed node."""
    from apps_bench.config.schema import typed_config
    from apps_bench.config.validate import InvalidSettings, check_settings

    node = compose_cell("limit=-1", "model.top_p=0", "topology.rounds=3")
    with pytest.raises(InvalidSettings) as on_node:
        check_settings(node)
    with pytest.raises(InvalidSettings) as on_typed:
        check_settings(typed_config(node))
    assert [b.key for b in on_typed.value.bad] == ["limit", "model.top_p", "topology.rounds"]
    assert str(on_typed.value) == str(on_node.value)
