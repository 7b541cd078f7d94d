"""A cell composes to the key, name and folder it had at b38b3ea: every model preset × topology × judge
profile, every optimizer, several seeds, the settings users type, a `--config-dir` preset.

A key that changes strands every recorded cell: its folder is no longer found (a resume solves again)
and its MLflow run is no longer the cell's. The cases are data (tests/fixtures/cells/make_keys.py, where
each setting is spelt once: a setting that moves changes its spelling there, never the stored key);
keys.json holds what the reference tree composed (`python tests/fixtures/cells/make_keys.py TREE`).
A change that is meant to make new cells bumps KEY_VERSION and rewrites keys.json in the same commit.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent / "fixtures" / "cells" / "make_keys.py"
_spec = importlib.util.spec_from_file_location("cell_key_cases", _PATH)
assert _spec is not None and _spec.loader is not None
cases = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cases  # its dataclasses look their module up
_spec.loader.exec_module(cases)

STORED = cases.load_keys()["cases"]


def test_every_case_has_its_stored_key():
    """No case goes unchecked, and no stored cell is dropped from the matrix."""
    assert sorted(c.id for c in cases.CASES) == sorted(STORED)


def test_the_matrix_covers_every_preset_topology_judge_and_optimizer():
    axes = {"model": cases.MODELS, "topology": cases.TOPOLOGIES, "judge": cases.JUDGES, "optimizer": cases.OPTIMIZERS}
    for short, options in axes.items():
        covered = {c.settings.get(short) for c in cases.CASES}
        assert set(options) <= covered, short


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_same_cell_key_name_and_folder(case):
    want = STORED[case.id]
    got = cases.compose_case(case)
    assert got == {k: want[k] for k in ("key", "name", "dir_name")}, f"{case.id}: {' '.join(case.overrides())}"
