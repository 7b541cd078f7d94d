"""The disk fails (#43 point 2): a small tmpfs that fills while a real cell writes its records, and read-only
mounts as the cell folder and as the working directory, through the real CLI.

One line with what failed and the fix, exit 2, no traceback; once space is freed the rerun resumes and ends with
every problem recorded once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from conftest import cli_env, run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

LIMIT = 40


@contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _keys(cell: Path) -> list[str]:
    """The recorded keys as the store reads them: a full disk may leave a torn last line (no newline), which
    the rerun cuts off; only complete lines are records."""
    text = (cell / "records.jsonl").read_text()
    return [json.loads(x)["key"] for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]


def _cell(cwd: Path, rows: Path, out_dir: Path):
    return run_cli(
        [
            "allow_any_cell=true",
            "dataset=apps",
            f"dataset.path={rows}",
            "dataset.split=train",
            f"limit={LIMIT}",
            "tracking=none",
            "progress=false",
            f"out_dir={out_dir}",
        ],
        cwd,
    )


def _said(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    said = [line for line in stderr.splitlines() if line.startswith("apps-bench: ") and "rerun" in line.lower()]
    assert len(said) == 1, stderr[-3000:]
    return said[0]


@pytest.mark.slow
def test_a_disk_that_fills_while_records_are_written_then_the_rerun_after_space_is_freed(tmp_path: Path, apps_data_dir: Path):
    rows = apps_data_dir / "train_mini150.jsonl"
    with tmpfs(tmp_path / "disk", "size=200k") as disk:  # room for the cell's files and about half its records
        cell = disk / "cell"
        r = _cell(tmp_path, rows, cell)
        assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
        line = _said(r.stderr)
        assert "no space left" in line and str(cell) in line and "Free space" in line
        kept = _keys(cell)
        assert 0 < len(kept) < LIMIT and len(set(kept)) == len(kept)
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)  # space freed
        again = _cell(tmp_path, rows, cell)
        assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
        assert f"{len(kept)} already recorded, {LIMIT - len(kept)} to run" in again.stderr
        keys = _keys(cell)
        assert len(keys) == len(set(keys)) == LIMIT and set(kept) <= set(keys)


def test_a_read_only_cell_folder_is_said_in_one_line(tmp_path: Path, apps_data_dir: Path):
    rows = apps_data_dir / "train_mini150.jsonl"
    with tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        r = _cell(tmp_path, rows, ro / "cell")
        assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
        line = _said(r.stderr)
        assert "read-only" in line and str(ro / "cell") in line and "out_dir=" in line
        assert not (tmp_path / "outputs").exists()  # the Hydra run folder it made is gone too
        verbose = run_cli(
            [
                "allow_any_cell=true",
                "dataset=apps",
                f"dataset.path={rows}",
                "dataset.split=train",
                "limit=2",
                "tracking=none",
                f"out_dir={ro / 'cell'}",
                "hydra.verbose=apps_bench",
            ],
            tmp_path,
        )
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr  # the traceback when asked for, then the line
    assert [x for x in verbose.stderr.splitlines() if x.startswith("apps-bench: ")][-1] == line


def test_a_read_only_working_directory_is_said_in_one_line(tmp_path: Path):
    with tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        r = run_cli(["tracking=none"], ro)
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    assert "Traceback" not in r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("apps-bench: ")]
    assert "read-only" in line and "nothing was run" in line


def test_a_log_file_on_a_full_disk_costs_no_traceback_per_line(tmp_path: Path):
    """Hydra's job log sits in outputs/ too: once the disk is full, every line logged failed with a '--- Logging
    error ---' traceback. A log file's disk fault is quiet now; a logging bug (a bad format) is still reported."""
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        code = (
            "import logging, os\n"
            "from apps_bench.tracking import faults\n"
            f"logging.getLogger().addHandler(logging.FileHandler({str(disk / 'job.log')!r}))\n"
            f"fd = os.open({str(disk / 'filler')!r}, os.O_WRONLY | os.O_CREAT)\n"
            "try:\n"
            "    while True:\n"
            "        os.write(fd, bytes(4096))\n"
            "except OSError:\n"
            "    os.close(fd)\n"
            "faults.quiet_log_files()\n"
            "for i in range(20):\n"
            "    logging.warning('a line of the cell %d %s', i, 'x' * 4096)\n"
            "logging.warning('%d', 'a bug: not a number')\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=120
        )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("--- Logging error ---") == 1 and "TypeError" in r.stderr, r.stderr[-3000:]
    assert "No space left" not in r.stderr and "OSError" not in r.stderr, r.stderr[-3000:]
