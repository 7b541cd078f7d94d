"""benchmarks/study_scale.py at a tiny size: it runs through the real CLI, and what it prints adds up."""

from __future__ import annotations

import re
import subprocess
import sys
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest
from conftest import REPO, cli_env

pytestmark = pytest.mark.slow
CELLS, PROBLEMS, SEED_PROBLEMS, PAIRS = 2, 12, 4, 200


def _line(out: str, pattern: str) -> re.Match[str]:
    m = re.search(pattern, out, re.MULTILINE)
    assert m, f"no line matching {pattern!r} in:\n{out}"
    return m


def test_a_tiny_study_runs_and_its_figures_add_up(tmp_path: Path):
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "study_scale.py"),
            "--cells",
            str(CELLS),
            "--problems",
            str(PROBLEMS),
            "--seed-problems",
            str(SEED_PROBLEMS),
            "--pairs",
            str(PAIRS),
            "--keep",
            str(tmp_path / "work"),
        ],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    out = r.stdout
    assert f"apps_bench from {REPO / 'apps_bench'}" in out

    traced = _line(out, r"store per trace \(sequential_langgraph, (\d+) traces\)\s+([\d.]+) KB\s+traces\.json artifacts (\d+)")
    assert int(traced[1]) == SEED_PROBLEMS and float(traced[2]) > 0 and traced[3] == "0"

    study = _line(out, r"study: (\d+) cells, (\d+) records")
    assert (int(study[1]), int(study[2])) == (CELLS, CELLS * PROBLEMS)
    cells = list((tmp_path / "work" / "study" / "outputs" / "cells").glob("*/records.jsonl"))
    assert len(cells) == CELLS and sum(len(p.read_text().splitlines()) for p in cells) == CELLS * PROBLEMS
    keys = {frozenset(line.split('"key": "')[1].split('"')[0] for line in p.read_text().splitlines()) for p in cells}
    assert len(keys) == 1 and len(next(iter(keys))) == PROBLEMS  # every cell holds the same problems, each once

    report = _line(out, r"report from the folders\s+CPU\s+([\d.]+) s \(([\d.]+) ms per record\)\s+peak RSS\s+(\d+) MB")
    # CPU is printed to 0.1 s: the per-record figure is that CPU over cells x problems records, within its rounding
    assert abs(float(report[1]) * 1000 / (CELLS * PROBLEMS) - float(report[2])) <= 0.05 * 1000 / (CELLS * PROBLEMS) + 0.001
    assert int(report[3]) > 0
    _line(out, r"plan of 24 cells, beside 0 records\s+CPU\s+[\d.]+ s")
    _line(out, rf"plan of 24 cells, beside {CELLS * PROBLEMS} records\s+CPU\s+[\d.]+ s")

    assert _line(out, r"traces in the store (\d+) of (\d+) problems").group(1, 2) == (str(PROBLEMS), str(PROBLEMS))
    rerun = _line(out, r"rerun of the finished cell: .* it said: (.*)$")[1]
    assert f"{PROBLEMS} problems, {PROBLEMS} already recorded, 0 to run" in rerun
    assert "MLflow store after the rerun: unchanged" in out

    p = float(_line(out, rf"McNemar exact at {PAIRS} discordant pairs \(60/40\): [\d.]+ ms, p = (\S+)$")[1])
    b = PAIRS * 6 // 10
    exact = min(1, 2 * Fraction(sum(comb(PAIRS, k) for k in range(PAIRS - b + 1)), 2**PAIRS))
    assert abs(p - float(exact)) <= 1e-3 * float(exact)  # printed to 3 significant digits
