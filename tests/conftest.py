"""Shared fixtures: where the real APPS rows live, and a scratch environment for frameworks."""

from __future__ import annotations

from pathlib import Path

import pytest

APPS_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "apps"


@pytest.fixture(scope="session")
def apps_data_dir() -> Path:
    """`../shared/data/apps` beside the repository (CI has it); tests needing it skip otherwise."""
    if not APPS_DATA_DIR.is_dir():
        pytest.skip(f"real APPS rows not found at {APPS_DATA_DIR}")
    return APPS_DATA_DIR
