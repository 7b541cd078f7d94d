"""The seed's optimizer command (`optimizers.protocol.run --method ... --out DIR`) through
`python -m apps_bench.optimize`, and the refusal of its flags by `python -m apps_bench`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from apps_bench.optimize import SeedFormError, to_overrides


def test_seed_form_maps_onto_overrides():
    argv = [
        "--method",
        "maspo",
        "--dataset",
        "apps",
        "--topology",
        "sequential_langgraph",
        "--model",
        "qwen",
        "--seed",
        "0",
        "--out",
        "runs/maspo/apps/sequential/qwen/0",
        "--allow-any-cell",
    ]
    assert to_overrides(argv) == [
        "optimizer=maspo",
        "dataset=apps",
        "topology=sequential_langgraph",
        "model=qwen",
        "seed=0",
        "out_dir=runs/maspo/apps/sequential/qwen/0",
        "allow_any_cell=true",
    ]
    # overrides may follow or sit between the flags
    assert to_overrides(["--method", "gepa", "optimizer.params.budget.rollouts=200", "--seed", "2"]) == [
        "optimizer=gepa",
        "seed=2",
        "optimizer.params.budget.rollouts=200",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--method", "maspo", "--topology", "sequential"],
            "ambiguous here: it names 2 runners (sequential_crewai, sequential_langgraph)",
        ),
        (["--method", "maspo", "--topology", "centralized"], "centralized_autogen, centralized_langgraph"),
        (["--method", "mipro"], "--method mipro: no conf/optimizer/mipro.yaml; choose one of ['gepa', 'maspo', 'none']"),
        (["--method", "maspo", "--model", "gpt9"], "--model gpt9: no conf/model/gpt9.yaml"),
    ],
)
def test_seed_form_refuses_what_has_no_single_override(argv, message):
    with pytest.raises(SeedFormError) as info:
        to_overrides(argv)
    assert message in str(info.value)


def test_seed_form_applies_the_grid_guard_and_refuses_family_names(tmp_path: Path):
    """(A seed-form command that runs a cell: the seed cell of tests/test_pipeline.py's optimizer cell test.)"""
    refused = run_cli(["--method", "maspo", "--dataset", "demo", "--model", "gold"], tmp_path, module="apps_bench.optimize")
    assert refused.returncode == 2 and "optimizer=maspo" in refused.stderr and "allow_any_cell=true" in refused.stderr
    assert "running  python -m apps_bench optimizer=maspo dataset=demo model=gold" in refused.stderr
    bad = run_cli(["--method", "maspo", "--topology", "sequential"], tmp_path, module="apps_bench.optimize")
    assert bad.returncode == 2 and "sequential_crewai, sequential_langgraph" in bad.stderr


def test_main_entry_refuses_the_seed_optimizer_flags_with_their_overrides(tmp_path: Path):
    r = run_cli(
        ["--method", "maspo", "--dataset", "apps", "--topology", "sequential", "--model", "qwen", "--seed", "0", "--out", "x"],
        tmp_path,
    )
    assert r.returncode == 2
    for flag, override in (
        ("--method", "optimizer=NAME"),
        ("--dataset", "dataset=NAME"),
        ("--topology", "topology=NAME"),
        ("--model", "model=NAME"),
        ("--seed", "seed=N"),
        ("--out", "out_dir=PATH"),
    ):
        assert flag in r.stderr and override in r.stderr
    assert "sequential_langgraph or sequential_crewai" in r.stderr and "python -m apps_bench.optimize" in r.stderr


def test_help_imports_nothing_heavy():
    code = (
        "import sys, contextlib, io\n"
        "from apps_bench import optimize\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: optimize.main(['--help'])\n"
        "    except SystemExit: pass\n"
        "heavy = [m for m in ('hydra', 'omegaconf', 'mlflow', 'langchain_core', 'openai') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
