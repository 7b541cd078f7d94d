"""Refused before anything starts: an optimizer cell whose pool cannot hold its splits, and a solver worker
whose cell is gone before it was set up (#43 points 6 and 7).

The offline recipe of docs/optimizers.md runs as written; the command that cannot work (the pool is the cell's
own rows, too few once the eval questions are left out) is refused with one line, exit 2, before the gold server
or a solver process starts and before a file is written.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, run_cli

REPO = Path(__file__).resolve().parents[2]


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
def test_an_optimizer_pool_too_small_is_refused_before_any_process_or_file(tmp_path: Path):
    rows = REPO / "tests" / "fixtures" / "apps" / "train_mini150.jsonl"
    r = run_cli(
        ["optimizer=maspo", "allow_any_cell=true", "dataset=apps", f"dataset.path={rows}", f"optimizer.params.pool.path={rows}"],
        tmp_path,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "EOFError" not in out  # no solver process was started to be hung up on
    said = [line for line in r.stderr.splitlines() if line.startswith("apps-bench: optimizer=maspo")]
    assert len(said) == 1 and "train_size + val_size = 80" in said[0] and "nothing was run" in said[0], r.stderr
    assert "optimizing the single prompts first" not in out  # refused with the checks, not once the cell began
    assert _files(tmp_path) == []  # no cell folder, no store, no Hydra run folder


def _docs_recipe() -> list[str]:
    """The offline optimizer command docs/optimizers.md gives, as its words."""
    text = (REPO / "docs" / "optimizers.md").read_text()
    block = re.search(r"```\n(python -m apps_bench optimizer=maspo[^`]*?)```", text)
    assert block, "docs/optimizers.md has no offline optimizer recipe"
    words = shlex.split(block.group(1).replace("\\\n", " "))
    assert words[:3] == ["python", "-m", "apps_bench"]
    return words[3:]


@pytest.mark.slow
def test_the_docs_offline_optimizer_recipe_runs_as_written(tmp_path: Path):
    (tmp_path / "tests").symlink_to(REPO / "tests")  # the recipe names the suite's rows relative to the repo
    r = run_cli([*_docs_recipe(), "progress=false"], tmp_path, env=cli_env(tmp_path), timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    (cell,) = (tmp_path / "outputs" / "cells").iterdir()
    assert (cell / "optimizer" / "result.json").is_file() and (cell / "records.jsonl").read_text().strip()


def test_a_solver_worker_whose_cell_is_gone_before_setup_ends_quietly(tmp_path: Path):
    """The worker's body on a real pipe whose cell end is closed (a cell refused, failed or killed after it
    forked its workers): it returns without a traceback."""
    code = (
        "import multiprocessing as mp, os\n"
        "from apps_bench.config.schema import compose\n"
        "from apps_bench.cell.solver_pool import WorkerSpec, worker_main\n"
        "mine, theirs = mp.Pipe()\n"
        "theirs.close()\n"
        "worker_main(mine, WorkerSpec(cfg=compose([]), threads=1, env=dict(os.environ), cwd=os.getcwd(), name='w0'))\n"
        "print('worker returned')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "EOFError" not in r.stderr
    assert r.stdout.strip().endswith("worker returned")
